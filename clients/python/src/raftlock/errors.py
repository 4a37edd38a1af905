"""raftlock's errors as Python exceptions.

Every failed call raises :class:`RaftlockError` (or a subclass) carrying the
gRPC status code and the server's message, which is etcd's own for the etcd
API ("etcdserver: requested lease not found", ...). Nothing is swallowed:
a call that could not reach any member raises :class:`Unavailable`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import grpc

if TYPE_CHECKING:
    from ._proto.raftlock.v1.lock_pb2 import Owner


class RaftlockError(Exception):
    """A call failed; ``code`` is the gRPC status code, ``message`` the server's text."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class Unavailable(RaftlockError):
    """No member answered (every endpoint was tried)."""


class LockBusy(RaftlockError):
    """The lock was not granted within the wait; ``holders`` hold it now."""

    def __init__(self, name: bytes, holders: List["Owner"]) -> None:
        super().__init__(grpc.StatusCode.ABORTED, f"lock {name!r} is held by {len(holders)} other owner(s)")
        self.name = name
        self.holders = holders


class SessionLost(RaftlockError):
    """The session's lease ended (expired, or revoked by someone else)."""

    def __init__(self, lease: int, why: str) -> None:
        super().__init__(grpc.StatusCode.NOT_FOUND, f"session lease {lease:x} ended: {why}")
        self.lease = lease


def from_rpc(e: grpc.RpcError) -> RaftlockError:
    """The exception for a failed gRPC call."""
    code: Optional[grpc.StatusCode] = e.code() if hasattr(e, "code") else None
    message = e.details() if hasattr(e, "details") else str(e)
    code = code or grpc.StatusCode.UNKNOWN
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(code, message or "unavailable")
    return RaftlockError(code, message or "")
