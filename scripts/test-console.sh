#!/usr/bin/env bash
# Tests the web console (/ui) in a real browser: installs Debian's chromium
# and chromium-driver if they are missing, Selenium into the Python
# client's virtualenv (.tools/python-client, beside the client and pytest,
# whose test harness starts the clusters), then runs tests/console with
# pytest against members of $RAFTLOCK_BIN and locks taken with
# $RAFTLOCKCTL_BIN (default: the debug builds, built first). Screenshots go
# to target/console-screenshots. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v etcdctl >/dev/null || missing+=(etcd-client)
scripts/apt-install.sh "${missing[@]}"
venv=.tools/python-client
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  scripts/apt-install.sh python3-venv
  python3 -m venv "$venv" >/dev/null
fi
"$venv/bin/pip" install -q --disable-pip-version-check "./clients/python[test]" "selenium>=4.10" >&2
if [ -z "${RAFTLOCK_BIN:-}" ] || [ -z "${RAFTLOCKCTL_BIN:-}" ]; then
  cargo build -q --bin raftlock --bin raftlockctl
fi
export RAFTLOCK_BIN=${RAFTLOCK_BIN:-$PWD/target/debug/raftlock}
export RAFTLOCKCTL_BIN=${RAFTLOCKCTL_BIN:-$PWD/target/debug/raftlockctl}
export CONSOLE_SCREENSHOTS=${CONSOLE_SCREENSHOTS:-$PWD/target/console-screenshots}
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" tests/console
