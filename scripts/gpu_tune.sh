#!/usr/bin/env bash
# Decode-kernel tuning on a GPU in one device call. Builds one variant of the library per
# pipeline shape (the PAGEDKV_DECODE_* macros of src/detail/cuda_launch.hpp and
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
# Logs and JSON go to $OUT/tune-logs.tgz (or /tmp/tune-out/). Env: VARIANTS (space-separated
# name:heads_per_cta:stages:tile_bytes:min_ctas_per_sm; the first is the committed shape, "cur"),
# JOBS, DEADLINE_S (default 330: no variant's tests start after this many seconds).
set -uo pipefail
# --run FILE is relative to the caller's directory; everything else to the repository root.
[ "${1:-}" = --run ] && [ -f "${2:-}" ] && set -- --run "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
cd "$(dirname "$0")/.."

VARIANTS="${VARIANTS:-cur:4:3:8192:4 h4s2:4:2:8192:4 h4s4t4:4:4:4096:4 h4s3m3:4:3:8192:3 h8s2:8:2:8192:2}"
JOBS="${JOBS:-2}"
TARGETS=(bench_cuda_decode test_cuda_decode_attention test_cuda_device_decode_runner pagedkv_cli)
# Rows timed for every variant (Google Benchmark regex over BM_Decode/bf16:X/gqa:G/batch:B/ctx:C).
SUBSET='BM_Decode/bf16:0/gqa:4/batch:(1/ctx:32768|32/ctx:4096|256/ctx:4096|64/ctx:32768)/|BM_Decode/bf16:1/gqa:8/batch:(8/ctx:4096|128/ctx:4096)/|BM_Decode/bf16:1/gqa:4/batch:32/ctx:32768/'

