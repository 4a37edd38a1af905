//! Disk space: a member stops taking data before its disk is full, and
//! takes it again when space returns.
//!
//! A full disk must not crash a member in a loop or lose anything. The WAL
//! and the state store cannot be written without space, and sled, once a
//! write of its has failed, fails every later one; so the member keeps a
//! reserve (`--disk-space-reserve-bytes`) free instead:
//!
//! - [`watch`] looks at the data directory's file system every
//!   [`CHECK_INTERVAL`]. Below the reserve, this member refuses writes that add
//!   data at once and raises its NOSPACE alarm through the log, so that the
//!   whole cluster refuses them (`crate::model::alarm`) while deletions, compaction
//!   and revocation, which need little space, go on. When twice the reserve is
//!   free again, it disarms the alarm it raised (not one an operator or the
//!   quota raised).
//! - If the disk fills anyway (another process takes the space), the
//!   member's storage fails and it stops with an error; at the next start
//!   [`wait_for_space`] holds the start until the reserve is free, rather than
//!   failing again at once. The WAL and the state store are then as the last
//!   successful write left them, and the log replays the rest.
//!
//! Caveat: only space is watched; a file system out of inodes is not.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Node;
use crate::base::shutdown::Stopping;
use crate::model::alarm::{AlarmAction, AlarmKind};

/// The file that says this member's NOSPACE alarm is the disk's (see [`watch`]).
const DISK_ALARM_MARKER: &str = "nospace-alarm-raised-for-disk";

/// How often the free space is looked at.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Bytes free for an unprivileged writer on the file system holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a path with a NUL byte"))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is a
    // NUL-terminated string that outlives the call.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// The directory whose file system `data_dir` is (or will be) on: the data
/// directory itself, or its nearest existing ancestor.
fn existing(data_dir: &Path) -> PathBuf {
    let mut dir = data_dir.to_path_buf();
    while !dir.exists() {
        match dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => dir = parent.to_path_buf(),
            _ => return PathBuf::from("."),
        }
    }
    dir
}

/// Before storage is opened: wait while less than `reserve` is free (see the
/// module doc), saying so every ten seconds.
pub async fn wait_for_space(data_dir: &Path, reserve: u64) {
    let dir = existing(data_dir);
    let mut waited = 0u32;
    loop {
        match free_bytes(&dir) {
            Ok(free) if free < reserve => {
                if waited.is_multiple_of(20) {
                    tracing::error!(
                        free,
                        reserve,
                        dir = %dir.display(),
                        "not enough disk space to start; waiting for space (--disk-space-reserve-bytes)"
                    );
                }
                waited += 1;
                tokio::time::sleep(CHECK_INTERVAL).await;
            }
            // Space, or no way to tell: start.
            _ => return,
        }
    }
}

/// Watch the data directory's free space until the node stops (see the
/// module doc).
pub async fn watch(node: Arc<Node>, data_dir: PathBuf, reserve: u64, mut stopping: Stopping) {
    // Whether the alarm this member holds is one it raised for the disk: a
    // file in the data directory, so that it is known after a restart (the
    // full-disk path goes through one), written before the alarm is asked for.
    let marker = data_dir.join(DISK_ALARM_MARKER);
    let mut raised_here = marker.exists();
    loop {
        tokio::select! {
            _ = stopping.stopped() => return,
            _ = tokio::time::sleep(CHECK_INTERVAL) => {}
        }
        let Ok(free) = free_bytes(&data_dir) else { continue };
        let low = free < reserve;
        let recovered = free >= reserve.saturating_mul(2);
        if low {
            node.disk_low.store(true, Ordering::Relaxed);
        } else if recovered {
            node.disk_low.store(false, Ordering::Relaxed);
        }
        let raised = node.state().alarms().list().contains(&(node.id, AlarmKind::NoSpace));
        if low && !raised {
            tracing::warn!(free, reserve, "disk space below the reserve; raising alarm NOSPACE");
            // Even the marker may not fit: then the alarm, once raised, is
            // left to an operator to disarm.
            raised_here = std::fs::write(&marker, b"").is_ok();
            if let Err(e) = node.alarm(AlarmAction::Activate, node.id, AlarmKind::NoSpace).await {
                tracing::warn!(error = %e, "raising alarm NOSPACE (tried again shortly)");
            }
        } else if recovered && raised && raised_here && !node.over_quota() {
            tracing::info!(free, "disk space is back; disarming the NOSPACE alarm this member raised");
            if let Err(e) = node.alarm(AlarmAction::Deactivate, node.id, AlarmKind::NoSpace).await {
                tracing::warn!(error = %e, "disarming alarm NOSPACE (tried again shortly)");
            }
        } else if !raised && raised_here && !low {
            // Disarmed (by this member or an operator), or never raised.
            raised_here = false;
            let _ = std::fs::remove_file(&marker);
        }
    }
}
