#!/usr/bin/env bash
# Runs every CUDA test (tests/cuda/test_cuda_*.cpp, tests/model/test_*cuda*.cpp), the CUDA decode
# benchmark (with its 8-bit rows: fp8_e4m3 and int8 beside bf16 at contexts 8k and 32k, and the
# 8-bit / bf16 time table, goal <= 0.55; the page-size series, block_size 1..128 against 128;
# BENCH_FILTER=BM_Decode8bit runs only those), its peers in the same run
# (benchmarks/gpu_peers.py: torch SDPA, a gather + SDPA paged baseline, FlashInfer where it
# imports) and the main job on the device (`pagedkv generate --device cuda --cache all` on the
# random model and on stories260K, head_dim 8: the generic kernel) on a machine with an NVIDIA
# GPU, and prints a Markdown section to paste into docs/benchmarks.md.
#
# Usage, from the repository root:
#   scripts/gpu_check.sh                 build build-gpu/ (sm_90) here, then run (needs nvcc,
#                                        cmake, GTest, Google Benchmark, fmt, CLI11,
#                                        nlohmann_json and OpenBLAS on this machine)
#   scripts/gpu_check.sh --bundle        build build-gpu/ (sm_90) and pack the test and benchmark
#                                        executables, `pagedkv`, the peers script, stories260K and
#                                        the non-system shared libraries into build-gpu/bundle/
#                                        and build-gpu/bundle.tar.xz (do this on the build machine)
#   scripts/gpu_check.sh --run DIR|FILE  run a bundle made by --bundle, the folder or the .tar.xz
#                                        (do this on the GPU machine; needs the NVIDIA driver, and
#                                        xz for the archive; python3 with torch for the peers)
#
# With the device tool (the H200 image has nvcc and cmake but not GTest/benchmark/fmt):
#   here:   scripts/gpu_check.sh --bundle
#   there:  run(command="scripts/gpu_check.sh --run build-gpu/bundle.tar.xz",
#               carry=["build-gpu/bundle.tar.xz"], timeout_s=480)
# On an H200 (2026-11-29) the tests took about 1.5 minutes, the benchmark 30 s and generate a
# few seconds (the peers, the page-size rows and the generic kernel's tests are new since and
# unmeasured). The folder is ~80 MiB (OpenBLAS, for pagedkv's matrix products, is 35 MiB of it,
# the CUDA fat binaries most of the rest): over the 64 MiB a carry may take, hence the archive
# (~10 MiB).
# With OUT set (the device tool sets it), the paste section is also written to
# $OUT/gpu_check.md. Exit status: 0 when every test passed, none was skipped for lack of a
# device, and generate's device run agreed with the CPU caches; 1 otherwise; 2 for usage (also
# for a DIR that does not exist or holds no test).
#
# Not run here: the Python module's CUDA half (python/tests/test_cuda_ops.py, torch CUDA tensors
# through pagedkv._pagedkv). The H200 image has torch, but its Python may not be the 3.11 a
# module built here targets, and it has no network and no fmt / nanobind to build one there, so
# this script cannot bring a module that is sure to load. Where a matching interpreter with
# nanobind exists: configure with -DPAGEDKV_BUILD_PYTHON=ON -DPython_EXECUTABLE=<it>, build
# pagedkv_python, then `PYTHONPATH=$BUILD/python <it> -m pytest -rs python/tests/test_cuda_ops.py`
# (it skips with "no CUDA device: ..." when torch, a device or the CUDA build is missing).
#
# Env: ARCH (default 90) for the build; JOBS (default 2) build parallelism; BUILD (default
# build-gpu) the build folder; BENCH_FILTER to
# run a subset of the benchmark (Google Benchmark regex).
set -uo pipefail
# --run DIR is relative to the caller's directory; everything else to the repository root.
[ "${1:-}" = --run ] && [ -d "${2:-}" ] && set -- --run "$(cd "$2" && pwd)"
[ "${1:-}" = --run ] && [ -f "${2:-}" ] && set -- --run "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
cd "$(dirname "$0")/.."

ARCH="${ARCH:-90}"
JOBS="${JOBS:-2}"
BUILD="${BUILD:-build-gpu}"

build() {
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DPAGEDKV_BUILD_CLI=ON -DPAGEDKV_BUILD_TESTS=ON -DPAGEDKV_BUILD_BENCHMARKS=ON >/dev/null ||
    return 1
  local targets=(bench_cuda_decode pagedkv_cli)
  for f in tests/cuda/test_cuda_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
  for f in tests/model/test_*cuda*.cpp; do targets+=("model_$(basename "$f" .cpp)"); done
  cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"
}

