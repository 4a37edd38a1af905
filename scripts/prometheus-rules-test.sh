#!/usr/bin/env bash
# Checks raftlock's Prometheus rules (deploy/prometheus): `promtool check
# rules`, then `promtool test rules` on the synthetic series of
# deploy/prometheus/tests.yml, every alert firing where it must and silent
# where it must not. Installs Debian's prometheus package (for promtool)
# when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v promtool >/dev/null || scripts/apt-install.sh prometheus
cd deploy/prometheus
promtool check rules raftlock.rules.yml
promtool test rules tests.yml
