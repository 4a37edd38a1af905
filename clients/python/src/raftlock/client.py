"""The connection to a raftlock cluster: endpoints, failover, auth, TLS, and
the etcd v3 calls a program needs besides locks (KV, txn, leases, watches).

Invariants: a call goes to the endpoint that answered last; when a member
cannot be reached (``UNAVAILABLE``) the call is made again on the next
endpoint, each endpoint tried once per call, and :class:`Unavailable` is
raised when none answered. Reads, keepalives and the lock introspection
calls also move on when a member does not answer within the call's
timeout (a member that hangs); gRPC keepalives find a silent connection
within 15 s. A refused auth token (tokens are each member's own) is
replaced and the call made again. Every other failure is raised at once
as a :class:`RaftlockError` with the server's code and message (etcd's).
A lock's fenced release is made once: a retry could give back a second
hold.

Caveat: a write whose member went away after it was sent may have been
applied; as with etcd's clients, retrying it is the caller's decision for
anything but the lock calls (an acquire is safe to retry, see the proto).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

import grpc

if TYPE_CHECKING:
    from .session import Session

from ._proto.etcdserverpb import rpc_pb2 as rpc
from ._proto.etcdserverpb import rpc_pb2_grpc as rpc_grpc
from ._proto.mvccpb import kv_pb2
from ._proto.raftlock.v1 import lock_pb2 as locks_pb
from ._proto.raftlock.v1 import lock_pb2_grpc as locks_grpc
from ._proto.v3electionpb import v3election_pb2 as election_pb
from ._proto.v3electionpb import v3election_pb2_grpc as election_grpc
from . import _requests as build
from ._requests import Bytes
from ._requests import b as _b
from .errors import RaftlockError, Unavailable, from_rpc

T = TypeVar("T")

KeyValue = kv_pb2.KeyValue
Event = kv_pb2.Event


@dataclass(frozen=True)
class TLS:
    """Client TLS: the CA that signed the members' certificates, and (for
    mTLS) the client's certificate and key, as PEM file paths."""

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Optional[str]) -> Optional[bytes]:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


class _Stubs:
    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.kv = rpc_grpc.KVStub(channel)
        self.lease = rpc_grpc.LeaseStub(channel)
        self.watch = rpc_grpc.WatchStub(channel)
        self.auth = rpc_grpc.AuthStub(channel)
        self.maintenance = rpc_grpc.MaintenanceStub(channel)
        self.locks = locks_grpc.LocksStub(channel)
        self.election = election_grpc.ElectionStub(channel)


