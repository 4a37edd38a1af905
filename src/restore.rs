//! Restoring a backup (`raftlockctl snapshot restore`, etcdutl's flags): a
//! new member's data directory from a `snapshot save` file.
//!
//! Every member of the new cluster is restored from the same file with the
//! same `--initial-cluster` and `--initial-cluster-token`; each then starts
//! with those flags and the cluster elects a leader as a new one would, with
//! the saved keys, history, leases, users and roles. Member IDs derive from
//! the token and peer URLs, as for any new cluster (a new token gives new
//! IDs). The old cluster's member attributes and alarms are not carried over.
//!
//! The revision jumps forward by [`DEFAULT_BUMP_REVISION`] unless told
//! otherwise, and the jumped-to revision is marked compacted: a restore must
//! never hand out a fencing token (a revision) the old cluster may already
//! have handed out after the backup was taken.
//!
//! Invariants: the file's SHA-256 trailer (etcd's format, which etcdctl also
//! checks) must match unless `skip_hash_check`; the data directory must not
//! exist (nothing is overwritten); on failure nothing is left behind.
//!
//! Caveat: the restored members all hold the state as applied at one log
//! position (index 1, before any term), so a member restored from another
//! file, or with other flags, must not join them: it would agree on that
//! position while holding another state.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use sha2::Digest;

use crate::config::Config;

/// What to restore and as which member.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    pub file: PathBuf,
    pub name: String,
    pub initial_cluster: String,
    pub initial_cluster_token: String,
    pub initial_advertise_peer_urls: String,
    /// Default: `<name>.raftlock`, as the server's.
    pub data_dir: Option<PathBuf>,
    pub skip_hash_check: bool,
    /// How far the restored store's revision jumps past the backup's
    /// ([`DEFAULT_BUMP_REVISION`]; etcdutl's `--bump-revision`).
    pub bump_revision: u64,
    /// Whether the jumped-to revision is also the compaction revision
    /// (etcdutl's `--mark-compacted`): reads and watches from before it are
    /// refused as compacted, instead of silently missing what the old
    /// cluster wrote after the backup.
    pub mark_compacted: bool,
}

/// How far a restore moves the revision by default: a billion. Revisions
/// are raftlock's fencing tokens, and the cluster a backup came from went on
/// handing them out after the backup was taken — up to a revision nobody
/// can know from the file. A restored cluster that started again at the
/// backup's revision would hand out the same tokens a second time, and a
/// resource that remembers the highest token it has seen would obey a stale
/// holder and refuse the new one. A billion is more than a cluster writes
/// between a backup and its restore at usual rates (3,000 writes a second
/// take almost four days to reach it; past that, pass a larger bump), and
/// leaves room for billions of restores in a 63-bit revision.
pub const DEFAULT_BUMP_REVISION: u64 = 1_000_000_000;

/// What a restore made.
#[derive(Clone, Debug)]
pub struct Restored {
    pub data_dir: PathBuf,
    pub member_id: u64,
    pub cluster_id: u64,
    pub members: usize,
    pub revision: i64,
}

/// Restore `opts.file` into a new data directory (see the module doc).
pub async fn restore(opts: &RestoreOptions) -> anyhow::Result<Restored> {
    let mut args = vec![
        "raftlock".to_string(),
        format!("--name={}", opts.name),
        format!("--initial-cluster={}", opts.initial_cluster),
        format!("--initial-cluster-token={}", opts.initial_cluster_token),
        format!("--initial-advertise-peer-urls={}", opts.initial_advertise_peer_urls),
    ];
    if let Some(dir) = &opts.data_dir {
        args.push(format!("--data-dir={}", dir.display()));
    }
    let config = Config::try_parse_from(args).map_err(|e| anyhow::anyhow!("{e}"))?;
    let me = config.member_id();
    let members = config.initial_members()?;
    match members.get(&me) {
        Some(m) if m.name == opts.name => {}
        _ => bail!(
            "--initial-cluster names `{}` with other peer URLs than --initial-advertise-peer-urls ({})",
            opts.name,
            opts.initial_advertise_peer_urls
        ),
    }
    if opts.mark_compacted && opts.bump_revision == 0 {
        bail!("--mark-compacted needs --bump-revision above 0 (there is nothing to mark)");
    }
    let bump = i64::try_from(opts.bump_revision).ok().filter(|b| *b <= i64::MAX / 2);
    let Some(bump) = bump else { bail!("--bump-revision {} is too large", opts.bump_revision) };
    let data_dir = config.data_dir();
    if data_dir.exists() {
        bail!("data directory {} exists; restore makes a new one", data_dir.display());
    }
    let image = read_backup(&opts.file, opts.skip_hash_check)?;
    let nodes = members
        .values()
        .map(|m| (m.id, crate::raft::MemberNode { name: m.name.clone(), peer_url: m.peer_urls[0].clone() }))
        .collect();
    let bump = crate::raft::RevisionBump { by: bump, mark_compacted: opts.mark_compacted };
    let made = crate::raft::restore_member(&data_dir, &image, nodes, me, bump).await;
    match made {
        Ok(revision) => Ok(Restored {
            data_dir,
            member_id: me,
            cluster_id: crate::base::ids::cluster_id(&opts.initial_cluster_token),
            members: members.len(),
            revision,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&data_dir);
            Err(e)
        }
    }
}

/// A backup file's image: its content without the SHA-256 trailer, checked.
fn read_backup(file: &Path, skip_hash_check: bool) -> anyhow::Result<Vec<u8>> {
    let mut data = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    if data.len() < 32 {
        bail!("{} is not a snapshot file: {} bytes", file.display(), data.len());
    }
    let body = data.len() - 32;
    let digest = sha2::Sha256::digest(&data[..body]);
    if digest.as_slice() != &data[body..] {
        if !skip_hash_check {
            bail!(
                "{}: snapshot hash mismatch (a damaged or cut file; --skip-hash-check to restore anyway)",
                file.display()
            );
        }
    } else {
        data.truncate(body);
    }
    Ok(data)
}
