from raftlock._proto.etcdserverpb import rpc_pb2 as _rpc_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WRITE: _ClassVar[Mode]
    READ: _ClassVar[Mode]
WRITE: Mode
READ: Mode

class AcquireRequest(_message.Message):
    __slots__ = ("name", "lease", "wait_ms", "permits", "metadata", "mode", "reentrant", "locks", "lock_delay_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    REENTRANT_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    lease: int
    wait_ms: int
    permits: int
    metadata: bytes
    mode: Mode
    reentrant: bool
    locks: _containers.RepeatedCompositeFieldContainer[LockSpec]
    lock_delay_ms: int
    def __init__(self, name: _Optional[bytes] = ..., lease: _Optional[int] = ..., wait_ms: _Optional[int] = ..., permits: _Optional[int] = ..., metadata: _Optional[bytes] = ..., mode: _Optional[_Union[Mode, str]] = ..., reentrant: _Optional[bool] = ..., locks: _Optional[_Iterable[_Union[LockSpec, _Mapping]]] = ..., lock_delay_ms: _Optional[int] = ...) -> None: ...

class LockSpec(_message.Message):
    __slots__ = ("name", "mode", "permits")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    mode: Mode
    permits: int
    def __init__(self, name: _Optional[bytes] = ..., mode: _Optional[_Union[Mode, str]] = ..., permits: _Optional[int] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("name", "key", "token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    key: bytes
    token: int
    def __init__(self, name: _Optional[bytes] = ..., key: _Optional[bytes] = ..., token: _Optional[int] = ...) -> None: ...

class Owner(_message.Message):
    __slots__ = ("key", "token", "lease", "ttl", "granted_ttl", "metadata", "mode", "holds", "lock_delay_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    GRANTED_TTL_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    token: int
    lease: int
    ttl: int
    granted_ttl: int
    metadata: bytes
    mode: Mode
    holds: int
    lock_delay_ms: int
    def __init__(self, key: _Optional[bytes] = ..., token: _Optional[int] = ..., lease: _Optional[int] = ..., ttl: _Optional[int] = ..., granted_ttl: _Optional[int] = ..., metadata: _Optional[bytes] = ..., mode: _Optional[_Union[Mode, str]] = ..., holds: _Optional[int] = ..., lock_delay_ms: _Optional[int] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("header", "acquired", "key", "token", "holders", "holds", "grants", "blocked_on")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_ON_FIELD_NUMBER: _ClassVar[int]
    header: _rpc_pb2.ResponseHeader
    acquired: bool
    key: bytes
    token: int
    holders: _containers.RepeatedCompositeFieldContainer[Owner]
    holds: int
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    blocked_on: bytes
    def __init__(self, header: _Optional[_Union[_rpc_pb2.ResponseHeader, _Mapping]] = ..., acquired: _Optional[bool] = ..., key: _Optional[bytes] = ..., token: _Optional[int] = ..., holders: _Optional[_Iterable[_Union[Owner, _Mapping]]] = ..., holds: _Optional[int] = ..., grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ..., blocked_on: _Optional[bytes] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("key", "token", "grants")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    token: int
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    def __init__(self, key: _Optional[bytes] = ..., token: _Optional[int] = ..., grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ...) -> None: ...

class GrantReleased(_message.Message):
    __slots__ = ("key", "released", "current_token")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    released: bool
    current_token: int
    def __init__(self, key: _Optional[bytes] = ..., released: _Optional[bool] = ..., current_token: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("header", "released", "current_token", "holds", "results")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: _rpc_pb2.ResponseHeader
    released: bool
    current_token: int
    holds: int
    results: _containers.RepeatedCompositeFieldContainer[GrantReleased]
    def __init__(self, header: _Optional[_Union[_rpc_pb2.ResponseHeader, _Mapping]] = ..., released: _Optional[bool] = ..., current_token: _Optional[int] = ..., holds: _Optional[int] = ..., results: _Optional[_Iterable[_Union[GrantReleased, _Mapping]]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("name", "permits", "limit", "waiters_after", "waiters_after_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WAITERS_AFTER_FIELD_NUMBER: _ClassVar[int]
    WAITERS_AFTER_KEY_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    permits: int
    limit: int
    waiters_after: int
    waiters_after_key: bytes
    def __init__(self, name: _Optional[bytes] = ..., permits: _Optional[int] = ..., limit: _Optional[int] = ..., waiters_after: _Optional[int] = ..., waiters_after_key: _Optional[bytes] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("header", "holders", "waiters", "lock_delay", "more")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    header: _rpc_pb2.ResponseHeader
    holders: _containers.RepeatedCompositeFieldContainer[Owner]
    waiters: _containers.RepeatedCompositeFieldContainer[Owner]
    lock_delay: LockDelay
    more: bool
    def __init__(self, header: _Optional[_Union[_rpc_pb2.ResponseHeader, _Mapping]] = ..., holders: _Optional[_Iterable[_Union[Owner, _Mapping]]] = ..., waiters: _Optional[_Iterable[_Union[Owner, _Mapping]]] = ..., lock_delay: _Optional[_Union[LockDelay, _Mapping]] = ..., more: _Optional[bool] = ...) -> None: ...

class LockDelay(_message.Message):
    __slots__ = ("delay_ms", "revision", "remaining_ms")
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    delay_ms: int
    revision: int
    remaining_ms: int
    def __init__(self, delay_ms: _Optional[int] = ..., revision: _Optional[int] = ..., remaining_ms: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("prefix", "permits", "limit", "page")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    prefix: bytes
    permits: int
    limit: int
    page: bytes
    def __init__(self, prefix: _Optional[bytes] = ..., permits: _Optional[int] = ..., limit: _Optional[int] = ..., page: _Optional[bytes] = ...) -> None: ...

class LockSummary(_message.Message):
    __slots__ = ("name", "holders", "waiters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    holders: _containers.RepeatedCompositeFieldContainer[Owner]
    waiters: int
    def __init__(self, name: _Optional[bytes] = ..., holders: _Optional[_Iterable[_Union[Owner, _Mapping]]] = ..., waiters: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("header", "locks", "next_page")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_FIELD_NUMBER: _ClassVar[int]
    header: _rpc_pb2.ResponseHeader
    locks: _containers.RepeatedCompositeFieldContainer[LockSummary]
    next_page: bytes
    def __init__(self, header: _Optional[_Union[_rpc_pb2.ResponseHeader, _Mapping]] = ..., locks: _Optional[_Iterable[_Union[LockSummary, _Mapping]]] = ..., next_page: _Optional[bytes] = ...) -> None: ...

class ValidateRequest(_message.Message):
    __slots__ = ("key", "token", "permits")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    token: int
    permits: int
    def __init__(self, key: _Optional[bytes] = ..., token: _Optional[int] = ..., permits: _Optional[int] = ...) -> None: ...

class ValidateResponse(_message.Message):
    __slots__ = ("header", "current", "current_token", "lease", "ttl")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    header: _rpc_pb2.ResponseHeader
    current: bool
    current_token: int
    lease: int
    ttl: int
    def __init__(self, header: _Optional[_Union[_rpc_pb2.ResponseHeader, _Mapping]] = ..., current: _Optional[bool] = ..., current_token: _Optional[int] = ..., lease: _Optional[int] = ..., ttl: _Optional[int] = ...) -> None: ...

class ObserveRequest(_message.Message):
    __slots__ = ("name", "permits", "start_revision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    permits: int
    start_revision: int
    def __init__(self, name: _Optional[bytes] = ..., permits: _Optional[int] = ..., start_revision: _Optional[int] = ...) -> None: ...

class LockEvent(_message.Message):
    __slots__ = ("kind", "owner", "revision", "position", "was_holding", "lock_delay_ms")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        HOLDING: _ClassVar[LockEvent.Kind]
        WAITING: _ClassVar[LockEvent.Kind]
        QUEUED: _ClassVar[LockEvent.Kind]
        GRANTED: _ClassVar[LockEvent.Kind]
        RELEASED: _ClassVar[LockEvent.Kind]
        LEASE_ENDED: _ClassVar[LockEvent.Kind]
        ENDED: _ClassVar[LockEvent.Kind]
        DELAY_STARTED: _ClassVar[LockEvent.Kind]
        DELAY_ENDED: _ClassVar[LockEvent.Kind]
    HOLDING: LockEvent.Kind
    WAITING: LockEvent.Kind
    QUEUED: LockEvent.Kind
    GRANTED: LockEvent.Kind
    RELEASED: LockEvent.Kind
    LEASE_ENDED: LockEvent.Kind
    ENDED: LockEvent.Kind
    DELAY_STARTED: LockEvent.Kind
    DELAY_ENDED: LockEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    WAS_HOLDING_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    kind: LockEvent.Kind
    owner: Owner
    revision: int
    position: int
    was_holding: bool
    lock_delay_ms: int
    def __init__(self, kind: _Optional[_Union[LockEvent.Kind, str]] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ..., revision: _Optional[int] = ..., position: _Optional[int] = ..., was_holding: _Optional[bool] = ..., lock_delay_ms: _Optional[int] = ...) -> None: ...

class ObserveResponse(_message.Message):
    __slots__ = ("header", "events")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    header: _rpc_pb2.ResponseHeader
    events: _containers.RepeatedCompositeFieldContainer[LockEvent]
    def __init__(self, header: _Optional[_Union[_rpc_pb2.ResponseHeader, _Mapping]] = ..., events: _Optional[_Iterable[_Union[LockEvent, _Mapping]]] = ...) -> None: ...
