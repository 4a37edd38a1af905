#!/usr/bin/env bash
# Tests the Python client (clients/python) against real raftlock members:
# installs it with its test extras (pytest, grpcio-tools for the check that
# the generated modules are current) into a virtualenv under .tools/, as a
# user would (`pip install ./clients/python`), then runs pytest with the
# members from $RAFTLOCK_BIN (default: target/debug/raftlock, built first).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.tools/python-client
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  scripts/apt-install.sh python3-venv
  python3 -m venv "$venv" >/dev/null
fi
"$venv/bin/pip" install -q --disable-pip-version-check "./clients/python[test]" >&2
[ -n "${RAFTLOCK_BIN:-}" ] || cargo build -q --bin raftlock
export RAFTLOCK_BIN=${RAFTLOCK_BIN:-$PWD/target/debug/raftlock}
# From outside the source tree, so the installed package is what is tested.
cd clients/python/tests && exec "../../../$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" .
