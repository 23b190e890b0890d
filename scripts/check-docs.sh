#!/usr/bin/env bash
# Builds the API reference (docs/Doxyfile: every header under include/pagedkv/) into a scratch
# folder and fails when Doxygen warns (an undocumented public function, type, member or
# enumerator, or a documentation error) or when a declaration quoted in docs/api.md is no longer
# in the headers, or when a relative link of the Markdown pages is broken (check_links.py).
# Meant for .ci/run, beside scripts/check-format.sh.
# Usage: scripts/check-docs.sh            check; the HTML is thrown away
#        scripts/check-docs.sh --out DIR  check and keep the HTML in DIR/html (index.html)
# Exit: 0 no warning ("check-docs: 0 warnings"); 1 warnings (listed, one a line, duplicates
# dropped) or Doxygen failed; 2 doxygen is not installed or a bad argument.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v doxygen >/dev/null || {
  echo "check-docs: doxygen not found (Debian doxygen; scripts/install-deps.sh installs it)" >&2
  exit 2
}
out=""
case "${1:-}" in
  "") ;;
  --out)
    [ -n "${2:-}" ] || { echo "check-docs: --out needs a folder" >&2; exit 2; }
    mkdir -p "$2"
    out="$(cd "$2" && pwd)"
    ;;
  *) echo "check-docs: unknown argument '$1' (usage: check-docs.sh [--out DIR])" >&2; exit 2 ;;
esac
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
[ -n "$out" ] || out="$scratch/out"
log="$scratch/warnings.log"
# Same settings as docs/Doxyfile; only where the output and the warnings go differ.
if ! { cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = \"$out\""; echo "WARN_LOGFILE = \"$log\""; } |
  doxygen - >"$scratch/doxygen.out" 2>&1; then
  echo "check-docs: doxygen failed ($(doxygen --version)):" >&2
  cat "$scratch/doxygen.out" "$log" >&2 2>/dev/null || true
  exit 1
fi
# Doxygen repeats a warning for each class that inherits the member: keep the first of each.
root="$(pwd)/"
mapfile -t warnings < <(sed "s|^$root||" "$log" | awk 'NF && !seen[$0]++')

# docs/api.md quotes signatures in ```cpp blocks whose first line starts with
# "// declarations": each declaration there (lines up to one ending in ; { or }, // comments
# dropped) must occur in some public header, whitespace ignored, so the page cannot drift from
# the code.
headers="$(find include/pagedkv -name '*.hpp' -print0 | sort -z | xargs -0 cat |
  sed 's|//.*$||' | tr -d ' \t\r\n')"
while IFS=$'\t' read -r line decl; do
  [[ "$headers" == *"$(tr -d ' \t' <<<"$decl")"* ]] ||
    warnings+=("docs/api.md:$line: warning: declaration not in include/pagedkv/: $decl")
done < <(awk '
  /^```/ { if (in_code) { in_code = 0; checked = 0; next } in_code = 1; first = 1; next }
  in_code && first { first = 0; checked = ($0 ~ /^\/\/ declarations/); if (checked) next }
  in_code && checked {
    sub(/\/\/.*$/, ""); gsub(/^[ \t]+|[ \t]+$/, "")
    if ($0 == "") next
    if (acc == "") start = NR
    acc = (acc == "" ? $0 : acc " " $0)
    if ($0 ~ /[;{}]$/) { printf "%d\t%s\n", start, acc; acc = "" }
  }' docs/api.md)
# Relative links of README.md and docs/ (and every other tracked page): the file exists and an
# anchor names one of its headings (scripts/check_links.py).
if ! links="$(python3 scripts/check_links.py 2>&1)"; then
  while IFS= read -r l; do warnings+=("$l"); done < <(grep '^  ' <<<"$links" | sed 's/^  //; s/$/ (warning: broken link)/')
fi

count=0
for w in "${warnings[@]}"; do
  [[ "$w" == *"warning:"* || "$w" == *"error:"* ]] && count=$((count + 1))
done
if ((count)); then
  echo "check-docs: $count warnings (doxygen $(doxygen --version)):" >&2
  printf '  %s\n' "${warnings[@]}" >&2
  exit 1
fi
echo "check-docs: 0 warnings"
