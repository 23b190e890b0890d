#!/usr/bin/env bash
# Fails when a C++/CUDA source (tracked, or new and not ignored) differs from what clang-format
# (.clang-format: Google base, 100 columns) makes of it, and names each such file. Run by .ci/run.
# Usage: scripts/check-format.sh          check (exit 1 and list the files on a difference)
#        scripts/check-format.sh --fix    rewrite the files in place
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format not found (Debian clang-format)" >&2; exit 2; }
# Tracked files and new ones not yet added (--others --exclude-standard: untracked, not ignored),
# so a file is checked before its first commit.
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check-format: ${#bad[@]} file(s) differ from clang-format ($(clang-format --version | head -1)):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "check-format: run scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
