"""raftlock's asyncio client: the synchronous client's calls, sessions and
locks on ``grpc.aio``, for programs that run an event loop.

    import raftlock.aio

    async with raftlock.aio.Client(["127.0.0.1:2379"]) as client:
        async with client.session(ttl=10) as session:
            async with session.lock("jobs/nightly", wait=5.0) as lock:
                await write_somewhere(fencing_token=lock.token)

``client.session(...)`` and ``session.lock(...)`` may also be awaited
(``session = await client.session(10)``). A session's lease is renewed by a
task of the loop, a lock's events followed by another; ``lost`` is an
:class:`asyncio.Event`. Failover, errors and fencing are as in the
synchronous client (module :mod:`raftlock.client` and :mod:`raftlock.session`).

Caveat: a client belongs to the event loop it was first used on, as its
``grpc.aio`` channels do.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Generator, Generic, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc
import grpc.aio

from . import _requests as build
from ._proto.etcdserverpb import rpc_pb2 as rpc
from ._proto.raftlock.v1 import lock_pb2 as locks_pb
from ._proto.v3electionpb import v3election_pb2 as election_pb
from ._requests import READ, WRITE, Bytes, Grant, LockSpec
from ._requests import b as _b
from .client import TLS, KeyValue, _Connection, _Stubs
from .errors import LockBusy, RaftlockError, SessionLost, from_rpc
from .session import _GrantEnd

__all__ = ["Client", "Leadership", "Lock", "MultiLock", "READ", "Session", "WRITE"]

T = TypeVar("T")


class _Opening(Generic[T]):
    """What ``client.session()`` and ``session.lock()`` return: awaited, the
    session or lock; used with ``async with``, also closed or released."""

    def __init__(self, open: Callable[[], Awaitable[T]]) -> None:
        self._open = open
        self._value: Any = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._open().__await__()

    async def __aenter__(self) -> T:
        self._value = await self._open()
        return self._value

    async def __aexit__(self, *exc: object) -> None:
        await self._value.__aexit__(*exc)


class Client(_Connection):
    """An asyncio client; arguments as :class:`raftlock.Client`'s."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: Optional[TLS] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(endpoints, tls, user, password, timeout, grpc.aio.secure_channel, grpc.aio.insecure_channel)
        self._authenticating_async = asyncio.Lock()

    async def _authenticate(self, stale: Optional[str] = None) -> None:
        """As :meth:`raftlock.Client._authenticate` (one at a time, the token
        replaced only by a new one)."""
        async with self._authenticating_async:
            if stale is not None and self._token != stale:
                return
            req = rpc.AuthenticateRequest(name=self._user or "", password=self._password or "")
            self._token = (await self._call(lambda s: s.auth.Authenticate, req, self.timeout, authenticating=True)).token

    async def call(
        self,
        method: Callable[[_Stubs], Callable[..., Any]],
        request: object,
        timeout: Optional[float] = -1.0,
        *,
        retry: str = "unavailable",
    ) -> Any:
        """One unary call, failing over as :meth:`raftlock.Client.call` does."""
        return await self._call(method, request, self.timeout if timeout == -1.0 else timeout, retry=retry)

    async def _call(
        self,
        method: Callable[[_Stubs], Callable[..., Any]],
        request: object,
        timeout: Optional[float],
        authenticating: bool = False,
        retry: str = "unavailable",
    ) -> Any:
        if self._user is not None and self._token is None and not authenticating:
            await self._authenticate()
        last: Optional[grpc.RpcError] = None
        reauthenticated = False
        tries = 0
        while tries < len(self._endpoints):
            index = self._current
            token = self._token
            try:
                return await method(self._stubs_for(self._endpoints[index]))(
                    request, timeout=timeout, metadata=self._metadata()
                )
            except grpc.RpcError as e:
                last = e
                may_reauthenticate = not reauthenticated and not authenticating
                if self._judge(e, index, may_reauthenticate, retry, timeout is not None) == "next":
                    tries += 1
                    continue
                reauthenticated = True
                await self._authenticate(token)
        raise self._none_answered(last)

    async def close(self) -> None:
        for stubs in self._stubs.values():
            await stubs.channel.close()  # type: ignore[misc]
        self._stubs.clear()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- KV and leases ------------------------------------------------------

    async def get(self, key: Bytes, *, serializable: bool = False) -> Optional[KeyValue]:
        kvs = (await self.range(key, serializable=serializable)).kvs
        return kvs[0] if kvs else None

    async def range(
        self, key: Bytes, range_end: Optional[Bytes] = None, *, prefix: bool = False, revision: int = 0,
        limit: int = 0, serializable: bool = False,
    ) -> rpc.RangeResponse:
        key = _b(key)
        req = rpc.RangeRequest(
            key=key, range_end=build.range_end(key, range_end, prefix), revision=revision, limit=limit,
            serializable=serializable,
        )
        return await self.call(lambda s: s.kv.Range, req, retry="always")

    async def put(self, key: Bytes, value: Bytes, *, lease: int = 0) -> rpc.PutResponse:
        return await self.call(lambda s: s.kv.Put, rpc.PutRequest(key=_b(key), value=_b(value), lease=lease))

    async def delete(self, key: Bytes, range_end: Optional[Bytes] = None, *, prefix: bool = False) -> int:
        key = _b(key)
        req = rpc.DeleteRangeRequest(key=key, range_end=build.range_end(key, range_end, prefix))
        return (await self.call(lambda s: s.kv.DeleteRange, req)).deleted

    async def txn(
        self, compare: Sequence[rpc.Compare], success: Sequence[rpc.RequestOp] = (), failure: Sequence[rpc.RequestOp] = ()
    ) -> rpc.TxnResponse:
        req = rpc.TxnRequest(compare=list(compare), success=list(success), failure=list(failure))
        return await self.call(lambda s: s.kv.Txn, req)

    async def lease_grant(self, ttl: int) -> int:
        return (await self.call(lambda s: s.lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl))).ID

    async def lease_revoke(self, lease: int) -> None:
        await self.call(lambda s: s.lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease))

    async def lease_ttl(self, lease: int) -> int:
        """Seconds left on the lease; -1 if it does not exist."""
        req = rpc.LeaseTimeToLiveRequest(ID=lease)
        return (await self.call(lambda s: s.lease.LeaseTimeToLive, req, retry="always")).TTL

    async def lease_keep_alive_once(self, lease: int, timeout: Optional[float] = None) -> int:
        """Renew the lease once; its TTL, or 0 if it no longer exists
        (``timeout``: as :meth:`raftlock.Client.lease_keep_alive_once`)."""

        def once(stubs: _Stubs) -> Callable[..., Awaitable[int]]:
            async def renew(request: object, timeout: float, metadata: object) -> int:
                call = stubs.lease.LeaseKeepAlive(iter([request]), timeout=timeout, metadata=metadata)
                async for response in call:
                    call.cancel()
                    return response.TTL
                return 0

            return renew

        return await self.call(once, rpc.LeaseKeepAliveRequest(ID=lease), timeout or self.timeout, retry="always")

    async def watch(
        self, key: Bytes, range_end: Optional[Bytes] = None, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[Any]:
        """The events of a watch from ``start_revision``, picked up on another
        member from the next revision when its member fails; OUT_OF_RANGE
        when that revision was compacted."""
        key = _b(key)
        end = build.range_end(key, range_end, prefix)
        next_revision, failures = start_revision, 0
        while True:
            call, endpoint = self.stream(lambda s: s.watch.Watch, _watch_requests(build.watch_create(key, end, next_revision, False)))
            try:
                async for response in call:
                    failures = 0
                    build.check_watch_response(response)
                    for event in response.events:
                        next_revision = event.kv.mod_revision + 1
                        yield event
                    if not next_revision:
                        next_revision = response.header.revision + 1
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or failures > 3 * len(self._endpoints):
                    raise from_rpc(e) from None
                failures += 1
                self.next_endpoint(endpoint)
                await asyncio.sleep(0.2)
            finally:
                call.cancel()

    # -- locks and elections -----------------------------------------------

    def session(self, ttl: int = 10) -> "_Opening[Session]":
        """A lease kept alive by a task (await it, or ``async with`` it)."""

        async def open() -> Session:
            session = Session(self, ttl)
            await session._open()
            return session

        return _Opening(open)

    async def describe(self, name: Bytes, *, permits: int = 1) -> locks_pb.DescribeResponse:
        req = locks_pb.DescribeRequest(name=_b(name), permits=permits)
        resp = await self.call(lambda s: s.locks.Describe, req, retry="always")
        while resp.more and resp.waiters:
            req.waiters_after, req.waiters_after_key = resp.waiters[-1].token, resp.waiters[-1].key
            page = await self.call(lambda s: s.locks.Describe, req, retry="always")
            resp.waiters.extend(page.waiters)
            resp.more = page.more
        return resp

    async def list_locks(self, prefix: Bytes = b"", *, permits: int = 1) -> List[locks_pb.LockSummary]:
        locks: List[locks_pb.LockSummary] = []
        req = locks_pb.ListRequest(prefix=_b(prefix), permits=permits)
        while True:
            resp = await self.call(lambda s: s.locks.List, req, retry="always")
            locks.extend(resp.locks)
            if not resp.next_page:
                return locks
            req = locks_pb.ListRequest(prefix=_b(prefix), permits=permits, page=resp.next_page)

    async def validate(self, key: Bytes, token: int, *, permits: int = 1) -> locks_pb.ValidateResponse:
        req = locks_pb.ValidateRequest(key=_b(key), token=token, permits=permits)
        return await self.call(lambda s: s.locks.Validate, req, retry="always")

    async def leader(self, name: Bytes) -> Optional[KeyValue]:
        try:
            resp = await self.call(lambda s: s.election.Leader, election_pb.LeaderRequest(name=_b(name)), retry="always")
        except RaftlockError as e:
            if e.message == "election: no leader":
                return None
            raise
        return resp.kv


async def _watch_requests(create: rpc.WatchRequest) -> AsyncIterator[rpc.WatchRequest]:
    yield create
    # Keep the sending side open (a closed one ends the watch) until the call ends.
    await asyncio.Event().wait()


class Session:
    """A lease kept alive by a task of the loop; see :class:`raftlock.Session`."""

    def __init__(self, client: Client, ttl: int) -> None:
        if ttl < 1:
            raise ValueError("a session's TTL is at least one second")
        self.client, self.ttl = client, ttl
        self.lease = 0
        self.lost = asyncio.Event()
        self.lost_reason: Optional[str] = None
        self._closed = False
        self._locks: List[_GrantEnd] = []
        self._held: "weakref.WeakValueDictionary[Tuple[bytes, int], Lock]" = weakref.WeakValueDictionary()
        self._keeper: Optional["asyncio.Task[None]"] = None

    async def _open(self) -> None:
        self.lease = await self.client.lease_grant(self.ttl)
        self._keeper = asyncio.get_running_loop().create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        # As the synchronous session's: renewed is when the last answered
        # renewal was sent; each member gets a third of the TTL at most.
        renewed = time.monotonic()
        attempt = min(self.client.timeout, self.ttl / 3)
        while not self._closed:
            await asyncio.sleep(max(0.0, min(self.ttl / 3, renewed + self.ttl - time.monotonic())))
            if time.monotonic() - renewed >= self.ttl:
                return self._lose(f"not renewed for its TTL ({self.ttl} s)")
            sent = time.monotonic()
            try:
                ttl = await self.client.lease_keep_alive_once(self.lease, timeout=attempt)
            except RaftlockError as e:
                if time.monotonic() - renewed >= self.ttl:
                    return self._lose(f"not renewed for its TTL ({self.ttl} s): {e.message}")
                continue
            if ttl <= 0:
                return self._lose("its lease ended (expired or revoked)")
            renewed = sent

    def _lose(self, why: str) -> None:
        if self._closed:
            return
        self.lost_reason = why
        self.lost.set()
        for lock in self._locks:
            lock._lose(f"session lost: {why}")

    def lock(
        self, name: Bytes, *, wait: Optional[float] = None, permits: int = 1, mode: str = WRITE,
        reentrant: bool = False, metadata: Bytes = b"", lock_delay: float = 0.0,
    ) -> "_Opening[Lock]":
        """Acquire lock ``name``; arguments as :meth:`raftlock.Session.lock`."""

        async def open() -> Lock:
            if self.lost.is_set():
                raise SessionLost(self.lease, self.lost_reason or "lost")
            req = build.acquire(name, self.lease, wait, permits, mode, reentrant, metadata, lock_delay)
            timeout = None if wait is None else wait + self.client.timeout
            resp = await self.client.call(lambda s: s.locks.Acquire, req, timeout=timeout)
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

        return _Opening(open)

    def lock_all(
        self, locks: Sequence[Union[Bytes, LockSpec]], *, wait: Optional[float] = None, metadata: Bytes = b""
    ) -> "_Opening[MultiLock]":
        """Acquire several locks all or none; see :meth:`raftlock.Session.lock_all`."""

        async def open() -> MultiLock:
            if self.lost.is_set():
                raise SessionLost(self.lease, self.lost_reason or "lost")
            specs = build.specs(locks)
            req = build.acquire_all(specs, self.lease, wait, metadata)
            timeout = None if wait is None else wait + self.client.timeout
            resp = await self.client.call(lambda s: s.locks.Acquire, req, timeout=timeout)
            if not resp.acquired:
                raise LockBusy(resp.blocked_on, list(resp.holders))
            multi = MultiLock(self, specs, [Grant(g.name, g.key, g.token) for g in resp.grants])
            self._track(multi)
            return multi

        return _Opening(open)

    async def campaign(self, name: Bytes, value: Bytes, *, wait: Optional[float] = None) -> "Leadership":
        """Campaign in election ``name``; see :meth:`raftlock.Session.campaign`."""
        if self.lost.is_set():
            raise SessionLost(self.lease, self.lost_reason or "lost")
        req = election_pb.CampaignRequest(name=_b(name), lease=self.lease, value=_b(value))
        resp = await self.client.call(lambda s: s.election.Campaign, req, timeout=wait)
        leadership = Leadership(self, _b(name), resp.leader)
        self._track(leadership)
        return leadership

    def _track(self, grant: _GrantEnd) -> None:
        """As :meth:`raftlock.Session._track`."""
        self._locks.append(grant)
        if self._closed:
            grant._released = True
            grant._stop_following()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._keeper is not None:
            self._keeper.cancel()
        for lock in self._locks:
            lock._stop_following()
        try:
            await self.client.lease_revoke(self.lease)
        except RaftlockError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _follow(end: _GrantEnd, client: Client, name: bytes, permits: int, key: bytes, token: int) -> None:
    """Follow one lock's events from a grant's revision, on the client's
    current member (the next one when it fails), and tell ``end`` when they
    say the grant ended."""
    start = max(token, 1)
    while True:
        req = locks_pb.ObserveRequest(name=name, permits=permits, start_revision=start)
        auth_token = client._token
        call, endpoint = client.stream(lambda s: s.locks.Observe, req)
        try:
            async for message in call:
                why = build.grant_end(message, key, token, start == 0)
                if why == build.ENDED:
                    try:  # the cause, from the lease (history keeps none)
                        why = build.ended_by(await client.lease_ttl(end.session.lease))
                    except RaftlockError:
                        pass
                if why is not None:
                    return end._lose(why, from_events=True)
                start = max(start, message.header.revision + 1)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.OUT_OF_RANGE:
                start = 0
                continue
            if client._refused_token(e):
                try:
                    await client._authenticate(auth_token)
                except RaftlockError:
                    client.next_endpoint(endpoint)
            elif e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED):
                return end._lose(f"its events could not be followed: {from_rpc(e)}")
            else:
                client.next_endpoint(endpoint)
        finally:
            call.cancel()
        await asyncio.sleep(0.2)


