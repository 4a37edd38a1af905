#!/usr/bin/env bash
# Installs the Debian packages named as arguments (nothing if there are
# none), as root or through sudo: the one place raftlock's set-up scripts
# install what they need. Callers pass only what is missing. Prints nothing
# on stdout (some callers print a path there); apt's errors go to stderr.
#
#   scripts/apt-install.sh protobuf-compiler nftables
set -euo pipefail
[ $# -gt 0 ] || exit 0
sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
# An install interrupted earlier (a cancelled job, say) leaves dpkg
# refusing every other until its packages are configured: finish it first.
$sudo dpkg --configure -a >&2
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