bundle() {
  local out="$BUILD/bundle"
  rm -rf "$out" && mkdir -p "$out/lib"
  find "$BUILD/tests" -maxdepth 1 -type f -executable -name '*test_*cuda*' -exec cp {} "$out/" \;
  cp "$BUILD/benchmarks/bench_cuda_decode" "$BUILD/src/cli/pagedkv" "$out/"
  scripts/copy_shared_libs.sh "$out/lib" "$out"/*test_*cuda* "$out/bench_cuda_decode" \
    "$out/pagedkv" || return 1
  cp scripts/gpu_check.sh benchmarks/gpu_peers.py models/stories260K.bin models/tok512.bin "$out/"
  tar -C "$out" -cJf "$BUILD/bundle.tar.xz" . || return 1
  echo "bundle: $out ($(du -sh "$out" | cut -f1)) and $BUILD/bundle.tar.xz" \
    "($(du -h "$BUILD/bundle.tar.xz" | cut -f1)); carry the archive and run" \
    "scripts/gpu_check.sh --run $BUILD/bundle.tar.xz"
}

run() {
  local dir="$1"
  if [ -f "$dir" ]; then  # the archive: unpack next to it
    local into="${dir%.tar.xz}.run"
    rm -rf "$into" && mkdir -p "$into" && tar -C "$into" -xJf "$dir" || return 2
    dir=$into
  fi
  if ! compgen -G "$dir/*test_*cuda*" >/dev/null; then
    echo "gpu_check.sh: no CUDA test executables in $dir (make it with --bundle)" >&2
    return 2
  fi
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local gpu driver
  gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  echo "== GPU: ${gpu:-unknown}; driver ${driver:-unknown}"

  local status=0 summary=""
  for t in "$dir"/*test_*cuda*; do
    local name log passed failed skipped
    name=$(basename "$t")
    log=$(mktemp)
    "$t" --gtest_brief=1 >"$log" 2>&1
    local rc=$?
    passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
    failed=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' || echo 0)
    skipped=$(grep -oE '\[  SKIPPED \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
    echo "== $name: rc $rc, passed ${passed:-0}, failed ${failed:-0}, skipped ${skipped:-0}"
    if [ "$rc" -ne 0 ]; then
      status=1
      # 127 / a loader error: the bundle needs glibc >= 2.34 and libstdc++ >= GCC 12's.
      grep -qE 'error while loading shared libraries|GLIBC' "$log" && ldd "$t" | grep 'not found'
      grep -E 'Failure|Expected|Which is|actual|FAILED|error' "$log" | head -60
    fi
    if grep -q 'no CUDA device' "$log"; then
      status=1
      echo "   tests skipped with 'no CUDA device' on a GPU machine"
    fi
    summary+="| $name | ${passed:-0} | ${failed:-0} | ${skipped:-0} |"$'\n'
    rm -f "$log"
  done

  local bench_log bench_json peers_log
  bench_log=$(mktemp)
  bench_json=$(mktemp)
  peers_log=$(mktemp)
  echo "== bench_cuda_decode"
  "$dir/bench_cuda_decode" ${BENCH_FILTER:+--benchmark_filter="$BENCH_FILTER"} \
    --benchmark_out="$bench_json" --benchmark_out_format=json | tee "$bench_log"
  # The peers in the same run (torch's SDPA, a gather + SDPA paged baseline, FlashInfer where it
  # imports), joined with the benchmark's rows; not part of the exit status (a peer missing on
  # the machine is not a pagedkv failure), its own exit code is printed.
  echo "== benchmarks/gpu_peers.py"
  python3 "$dir/gpu_peers.py" --ours "$bench_json" 2>&1 | tee "$peers_log"
  echo "   gpu_peers.py exit ${PIPESTATUS[0]}"

  # The main job with the paged cache on the device, checked against the CPU caches: the
  # random model (head_dim 64, the fast kernel), then stories260K (head_dim 8, the generic one).
  local gen_log gen_rc=0
  gen_log=$(mktemp)
  device_generate "$gen_log" --model random || gen_rc=1
  device_generate "$gen_log" --model "$dir/stories260K.bin" --tokenizer "$dir/tok512.bin" \
    --prompt "One day, a big bear" --steps 256 || gen_rc=1
  [ "$gen_rc" -eq 0 ] || status=1

  echo
  paste_section "$gpu" "$driver" "$summary" "$bench_log" "$gen_log" "$peers_log" |
    tee ${OUT:+"$OUT/gpu_check.md"}
  rm -f "$bench_log" "$bench_json" "$peers_log" "$gen_log"
  return "$status"
}

# pagedkv generate --device cuda --cache all with the given model arguments, appended to the log
# file $1 under a "### pagedkv generate ..." heading; fails unless it exits 0 and the device run
# agrees with the CPU caches.
device_generate() {
  local log=$1 one rc
  shift
  one=$(mktemp)
  echo "== pagedkv generate $* --device cuda --cache all"
  "$dir/pagedkv" generate "$@" --device cuda --cache all >"$one" 2>&1
  rc=$?
  cat "$one"
  { echo; echo "### pagedkv generate $(basename "$2") --device cuda --cache all (exit $rc)"; echo
    echo '```'; sed -n '/^cache /,$p' "$one"; echo '```'; } >>"$log"
  if [ "$rc" -ne 0 ] || ! grep -q 'agreement: contiguous vs paged-cuda: same tokens' "$one"; then
    echo "   pagedkv generate --device cuda: rc $rc, or no agreement with the CPU caches"
    rm -f "$one"
    return 1
  fi
  rm -f "$one"
}

# The Markdown section for docs/benchmarks.md, between ===== lines.
paste_section() {
  local gpu=$1 driver=$2 summary=$3 bench_log=$4 gen_log=$5 peers_log=$6
  echo "================ paste into docs/benchmarks.md ================"
  echo "## CUDA backend: $(date -u +%Y-%m-%d), ${gpu:-unknown GPU}, driver ${driver:-?}"
  echo
  echo "scripts/gpu_check.sh at commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo
  echo "| test executable | passed | failed | skipped |"
  echo "|---|---|---|---|"
  printf '%s' "$summary"
  sed -n '/^### CUDA decode attention/,$p' "$bench_log"
  sed -n '/^### /,$p' "$peers_log"
  cat "$gen_log"
  echo "================================================================"
}

case "${1:-}" in
  --bundle) build && bundle ;;
  --run) run "${2:?usage: gpu_check.sh --run DIR}" ;;
  "") build && bundle && run "$BUILD/bundle" ;;
  *) echo "usage: gpu_check.sh [--bundle | --run DIR]" >&2; exit 2 ;;
esac
