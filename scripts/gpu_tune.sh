#!/usr/bin/env bash
# Decode-kernel tuning on a GPU in one device call. Builds one variant of the library per
# kernel shape (the PAGEDKV_DECODE_* macros of cuda/launch.hpp and
# include/pagedkv/cuda/decode_attention.hpp), times each on a subset of bench_cuda_decode, then
# runs the fastest variant's decode tests (falling back to the next if they fail), its full
# benchmark and `pagedkv generate --device cuda`, and finally the other variants' tests.
#
# Usage, from the repository root:
#   scripts/gpu_tune.sh --bundle        here: build build-tune/<variant>/ (sm_90) and pack
#                                       build-tune/bundle.tar.xz (executables + shared libraries)
#   scripts/gpu_tune.sh --run FILE      on the GPU machine (needs the NVIDIA driver, python3, xz)
# With the device tool: run(command="scripts/gpu_tune.sh --run build-tune/bundle.tar.xz",
#                           carry=["build-tune/bundle.tar.xz"], timeout_s=420)
#
# VARIANTS: space-separated shapes, each `name` alone (the committed shape: no macro set) or
# name:heads_per_cta:stages:tile_bytes:min_ctas_per_sm. JOBS: build parallelism. DEADLINE_S
# (default 330): no other variant's tests start after this many seconds. Logs and JSON go to
# $OUT/tune-logs.tgz (or /tmp/tune-out/); only a few files come back from the device tool.
# Exit status: 0 when the chosen variant passed its tests, its benchmark and generate ran and
# agreed with the CPU caches, and every other variant tested passed; 1 otherwise; 2 for usage.
set -uo pipefail
usage() { echo "usage: gpu_tune.sh --bundle | --run FILE" >&2; exit 2; }
if [ "${1:-}" = --run ]; then
  [ -n "${2:-}" ] || usage
  [ -f "$2" ] || { echo "gpu_tune.sh: no such file: $2" >&2; exit 2; }
  set -- --run "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"  # before the cd below
fi
cd "$(dirname "$0")/.."

VARIANTS="${VARIANTS:-cur h4s2:4:2:8192:4 h4s4t4:4:4:4096:4 h4s3m3:4:3:8192:3 h8s2:8:2:8192:2}"
JOBS="${JOBS:-2}"
TARGETS=(bench_cuda_decode test_cuda_decode_attention test_cuda_device_decode_runner pagedkv_cli)
# Rows timed for every variant (Google Benchmark regex; "bf16:0" is fp16, "bf16:1" bf16).
SUBSET='BM_Decode/bf16:0/gqa:4/batch:(1/ctx:32768|32/ctx:4096|256/ctx:4096|64/ctx:32768)/'
SUBSET+='|BM_Decode/bf16:1/gqa:8/batch:(8/ctx:4096|128/ctx:4096)/'
SUBSET+='|BM_Decode/bf16:1/gqa:4/batch:32/ctx:32768/'

