"""Sessions and native locks.

A :class:`Session` is a lease kept alive by a background thread (renewed
every third of its TTL, on whichever member answers). Locks are taken
through it: each :class:`Lock` is a grant of raftlock's native API, with
its owner key and fencing token, and a ``lost`` event that is set when the
grant ends without its holder releasing it — its lease expired or was
revoked, or its key was deleted by someone else. ``lost`` is set from the
lock's events (``Observe``), as soon as the member the client follows
applies the change that ended the grant, and for every lock of a session
whose lease could not be renewed before its TTL ran out.

Invariants: a lock's ``release`` is fenced by its token, so it never
deletes a later grant; once ``lost`` is set it stays set.

Caveat: a holder that is paused (a GC pause, a stopped process) learns
nothing while paused; what protects the resource then is the fencing token
(or a lock-delay), which is why ``token`` is there.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc

from ._proto.raftlock.v1 import lock_pb2 as locks_pb
from ._proto.v3electionpb import v3election_pb2 as election_pb
from . import _requests as build
from ._requests import READ, WRITE, Bytes, Grant, LockSpec
from ._requests import b as _b
from .client import Client
from .errors import LockBusy, RaftlockError, SessionLost, from_rpc

__all__ = ["READ", "WRITE", "Grant", "Leadership", "Lock", "LockSpec", "MultiLock", "Session"]


class Session:
    """A lease kept alive in the background; see the module doc.

    Use it as a context manager: leaving it revokes the lease, which
    releases every lock taken through it.
    """

    def __init__(self, client: Client, ttl: int = 10) -> None:
        if ttl < 1:
            raise ValueError("a session's TTL is at least one second")
        self.client = client
        self.ttl = ttl
        self.lease = client.lease_grant(ttl)
        self.lost = threading.Event()
        self.lost_reason: Optional[str] = None
        self._closed = threading.Event()
        self._locks: "weakref.WeakSet[_GrantEnd]" = weakref.WeakSet()
        # Grants by (key, token): an acquire of a lock the session holds
        # answers with the same grant, and gets the same Lock.
        self._held: "weakref.WeakValueDictionary[Tuple[bytes, int], Lock]" = weakref.WeakValueDictionary()
        self._keeper = threading.Thread(target=self._keep_alive, name=f"raftlock-session-{self.lease:x}", daemon=True)
        self._keeper.start()

    def _keep_alive(self) -> None:
        # The lease lives at least until renewed + TTL: renewed is when the
        # last renewal that was answered was sent. Each member gets a third
        # of the TTL at most, so a member that hangs leaves time for others.
        renewed = time.monotonic()
        attempt = min(self.client.timeout, self.ttl / 3)
        while not self._closed.wait(max(0.0, min(self.ttl / 3, renewed + self.ttl - time.monotonic()))):
            if time.monotonic() - renewed >= self.ttl:
                self._lose(f"not renewed for its TTL ({self.ttl} s)")
                return
            sent = time.monotonic()
            try:
                ttl = self.client.lease_keep_alive_once(self.lease, timeout=attempt)
            except RaftlockError as e:
                if time.monotonic() - renewed >= self.ttl:
                    self._lose(f"not renewed for its TTL ({self.ttl} s): {e.message}")
                    return
                continue
            if ttl <= 0:
                self._lose("its lease ended (expired or revoked)")
                return
            renewed = sent

    def _lose(self, why: str) -> None:
        if self._closed.is_set():
            return
        self.lost_reason = why
        self.lost.set()
        for lock in list(self._locks):
            lock._lose(f"session lost: {why}")

    def lock(
        self,
        name: Bytes,
        *,
        wait: Optional[float] = None,
        permits: int = 1,
        mode: str = WRITE,
        reentrant: bool = False,
        metadata: Bytes = b"",
        lock_delay: float = 0.0,
    ) -> "Lock":
        """Acquire lock ``name`` for this session's lease.

        ``wait``: None waits until granted; 0 tries once; else seconds.
        Raises :class:`LockBusy` (with the holders) if it was not granted in
        time. ``permits`` > 1 makes it a semaphore; ``mode`` "read" a shared
        read lock; ``reentrant`` adds a hold if the lease holds it already;
        ``lock_delay`` (seconds, at most 60) keeps the lock from anyone else
        for that long after this grant ends involuntarily.
        """
        if self.lost.is_set():
            raise SessionLost(self.lease, self.lost_reason or "lost")
        req = build.acquire(name, self.lease, wait, permits, mode, reentrant, metadata, lock_delay)
        timeout = None if wait is None else wait + self.client.timeout
        resp = self.client.call(lambda s: s.locks.Acquire, req, timeout=timeout)
        if not resp.acquired:
            raise LockBusy(_b(name), list(resp.holders))
        held = self._held.get((resp.key, resp.token))
        if held is not None and held._live():
            held.holds = resp.holds
            return held
        lock = Lock(self, _b(name), permits, resp.key, resp.token, resp.holds)
        self._track(lock)
        self._held[(resp.key, resp.token)] = lock
        return lock

    def lock_all(
        self, locks: Sequence[Union[Bytes, LockSpec]], *, wait: Optional[float] = None, metadata: Bytes = b""
    ) -> "MultiLock":
        """Acquire several locks for this session's lease, all or none: each
        a name (a write lock) or a :class:`LockSpec` (name, mode, permits);
        at least two, none nested under another. However many clients ask
        for overlapping sets, in whatever order, nobody deadlocks. ``wait``
        as in :meth:`lock`; not granted in time: :class:`LockBusy` with the
        holders of the first lock that was not held (its ``name``)."""
        if self.lost.is_set():
            raise SessionLost(self.lease, self.lost_reason or "lost")
        specs = build.specs(locks)
        req = build.acquire_all(specs, self.lease, wait, metadata)
        timeout = None if wait is None else wait + self.client.timeout
        resp = self.client.call(lambda s: s.locks.Acquire, req, timeout=timeout)
        if not resp.acquired:
            raise LockBusy(resp.blocked_on, list(resp.holders))
        multi = MultiLock(self, specs, [Grant(g.name, g.key, g.token) for g in resp.grants])
        self._track(multi)
        return multi

    def campaign(self, name: Bytes, value: Bytes, *, wait: Optional[float] = None) -> "Leadership":
        """Campaign in election ``name`` with ``value`` (etcd's
        Election.Campaign): returns once this session leads, or raises
        :class:`RaftlockError` (DEADLINE_EXCEEDED) after ``wait`` seconds.
        Candidates lead in the order they campaigned. The leadership's
        ``lost`` is set as a lock's is."""
        if self.lost.is_set():
            raise SessionLost(self.lease, self.lost_reason or "lost")
        req = election_pb.CampaignRequest(name=_b(name), lease=self.lease, value=_b(value))
        resp = self.client.call(lambda s: s.election.Campaign, req, timeout=wait)
        leadership = Leadership(self, _b(name), resp.leader)
        self._track(leadership)
        return leadership

    def _track(self, grant: "_GrantEnd") -> None:
        """Follow a new grant's session; one answered after close began is
        ended with the session (released, not followed)."""
        self._locks.add(grant)
        if self._closed.is_set():
            grant._released = True
            grant._stop_following()

    def close(self) -> None:
        """End the session: stop renewing and revoke the lease (its locks
        are released with it)."""
        if self._closed.is_set():
            return
        self._closed.set()
        for lock in list(self._locks):
            lock._stop_following()
        try:
            self.client.lease_revoke(self.lease)
        except RaftlockError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _GrantEnd:
    """How a grant learns that it ended, shared by :class:`Lock` and the
    asyncio client's: ``lost`` (an event of either kind, made by the
    subclass) is set once, never for the holder's own last release. While
    a release of the holder's is in flight, an end seen in the events may be
    that release's own: it is held back until the answer says."""

    lost: Any

    def __init__(self) -> None:
        self.lost_reason: Optional[str] = None
        self._released = False
        self._ending = threading.Lock()
        self._releasing = 0
        self._held_back: Optional[str] = None
        # A release whose answer was lost may have been applied: a deletion
        # of the key by a request, seen from then on, is taken for it.
        self._maybe_released = False

    def _live(self) -> bool:
        return not self._released and not self.lost.is_set()

    def _lose(self, why: str, *, from_events: bool = False) -> None:
        with self._ending:
            if self._released or self.lost.is_set():
                return
            if from_events and self._releasing:
                self._held_back = why
                return
            if from_events and self._maybe_released and why == build.DELETED_BY_REQUEST:
                self._released = True
                released = True
            else:
                released = False
                self.lost_reason = why
                self.lost.set()
        if released:
            self._stop_following()

    def _release_starts(self) -> None:
        with self._ending:
            self._releasing += 1

    def _release_ended(self, resp: Optional[locks_pb.ReleaseResponse], error: Optional[RaftlockError] = None) -> None:
        """After a release's answer (None: it failed with ``error``): the
        holds left, and an end held back told unless this release gave back
        the last hold. A release whose member could not be reached or did not
        answer in time may have been applied: a deletion by a request seen
        meanwhile or later is taken for it."""
        ambiguous = error is not None and error.code in (
            grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
        )
        with self._ending:
            self._releasing -= 1
            if resp is not None and resp.released and resp.holds == 0:
                self._released = True
            if ambiguous:
                self._maybe_released = True
            held_back, self._held_back = self._held_back, None
        if resp is not None and resp.released:
            self.holds = resp.holds
            if resp.holds == 0:
                self._stop_following()
        if held_back is not None:
            self._lose(held_back, from_events=True)

    def _release(self, call: Any) -> Any:
        """Make a fenced release (``call``, made once), with the bookkeeping above."""
        self._release_starts()
        resp = None
        error: Optional[RaftlockError] = None
        try:
            resp = call()
        except RaftlockError as e:
            error = e
            raise
        finally:
            self._release_ended(resp, error)
        return resp

    def _stop_following(self) -> None:
        raise NotImplementedError


