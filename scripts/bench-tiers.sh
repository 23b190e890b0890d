#!/usr/bin/env bash
# The tier figures of docs/tiers.md ("Measured"): (1) store and load bandwidth of each tier
# against a memcpy of the same bytes (benchmarks/bench_tiers.cpp, Google Benchmark JSON), with a
# redis-server started on loopback for the Redis rows; (2) TTFT and prompt tokens prefilled by
# `pagedkv generate` on the built-in model: cold; hits in the pool and in the host tier (one
# process: --warm-pass pool / tiers runs the prompts once first); onboarding from a disk file
# and from Redis that an earlier instance (another process) filled. Each case runs REPEATS times;
# the table gives the median TTFT. In every warm case the first prompt loads the shared prefix
# and the other two then share it in the pool.
# Usage: scripts/bench-tiers.sh [BUILD_DIR (build)] [OUT_DIR (build/bench-tiers)] [REPEATS (5)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-$build/bench-tiers}
repeats=${3:-5}
cli=$build/src/cli/pagedkv
bench=$build/benchmarks/bench_tiers
for exe in "$cli" "$bench"; do
  [ -x "$exe" ] || { echo "bench-tiers: $exe is not built" >&2; exit 2; }
done
server=$(command -v redis-server || echo /usr/bin/redis-server)
[ -x "$server" ] || { echo "bench-tiers: redis-server is not installed" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out"

port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
"$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --maxmemory 1gb \
  --maxmemory-policy allkeys-lru --daemonize no > "$out/redis.log" 2>&1 &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done

PAGEDKV_BENCH_REDIS=127.0.0.1:$port "$bench" --benchmark_out="$out/bench_tiers.json" \
  --benchmark_out_format=json --benchmark_min_time=0.2 > "$out/bench_tiers.txt"
redis-cli -p "$port" flushall > /dev/null

# Three prompts behind one shared prefix (tests/tiers/two_instances.sh uses the same set).
prefix="Once upon a time, there was a little girl named Lily. She lived in a small house with her \
mom and dad and her dog Max. Every morning Lily woke up early, put on her red shoes and ran into \
the garden to look at the flowers. One day she saw a big yellow bird sitting on the fence. The \
bird was singing a happy song, and Lily wanted to sing with it. She sat down on the grass and \
listened very carefully. Then she"
printf '%s\n' "$prefix smiled and waved." "$prefix asked her mom for some bread." \
  "$prefix ran to tell Max." > "$out/prompts.txt"
common=(--prompts "$out/prompts.txt" --steps 240 --block-size 16 --cache paged --json)

run() {  # run NAME ARGS...: REPEATS runs, one JSON each
  local name=$1
  shift
  for i in $(seq "$repeats"); do "$cli" generate "${common[@]}" "$@" > "$out/$name.$i.json"; done
}
run cold
run pool --prefix-caching --warm-pass pool
run host --tier-host-mib 64 --warm-pass tiers
# Instance A fills the tiers once; every B run onboards from them (B writes back nothing new).
"$cli" generate "${common[@]}" --tier-disk "$out/kv.tier" > "$out/disk_a.json"
run disk --tier-disk "$out/kv.tier"
"$cli" generate "${common[@]}" --tier-redis "127.0.0.1:$port" > "$out/redis_a.json"
run redis --tier-redis "127.0.0.1:$port"

python3 - "$out" "$repeats" <<'EOF'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
print("| case | TTFT ms (median of %d) | prompt tokens | prefilled | onboarded |" % repeats)
print("| --- | ---: | ---: | ---: | ---: |")
prompt = json.load(open(f"{out}/disk.1.json"))["modes"][0]["prefix_cache"]["prompt_tokens"]
for name in ["cold", "pool", "host", "disk", "redis"]:
    runs = [json.load(open(f"{out}/{name}.{i}.json"))["modes"][0] for i in range(1, repeats + 1)]
    pc = runs[0].get("prefix_cache") or {}
    ttft = statistics.median(r["ttft_ms"] for r in runs)
    prefilled = prompt - pc.get("prompt_tokens_cached", 0)
    print(f"| {name} | {ttft:.2f} | {prompt} | {prefilled} | {pc.get('onboarded_tokens', 0)} |")
EOF
echo "bench-tiers: JSON in $out/bench_tiers.json, text in $out/bench_tiers.txt"
