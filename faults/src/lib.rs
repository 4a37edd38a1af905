//! raftlock's fault suite as a library: the recorded histories and the
//! checkers that judge them. The binary (`main.rs`) runs clusters, nemeses and
//! workloads and feeds what it recorded here.

pub mod check;
pub mod history;