bundle() {
  local out=build-tune/pack
  rm -rf "$out" && mkdir -p "$out/lib"
  for v in $VARIANTS; do
    IFS=: read -r name heads stages tile ctas <<<"$v"
    local defs="-DPAGEDKV_DECODE_HEADS_PER_CTA=$heads -DPAGEDKV_DECODE_STAGES=$stages"
    defs+=" -DPAGEDKV_DECODE_TILE_BYTES=$tile -DPAGEDKV_DECODE_MIN_CTAS_PER_SM=$ctas"
    local dir="build-tune/$name"
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_CXX_FLAGS="$defs" -DCMAKE_CUDA_FLAGS="$defs" -DPAGEDKV_BUILD_CLI=ON \
      -DPAGEDKV_BUILD_TESTS=ON -DPAGEDKV_BUILD_BENCHMARKS=ON >/dev/null || return 1
    cmake --build "$dir" -j "$JOBS" --target "${TARGETS[@]}" >"$dir.log" 2>&1 ||
      { tail -30 "$dir.log"; return 1; }
    mkdir -p "$out/$name"
    cp "$dir/benchmarks/bench_cuda_decode" "$dir/tests/test_cuda_decode_attention" \
      "$dir/tests/test_cuda_device_decode_runner" "$dir/src/cli/pagedkv" "$out/$name/"
    echo "built $name ($defs)"
  done
  for exe in "$out"/*/*; do
    ldd "$exe" | awk '/=> \// {print $3}' |
      grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
      xargs -r -I{} cp -L {} "$out/lib/"
  done
  echo "$VARIANTS" >"$out/variants"
  tar -C "$out" -cJf build-tune/bundle.tar.xz . && du -h build-tune/bundle.tar.xz
}

run() {
  local start=$SECONDS deadline="${DEADLINE_S:-330}" out=/tmp/tune-logs dir=/tmp/tune
  local keep="${OUT:-/tmp/tune-out}"  # at most a few files come back: logs travel as one tarball
  mkdir -p "$out" "$dir" "$keep" && tar -C "$dir" -xJf "$1" || return 1
  save() { tar -C "$out" -czf "$keep/tune-logs.tgz" .; }
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  local names=()
  for v in $(cat "$dir/variants"); do names+=("${v%%:*}"); done
  # Warm-up (clocks, module load), then every variant, then the first one again: the spread
  # between its two runs is the noise floor of the comparison.
  "$dir/${names[0]}/bench_cuda_decode" --benchmark_filter='batch:32/ctx:4096' >/dev/null 2>&1
  for n in "${names[@]}" "${names[0]}_again"; do
    "$dir/${n%_again}/bench_cuda_decode" --benchmark_filter="$SUBSET" --benchmark_out_format=json \
      --benchmark_out="$out/subset_$n.json" >"$out/subset_$n.log" 2>&1
    echo "subset $n: rc $? at $((SECONDS - start)) s"
  done
  # Variants ranked by the geometric mean of paged time over the subset.
  local ranked
  ranked=$(python3 - "$out" "$(cat "$dir/variants") ${names[0]}_again" <<'PY'
import json, math, sys
out, variants = sys.argv[1], sys.argv[2].split()
rows, score = {}, {}
for v in variants:
    n = v.split(':')[0]
    try:
        bs = json.load(open(f'{out}/subset_{n}.json'))['benchmarks']
    except Exception as e:
        print(f'# {n}: no results ({e})', file=sys.stderr); continue
    t = {b['name'].split('/min_time')[0]: (b['paged_us'], b['paged/contig'], b['pct_of_copy'])
         for b in bs if 'paged_us' in b}
    rows[n] = t
    if t: score[n] = math.exp(sum(math.log(x[0]) for x in t.values()) / len(t))
names = sorted((n for n in score if not n.endswith('_again')), key=score.get)
with open(f'{out}/subset_table.md', 'w') as f:
    keys = sorted({k for t in rows.values() for k in t})
    f.write('| row | ' + ' | '.join(f'{n} ({v})' for n, v in ((v.split(':')[0], v) for v in variants)) + ' |\n')
    f.write('|---' * (len(variants) + 1) + '|\n')
    for k in keys:
        cells = []
        for v in variants:
            x = rows.get(v.split(':')[0], {}).get(k)
            cells.append(f'{x[0]:.1f} us, {x[2]:.0f}%, x{x[1]:.3f}' if x else '-')
        f.write(f'| {k.replace("BM_Decode/", "")} | ' + ' | '.join(cells) + ' |\n')
    f.write('| geomean paged us | ' + ' | '.join(f'{score[v.split(":")[0]]:.1f}' if v.split(':')[0] in score else '-' for v in variants) + ' |\n')
print(' '.join(names))
PY
)
  save
  cat "$out/subset_table.md"
  echo "ranked: $ranked"
  local best="" tested=""
  for n in $ranked; do
    local ok=1
    for t in test_cuda_decode_attention test_cuda_device_decode_runner; do
      "$dir/$n/$t" --gtest_brief=1 >"$out/test_${n}_$t.log" 2>&1 || ok=0
      echo "$n $t: $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_${n}_$t.log" | tr '\n' ' ')"
    done
    tested+=" $n"
    if [ "$ok" = 1 ]; then best=$n; break; fi
  done
  [ -n "$best" ] || { echo "no variant passed its tests"; return 1; }
  echo "best: $best at $((SECONDS - start)) s"
  "$dir/$best/bench_cuda_decode" --benchmark_format=json --benchmark_out="$out/full_$best.json" \
    >"$out/full_$best.log" 2>&1
  echo "full benchmark of $best: rc $? at $((SECONDS - start)) s"
  save
  sed -n '/^### CUDA decode attention/,$p' "$out/full_$best.log"
  "$dir/$best/pagedkv" generate --device cuda --cache all >"$out/generate_$best.log" 2>&1
  echo "generate ($best): rc $?"
  sed -n '/^cache /,$p' "$out/generate_$best.log"
  for n in "${names[@]}"; do
    case " $tested " in *" $n "*) continue ;; esac
    [ $((SECONDS - start)) -lt "$deadline" ] || { echo "tests of $n: no time left"; continue; }
    for t in test_cuda_decode_attention test_cuda_device_decode_runner; do
      "$dir/$n/$t" --gtest_brief=1 >"$out/test_${n}_$t.log" 2>&1
      echo "$n $t: rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_${n}_$t.log" | tr '\n' ' ')"
    done
  done
  save
  echo "total $((SECONDS - start)) s"
}

case "${1:-}" in
  --bundle) bundle ;;
  --run) run "${2:?usage: gpu_tune.sh --run FILE}" ;;
  *) echo "usage: gpu_tune.sh --bundle | --run FILE" >&2; exit 2 ;;
esac