class _Connection:
    """What the synchronous and the asyncio clients share: the endpoints,
    which one is current, the channels (made by ``_channel``), the auth
    token, and how a failed call is judged (:meth:`_judge`)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        tls: Optional[TLS],
        user: Optional[str],
        password: Optional[str],
        timeout: float,
        secure_channel: Callable[..., Any],
        insecure_channel: Callable[..., Any],
    ) -> None:
        if not endpoints:
            raise ValueError("at least one endpoint is needed")
        self.timeout = timeout
        self._tls = tls or (TLS() if any(e.startswith("https://") for e in endpoints) else None)
        self._endpoints = [e.split("://", 1)[-1] for e in endpoints]
        self._stubs: Dict[str, _Stubs] = {}
        self._current = 0
        self._mutex = threading.Lock()
        self._user, self._password = user, password
        self._token: Optional[str] = None
        self._authenticating = threading.Lock()
        self._secure_channel, self._insecure_channel = secure_channel, insecure_channel

    @property
    def endpoints(self) -> List[str]:
        return list(self._endpoints)

    def _stubs_for(self, endpoint: str) -> _Stubs:
        with self._mutex:
            stubs = self._stubs.get(endpoint)
            if stubs is None:
                options = [
                    ("grpc.max_receive_message_length", 64 << 20),
                    # A member that hangs (stopped, cut off) is found by its
                    # silence: its connection fails, and the streams on it.
                    ("grpc.keepalive_time_ms", 10_000),
                    ("grpc.keepalive_timeout_ms", 5_000),
                    ("grpc.keepalive_permit_without_calls", 1),
                    ("grpc.http2.max_pings_without_data", 0),
                ]
                if self._tls is not None:
                    channel = self._secure_channel(endpoint, self._tls.credentials(), options)
                else:
                    channel = self._insecure_channel(endpoint, options)
                stubs = self._stubs[endpoint] = _Stubs(channel)
            return stubs

    def _metadata(self) -> Optional[List[Tuple[str, str]]]:
        return [("token", self._token)] if self._token else None

    def _judge(self, e: grpc.RpcError, index: int, may_reauthenticate: bool, retry: str, deadline: bool) -> str:
        """What a failed call does next: "next" (its member could not be
        reached, or did not answer within the call's deadline and the call
        may be made twice: the next endpoint becomes current),
        "reauthenticate" (the token was refused: tokens are each member's
        own), or it raises the call's error. ``retry`` is "unavailable"
        (retry when the member cannot be reached), "always" (also on the
        deadline) or "never" (a fenced release: its caller learns the answer
        was lost); ``deadline``: the call had one."""
        code = e.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            self.next_endpoint(self._endpoints[index])
            if retry != "never":
                return "next"
        elif may_reauthenticate and self._refused_token(e):
            return "reauthenticate"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED and deadline:
            self.next_endpoint(self._endpoints[index])
            if retry == "always":
                return "next"
        raise from_rpc(e) from None

    def _refused_token(self, e: grpc.RpcError) -> bool:
        return (
            self._user is not None
            and e.code() == grpc.StatusCode.UNAUTHENTICATED
            and "token" in (e.details() or "")
        )

    @staticmethod
    def _none_answered(last: Optional[grpc.RpcError]) -> Unavailable:
        return Unavailable(grpc.StatusCode.UNAVAILABLE, f"no endpoint answered ({last.details() if last else 'none tried'})")

    def stream(self, method: Callable[[_Stubs], Callable[..., T]], request: object) -> Tuple[T, str]:
        """Open a stream on the current endpoint; with the endpoint used."""
        endpoint = self._endpoints[self._current]
        return method(self._stubs_for(endpoint))(request, metadata=self._metadata()), endpoint

    def next_endpoint(self, after: str) -> None:
        """The member at ``after`` failed a call or a stream: use the next one."""
        with self._mutex:
            if self._endpoints[self._current] == after:
                self._current = (self._current + 1) % len(self._endpoints)


class Client(_Connection):
    """A client of a raftlock cluster (or of any etcd v3 server, for the
    etcd calls).

    ``endpoints`` are ``host:port``, ``http://host:port`` or
    ``https://host:port``; ``tls`` (or an ``https`` endpoint) makes every
    connection TLS. With ``user`` and ``password`` the client authenticates
    (etcd's simple tokens) and again whenever its token is refused.
    ``timeout`` is each call's deadline in seconds (a lock's wait is added
    to it).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: Optional[TLS] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(endpoints, tls, user, password, timeout, grpc.secure_channel, grpc.insecure_channel)
        if user is not None:
            self._authenticate()

    # -- plumbing ---------------------------------------------------------

    def _authenticate(self, stale: Optional[str] = None) -> None:
        """Fetch a token (replacing ``stale``, which a member refused,
        unless another call replaced it meanwhile). The token in use is
        replaced only by a new one, never cleared; one at a time."""
        with self._authenticating:
            if stale is not None and self._token != stale:
                return
            req = rpc.AuthenticateRequest(name=self._user or "", password=self._password or "")
            self._token = self.call(lambda s: s.auth.Authenticate, req, reauthenticate=False).token

    def call(
        self,
        method: Callable[[_Stubs], Callable[..., T]],
        request: object,
        timeout: Optional[float] = -1.0,
        *,
        retry: str = "unavailable",
        reauthenticate: bool = True,
    ) -> T:
        """Make one unary call (``method`` picks it from the stubs), failing
        over to the next endpoint while members cannot be reached (and, with
        ``retry="always"``, when one does not answer within ``timeout``,
        each attempt's deadline). ``timeout`` None waits as long as the call
        takes; ``retry="never"`` makes it once."""
        deadline = self.timeout if timeout == -1.0 else timeout
        last: Optional[grpc.RpcError] = None
        reauthenticated = not reauthenticate
        tries = 0
        while tries < len(self._endpoints):
            index = self._current
            stubs = self._stubs_for(self._endpoints[index])
            token = self._token
            try:
                return method(stubs)(request, timeout=deadline, metadata=self._metadata())
            except grpc.RpcError as e:
                last = e
                if self._judge(e, index, not reauthenticated, retry, deadline is not None) == "next":
                    tries += 1
                    continue
                reauthenticated = True
                self._authenticate(token)
        raise self._none_answered(last)

    def close(self) -> None:
        with self._mutex:
            for stubs in self._stubs.values():
                stubs.channel.close()
            self._stubs.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- KV ---------------------------------------------------------------

    def get(self, key: Bytes, *, serializable: bool = False) -> Optional[KeyValue]:
        """The key's current KeyValue, or None."""
        kvs = self.range(key, serializable=serializable).kvs
        return kvs[0] if kvs else None

    def range(
        self,
        key: Bytes,
        range_end: Optional[Bytes] = None,
        *,
        prefix: bool = False,
        revision: int = 0,
        limit: int = 0,
        keys_only: bool = False,
        count_only: bool = False,
        serializable: bool = False,
    ) -> rpc.RangeResponse:
        key = _b(key)
        end = build.range_end(key, range_end, prefix)
        req = rpc.RangeRequest(
            key=key,
            range_end=end,
            revision=revision,
            limit=limit,
            keys_only=keys_only,
            count_only=count_only,
            serializable=serializable,
        )
        return self.call(lambda s: s.kv.Range, req, retry="always")

    def put(self, key: Bytes, value: Bytes, *, lease: int = 0, prev_kv: bool = False) -> rpc.PutResponse:
        return self.call(lambda s: s.kv.Put, rpc.PutRequest(key=_b(key), value=_b(value), lease=lease, prev_kv=prev_kv))

    def delete(self, key: Bytes, range_end: Optional[Bytes] = None, *, prefix: bool = False) -> int:
        """Delete a key (or a range, or a prefix); how many were deleted."""
        key = _b(key)
        end = build.range_end(key, range_end, prefix)
        return self.call(lambda s: s.kv.DeleteRange, rpc.DeleteRangeRequest(key=key, range_end=end)).deleted

    def txn(
        self,
        compare: Sequence[rpc.Compare],
        success: Sequence[rpc.RequestOp] = (),
        failure: Sequence[rpc.RequestOp] = (),
    ) -> rpc.TxnResponse:
        """An etcd transaction: build its parts with :mod:`raftlock.txn`."""
        req = rpc.TxnRequest(compare=list(compare), success=list(success), failure=list(failure))
        return self.call(lambda s: s.kv.Txn, req)

    def compact(self, revision: int, *, physical: bool = False) -> None:
        self.call(lambda s: s.kv.Compact, rpc.CompactionRequest(revision=revision, physical=physical))

    # -- leases -----------------------------------------------------------

    def lease_grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; its id."""
        return self.call(lambda s: s.lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl)).ID

    def lease_revoke(self, lease: int) -> None:
        self.call(lambda s: s.lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease))

    def lease_ttl(self, lease: int) -> int:
        """Seconds left on the lease; -1 if it does not exist."""
        return self.call(lambda s: s.lease.LeaseTimeToLive, rpc.LeaseTimeToLiveRequest(ID=lease), retry="always").TTL

    def lease_keep_alive_once(self, lease: int, timeout: Optional[float] = None) -> int:
        """Renew the lease once; its TTL, or 0 if it no longer exists.
        ``timeout`` bounds each member's attempt (the client's by default):
        a member that hangs is left for the next."""
        deadline = timeout or self.timeout

        def once(stubs: _Stubs) -> Callable[..., int]:
            def renew(request: object, timeout: float, metadata: object) -> int:
                responses = stubs.lease.LeaseKeepAlive(iter([request]), timeout=timeout, metadata=metadata)
                for response in responses:
                    responses.cancel()
                    return response.TTL
                return 0

            return renew

        return self.call(once, rpc.LeaseKeepAliveRequest(ID=lease), timeout=deadline, retry="always")

    # -- watches ----------------------------------------------------------

    def watch(
        self,
        key: Bytes,
        range_end: Optional[Bytes] = None,
        *,
        prefix: bool = False,
        start_revision: int = 0,
        prev_kv: bool = False,
    ) -> "Watch":
        """Watch a key, range or prefix from ``start_revision`` (0: from
        now). Iterate over the returned :class:`Watch` for events; it picks
        the watch up on another member if its member fails, from the
        revision after the last event, and raises :class:`RaftlockError`
        (OUT_OF_RANGE) if that revision was compacted."""
        key = _b(key)
        return Watch(self, key, build.range_end(key, range_end, prefix), start_revision, prev_kv)

    # -- native locks -----------------------------------------------------

    def session(self, ttl: int = 10) -> "Session":
        """A lease of ``ttl`` seconds kept alive in the background (see
        :class:`raftlock.Session`); locks are taken through it."""
        from .session import Session

        return Session(self, ttl)

    def describe(self, name: Bytes, *, permits: int = 1) -> locks_pb.DescribeResponse:
        """Who holds lock ``name`` and who waits for it (lowest token first).
        The server answers a page of waiters at a time; this asks for the
        pages that follow until it has them all."""
        req = locks_pb.DescribeRequest(name=_b(name), permits=permits)
        resp = self.call(lambda s: s.locks.Describe, req, retry="always")
        while resp.more and resp.waiters:
            req.waiters_after, req.waiters_after_key = resp.waiters[-1].token, resp.waiters[-1].key
            page = self.call(lambda s: s.locks.Describe, req, retry="always")
            resp.waiters.extend(page.waiters)
            resp.more = page.more
        return resp

    def list_locks(self, prefix: Bytes = b"", *, permits: int = 1) -> List[locks_pb.LockSummary]:
        """Every lock whose name starts with ``prefix``, with its holders.
        The server answers up to 1,000 locks at a time; this asks for every
        page (each read at its own revision: see ``ListRequest``)."""
        locks: List[locks_pb.LockSummary] = []
        req = locks_pb.ListRequest(prefix=_b(prefix), permits=permits)
        while True:
            resp = self.call(lambda s: s.locks.List, req, retry="always")
            locks.extend(resp.locks)
            if not resp.next_page:
                return locks
            req = locks_pb.ListRequest(prefix=_b(prefix), permits=permits, page=resp.next_page)

    def validate(self, key: Bytes, token: int, *, permits: int = 1) -> locks_pb.ValidateResponse:
        """Whether the grant (owner key and token) still holds its lock,
        read linearizably (``.current``), with its lease's TTL left."""
        req = locks_pb.ValidateRequest(key=_b(key), token=token, permits=permits)
        return self.call(lambda s: s.locks.Validate, req, retry="always")


    def observe(self, name: Bytes, *, permits: int = 1, start_revision: int = 0) -> Iterator[locks_pb.ObserveResponse]:
        """Lock ``name``'s events: the first message holds its holders and
        waiters (or, from ``start_revision`` > 0, every change since), each
        later one a revision's changes (``LockEvent``: granted, released,
        lease ended, queued, lock-delay started and ended). One member's
        stream: it ends with :class:`RaftlockError` if that member fails
        (resume from the last header's revision + 1)."""
        req = locks_pb.ObserveRequest(name=_b(name), permits=permits, start_revision=start_revision)
        responses, _ = self.stream(lambda s: s.locks.Observe, req)
        try:
            yield from responses
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc(e) from None

    # -- elections --------------------------------------------------------

    def leader(self, name: Bytes) -> Optional[KeyValue]:
        """Election ``name``'s leader key (its value is the leader's
        proclamation), or None when nobody leads."""
        try:
            resp = self.call(lambda s: s.election.Leader, election_pb.LeaderRequest(name=_b(name)), retry="always")
        except RaftlockError as e:
            if e.message == "election: no leader":
                return None
            raise
        return resp.kv

    def observe_leader(self, name: Bytes) -> Iterator[KeyValue]:
        """Each leader of election ``name`` (and each proclamation), as
        etcd's Election.Observe tells them, from the current one on."""
        responses, _ = self.stream(lambda s: s.election.Observe, election_pb.LeaderRequest(name=_b(name)))
        try:
            for response in responses:
                yield response.kv
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc(e) from None


