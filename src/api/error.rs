//! Every error a client can see, with etcd's gRPC code and message, in one
//! place (as etcd's `toGRPCErrorMap`): clients (etcdctl, clientv3, jetcd, …)
//! decide what to do from exactly these. The layers below speak in typed
//! errors (`ServerError`, `WriteError`, `MvccError`, `MembershipFailure`,
//! `TransferError`, `RecipeError`) and never in etcd's wire strings; what a
//! handler refuses before it calls the node is here too.

use tonic::Status;

use crate::locks::RecipeError;
use crate::model::auth::AuthError;
use crate::model::mvcc::MvccError;
use crate::node::{MembershipFailure, MembershipRefusal, ServerError, TransferError, WriteError};

// ---------------------------------------------------------------------------
// Requests refused before they reach the node (etcd's checks and messages)
// ---------------------------------------------------------------------------

pub fn empty_key() -> Status {
    Status::invalid_argument("etcdserver: key is not provided")
}
pub fn value_provided() -> Status {
    Status::invalid_argument("etcdserver: value is provided")
}
pub fn lease_provided() -> Status {
    Status::invalid_argument("etcdserver: lease is provided")
}
pub fn too_many_ops() -> Status {
    Status::invalid_argument("etcdserver: too many operations in txn request")
}
pub fn duplicate_key() -> Status {
    Status::invalid_argument("etcdserver: duplicate key given in txn request")
}
pub fn invalid_sort_option() -> Status {
    Status::invalid_argument("etcdserver: invalid sort option")
}
pub fn request_too_large() -> Status {
    Status::invalid_argument("etcdserver: request is too large")
}
/// Not an etcd error (etcd panics on these); raftlock rejects them cleanly.
pub fn invalid_compare() -> Status {
    Status::invalid_argument("etcdserver: invalid compare target or result")
}
pub fn too_large_ttl() -> Status {
    Status::out_of_range("etcdserver: too large lease TTL")
}
pub fn unknown_alarm_action() -> Status {
    Status::invalid_argument("etcdserver: unknown alarm action")
}
/// An election request without the leader key Campaign returned.
pub fn no_leader_key() -> Status {
    Status::invalid_argument("election: no leader key given")
}

// The native lock API's own checks (raftlock's messages).

pub fn no_lock_name() -> Status {
    Status::invalid_argument("raftlock: lock name is not provided")
}
pub fn lease_required() -> Status {
    Status::invalid_argument("raftlock: a lease is required (grant one and keep it alive while holding the lock)")
}
pub fn too_many_permits(max: u32) -> Status {
    Status::invalid_argument(format!("raftlock: permits must be at most {max}"))
}
pub fn too_many_locks(max: usize) -> Status {
    Status::invalid_argument(format!("raftlock: a multi-lock takes at most {max} locks"))
}
pub fn multi_lock_names_too_long(max: usize) -> Status {
    Status::invalid_argument(format!("raftlock: a multi-lock's names may have at most {max} bytes together"))
}
pub fn multi_lock_fields() -> Status {
    Status::invalid_argument(
        "raftlock: a multi-lock names its locks in `locks` (or its grants in `grants`); leave the one-lock fields unset",
    )
}
pub fn negative_start_revision() -> Status {
    Status::invalid_argument("raftlock: start_revision must not be negative")
}
pub fn lock_delay_too_long(max: u32) -> Status {
    Status::invalid_argument(format!("raftlock: lock_delay_ms must be at most {max}"))
}
pub fn lock_delay_not_exclusive() -> Status {
    Status::invalid_argument("raftlock: a lock-delay is only for an exclusive lock (WRITE mode, one permit)")
}
pub fn multi_lock_delay() -> Status {
    Status::invalid_argument("raftlock: a multi-lock cannot have a lock-delay")
}
pub fn multi_lock_reentrant() -> Status {
    Status::invalid_argument("raftlock: a multi-lock cannot be reentrant")
}
pub fn bad_lock_set(problem: &str) -> Status {
    Status::invalid_argument(format!("raftlock: {problem}"))
}
pub fn read_lock_permits() -> Status {
    Status::invalid_argument("raftlock: a read lock is shared by every reader; its permits must be 0 or 1")
}
pub fn unknown_lock_mode(mode: i32) -> Status {
    Status::invalid_argument(format!("raftlock: unknown lock mode {mode}"))
}
pub fn release_needs_token() -> Status {
    Status::invalid_argument("raftlock: release needs the grant's fencing token")
}

// ---------------------------------------------------------------------------
// Failures of the node and the layers below
// ---------------------------------------------------------------------------

/// A failure of this member, not of the request (an I/O error, a task that
/// panicked): the member says what it was doing.
pub fn internal(doing: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("raftlock: {doing}: {e}"))
}

/// etcd's message for a member without a leader (also listed by Status).
pub const NO_LEADER: &str = "etcdserver: no leader";

pub fn no_leader() -> Status {
    server(ServerError::NoLeader)
}

pub fn server(e: ServerError) -> Status {
    match e {
        ServerError::NoLeader => Status::unavailable(NO_LEADER),
        ServerError::LeaderChanged => Status::unavailable("etcdserver: leader changed"),
        ServerError::Timeout => Status::unavailable("etcdserver: request timed out"),
        ServerError::Stopped => Status::unavailable("etcdserver: server stopped"),
        ServerError::TooManyRequests => Status::resource_exhausted("etcdserver: too many requests"),
        ServerError::NeedsRelease(why) => Status::failed_precondition(format!("raftlock: {why}")),
    }
}