async def _release(end: _GrantEnd, call: Callable[[], Awaitable[Any]]) -> Any:
    """A fenced release (``call``, made once) with ``end``'s bookkeeping."""
    end._release_starts()
    resp = None
    error: Optional[RaftlockError] = None
    try:
        resp = await call()
    except RaftlockError as e:
        error = e
        raise
    finally:
        end._release_ended(resp, error)
    return resp


class Lock(_GrantEnd):
    """A grant, as :class:`raftlock.Lock`; ``lost`` is an :class:`asyncio.Event`."""

    def __init__(self, session: Session, name: bytes, permits: int, key: bytes, token: int, holds: int) -> None:
        self.session, self.name, self.permits = session, name, permits
        self.key, self.token, self.holds = key, token, holds
        super().__init__()
        self.lost = asyncio.Event()
        self._follower = asyncio.get_running_loop().create_task(_follow(self, session.client, name, permits, key, token))

    def _stop_following(self) -> None:
        self._follower.cancel()

    async def release(self) -> bool:
        """Give back one hold, fenced by the token (see :meth:`raftlock.Lock.release`)."""
        req = locks_pb.ReleaseRequest(key=self.key, token=self.token)
        return (await _release(self, lambda: self.session.client.call(lambda s: s.locks.Release, req, retry="never"))).released

    async def validate(self) -> bool:
        return (await self.session.client.validate(self.key, self.token, permits=self.permits)).current

    async def __aenter__(self) -> "Lock":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.lost.is_set():
            await self.release()