class Watch:
    """The events of one watch, as an iterator (see :meth:`Client.watch`)."""

    def __init__(self, client: Client, key: bytes, end: bytes, start_revision: int, prev_kv: bool) -> None:
        self._client, self._key, self._end, self._prev_kv = client, key, end, prev_kv
        self._next = start_revision
        self._closed = threading.Event()
        self._call: Optional[grpc.Call] = None
        self.revision = 0

    def _open(self) -> Tuple[Iterator[rpc.WatchResponse], str]:
        create = build.watch_create(self._key, self._end, self._next, self._prev_kv)
        closed = self._closed

        def requests() -> Iterator[rpc.WatchRequest]:
            yield create
            # Keep the sending side open: a closed one ends the watch.
            closed.wait()

        responses, endpoint = self._client.stream(lambda s: s.watch.Watch, requests())
        self._call = responses  # type: ignore[assignment]
        return responses, endpoint

    def __iter__(self) -> Iterator[Event]:
        failures = 0
        while not self._closed.is_set():
            responses, endpoint = self._open()
            try:
                for response in responses:
                    failures = 0
                    build.check_watch_response(response)
                    self.revision = max(self.revision, response.header.revision)
                    for event in response.events:
                        self._next = event.kv.mod_revision + 1
                        yield event
                    if not self._next:
                        # Before any event: resume from after what this member had.
                        self._next = response.header.revision + 1
            except grpc.RpcError as e:
                if self._closed.is_set() or e.code() == grpc.StatusCode.CANCELLED:
                    return
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise from_rpc(e) from None
                failures += 1
                self._client.next_endpoint(endpoint)
                if failures > 3 * len(self._client.endpoints):
                    raise from_rpc(e) from None
                self._closed.wait(0.2)

    def close(self) -> None:
        self._closed.set()
        if self._call is not None:
            self._call.cancel()
