//! What openraft stores through raftlock: the log ([`log_store`], in the WAL
//! with an in-memory tail) and the state machine ([`state_machine`], the
//! MVCC store applied in log order with its journal, checkpoints and
//! snapshot images); when the log is cut back ([`log_bound`]); and a
//! restored backup as a member's first state ([`restore`]).

pub mod log_bound;
pub mod log_store;
pub mod restore;
pub mod state_machine;