bundle() {
  local out=build-tune/pack
  rm -rf "$out" && mkdir -p "$out/lib"
  for v in $VARIANTS; do
    local name heads stages tile ctas defs=""
    IFS=: read -r name heads stages tile ctas <<<"$v"
    if [ -n "${heads:-}" ]; then
      defs="-DPAGEDKV_DECODE_HEADS_PER_CTA=$heads -DPAGEDKV_DECODE_STAGES=$stages"
      defs+=" -DPAGEDKV_DECODE_TILE_BYTES=$tile -DPAGEDKV_DECODE_MIN_CTAS_PER_SM=$ctas"
    fi
    local dir="build-tune/$name"
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_CXX_FLAGS="$defs" -DCMAKE_CUDA_FLAGS="$defs" -DPAGEDKV_BUILD_CLI=ON \
      -DPAGEDKV_BUILD_TESTS=ON -DPAGEDKV_BUILD_BENCHMARKS=ON >/dev/null || return 1
    cmake --build "$dir" -j "$JOBS" --target "${TARGETS[@]}" >"$dir.log" 2>&1 ||
      { tail -30 "$dir.log"; return 1; }
    mkdir -p "$out/$name"
    cp "$dir/benchmarks/bench_cuda_decode" "$dir/tests/test_cuda_decode_attention" \
      "$dir/tests/test_cuda_device_decode_runner" "$dir/src/cli/pagedkv" "$out/$name/"
    echo "built $name (${defs:-committed shape})"
  done
  scripts/copy_shared_libs.sh "$out/lib" "$out"/*/* || return 1
  echo "$VARIANTS" >"$out/variants"
  tar -C "$out" -cJf build-tune/bundle.tar.xz . && du -h build-tune/bundle.tar.xz
}

# Runs variant $1's decode tests (logs in $out); status 0 when both executables pass.
test_variant() {
  local n=$1 ok=0 t
  for t in test_cuda_decode_attention test_cuda_device_decode_runner; do
    timeout 300 "$dir/$n/$t" --gtest_brief=1 >"$out/test_${n}_$t.log" 2>&1 || ok=1
    echo "$n $t: $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_${n}_$t.log" | tr '\n' ' ')"
  done
  return "$ok"
}

run() {
  local start=$SECONDS deadline="${DEADLINE_S:-330}" status=0
  out=/tmp/tune-logs dir=/tmp/tune
  local keep="${OUT:-/tmp/tune-out}"
  rm -rf "$out" "$dir" && mkdir -p "$out" "$dir" "$keep" && tar -C "$dir" -xJf "$1" || return 1
  save() { tar -C "$out" -czf "$keep/tune-logs.tgz" .; }
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1
  local names=() v n
  for v in $(cat "$dir/variants"); do names+=("${v%%:*}"); done
  # Warm-up (clocks, module load), then every variant, then the first one again: the spread
  # between its two runs is the noise floor of the comparison.
  timeout 120 "$dir/${names[0]}/bench_cuda_decode" --benchmark_filter='batch:32/ctx:4096' \
    >/dev/null 2>&1
  for n in "${names[@]}" "${names[0]}_again"; do
    timeout 120 "$dir/${n%_again}/bench_cuda_decode" --benchmark_filter="$SUBSET" \
      --benchmark_out_format=json --benchmark_out="$out/subset_$n.json" >"$out/subset_$n.log" 2>&1
    echo "subset $n: rc $? at $((SECONDS - start)) s"
  done
  # Variants ranked by the geometric mean of paged time over the subset (those with results).
  local ranked
  ranked=$(python3 - "$out" "$(cat "$dir/variants") ${names[0]}_again" <<'PY'
import json, math, sys
out, variants = sys.argv[1], sys.argv[2].split()
names = [v.split(':')[0] for v in variants]
rows, score = {}, {}
for n in names:
    try:
        bs = json.load(open(f'{out}/subset_{n}.json'))['benchmarks']
    except Exception as e:
        print(f'# {n}: no results ({e})', file=sys.stderr)
        continue
    t = {b['name'].split('/min_time')[0]: (b['paged_us'], b['paged/contig'], b['pct_of_copy'])
         for b in bs if 'paged_us' in b}
    rows[n] = t
    if t:
        score[n] = math.exp(sum(math.log(x[0]) for x in t.values()) / len(t))
with open(f'{out}/subset_table.md', 'w') as f:
    keys = sorted({k for t in rows.values() for k in t})
    f.write('| row | ' + ' | '.join(variants) + ' |\n' + '|---' * (len(variants) + 1) + '|\n')
    for k in keys:
        cells = []
        for n in names:
            x = rows.get(n, {}).get(k)
            cells.append(f'{x[0]:.1f} us, {x[2]:.0f}%, x{x[1]:.3f}' if x else '-')
        f.write(f'| {k.replace("BM_Decode/", "")} | ' + ' | '.join(cells) + ' |\n')
    f.write('| geomean paged us | ' +
            ' | '.join(f'{score[n]:.1f}' if n in score else '-' for n in names) + ' |\n')
print(' '.join(sorted((n for n in score if not n.endswith('_again')), key=score.get)))
PY
)
  save
  cat "$out/subset_table.md"
  if [ -z "$ranked" ]; then
    echo "no benchmark results: testing the variants in the order given"
    ranked="${names[*]}"
    status=1
  fi
  echo "ranked: $ranked"
  local best="" tested=""
  for n in $ranked; do
    tested+=" $n"
    if test_variant "$n"; then best=$n; break; fi
  done
  save
  [ -n "$best" ] || { echo "no variant passed its tests"; return 1; }
  echo "best: $best at $((SECONDS - start)) s"
  timeout 300 "$dir/$best/bench_cuda_decode" --benchmark_format=json \
    --benchmark_out="$out/full_$best.json" >"$out/full_$best.log" 2>&1 || status=1
  echo "full benchmark of $best: at $((SECONDS - start)) s"
  save
  sed -n '/^### CUDA decode attention/,$p' "$out/full_$best.log"
  timeout 120 "$dir/$best/pagedkv" generate --model random --device cuda --cache all \
    >"$out/generate_$best.log" 2>&1 || status=1
  grep -q 'agreement: contiguous vs paged-cuda: same tokens' "$out/generate_$best.log" ||
    { status=1; echo "generate ($best): failed or disagreed with the CPU caches"; }
  sed -n '/^cache /,$p' "$out/generate_$best.log"
  for n in "${names[@]}"; do
    case " $tested " in *" $n "*) continue ;; esac
    [ $((SECONDS - start)) -lt "$deadline" ] || { echo "tests of $n: no time left"; continue; }
    test_variant "$n" || status=1
  done
  save
  echo "total $((SECONDS - start)) s, status $status"
  return "$status"
}

case "${1:-}" in
  --bundle) bundle ;;
  --run) run "$2" ;;
  *) usage ;;
esac
