#!/usr/bin/env bash
# Builds what an operator downloads for a raftlock release, into
# target/dist/raftlock-<version>/ (the directory is printed last):
#
#   raftlock, raftlockctl           static x86_64 Linux binaries (release
#                                   profile, fat LTO, glibc's crt-static):
#                                   the same the release image holds
#   raftlock-<version>-image.tar    the container image, tagged
#                                   raftlock:<version> and raftlock:latest
#                                   (docker save; `docker load -i` it)
#   RELEASE-NOTES.md                the release's section of CHANGELOG.md
#   SHA256SUMS                      the SHA-256 of each file above
#
# The commit built is compiled in (`raftlock --version` prints it; "-dirty"
# when the tree has uncommitted changes). About 15 minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "raftlock"))')
sha=$(git rev-parse --short=12 HEAD)
git diff --quiet HEAD -- || sha="$sha-dirty"
export RAFTLOCK_GIT_SHA=$sha
# The static binaries and the image raftlock:latest from them.
scripts/docker-image.sh >&2
built=target/x86_64-unknown-linux-gnu/release
dist=target/dist/raftlock-$version
rm -rf "$dist"; mkdir -p "$dist"
cp "$built/raftlock" "$built/raftlockctl" "$dist/"
docker tag raftlock:latest "raftlock:$version"
# Both tags: docker-compose.yml runs raftlock:latest.
docker save "raftlock:$version" raftlock:latest -o "$dist/raftlock-$version-image.tar"
python3 - "$version" CHANGELOG.md >"$dist/RELEASE-NOTES.md" <<'PY'
import sys
version, path = sys.argv[1], sys.argv[2]
lines, out = open(path).read().splitlines(), None
for line in lines:
    if line.startswith("## "):
        if out is not None:
            break
        if line[3:].split()[0] == version:
            out = [f"# raftlock {version}"]
        continue
    if out is not None:
        out.append(line)
if out is None:
    sys.exit(f"CHANGELOG.md has no section for {version}")
print("\n".join(out).strip())
PY
(cd "$dist" && sha256sum raftlock raftlockctl "raftlock-$version-image.tar" RELEASE-NOTES.md >SHA256SUMS)
# What an operator would check first: static, the right release and commit.
for b in raftlock raftlockctl; do
  # A static binary needs no shared library (glibc's static-pie still has
  # a dynamic section, so ldd is no test).
  if readelf -d "$dist/$b" | grep -q NEEDED; then
    echo "$dist/$b needs shared libraries" >&2
    exit 1
  fi
done
"$dist/raftlock" --version | grep -qx "raftlock $version" || { echo "raftlock --version is not $version" >&2; exit 1; }
"$dist/raftlock" --version | grep -qx "Git SHA: $sha" || { echo "raftlock --version does not name $sha" >&2; exit 1; }
echo "$dist"