class _Follower:
    """Follows one lock's events from a grant's revision, on the client's
    current member (the next one when it fails), on a thread of its own,
    and tells ``end`` when they say the grant ended."""

    def __init__(self, end: _GrantEnd, client: Client, name: bytes, permits: int, key: bytes, token: int) -> None:
        self._end, self._client = end, client
        self._grant = (name, permits, key, token)
        self._stop = threading.Event()
        self._call: Optional[grpc.Call] = None
        self._thread = threading.Thread(target=self._run, name=f"raftlock-lock-{token}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()

    def _run(self) -> None:
        name, permits, key, token = self._grant
        client = self._client
        start = max(token, 1)
        while not self._stop.is_set():
            req = locks_pb.ObserveRequest(name=name, permits=permits, start_revision=start)
            auth_token = client._token
            responses, endpoint = client.stream(lambda s: s.locks.Observe, req)
            self._call = responses  # type: ignore[assignment]
            if self._stop.is_set():
                responses.cancel()
                return
            try:
                for message in responses:
                    why = build.grant_end(message, key, token, start == 0)
                    if why == build.ENDED:
                        try:  # the cause, from the lease (history keeps none)
                            why = build.ended_by(client.lease_ttl(self._end.session.lease))
                        except RaftlockError:
                            pass
                    if why is not None:
                        self._end._lose(why, from_events=True)
                        return
                    start = max(start, message.header.revision + 1)
            except grpc.RpcError as e:
                if self._stop.is_set() or e.code() == grpc.StatusCode.CANCELLED:
                    return
                if e.code() == grpc.StatusCode.OUT_OF_RANGE:
                    start = 0
                    continue
                if client._refused_token(e):
                    try:
                        client._authenticate(auth_token)
                    except RaftlockError:
                        client.next_endpoint(endpoint)
                elif e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._end._lose(f"its events could not be followed: {from_rpc(e)}")
                    return
                else:
                    client.next_endpoint(endpoint)
            self._stop.wait(0.2)


class Lock(_GrantEnd):
    """A grant: ``key``, ``token`` (the fencing token), ``holds`` (reentrant
    holds), and ``lost`` (a :class:`threading.Event`, set when the grant
    ended without a release; ``lost_reason`` says how)."""

    def __init__(self, session: Session, name: bytes, permits: int, key: bytes, token: int, holds: int) -> None:
        self.session = session
        self.name = name
        self.permits = permits
        self.key = key
        self.token = token
        self.holds = holds
        super().__init__()
        self.lost = threading.Event()
        self._follower = _Follower(self, session.client, name, permits, key, token)

    def _stop_following(self) -> None:
        self._follower.stop()

    def release(self) -> bool:
        """Give back one hold, fenced by the token: True if it was released
        (``holds`` is then what is left), False if the grant had already
        ended (nothing was changed). Made once: if its member cannot be
        reached or does not answer in time, the error says so, and the
        release may or may not have been applied (a second release answers
        False if it was)."""
        req = locks_pb.ReleaseRequest(key=self.key, token=self.token)
        resp = self._release(lambda: self.session.client.call(lambda s: s.locks.Release, req, retry="never"))
        return resp.released

    def validate(self) -> bool:
        """Whether this grant still holds its lock, read linearizably."""
        return self.session.client.validate(self.key, self.token, permits=self.permits).current

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc: object) -> None:
        # One hold back (a reentrant acquire's block gives back its own).
        if not self.lost.is_set():
            self.release()

    def __repr__(self) -> str:
        return f"Lock(name={self.name!r}, key={self.key!r}, token={self.token}, holds={self.holds}, lost={self.lost.is_set()})"


