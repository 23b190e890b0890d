#!/usr/bin/env bash
# Mutation testing of the core sources (issue 23, docs/reliability.md "Mutation testing").
#   bash scripts/mutation.sh --sample 150 --seed 1 --budget 560 --min-kill-rate 85   # the CI job
#   bash scripts/mutation.sh --all                                                  # hours
#   bash scripts/mutation.sh --sample 20 --files 'prefix_cache'                     # one file
# Every argument goes to scripts/mutation.py (--help lists them). Environment: BUILD_DIR (the
# build folder to mutate in, default build; configured here with CUDA off if it is missing),
# WORK_DIR (mutants and report.{txt,json}, default build-mutation), VENV (a virtual environment
# with universalmutator, default build-ci-venv, created from scripts/requirements-ci.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
WORK_DIR=${WORK_DIR:-build-mutation}
VENV=${VENV:-build-ci-venv}

if [ ! -x "$VENV/bin/mutate" ]; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q -r scripts/requirements-ci.txt
fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DPAGEDKV_ENABLE_CUDA=OFF
fi

# The driver restores each source after its mutant, on errors, Ctrl-C and SIGTERM; this trap is
# the second line: if the driver itself dies (SIGKILL, out of memory), the backup it left of the
# file under mutation goes back in place.
restore() {
  local f
  for f in "$WORK_DIR"/backup/*.orig; do
    [ -e "$f" ] || continue
    cp "${f%.orig}.bytes" "$(head -n1 "$f")"
    echo "mutation.sh: restored $(head -n1 "$f")" >&2
    rm -f "$f" "${f%.orig}.bytes"
  done
}
trap restore EXIT
trap 'restore; exit 130' INT TERM

"$VENV/bin/python" scripts/mutation.py --build-dir "$BUILD_DIR" --work-dir "$WORK_DIR" \
  --mutate "$VENV/bin/mutate" "$@"
