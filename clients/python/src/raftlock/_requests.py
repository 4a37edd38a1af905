"""What the synchronous and the asyncio clients share: how each call's
request is built from its arguments, and how a lock's events tell that its
grant ended. Pure functions; no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional, Sequence, Union

from ._proto.etcdserverpb import rpc_pb2 as rpc
from ._proto.raftlock.v1 import lock_pb2 as locks_pb

Bytes = Union[bytes, str]

READ = "read"
WRITE = "write"


def b(value: Bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def prefix_end(prefix: bytes) -> bytes:
    """The range end that makes a range of every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def range_end(key: bytes, end: Optional[Bytes], prefix: bool) -> bytes:
    return prefix_end(key) if prefix else b(end or b"")


def acquire(
    name: Bytes,
    lease: int,
    wait: Optional[float],
    permits: int,
    mode: str,
    reentrant: bool,
    metadata: Bytes,
    lock_delay: float,
) -> locks_pb.AcquireRequest:
    """An Acquire; ``wait`` None waits until granted, 0 tries once."""
    if mode not in (READ, WRITE):
        raise ValueError(f"mode is {READ!r} or {WRITE!r}, not {mode!r}")
    return locks_pb.AcquireRequest(
        name=b(name),
        lease=lease,
        wait_ms=-1 if wait is None else max(0, int(wait * 1000)),
        permits=permits,
        metadata=b(metadata),
        mode=locks_pb.READ if mode == READ else locks_pb.WRITE,
        reentrant=reentrant,
        lock_delay_ms=int(lock_delay * 1000),
    )


@dataclass(frozen=True)
class LockSpec:
    """One lock of a multi-lock: its name, mode and permits."""

    name: Bytes
    mode: str = WRITE
    permits: int = 1


class Grant(NamedTuple):
    """One lock's grant of a multi-lock: its name, owner key and fencing token."""

    name: bytes
    key: bytes
    token: int


def specs(locks: Sequence[Union[Bytes, LockSpec]]) -> list:
    """A multi-lock's locks as :class:`LockSpec` (a plain name is a write lock)."""
    return [lock if isinstance(lock, LockSpec) else LockSpec(lock) for lock in locks]


def acquire_all(locks: Sequence[LockSpec], lease: int, wait: Optional[float], metadata: Bytes) -> locks_pb.AcquireRequest:
    """A multi-lock's Acquire; ``wait`` as in :func:`acquire`."""
    for lock in locks:
        if lock.mode not in (READ, WRITE):
            raise ValueError(f"mode is {READ!r} or {WRITE!r}, not {lock.mode!r}")
    return locks_pb.AcquireRequest(
        lease=lease,
        wait_ms=-1 if wait is None else max(0, int(wait * 1000)),
        metadata=b(metadata),
        locks=[
            locks_pb.LockSpec(name=b(lock.name), mode=locks_pb.READ if lock.mode == READ else locks_pb.WRITE, permits=lock.permits)
            for lock in locks
        ],
    )


def release_all(grants: Sequence[Grant]) -> locks_pb.ReleaseRequest:
    """The one Release of a multi-lock's grants, each fenced by its token."""
    return locks_pb.ReleaseRequest(grants=[locks_pb.Grant(key=g.key, token=g.token) for g in grants])


def check_watch_response(response: rpc.WatchResponse) -> None:
    """Raise what a watch response that ends the watch says: its revision
    was compacted (OUT_OF_RANGE, as etcd's clients say it) or the server
    cancelled it."""
    import grpc

    from .errors import RaftlockError

    if response.compact_revision:
        raise RaftlockError(
            grpc.StatusCode.OUT_OF_RANGE,
            f"mvcc: required revision has been compacted (compacted at {response.compact_revision})",
        )
    if response.canceled:
        raise RaftlockError(grpc.StatusCode.CANCELLED, response.cancel_reason or "watch canceled")


def watch_create(key: bytes, end: bytes, start_revision: int, prev_kv: bool) -> rpc.WatchRequest:
    create = rpc.WatchCreateRequest(key=key, range_end=end, start_revision=start_revision, prev_kv=prev_kv)
    return rpc.WatchRequest(create_request=create)


# Why a grant ended, by the event that tells it.
DELETED_BY_REQUEST = "its key was deleted by another client"
LEASE_ENDED = "its lease ended (expired or revoked)"
ENDED = "it ended"

_ENDS = {
    locks_pb.LockEvent.RELEASED: DELETED_BY_REQUEST,
    locks_pb.LockEvent.LEASE_ENDED: LEASE_ENDED,
    locks_pb.LockEvent.ENDED: ENDED,
}


def ended_by(lease_ttl: int) -> str:
    """Why a grant whose end the events could not tell (replayed from
    history, which keeps no cause) ended, by its lease's TTL now: -1 (gone)
    means its lease ended, else its key was deleted."""
    return LEASE_ENDED if lease_ttl < 0 else DELETED_BY_REQUEST


def grant_end(message: locks_pb.ObserveResponse, key: bytes, token: int, from_now: bool) -> Optional[str]:
    """Why the grant (``key``, ``token``) ended, if this message of its
    lock's events says it did. ``from_now``: the stream began with the lock
    as it is (its grant's history was compacted), where a grant absent from
    the first message has ended."""
    ours: Iterable[locks_pb.LockEvent] = [e for e in message.events if e.owner.key == key and e.owner.token == token]
    ours = list(ours)
    if from_now and not ours:
        return _ENDS[locks_pb.LockEvent.ENDED]
    for event in ours:
        if event.kind in _ENDS:
            return _ENDS[event.kind]
    return None
