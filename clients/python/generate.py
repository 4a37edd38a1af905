#!/usr/bin/env python3
"""Generate raftlock's Python gRPC modules from the repository's proto/.

Writes src/raftlock/_proto/ (checked in, so that installing the package needs
only grpcio and protobuf). The generated modules import each other as
`raftlock._proto.<package>`, so they live inside the package and never clash
with top-level modules of the same names. Run it after changing proto/:

    python3 clients/python/generate.py          # rewrite the modules
    python3 clients/python/generate.py --check  # exit 1 if they are stale

Needs grpcio-tools (its bundled protoc), pinned in requirements-dev.txt.
"""

import filecmp
import pathlib
import re
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "proto"
OUT = HERE / "src" / "raftlock" / "_proto"
# The client's protos: etcd's v3 API and raftlock's native lock API (not the
# member-to-member peer.proto).
FILES = [
    "authpb/auth.proto",
    "mvccpb/kv.proto",
    "etcdserverpb/rpc.proto",
    "v3lockpb/v3lock.proto",
    "v3electionpb/v3election.proto",
    "raftlock/v1/lock.proto",
]
PACKAGES = ("authpb", "mvccpb", "etcdserverpb", "v3lockpb", "v3electionpb", "raftlock")


def generate(into: pathlib.Path) -> None:
    from grpc_tools import protoc

    args = ["protoc", f"-I{PROTO}", f"--python_out={into}", f"--pyi_out={into}", f"--grpc_python_out={into}"]
    if protoc.main(args + FILES) != 0:
        sys.exit("protoc failed")
    imports = re.compile(r"^(from|import) (" + "|".join(PACKAGES) + r")(\.| )", re.M)
    for path in into.rglob("*.py*"):
        text = path.read_text()
        text = imports.sub(lambda m: f"{m.group(1)} raftlock._proto.{m.group(2)}{m.group(3)}", text)
        path.write_text(text)
    for directory in [into, *[p for p in into.rglob("*") if p.is_dir()]]:
        (directory / "__init__.py").write_text("")


def main() -> None:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        fresh = pathlib.Path(tmp) / "_proto"
        fresh.mkdir()
        generate(fresh)
        if check:
            stale = [str(p.relative_to(fresh)) for p in fresh.rglob("*") if p.is_file()
                     and not ((OUT / p.relative_to(fresh)).is_file() and filecmp.cmp(p, OUT / p.relative_to(fresh), shallow=False))]
            if stale:
                sys.exit(f"generated modules are stale (run clients/python/generate.py): {', '.join(sorted(stale))}")
            return
        shutil.rmtree(OUT, ignore_errors=True)
        shutil.copytree(fresh, OUT)


if __name__ == "__main__":
    main()
