//! etcd's start-up corruption check (`--experimental-initial-corrupt-check`):
//! once this member has caught up, its key-value history must hash the same
//! as every other member's at the same revision. A member whose history
//! differs — its state store was damaged on disk — refuses to serve, with an
//! error naming the peer, rather than serve data its peers do not have.
//!
//! The hash is `MvccStore::hash_kv` (Maintenance.HashKV), asked of each
//! peer over the peer protocol at this member's revision. A peer that has
//! not applied that revision yet is asked again shortly; one that cannot be
//! reached, or whose compaction differs (the hashes then cover different
//! history), is skipped with a warning, as etcd does. The member refuses to
//! serve when at least as many peers differ from it as agree with it
//! (itself included): a healthy member restarting next to a damaged one
//! still starts, and the damaged one names a peer it differs from. Caveat:
//! with one peer answering, one against one, a healthy member next to a
//! damaged one refuses too (it cannot tell which is damaged).

use std::time::Duration;

use tokio::time::Instant;

use super::Node;

/// How long the check waits for this member to catch up, and for a peer to
/// reach its revision.
const CHECK_WAIT: Duration = Duration::from_secs(30);

impl Node {
    /// Run the check (see the module doc); an error means a mismatch.
    pub async fn check_initial_corruption(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + CHECK_WAIT;
        // Caught up: everything committed before now is applied here.
        while let Err(e) = self.read_barrier().await {
            if Instant::now() >= deadline {
                tracing::warn!(error = %e, "initial corruption check skipped: this member could not catch up");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let revision = self.revision();
        let (mine, compacted) = {
            let state = self.state.clone();
            tokio::task::spawn_blocking(move || state.mvcc().hash_kv(revision)).await??
        };
        // This member agrees with itself.
        let mut agree = 1;
        let mut differ = Vec::new();
        for peer in self.members().into_iter().filter(|m| m.id != self.id) {
            let Some(url) = peer.peer_urls.first() else { continue };
            loop {
                match self.replica.peers.hash_kv(url, revision, Duration::from_secs(5)).await {
                    Ok(Ok((hash, their_compaction))) if their_compaction == compacted => {
                        if hash == mine {
                            agree += 1;
                        } else {
                            tracing::warn!(peer = format!("{:x}", peer.id), revision, "HashKV differs from a peer's");
                            differ.push((peer.id, peer.name.clone(), hash));
                        }
                        break;
                    }
                    Ok(Ok(_)) => {
                        tracing::warn!(peer = format!("{:x}", peer.id), "initial corruption check: compactions differ");
                        break;
                    }
                    // Not there yet (a future revision): ask again.
                    Ok(Err(e)) if e.contains("future revision") && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(peer = format!("{:x}", peer.id), error = %e, "initial corruption check skipped");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(peer = format!("{:x}", peer.id), error = %e, "initial corruption check: peer unreachable");
                        break;
                    }
                }
            }
        }
        if let Some((id, name, hash)) = differ.first().filter(|_| differ.len() >= agree) {
            anyhow::bail!(
                "found data inconsistency with peer {id:x} ({name}): HashKV at revision {revision} is {hash:08x} there \
                 and {mine:08x} here ({} of the peers that answered differ); this member's data is damaged: restore \
                 it from a snapshot or re-add it as a new member",
                differ.len()
            );
        }
        tracing::info!(revision, agree, differ = differ.len(), "initial corruption check passed");
        Ok(())
    }
}
