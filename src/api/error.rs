//! Every error a client can see, with etcd's gRPC code and message, in one place
//! — clients (etcdctl, clientv3, jetcd, …) decide what to do from exactly these.

use tonic::Status;

use crate::mvcc::MvccError;
use crate::server::{ServerError, WriteError};

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

pub fn mvcc(e: MvccError) -> Status {
    match e {
        MvccError::Compacted => Status::out_of_range("etcdserver: mvcc: required revision has been compacted"),
        MvccError::FutureRevision => Status::out_of_range("etcdserver: mvcc: required revision is a future revision"),
        MvccError::KeyNotFound => Status::invalid_argument("etcdserver: key not found"),
        MvccError::LeaseNotFound => Status::not_found("etcdserver: requested lease not found"),
        MvccError::LeaseExists => Status::failed_precondition("etcdserver: lease already exists"),
    }
}

/// A write that did not change the store: not replicated, or refused by apply.
pub fn write(e: WriteError) -> Status {
    match e {
        WriteError::Server(e) => server(e),
        WriteError::Rejected(e) => mvcc(e),
    }
}

pub fn no_leader() -> Status {
    server(ServerError::NoLeader)
}

pub fn server(e: ServerError) -> Status {
    match e {
        ServerError::NoLeader => Status::unavailable("etcdserver: no leader"),
        ServerError::LeaderChanged => Status::unavailable("etcdserver: leader changed"),
        ServerError::Timeout => Status::unavailable("etcdserver: request timed out"),
        ServerError::Stopped => Status::unavailable("etcdserver: server stopped"),
    }
}

pub fn membership(e: crate::server::MembershipFailure) -> Status {
    use crate::server::{MembershipFailure, MembershipRefusal};
    let refusal = match e {
        MembershipFailure::Server(e) => return server(e),
        MembershipFailure::Refused(r) => r,
    };
    let message = refusal.to_string();
    match refusal {
        MembershipRefusal::MemberNotFound => Status::not_found(message),
        MembershipRefusal::BadUrls => Status::invalid_argument(message),
        MembershipRefusal::Unhealthy => Status::unavailable(message),
        MembershipRefusal::PeerUrlExists
        | MembershipRefusal::NotLearner
        | MembershipRefusal::LearnerNotReady
        | MembershipRefusal::NotEnoughMembers => Status::failed_precondition(message),
    }
}
