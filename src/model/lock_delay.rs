//! Lock-delay, the part every replica computes: which deletions start one,
//! and the keys that carry it.
//!
//! A native grant that asked for a lock-delay has a *delay setting* beside
//! its owner key: `<owner key>.delay`, on the owner's lease, holding the
//! delay in milliseconds in decimal (1 to [`MAX_LOCK_DELAY_MS`]). It is
//! written once the grant is made (`locks::fenced`) and deleted with the
//! owner key by a native release, in the same txn.
//!
//! The rule, applied inside the write that deletes an owner key `N/x` whose
//! setting `N/x.delay` exists (so in that write's revision, atomically with
//! the deletion):
//! - a lease's end (expiry or revoke) deletes both: the grant ended
//!   involuntarily;
//! - any other write that deletes the owner key but leaves its setting (an
//!   etcd Unlock, a DeleteRange by someone else) ended it involuntarily too:
//!   the setting, now an orphan, is deleted in the same write;
//! - a write that deletes both (a native release; a DeleteRange over the
//!   whole lock) is a release: no delay.
//!
//! An involuntary end puts the lock's *delay marker* `N/.lock-delay`
//! (lease 0), whose value is the delay in milliseconds (the larger of the
//! new one and a marker already there). While it exists nobody is granted
//! lock `N` (`locks::turn`); it is deleted by the leader once the delay has
//! passed since this member applied the marker's latest put
//! (`locks::delay`), with a txn guarded by its mod_revision. Apply reads no
//! clock: when the delay ends is the leader's to say, as with lease expiry.
//!
//! Caveats: the rule looks at key names only, so a user who writes
//! `N/x.delay` by hand beside a key `N/x` gets a lock-delay on `N` when
//! `N/x` is deleted without it. Etcd clients that compare create revisions
//! (clientv3's Mutex, `etcdctl lock`) see the marker as one more key: those
//! that queue after the delay began wait for it, those queued before do not.

/// The release that brought lock-delays: every member must run it or a
/// later one before a lock-delay is granted, and a downgrade below it is
/// refused while one is in use (`node::versions`).
pub const SINCE: crate::base::version::Version = crate::base::version::Version::new(0, 2, 0);

/// The longest lock-delay, in milliseconds (Consul's limit, 60 s).
pub const MAX_LOCK_DELAY_MS: u32 = 60_000;

/// Where a delay setting's key ends: `<owner key>.delay`.
pub const SETTING_SUFFIX: &[u8] = b".delay";

/// The last segment of a lock's delay marker: `N/.lock-delay`.
pub const MARKER_SEGMENT: &[u8] = b".lock-delay";

/// The delay setting of owner key `owner`.
pub fn setting_key(owner: &[u8]) -> Vec<u8> {
    [owner, SETTING_SUFFIX].concat()
}

/// The delay marker of lock `name`.
pub fn marker_key(name: &[u8]) -> Vec<u8> {
    [name, b"/", MARKER_SEGMENT].concat()
}

/// Whether `key` is some lock's delay marker.
pub fn is_marker(key: &[u8]) -> bool {
    key.len() > MARKER_SEGMENT.len()
        && key.ends_with(MARKER_SEGMENT)
        && key[key.len() - MARKER_SEGMENT.len() - 1] == b'/'
}

/// Whether `key` is a delay setting (its name ends in `.delay`).
pub fn is_setting(key: &[u8]) -> bool {
    key.ends_with(SETTING_SUFFIX)
}

/// A delay in milliseconds as a setting or a marker holds it: decimal, 1 to
/// [`MAX_LOCK_DELAY_MS`]. Anything else is no delay.
pub fn parse_ms(value: &[u8]) -> Option<u32> {
    if value.is_empty() || value.len() > 5 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms: u32 = std::str::from_utf8(value).ok()?.parse().ok()?;
    (1..=MAX_LOCK_DELAY_MS).contains(&ms).then_some(ms)
}

/// The value a setting or marker holds for `ms`.
pub fn format_ms(ms: u32) -> Vec<u8> {
    ms.to_string().into_bytes()
}

/// The lock an owner key belongs to (its name up to the last `/`), if the
/// key can be an owner key: not a setting, a marker or a hold count.
pub fn lock_of_owner(key: &[u8]) -> Option<&[u8]> {
    if is_setting(key) || is_marker(key) || key.ends_with(b".holds") {
        return None;
    }
    key.iter().rposition(|&b| b == b'/').map(|slash| &key[..slash])
}

/// A delay marker's change, as apply published it: its put (the revision
/// and the delay in ms) or its deletion (`None`).
pub type MarkerChange = (Vec<u8>, Option<(i64, u32)>);

/// What apply tells this member's lock-delay keeper (`locks::delay`): each
/// marker's puts and deletions, in order, and that the store was replaced
/// (every marker must be looked at again). Not replicated; holds no time.
#[derive(Default)]
pub struct MarkerFeed {
    pending: std::sync::Mutex<(Vec<MarkerChange>, bool)>,
    changed: tokio::sync::Notify,
}

impl MarkerFeed {
    /// Queue what apply changed (`resync`: the store was replaced).
    pub fn push(&self, changes: impl Iterator<Item = MarkerChange>, resync: bool) {
        let mut pending = self.pending.lock().expect("marker feed poisoned");
        let before = pending.0.len();
        pending.0.extend(changes);
        pending.1 |= resync;
        if pending.0.len() > before || resync {
            drop(pending);
            self.changed.notify_one();
        }
    }

    /// Take what is queued: the changes, and whether to look again at all.
    pub fn take(&self) -> (Vec<MarkerChange>, bool) {
        std::mem::take(&mut *self.pending.lock().expect("marker feed poisoned"))
    }

    /// Resolves once something was queued since the last `take`.
    pub async fn changed(&self) {
        self.changed.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values() {
        assert_eq!(setting_key(b"db/1f"), b"db/1f.delay");
        assert_eq!(marker_key(b"db"), b"db/.lock-delay");
        assert!(is_marker(b"db/.lock-delay") && !is_marker(b".lock-delay") && !is_marker(b"db/x.lock-delay"));
        assert_eq!(lock_of_owner(b"a/b/1f"), Some(&b"a/b"[..]));
        assert_eq!(lock_of_owner(b"db/1f.delay"), None);
        assert_eq!(lock_of_owner(b"db/1f.holds"), None);
        assert_eq!(lock_of_owner(b"db/.lock-delay"), None);
        assert_eq!(lock_of_owner(b"plain"), None);
        assert_eq!(parse_ms(b"15000"), Some(15_000));
        assert_eq!(parse_ms(b"60000"), Some(60_000));
        for bad in [&b""[..], b"0", b"60001", b"-5", b"1e3", b"999999", b" 5"] {
            assert_eq!(parse_ms(bad), None, "{bad:?}");
        }
        assert_eq!(format_ms(250), b"250");
    }
}
