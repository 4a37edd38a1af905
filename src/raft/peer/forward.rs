//! Follower-side batching of forwarded writes: the writes that arrive while
//! earlier ones are on their way to the leader travel together in one
//! `Peer.Forward` call (see `crate::batcher`), and each waiter gets its own
//! command's apply result (or why it has none).

use std::time::Duration;

use super::client::{ForwardFailure, PeerClients};
use crate::batcher::{Batcher, CallError, Limits};
use crate::command::{Command, CommandResult};

/// Writes on their way from this follower to the leader (see the module doc).
#[derive(Clone)]
pub struct Forwarder {
    batcher: Batcher<(String, Command), Result<CommandResult, ForwardFailure>>,
}

/// Forwarded batches on their way at once, at most.
const FORWARD_IN_FLIGHT: usize = 2;
/// The most commands in one forwarded batch, its most bytes, and what may
/// wait behind the batches in flight: the proposer's bounds
/// (`raft::proposer`), so that what one forwarded call carries fits one entry.
const LIMITS: Limits = Limits {
    max_batch: crate::raft::proposer::MAX_BATCH_COMMANDS,
    max_batch_weight: crate::raft::proposer::MAX_BATCH_BYTES,
    max_in_flight: FORWARD_IN_FLIGHT,
    max_queued: crate::raft::proposer::MAX_QUEUED_COMMANDS,
    max_queued_weight: crate::raft::proposer::MAX_QUEUED_BYTES,
};

fn weigh((_, cmd): &(String, Command)) -> u64 {
    cmd.encoded_len()
}

impl Forwarder {
    pub fn start(clients: PeerClients, timeout: Duration) -> Forwarder {
        let batcher = Batcher::start(LIMITS, weigh, move |items: Vec<(String, Command)>| {
            let clients = clients.clone();
            async move {
                // Usually one leader URL; group by URL, keeping queue order.
                let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
                let mut cmds: Vec<Option<Command>> = Vec::with_capacity(items.len());
                for (i, (url, cmd)) in items.into_iter().enumerate() {
                    match groups.iter_mut().find(|(u, _)| *u == url) {
                        Some((_, idx)) => idx.push(i),
                        None => groups.push((url, vec![i])),
                    }
                    cmds.push(Some(cmd));
                }
                let mut results: Vec<Option<Result<CommandResult, ForwardFailure>>> = vec![None; cmds.len()];
                for (url, idx) in groups {
                    let group: Vec<Command> = idx.iter().map(|&i| cmds[i].take().expect("each command once")).collect();
                    for (i, r) in idx.into_iter().zip(clients.forward(&url, &group, timeout).await) {
                        results[i] = Some(r);
                    }
                }
                results.into_iter().map(|r| r.expect("every item forwarded")).collect()
            }
        });
        Forwarder { batcher }
    }

    /// Forward `cmd` to the leader at `url` and wait for its apply result.
    pub async fn forward(&self, url: String, cmd: Command) -> Result<CommandResult, ForwardFailure> {
        match self.batcher.call((url, cmd)).await {
            Ok(result) => result,
            Err(CallError::Overloaded) => Err(ForwardFailure::Overloaded),
            Err(CallError::Stopped) => Err(ForwardFailure::Unknown("forwarder stopped".into())),
        }
    }
}
