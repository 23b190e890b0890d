#!/usr/bin/env bash
# The layer rule, checked on every project include ("..."; <...> headers are outside it): a
# folder includes only its own layer and the layers below it (docs/design.md, "The map"):
#   apps (cli, ops, sim, benchmarks) > model > tiers > kernels (cpu, cuda) > storage >
#   metadata > vocabulary; reference depends on vocabulary only; tiers uses storage and
#   metadata, never the kernels.
# Prints each offending include and exits 1. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

vocab='pagedkv/(types|error|dtype|attention_params|config)\.hpp|core/[a-z_]+\.hpp'
api='pagedkv/[a-z_/]+\.hpp'
# "pathspec[ pathspec...]:allowed include paths (extended regex over the whole path)"
rules=(
  "include/pagedkv/*.hpp src/core:$vocab"
  "include/pagedkv/metadata src/metadata:$vocab|pagedkv/metadata/[a-z_]+\.hpp|metadata/[a-z_]+\.hpp"
  "include/pagedkv/reference src/reference:$vocab|pagedkv/reference/[a-z_]+\.hpp"
  "include/pagedkv/storage src/storage:$vocab|pagedkv/(metadata|storage)/[a-z_]+\.hpp|storage/[a-z_]+\.hpp"
  "include/pagedkv/cpu src/cpu:$vocab|pagedkv/(metadata|storage|cpu)/[a-z_]+\.hpp|cpu/[a-z_-]+\.(hpp|h)"
  "include/pagedkv/cuda cuda:$vocab|pagedkv/(metadata|storage|cuda)/[a-z_]+\.hpp|cuda/[a-z_/]+\.hpp|[a-z_]+\.cuh"
  "include/pagedkv/tiers src/tiers:$vocab|pagedkv/(metadata|storage|tiers)/[a-z_]+\.hpp|tiers/[a-z_]+\.hpp"
  "src/model:$vocab|$api|model/[a-z_]+\.hpp"
  "src/ops:$vocab|$api|ops/[a-z_]+\.hpp"
  "src/sim:$vocab|$api|sim/[a-z_]+\.hpp|model/[a-z_]+\.hpp"
)
status=0
for rule in "${rules[@]}"; do
  read -r -a specs <<< "${rule%%:*}"
  allowed=${rule#*:}
  pathspecs=()
  for s in "${specs[@]}"; do
    pathspecs+=("$s")
    # The top-level headers alone: not the layer folders below include/pagedkv, and not the
    # umbrella, which includes every layer by design.
    [ "$s" = "include/pagedkv/*.hpp" ] &&
      pathspecs+=(':!include/pagedkv/*/*' ':!include/pagedkv/pagedkv.hpp')
  done
  while IFS= read -r hit; do
    path=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<< "$hit")
    if ! grep -qE "^($allowed)\$" <<< "$path"; then
      echo "check-layers: ${hit%%#include*}includes \"$path\", above its layer" >&2
      status=1
    fi
  done < <(git grep -n '^#include "' -- "${pathspecs[@]}" || true)
done
[ "$status" -eq 0 ] && echo "check-layers: every include is of its own layer or one below"
exit "$status"
