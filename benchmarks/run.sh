#!/usr/bin/env bash
# Builds the benchmark suite (Release), runs it with --benchmark_format=json and writes the summary
# tables (machine, date, compiler flags, targets) into docs/benchmarks.md.
#
# Usage: benchmarks/run.sh [build-dir]            (default build-bench)
# Environment:
#   PAGEDKV_BENCH_FULL=1      the full grids (decode: block sizes x contexts 512..32k x batch 1/8/64
#                             x head_dim 64/128 x fp32/bf16; end to end: more positions). Hours on
#                             2 cores; the default subset takes a few minutes.
#   PAGEDKV_BENCH_MAX_GIB=N   skip decode configurations whose one-layer cache exceeds N GiB per
#                             kind (default 1)
#   BENCH_REPETITIONS=N       repetitions per benchmark, medians reported (default 3)
#   OMP_NUM_THREADS           attention threads (default: all cores)
#   OMP_WAIT_POLICY           default passive here (see below); active suits a dedicated machine
#   BENCH_FILTER=REGEX        run only matching benchmarks (quick checks; the summary is partial)
# Only ratios within one run are meaningful: run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
reps=${BENCH_REPETITIONS:-3}
# OpenMP threads that spin between parallel regions (libgomp's default) lose the CPU scheduler's
# favour on a machine shared with other work and then stall every parallel region for a time
# slice (measured: decode 1.5-2.5x slower); sleeping waiters do not. Override by setting it.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPAGEDKV_ENABLE_CUDA=OFF \
  -DPAGEDKV_BUILD_TESTS=OFF -DPAGEDKV_BUILD_BENCHMARKS=ON -DPAGEDKV_BUILD_CLI=ON >/dev/null
targets=(bench_allocator bench_attention_cpu)
# The end-to-end benchmark exists only with the model layer.
if [ -e "$build/benchmarks/bench_generate.enabled" ]; then
  targets+=(bench_generate)
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

out="$build/bench-results"
mkdir -p "$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
results=()
for t in "${targets[@]}"; do
  echo "run.sh: $t" >&2
  args=(--benchmark_format=json --benchmark_out_format=json --benchmark_out="$out/$t.json"
        --benchmark_filter="${BENCH_FILTER:-.}")
  # The end-to-end steps are few and long (fixed iterations); repeating them adds little.
  if [ "$t" != bench_generate ]; then
    args+=(--benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true)
  fi
  "$build/benchmarks/$t" "${args[@]}" >/dev/null
  results+=("$out/$t.json")
  if [ "$t" = bench_attention_cpu ] && [ -z "${OMP_NUM_THREADS:-}" ]; then
    # Decode again on one thread: the kernel alone, free of the scheduling stalls a parallel
    # region suffers when other processes share the cores.
    echo "run.sh: $t (1 thread)" >&2
    args=(--benchmark_format=json --benchmark_out_format=json --benchmark_out="$out/${t}_1t.json"
          --benchmark_filter="${BENCH_FILTER:-^BM_Decode/}"
          --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true)
    OMP_NUM_THREADS=1 "$build/benchmarks/$t" "${args[@]}" >/dev/null
    results+=("$out/${t}_1t.json")
  fi
done
python3 benchmarks/summarize.py --build "$build" --out docs/benchmarks.md \
  --load-before "$load_before" "${results[@]}"
