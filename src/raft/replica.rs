//! Starting openraft for this member, from its settings and the log store,
//! state machine and network raft/ built for it.
//!
//! Caveat: openraft's own election timer is set out of reach
//! (`cluster::prevote` runs elections); its snapshot policy is the per-member
//! stretched count (`store::log_bound`).

use crate::raft::cluster::prevote;
use crate::raft::peer::network;
use crate::raft::store::log_bound::{member_stretch, stretched};
use crate::raft::store::{log_store, state_machine};
use crate::raft::types::{Raft, RaftConfig, RaftSettings};

/// Start Raft for this member.
pub async fn start(
    id: u64,
    settings: &RaftSettings,
    log_store: log_store::LogStore,
    state_machine: state_machine::StateMachine,
    network: network::PeerNetwork,
) -> anyhow::Result<Raft> {
    // openraft's elections are off: `election` runs them (see its doc).
    let (election_timeout_min, election_timeout_max) = prevote::openraft_timeouts(settings.heartbeat_ms);
    let config = RaftConfig {
        cluster_name: settings.cluster_token.clone(),
        heartbeat_interval: settings.heartbeat_ms,
        election_timeout_min,
        election_timeout_max,
        // Stretched per member as the byte rule is (`bound_log`): the
        // members apply the same entries, and with one count for all they
        // wrote their images at once, which stalled writes cluster-wide.
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(stretched(
            settings.snapshot_count,
            member_stretch(id),
        )),
        max_in_snapshot_log_to_keep: settings.snapshot_catchup_entries,
        ..Default::default()
    };
    let config = std::sync::Arc::new(config.validate()?);
    Ok(openraft::Raft::new(id, config, network, log_store, state_machine).await?)
}