class Leadership(Lock):
    """This session leads an election: ``key`` and ``token`` (the leader
    key's revision, a fencing token as a lock's), ``lost``, and etcd's
    ``proclaim`` and ``resign``."""

    def __init__(self, session: Session, name: bytes, leader: election_pb.LeaderKey) -> None:
        self.leader = leader
        super().__init__(session, name, 1, leader.key, leader.rev, 1)

    def proclaim(self, value: Bytes) -> None:
        """Tell a new value as the leader (refused once leadership is lost)."""
        req = election_pb.ProclaimRequest(leader=self.leader, value=_b(value))
        self.session.client.call(lambda s: s.election.Proclaim, req)

    def resign(self) -> None:
        """Give up leadership; the next candidate leads. If it fails, this
        session may still lead (and ``lost`` still tells if that ends)."""
        req = election_pb.ResignRequest(leader=self.leader)

        def resign() -> locks_pb.ReleaseResponse:
            self.session.client.call(lambda s: s.election.Resign, req)
            return locks_pb.ReleaseResponse(released=True, holds=0)  # the last hold

        self._release(resign)

    def release(self) -> bool:
        self.resign()
        return True


class MultiLock(_GrantEnd):
    """Several locks held together (:meth:`Session.lock_all`): ``grants``
    (one :class:`Grant` per lock, in the request's order: name, key,
    token), and ``lost``, set when any of them ended without a release."""

    def __init__(self, session: Session, locks: List[LockSpec], grants: List[Grant]) -> None:
        self.session = session
        self.grants = grants
        self.holds = 1
        super().__init__()
        self.lost = threading.Event()
        self._followers = [
            _Follower(self, session.client, g.name, lock.permits, g.key, g.token) for lock, g in zip(locks, grants)
        ]

    def _stop_following(self) -> None:
        for follower in self._followers:
            follower.stop()

    def release(self) -> bool:
        """Give back every grant of the set in one call, each fenced by its
        token: True if every one was released. Made once, as
        :meth:`Lock.release`."""
        req = build.release_all(self.grants)
        resp = self._release(lambda: self.session.client.call(lambda s: s.locks.Release, req, retry="never"))
        return resp.released

    def __enter__(self) -> "MultiLock":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.lost.is_set():
            self.release()

    def __repr__(self) -> str:
        return f"MultiLock(grants={self.grants!r}, lost={self.lost.is_set()})"


def holders(client: Client, name: Bytes, permits: int = 1) -> List[locks_pb.Owner]:
    """The holders of lock ``name``, lowest token first."""
    return list(client.describe(name, permits=permits).holders)
