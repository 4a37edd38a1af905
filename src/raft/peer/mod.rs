//! The peer protocol: everything members say to each other on the peer URL,
//! both sides side by side. Clients never reach it; nothing outside `raft/`
//! but the node's start-up (`crate::node`) uses it.
//!
//! - [`messages`]: what travels (encoded in each RPC's `RaftPayload`);
//! - [`client`]: the asking side, one cached channel per peer;
//! - [`forward`]: a follower's writes batched on their way to the leader,
//!   on one long-lived stream per leader;
//! - [`identity`]: the cluster and member ID every request carries;
//! - [`gate`]: peer authentication, which every answer checks first;
//! - [`server`]: the answering side, which hands Raft RPCs to openraft and
//!   the rest to the leader's proposer, read index, lease authority,
//!   membership changes and leader transfer.
//!
//! openraft's own RPCs go through `raft::peer::network` (the `RaftNetwork`
//! adapter) over the same channels; a leader's log streams to each follower
//! on `Peer.Replicate` (`raft::peer::pipeline`).
//!
//! Module order: `messages`, `identity` <- `client` <- `forward`, `gate`
//! (which asks other members through `client`); `server` uses `messages`, `gate`
//! and `client` and the Raft modules beside it.

pub mod client;
pub mod gate;
pub mod identity;
pub mod messages;
pub mod network;
pub mod pipeline;
pub mod server;
