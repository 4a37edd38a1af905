//! The write path inside raft/: a follower's writes forwarded to the leader
//! in batches ([`forward`]), the leader's proposer that batches every
//! command into log entries ([`proposer`]), the order of one lease's grants
//! and expiries on the leader ([`lease_order`]), and the answers to
//! forwarded writes, taken from apply on the leader ([`forwarded`]).

pub mod forward;
pub mod forwarded;
pub mod lease_order;
pub mod proposer;
