//! Bounding the log: a snapshot once the log since the last one is large
//! (in bytes or entries), then a purge up to what slow followers still
//! need; each member stretches its thresholds (so that members do not all
//! write their images at once).

use crate::base::limits::{CATCHUP_LOG_BYTES, SNAPSHOT_LOG_BYTES};
use crate::raft::types::Raft;

/// How long a snapshot asked for may take before it is asked for again.
const SNAPSHOT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// How much `member_id` stretches the intervals of its whole-state writes
/// (snapshots here, checkpoints in `crate::raft::store::state_machine::layout`), in 1/2048ths:
/// spread over `[0, 1024)` (up to half again) by a multiplicative hash, since
/// member ids are random but need not be uniform in their low bits. Members
/// apply the same entries, so without it they would all write their image at
/// the same moment, and while one member writes, the others should still
/// make a quorum at full speed.
pub fn member_stretch(member_id: u64) -> u64 {
    (member_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % 1024
}

/// `base` stretched by `stretch` 2048ths (see [`member_stretch`]), at most
/// half of `u64::MAX` (openraft adds a snapshot count to a log index).
pub fn stretched(base: u64, stretch: u64) -> u64 {
    base.saturating_add(base.saturating_mul(stretch) / 2048).min(u64::MAX / 2)
}

/// Bound the log the WAL keeps in bytes, as openraft bounds it in entries
/// (`--snapshot-count`, `--snapshot-catchup-entries`): one entry is a whole
/// proposal batch (up to 2 MiB), so a count of entries alone lets a busy
/// member keep hundreds of MiB of log to replay. (What the log holds in
/// memory is bounded apart: see `log_store`.) Every half second: once the
/// entries applied since the last snapshot hold [`SNAPSHOT_LOG_BYTES`] or the
/// state's weight, whichever is more, stretched by `stretch` 2048ths
/// ([`member_stretch`]), ask for a snapshot (which is a checkpoint too); and
/// purge behind the last snapshot all but the newest entries holding
/// [`CATCHUP_LOG_BYTES`]. A
/// snapshot encodes the whole state, so waiting for as much log as the state
/// weighs keeps its cost per byte written bounded however large the state
/// (as checkpoints do, `crate::raft::store::state_machine::layout`); the WAL then keeps at most
/// about the state's weight of log. Runs until the node stops.
pub async fn bound_log(
    raft: Raft,
    log: crate::raft::store::log_store::LogStore,
    state: std::sync::Arc<crate::model::applied::AppliedState>,
    stretch: u64,
    mut stopping: crate::base::shutdown::Stopping,
) {
    let mut asked: Option<(u64, tokio::time::Instant)> = None;
    loop {
        tokio::select! {
            _ = stopping.stopped() => return,
            _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
        }
        let (snapshot, applied, purged) = {
            let m = raft.metrics();
            let m = m.borrow();
            (m.snapshot.map(|l| l.index), m.last_applied.map(|l| l.index), m.purged.map(|l| l.index))
        };
        let Some(applied) = applied else { continue };
        let waiting = asked
            .is_some_and(|(at_index, at)| snapshot.is_none_or(|s| s < at_index) && at.elapsed() < SNAPSHOT_PATIENCE);
        let base = SNAPSHOT_LOG_BYTES.max(state.size_bytes());
        let due = stretched(base, stretch);
        if !waiting && log.bytes_between(snapshot, applied) >= due {
            tracing::debug!(applied, "the log since the last snapshot is large; snapshotting");
            if raft.trigger().snapshot().await.is_err() {
                return;
            }
            asked = Some((applied, tokio::time::Instant::now()));
        }
        if let Some(snapshot) = snapshot {
            let upto = log.keep_at_most(snapshot, CATCHUP_LOG_BYTES);
            if upto > 0 && purged.is_none_or(|p| upto > p) && raft.trigger().purge_log(upto).await.is_err() {
                return;
            }
        }
    }
}
