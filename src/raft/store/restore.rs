//! Turning a backup image into a member's first state: `raftlock restore`
//! writes the image, the members and a revision bump as this member's
//! snapshot, so that it starts from the backup.

use crate::raft::store::state_machine::RevisionBump;
use crate::raft::types::{LogId, MemberNode};

/// Make a new member's data directory `data_dir` (state store and empty
/// WAL) hold a backup `image` as applied at the start of a new cluster of
/// `members` (see `crate::restore`); returns the image's revision.
pub async fn restore_member(
    data_dir: &std::path::Path,
    image: &[u8],
    members: std::collections::BTreeMap<u64, MemberNode>,
    id: u64,
    bump: RevisionBump,
) -> anyhow::Result<crate::model::mvcc::Revision> {
    use anyhow::Context;
    crate::storage::data_dir::prepare(data_dir)?;
    let db = crate::storage::StateStore::open(&data_dir.join("state"), &data_dir.join("images"))
        .context("creating the state store")?;
    // One position for every restored member: index 1, before any term
    // (as openraft's own bootstrap entry is), so any leader's term is later.
    let applied = LogId::new(openraft::CommittedLeaderId::new(0, 0), 1);
    let revision = crate::raft::store::state_machine::restore_backup(db.clone(), image, applied, members, bump)?;
    db.sync().context("syncing the state store")?;
    let log = crate::raft::store::log_store::LogStore::open(
        &data_dir.join("wal"),
        crate::base::limits::WAL_SEGMENT_BYTES,
        db,
        id,
    )
    .context("creating the WAL")?;
    drop(log);
    Ok(revision)
}