class Leadership(Lock):
    """This session leads an election; see :class:`raftlock.Leadership`."""

    def __init__(self, session: Session, name: bytes, leader: election_pb.LeaderKey) -> None:
        self.leader = leader
        super().__init__(session, name, 1, leader.key, leader.rev, 1)

    async def proclaim(self, value: Bytes) -> None:
        req = election_pb.ProclaimRequest(leader=self.leader, value=_b(value))
        await self.session.client.call(lambda s: s.election.Proclaim, req)

    async def resign(self) -> None:
        """Give up leadership (see :meth:`raftlock.Leadership.resign`)."""
        req = election_pb.ResignRequest(leader=self.leader)

        async def resign() -> locks_pb.ReleaseResponse:
            await self.session.client.call(lambda s: s.election.Resign, req)
            return locks_pb.ReleaseResponse(released=True, holds=0)  # the last hold

        await _release(self, resign)

    async def release(self) -> bool:
        await self.resign()
        return True


class MultiLock(_GrantEnd):
    """Several locks held together, as :class:`raftlock.MultiLock`; ``lost``
    is an :class:`asyncio.Event`."""

    def __init__(self, session: Session, locks: List[LockSpec], grants: List[Grant]) -> None:
        self.session, self.grants, self.holds = session, grants, 1
        super().__init__()
        self.lost = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._followers = [
            loop.create_task(_follow(self, session.client, g.name, lock.permits, g.key, g.token))
            for lock, g in zip(locks, grants)
        ]

    def _stop_following(self) -> None:
        for follower in self._followers:
            follower.cancel()

    async def release(self) -> bool:
        """Give back every grant of the set in one call (see :meth:`raftlock.MultiLock.release`)."""
        req = build.release_all(self.grants)
        return (await _release(self, lambda: self.session.client.call(lambda s: s.locks.Release, req, retry="never"))).released

    async def __aenter__(self) -> "MultiLock":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.lost.is_set():
            await self.release()
