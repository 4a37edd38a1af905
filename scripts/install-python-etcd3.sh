#!/usr/bin/env bash
# Installs python-etcd3 (the etcd3 package from PyPI) into a virtualenv under
# .tools/ for the interop tests, and prints the path of its python.
#
# etcd3 0.12.0 (the last release) needs tenacity older than 7 (its lock's wait
# callback has the old signature) and, with current protobuf, the pure-python
# protobuf runtime (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python, set by the test).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.tools/python-etcd3
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import etcd3" 2>/dev/null; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    scripts/apt-install.sh python3-venv
    rm -rf "$venv"
    python3 -m venv "$venv" >/dev/null
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check "etcd3==0.12.0" "tenacity<7" >&2
fi
echo "$PWD/$venv/bin/python"