pub fn mvcc(e: MvccError) -> Status {
    match e {
        MvccError::Compacted => Status::out_of_range("etcdserver: mvcc: required revision has been compacted"),
        MvccError::FutureRevision => Status::out_of_range("etcdserver: mvcc: required revision is a future revision"),
        MvccError::KeyNotFound => Status::invalid_argument("etcdserver: key not found"),
        MvccError::LeaseNotFound => Status::not_found("etcdserver: requested lease not found"),
        MvccError::LeaseExists => Status::failed_precondition("etcdserver: lease already exists"),
        MvccError::NoSpace => Status::resource_exhausted("etcdserver: mvcc: database space exceeded"),
        MvccError::ResponseTooLarge => Status::resource_exhausted(format!(
            "etcdserver: mvcc: range response is too large (the limit is {} bytes; read it in pages with a limit)",
            crate::base::limits::MAX_RANGE_RESPONSE_BYTES
        )),
        MvccError::Malformed => Status::invalid_argument("etcdserver: invalid command"),
    }
}

/// A write that did not change the store: not replicated, or refused by apply.
pub fn write(e: WriteError) -> Status {
    match e {
        WriteError::Server(e) => server(e),
        WriteError::Rejected(e) => mvcc(e),
        WriteError::Denied(e) => auth(e),
    }
}

/// What auth refused, with etcd's code and message.
pub fn auth(e: AuthError) -> Status {
    use tonic::Code;
    use AuthError::*;
    let code = match e {
        // etcd has no gRPC error for it: its auth package's error goes out as is.
        NoPasswordUser => return unchecked_auth(e),
        PermissionDenied => Code::PermissionDenied,
        InvalidToken => Code::Unauthenticated,
        AuthFailed | UserEmpty | RoleEmpty | PermissionNotGiven | InvalidManagement | OldRevision => {
            Code::InvalidArgument
        }
        UserNotFound | UserAlreadyExists | RoleNotFound | RoleAlreadyExists | RoleNotGranted | PermissionNotGranted
        | NotEnabled | RootUserNotExist | RootRoleNotExist => Code::FailedPrecondition,
    };
    Status::new(code, format!("etcdserver: {e}"))
}

/// An auth error as etcd's auth package words it, with code Unknown: what
/// etcd's Maintenance service answers (its admin check hands the error on
/// without mapping it).
pub fn unchecked_auth(e: AuthError) -> Status {
    Status::unknown(format!("auth: {e}"))
}

pub fn membership(e: MembershipFailure) -> Status {
    let refusal = match e {
        MembershipFailure::Server(e) => return server(e),
        MembershipFailure::Refused(r) => r,
    };
    match refusal {
        MembershipRefusal::MemberNotFound => Status::not_found("etcdserver: member not found"),
        MembershipRefusal::BadUrls => Status::invalid_argument("etcdserver: given member URLs are invalid"),
        MembershipRefusal::Unhealthy => Status::unavailable("etcdserver: unhealthy cluster"),
        MembershipRefusal::PeerUrlExists => Status::failed_precondition("etcdserver: Peer URLs already exists"),
        MembershipRefusal::NotLearner => Status::failed_precondition("etcdserver: can only promote a learner member"),
        MembershipRefusal::LearnerNotReady => {
            Status::failed_precondition("etcdserver: can only promote a learner member which is in sync with leader")
        }
        MembershipRefusal::NotEnoughMembers => {
            Status::failed_precondition("etcdserver: re-configuration failed due to not enough started members")
        }
    }
}

/// Maintenance.MoveLeader's failures.
pub fn transfer(e: TransferError) -> Status {
    match e {
        TransferError::NotLeader => Status::failed_precondition("etcdserver: not leader"),
        TransferError::BadTransferee => Status::failed_precondition("etcdserver: bad leader transferee"),
        TransferError::TimedOut => Status::unavailable("etcdserver: request timed out"),
    }
}

/// etcd's v3lock and v3election services pass their internal client's
/// failures through as gRPC code Unknown, with the same message;
/// availability errors stay Unavailable here, so that clients retry them.
pub fn v3_recipe(e: RecipeError) -> Status {
    match e {
        RecipeError::Server(e) => server(e),
        RecipeError::Mvcc(e) => Status::unknown(mvcc(e).message()),
        RecipeError::SessionExpired => Status::unknown("session: session is expired"),
        RecipeError::NotLeader => Status::unknown("election: not leader"),
        RecipeError::NoLeader => Status::unknown("election: no leader"),
        RecipeError::TimedOut => Status::unknown("lock: wait timed out"),
        RecipeError::Denied(e) => Status::unknown(auth(e).message()),
        // Only native acquires can meet these.
        e @ (RecipeError::OtherMode(_)
        | RecipeError::Contended
        | RecipeError::NotAnOwnerKey(_)
        | RecipeError::PartlyQueued(_)) => native_recipe(e),
    }
}

/// The native lock API's failures.
pub fn native_recipe(e: RecipeError) -> Status {
    match e {
        RecipeError::Server(e) => server(e),
        RecipeError::Mvcc(e) => mvcc(e),
        RecipeError::Denied(e) => auth(e),
        RecipeError::SessionExpired => {
            Status::failed_precondition("raftlock: the lease ended while waiting for the lock")
        }
        e @ RecipeError::OtherMode(_) => Status::failed_precondition(format!("raftlock: {e}")),
        e @ RecipeError::Contended => Status::aborted(format!("raftlock: {e}; try again")),
        e @ RecipeError::NotAnOwnerKey(_) => Status::invalid_argument(e.to_string()),
        e @ RecipeError::PartlyQueued(_) => Status::failed_precondition(e.to_string()),
        other => v3_recipe(other),
    }
}
