#!/usr/bin/env bash
# Creates (or updates) the virtual environment the Python package is built and tested with:
#   bash scripts/python-setup.sh [venv-dir]      (default: build-py-venv)
# The interpreter is Debian's /usr/bin/python3 (3.11), never another python3 on PATH, so the
# module, CMake's Python_EXECUTABLE and pytest all use one interpreter (docs/python.md).
# --system-site-packages makes Debian's python3-numpy and python3-torch visible; the pins in
# python/requirements.txt come from PyPI. Idempotent: a second run only checks the pins.
# Prints the venv's python path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-build-py-venv}"
# Debian's interpreter, headers, venv module, numpy and CPU torch (torch is optional for the
# tests, which skip its cases with a printed reason; installed here because CI runs them).
pkgs=(python3 python3-dev python3-venv python3-numpy python3-torch)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "python-setup: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >&2
fi
py=/usr/bin/python3
if [ ! -x "$py" ]; then
  echo "python-setup: $py is missing (apt-get install python3 python3-dev python3-venv)" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements.txt
"$venv/bin/python" -c "import nanobind, numpy; print('python-setup: nanobind', nanobind.__version__, 'numpy', numpy.__version__)" >&2
cd "$venv" && echo "$(pwd)/bin/python"
