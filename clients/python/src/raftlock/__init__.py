"""raftlock's Python client: fenced locks, semaphores, read-write and
reentrant holds, sessions that tell when a lock is lost, and the etcd v3
KV, lease and watch calls, for a raftlock cluster (the etcd calls work
against etcd too).

    import raftlock
    client = raftlock.Client(["127.0.0.1:2379"])
    with client.session(ttl=10) as session:
        with session.lock("jobs/nightly", wait=5.0) as lock:
            write_somewhere(fencing_token=lock.token)
"""

from . import txn
from ._proto.raftlock.v1.lock_pb2 import LockEvent
from ._requests import prefix_end
from .client import TLS, Client, Watch
from .errors import LockBusy, RaftlockError, SessionLost, Unavailable
from .session import READ, WRITE, Grant, Leadership, Lock, LockSpec, MultiLock, Session

__all__ = [
    "Client",
    "Grant",
    "Leadership",
    "Lock",
    "LockEvent",
    "LockBusy",
    "LockSpec",
    "MultiLock",
    "RaftlockError",
    "READ",
    "Session",
    "SessionLost",
    "TLS",
    "Unavailable",
    "Watch",
    "WRITE",
    "prefix_end",
    "txn",
]
__version__ = "0.2.0"
