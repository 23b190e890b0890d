#!/usr/bin/env bash
# Copies into DEST every shared library the given executables load that a bare CUDA image may
# lack (fmt, benchmark, hwy, gomp, cudart, OpenBLAS, ...). The C and C++ runtimes (glibc,
# libstdc++, libgcc_s) are left to the target system, which must be at least as new as this
# one. Used by gpu_check.sh and gpu_tune.sh when they pack a bundle.
# Usage: scripts/copy_shared_libs.sh DEST EXE...
set -euo pipefail
dest=${1:?usage: copy_shared_libs.sh DEST EXE...}
shift
mkdir -p "$dest"
for exe in "$@"; do
  # `|| true`: an executable that loads only the runtimes above leaves grep nothing to print,
  # which is not an error (pipefail would make it one).
  ldd "$exe" | awk '/=> \// {print $3}' |
    { grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' || true; } |
    xargs -r -I{} cp -L {} "$dest/"
done
