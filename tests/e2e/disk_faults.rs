//! Disk faults on a real member: a disk running out of space (a small tmpfs
//! as the data directory's file system) and fsync failing with EIO (an
//! LD_PRELOAD shim around fdatasync/fsync, built here with the system's C
//! compiler). Both need root (mount; CI runs as root).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{grpc_error, Cluster};
use etcd_client::GetOptions;

const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";

/// A tmpfs of `mib` MiB mounted at a new directory, unmounted when dropped.
struct SmallDisk {
    _dir: tempfile::TempDir,
    mount: PathBuf,
}

impl SmallDisk {
    fn new(mib: u64) -> SmallDisk {
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts a tmpfs: run it as root (CI does)");
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("disk");
        std::fs::create_dir(&mount).unwrap();
        let size = format!("size={mib}m");
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", &size, "tmpfs"]).arg(&mount).output().unwrap();
        assert!(out.status.success(), "mount: {}", crate::common::text(&out));
        SmallDisk { _dir: dir, mount }
    }

    fn free(&self) -> u64 {
        let c = std::ffi::CString::new(self.mount.to_str().unwrap()).unwrap();
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut stat) }, 0);
        stat.f_bavail as u64 * stat.f_frsize as u64
    }

    /// Fill the disk with a file until at most `leave` bytes are free (0:
    /// until the file system refuses more).
    fn fill(&self, leave: u64) -> PathBuf {
        let path = self.mount.join("filler");
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let chunk = vec![0xa5u8; 256 << 10];
        while self.free() > leave {
            let want = (self.free() - leave).min(chunk.len() as u64) as usize;
            if file.write_all(&chunk[..want.max(1)]).is_err() {
                break;
            }
        }
        let _ = file.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// Put until `f` says the answer is the one waited for (at most 10 s).
async fn until_put(c: &mut etcd_client::Client, what: &str, f: impl Fn(&Result<(), (tonic::Code, String)>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = c.put("disk/probe", "x", None).await.map(|_| ()).map_err(grpc_error);
        if f(&answer) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: last answer {answer:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Below its reserve a member refuses writes with etcd's NOSPACE error
/// (alarm raised) and still serves reads and deletions; with space back it
/// takes writes again by itself. A disk filled to the last byte stops it
/// at worst, and the next start waits for space instead of failing again;
/// nothing acknowledged is lost.
#[tokio::test]
async fn a_full_disk_refuses_writes_cleanly_and_recovers_when_space_returns() {
    let disk = SmallDisk::new(128);
    let mut cluster = Cluster::unstarted(1);
    cluster.members[0].data_dir = disk.mount.join("m0.raftlock");
    cluster.add_args(&["--disk-space-reserve-bytes", &(16u64 << 20).to_string()]);
    cluster.start_all().await;
    let mut c = cluster.client(0).await;
    for i in 0..20 {
        c.put(format!("disk/{i:02}"), vec![b'v'; 10_000], None).await.unwrap();
    }

    // Below the reserve: refused, alarmed; reads and deletions go on.
    let filler = disk.fill(8 << 20);
    until_put(&mut c, "refused below the reserve", |a| matches!(a, Err((_, m)) if m == NO_SPACE)).await;
    let alarms = c.alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None).await.unwrap();
    assert_eq!(alarms.alarms().len(), 1, "{alarms:?}");
    assert_eq!(c.get("disk/00", None).await.unwrap().kvs().len(), 1);
    c.delete("disk/00", None).await.unwrap();

    // Space returns: writes resume without an operator.
    std::fs::remove_file(&filler).unwrap();
    until_put(&mut c, "taken again with space back", Result::is_ok).await;
    let alarms = c.alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None).await.unwrap();
    assert!(alarms.alarms().is_empty(), "{alarms:?}");

    // The last byte taken: whatever the member does, it does not lose data
    // or fail in a loop. It is restarted while the disk is full, and waits.
    let filler = disk.fill(0);
    let _ = c.put("disk/full", "x", None).await;
    cluster.kill(0);
    cluster.restart(0).expect("restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.log_of(0).contains("not enough disk space to start") {
        assert!(Instant::now() < deadline, "no wait for space:\n{}", cluster.log_of(0));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cluster.wait_exit(0, Duration::from_secs(2)), None, "it waits, it does not exit");
    std::fs::remove_file(&filler).unwrap();
    cluster.wait_ready().await;
    let mut c = cluster.client(0).await;
    let kept = c.get("disk/", Some(GetOptions::new().with_prefix().with_keys_only())).await.unwrap();
    let keys: Vec<&[u8]> = kept.kvs().iter().map(|kv| kv.key()).collect();
    for i in 1..20 {
        assert!(keys.contains(&format!("disk/{i:02}").as_bytes()), "disk/{i:02} lost: {keys:?}");
    }
    assert!(!keys.contains(&b"disk/00".as_slice()), "the deletion was kept");
    until_put(&mut c, "taken after the restart", Result::is_ok).await;
}

/// An LD_PRELOAD library whose fdatasync and fsync fail with EIO while
/// `$EIO_TRIGGER` names a file that exists.
fn eio_shim(dir: &Path) -> PathBuf {
    let source = dir.join("eio.c");
    std::fs::write(
        &source,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
static int failing(void) {
    const char *f = getenv("EIO_TRIGGER");
    return f && access(f, F_OK) == 0;
}
int fdatasync(int fd) {
    if (failing()) { errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
int fsync(int fd) {
    if (failing()) { errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}
"#,
    )
    .unwrap();
    let lib = dir.join("libeio.so");
    let out = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(&source).arg("-ldl").output().unwrap();
    assert!(out.status.success(), "cc: {}", crate::common::text(&out));
    lib
}

/// fsync failing with EIO stops the member with a clear error (it does not
/// go on serving reads from a state that no longer moves), and what it had
/// acknowledged is there when it starts again on a good disk.
#[tokio::test]
async fn an_fsync_failure_stops_the_member_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let shim = eio_shim(dir.path());
    let trigger = dir.path().join("fail-fsync");
    let mut cluster = Cluster::unstarted(1);
    cluster.env.push(("LD_PRELOAD".into(), shim.to_str().unwrap().into()));
    cluster.env.push(("EIO_TRIGGER".into(), trigger.to_str().unwrap().into()));
    cluster.start_all().await;
    let mut c = cluster.client(0).await;
    for i in 0..10 {
        c.put(format!("eio/{i}"), "v", None).await.unwrap();
    }
    std::fs::write(&trigger, b"").unwrap();
    assert!(c.put("eio/failed", "v", None).await.is_err(), "a write whose sync failed is not acknowledged");
    let status = cluster.wait_exit(0, Duration::from_secs(10)).unwrap_or_else(|| {
        panic!("the member still runs after a failed fsync:\n{}", cluster.log_of(0));
    });
    assert!(!status.success(), "{status:?}");
    let log = cluster.log_of(0);
    assert!(log.contains("Input/output error") && log.contains("this member stops"), "{log}");

    std::fs::remove_file(&trigger).unwrap();
    cluster.restart(0).expect("restart");
    cluster.wait_ready().await;
    let mut c = cluster.client(0).await;
    let kept = c.get("eio/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap();
    assert!(kept.count() >= 10, "acknowledged writes lost: {}", kept.count());
}
