#!/usr/bin/env python3
"""Writes the fuzz targets' starting corpus (fuzz/corpus/<target>/seed-*):
hand-encoded examples of each format, as raftlock encodes it — bincode with
fixed-width little-endian integers behind a format byte (1) — so that the
fuzzers start from inputs that decode and reach apply, replay and install.
Real WAL, journal and image files from a data directory can be added with
`--from DATA_DIR`. Run from the repository's root; it only adds files.
"""
import json
import os
import struct
import sys

def u32(v): return struct.pack("<I", v)
def u64(v): return struct.pack("<Q", v)
def i64(v): return struct.pack("<q", v)
def b(x): x = x.encode() if isinstance(x, str) else x; return u64(len(x)) + x
def boolean(v): return bytes([1 if v else 0])

def put(key, value, lease=0): return u32(0) + b(key) + b(value) + i64(lease) + boolean(False) * 3
def delete(key, end=""): return u32(1) + b(key) + b(end) + boolean(True)
def range_req(key, end="", limit=0, revision=0, sort=(0, 0), count_only=False):
    return (b(key) + b(end) + i64(limit) + i64(revision) + u32(sort[0]) + u32(sort[1]) + boolean(False)
            + boolean(count_only) + i64(0) * 4)
def compare(key, target=1, result=0, number=0, value=""):
    return u32(result) + u32(target) + b(key) + b("") + i64(number) + b(value)
def ops(*items): return u64(len(items)) + b"".join(items)
def op_range(r): return u32(0) + r
def op_put(p): return u32(1) + p[4:]
def op_delete(d): return u32(2) + d[4:]
def txn(compares, success, failure): return u32(2) + ops(*compares) + ops(*success) + ops(*failure)
def op_txn(t): return u32(3) + t[4:]

commands = {
    "put": put("k", "v"),
    "put-leased": put("held", "x", lease=7),
    "delete": delete("a", "z"),
    "txn": txn([compare("a", target=1, number=0)],
               [op_range(range_req("a", "\0", sort=(2, 4))), op_put(put("t", "1")), op_delete(delete("c"))],
               [op_range(range_req("b", count_only=True))]),
    "txn-nested": txn([], [op_txn(txn([compare("b", target=3, value="b")], [op_put(put("n", "1"))], []))], []),
    "compact": u32(3) + i64(2),
    "batch": u32(5) + ops(put("x", "1"), delete("x")),
    "lease-grant": u32(6) + i64(9) + i64(30),
    "lease-revoke": u32(7) + i64(7),
    "lease-expire": u32(8) + i64(7) + u64(1),
    "auth-enable": u32(9) + u32(0),
    "as-user-put": u32(10) + b("alice") + u64(1) + put("u", "v"),
    "alarm": u32(11) + u32(0) + u64(1) + u32(1),
    "forwarded": u32(12) + u64(2) + u64(40) + put("f", "v"),
    # Lock-delay: a delayed grant deleted by someone else, another ended by its lease's revoke.
    "lock-delay": u32(5) + ops(u32(6) + i64(7) + i64(30), put("d/o", "", lease=7), put("d/o.delay", "1500", lease=7),
                               delete("d/o"), put("e/o", "", lease=7), put("e/o.delay", "60000", lease=7),
                               u32(7) + i64(7)),
}
peer = {
    "forward-batch": u64(7) + ops(put("k", "v"), txn([], [op_put(put("t", "1"))], [])) + u64(100),
    "untagged-batch": u64(8) + ops(put("k", "v")),
    "vote": u64(3) + u64(1) + u64(5) + boolean(False) + b"\x01" + u64(2) + u64(1) + u64(10),
}
gateway = [
    {"create_request": {"key": "YQ==", "range_end": "Yg==", "prev_kv": True}},
    {"ID": "7"},
    {"compare": [{"key": "YQ==", "target": "VERSION", "version": "0"}],
     "success": [{"request_put": {"key": "YQ==", "value": "MQ=="}}]},
]

def write(target, name, data):
    d = os.path.join("fuzz", "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)

for name, c in commands.items():
    write("command_apply", name, b"\x01" + c)
for name, p in peer.items():
    write("peer_payload", name, b"\x01" + p)
write("gateway_json", "stream", b"".join(json.dumps(o).encode() + b"\n" for o in gateway))
write("gateway_json", "nested-strings", b'{"a": "}{\\"", "b": [{"c": "]"}]} {}')

if len(sys.argv) == 3 and sys.argv[1] == "--from":
    data_dir = sys.argv[2]
    for root, _, files in os.walk(data_dir):
        for f in files:
            path = os.path.join(root, f)
            head = open(path, "rb").read(64 << 10)
            if "wal" in root and f.endswith(".wal"):
                write("wal_segment", f, head.rstrip(b"\0") or head[:512])
            elif f.startswith("journal"):
                write("state_journal", f, head)
            elif f.endswith(".image"):
                write("snapshot_image", f, head)
