#!/usr/bin/env bash
# Fuzzing job of CI (issue 8; docs/reliability.md): builds the libFuzzer targets of tests/fuzz
# with clang (-fsanitize=fuzzer,address,undefined) in a separate build folder and runs each for a
# bounded time from its committed seed corpus. Fails on any crash, leak, sanitizer report,
# timeout, huge allocation or broken invariant (the targets abort on those); the input that
# triggered it is kept under <build>/artifacts/<target>/ and printed.
# Usage: scripts/ci-fuzz.sh [seconds per target, default 60] [target...]   (default: all)
# Environment: JOBS (targets fuzzed at once and build jobs, default 2), PAGEDKV_FUZZ_DIR
# (build-fuzz). Reproduce a finding: <build>/tests/fuzz/<target> <artifact file>.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
jobs=${JOBS:-2}
dir=${PAGEDKV_FUZZ_DIR:-build-fuzz}
start=$(date +%s)

# clang, its sanitizer/fuzzer runtimes and clang's OpenMP runtime are not in install-deps.sh
# (the main build is gcc); install them the same way when missing.
pkgs=(clang libclang-rt-14-dev libomp-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ci-fuzz: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi

# SIMD: only Highway's AVX3 target and its fallback are compiled, as in the sanitizer builds
# (every SIMD target at -O1 with ASan took 11 CPU-minutes for src/cpu/attention_hwy.cpp alone;
# the fuzzers look for crashes in parsing and bookkeeping, not in vector code). One SIMD target
# must stay: with the fallback alone Highway 1.0.3 dispatches statically to a target name
# (N_EMU128) it did not compile under clang.
hwy_disabled='(HWY_SSSE3|HWY_SSE4|HWY_AVX2)'
# -O1 -g: fast enough to fuzz, readable stack traces. Tests and benchmarks are off (this build
# only makes fuzzers); the CLI stays on because it brings the model layer the model fuzzers need.
CC=clang CXX=clang++ cmake -S . -B "${dir}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" -DPAGEDKV_BUILD_FUZZ=ON -DPAGEDKV_BUILD_TESTS=OFF \
  -DPAGEDKV_BUILD_BENCHMARKS=OFF -DPAGEDKV_BUILD_CLI=ON -DPAGEDKV_ENABLE_CUDA=OFF \
  -DPAGEDKV_BUILD_PYTHON=OFF "-DPAGEDKV_HWY_DISABLED_TARGETS=${hwy_disabled}" >/dev/null
# (read fails at end of input without a newline: the list is still read)
IFS=";" read -r -a all_targets < "${dir}/tests/fuzz/targets.txt" || true
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")
cmake --build "${dir}" -j"${jobs}" --target "${targets[@]}"
built=$(date +%s)

# Leaks and UB are findings; a single allocation above 1 GiB is one too (a corrupt header must
# not drive an allocation), and so is an input that runs over 10 s (a hang).
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# One OpenMP thread per fuzzer: JOBS fuzzers already share the cores.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

fuzz_one() {
  local t=$1
  local work="${dir}/corpus/${t}" artifacts="${dir}/artifacts/${t}" log="${dir}/fuzz-${t}.log"
  mkdir -p "${work}" "${artifacts}"
  # New inputs go to ${work}; the committed seeds are read, never written.
  if "${dir}/tests/fuzz/${t}" -max_total_time="${secs}" -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="${artifacts}/" \
      "${work}" "tests/fuzz/${t}" >"${log}" 2>&1; then
    echo "ci-fuzz: ${t}: ok ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "${log}" |
      grep -o '[0-9]*$') runs, corpus $(find "${work}" -type f | wc -l) new inputs)"
  else
    echo "ci-fuzz: ${t}: FAILED; last lines of ${log}:" >&2
    tail -n 40 "${log}" >&2
    echo "ci-fuzz: ${t}: reproducer(s): $(find "${artifacts}" -type f | tr '\n' ' ')" >&2
    return 1
  fi
}

failed=0
running=0
for t in "${targets[@]}"; do
  fuzz_one "${t}" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done

echo "ci-fuzz: build $((built - start)) s, fuzzing $(( $(date +%s) - built )) s" \
  "(${#targets[@]} targets x ${secs} s, ${jobs} at a time)"
if ((failed)); then
  echo "ci-fuzz: FAILED" >&2
  exit 1
fi
echo "ci-fuzz: all targets ok"
