"""Building etcd transactions: compares and operations for :meth:`Client.txn`.

A fencing example: a resource store that keeps its writes behind the lock
holder's token compares the owner key's create revision with the token::

    from raftlock import txn
    client.txn([txn.create_revision(lock.key, "==", lock.token)],
               success=[txn.put("jobs/output", b"done")])

which fails (``succeeded`` False) once the grant is gone or replaced.
"""

from __future__ import annotations

from typing import Optional

from ._proto.etcdserverpb import rpc_pb2 as rpc
from ._requests import Bytes, prefix_end
from ._requests import b as _b

_RESULTS = {
    "==": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}


def _compare(key: Bytes, op: str, target: "rpc.Compare.CompareTarget.ValueType", **value: object) -> rpc.Compare:
    if op not in _RESULTS:
        raise ValueError(f"a compare is one of {', '.join(_RESULTS)}, not {op!r}")
    return rpc.Compare(key=_b(key), result=_RESULTS[op], target=target, **value)  # type: ignore[arg-type]


def value(key: Bytes, op: str, v: Bytes) -> rpc.Compare:
    return _compare(key, op, rpc.Compare.VALUE, value=_b(v))


def version(key: Bytes, op: str, v: int) -> rpc.Compare:
    return _compare(key, op, rpc.Compare.VERSION, version=v)


def create_revision(key: Bytes, op: str, revision: int) -> rpc.Compare:
    return _compare(key, op, rpc.Compare.CREATE, create_revision=revision)


def mod_revision(key: Bytes, op: str, revision: int) -> rpc.Compare:
    return _compare(key, op, rpc.Compare.MOD, mod_revision=revision)


def lease(key: Bytes, op: str, lease_id: int) -> rpc.Compare:
    return _compare(key, op, rpc.Compare.LEASE, lease=lease_id)


def put(key: Bytes, v: Bytes, *, lease: int = 0) -> rpc.RequestOp:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=_b(key), value=_b(v), lease=lease))


def get(key: Bytes, range_end: Optional[Bytes] = None, *, prefix: bool = False) -> rpc.RequestOp:
    end = prefix_end(_b(key)) if prefix else _b(range_end or b"")
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=_b(key), range_end=end))


def delete(key: Bytes, range_end: Optional[Bytes] = None, *, prefix: bool = False) -> rpc.RequestOp:
    end = prefix_end(_b(key)) if prefix else _b(range_end or b"")
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=_b(key), range_end=end))
