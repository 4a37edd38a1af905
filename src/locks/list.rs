//! Listing native locks a page at a time (`raftlock.v1.Locks/List`): every
//! lock whose name starts with a prefix, each on one page, with its holders
//! and how many wait.
//!
//! A lock is recognised by its owner keys: `<name>/<lease hex>` or
//! `<name>/read-<lease hex>`, attached to that very lease ([`lock_name`]).
//! Locks are listed in the order of their first owner key in key order. A
//! page walks the keys in key order from its start (the first owner key of
//! its first lock; the prefix for the first page), a chunk at a time, and
//! lists a lock where it meets the lock's first owner key: a lock met again
//! (its waiters' keys) is not listed again, nor is a lock whose directory
//! the page starts inside and that has an owner key before the start (a
//! page before listed it). The page ends at the first lock past its limit,
//! whose first owner key is the next page's start ([`Page::next`]).
//!
//! Why that order, and not the names': a lock's keys are not contiguous in
//! key order when one name is a directory of another (`jobs/1a`,
//! `jobs/nightly/2b`, `jobs/ff`), and names and their keys sort differently
//! (`a` < `a-b`, but `a-b/…` < `a/…`). Walking keys in their own order reads
//! each key once across every page, with no sort and no whole-prefix read.
//!
//! Cost of a page: the keys walked (the listed locks' waiters and any other
//! keys between its first lock and the next page's); per lock listed, its
//! holders from the front of its queue (`holders_now`) and a walk over its
//! owner keys to count them (a lock with 10,000 waiting reads 10,000 keys,
//! and answers one number); per directory the page starts inside, a skip
//! over its direct keys before the start. The answer holds at most `limit`
//! locks. Every walk reads [`CHUNK`] live keys at a time with
//! `MvccStore::first_live`, which stops there. (A limited range counts the
//! rest of its range; read with it, a page walked about n² / 512 keys for a
//! lock with n waiting, 20 million for 100,000.)
//!
//! Caveats: each page is read at its own revision, as etcd's paged ranges
//! are when not pinned to one: a lock whose first owner key comes or goes
//! between two pages may be listed twice or not at all. A page is read
//! under the store's read lock, which apply waits for: with 100,000 locks
//! held, a page of 1,000 answered in 21-37 ms end to end, and a lock with
//! 100,000 waiting was listed in 162-228 ms (a page of 10,000 locks, the
//! most one answer holds, reads ten times as much as a page of 1,000).

use std::collections::HashSet;

use super::fenced::Owner;
use super::{holders_now, prefix_end, queue_prefix, RecipeError};
use crate::model::mvcc::{KeyRange, KeyValue, MvccError, MvccStore};
use crate::node::Node;

/// Keys read at once by a page's walk.
const CHUNK: usize = 256;

/// Locks a page lists when the request sets no limit, and at most.
pub const DEFAULT_LIMIT: usize = 1_000;
pub const MAX_LIMIT: usize = 10_000;

/// A lock found by [`list`].
pub struct Summary {
    pub name: Vec<u8>,
    pub holders: Vec<Owner>,
    pub waiters: usize,
}

/// One page of locks.
pub struct Page {
    pub locks: Vec<Summary>,
    /// Where the next page starts (the first owner key of the first lock
    /// not listed here); `None` on the last page.
    pub next: Option<Vec<u8>>,
    pub revision: i64,
}

/// The page of locks named with `prefix` (all when empty) that starts at
/// `start` (empty: the first page; else a page's [`Page::next`]), at most
/// `limit` of them, read linearizably.
pub async fn list(node: &Node, prefix: &[u8], start: &[u8], limit: usize, permits: usize) -> Result<Page, RecipeError> {
    node.read_barrier().await?;
    let mvcc = node.state().mvcc();
    page(&mvcc, prefix, start, limit, permits).map_err(RecipeError::Mvcc)
}

fn page(mvcc: &MvccStore, prefix: &[u8], start: &[u8], limit: usize, permits: usize) -> Result<Page, MvccError> {
    let end = if prefix.is_empty() { vec![0] } else { prefix_end(prefix) };
    let first = if prefix.is_empty() { vec![0] } else { prefix.to_vec() };
    let mut at = first.clone().max(start.to_vec());
    // The locks this page must not list: those met already, and those whose
    // directory the page starts inside with an owner key before its start.
    let mut listed: HashSet<Vec<u8>> = HashSet::new();
    if at > first {
        for slash in at.iter().enumerate().filter(|(_, b)| **b == b'/').map(|(i, _)| i) {
            let name = &at[..slash];
            if name.starts_with(prefix) && has_owner_key_before(mvcc, name, &at) {
                listed.insert(name.to_vec());
            }
        }
    }
    let mut locks = Vec::new();
    loop {
        let (kvs, more) = mvcc.first_live(&KeyRange::new(&at, &end), CHUNK);
        for kv in &kvs {
            let Some(name) = lock_name(kv).filter(|name| name.starts_with(prefix)) else { continue };
            if listed.contains(name) {
                continue;
            }
            if locks.len() == limit {
                return Ok(Page { locks, next: Some(kv.key.clone()), revision: mvcc.revision() });
            }
            listed.insert(name.to_vec());
            locks.push(summary(mvcc, name, permits)?);
        }
        match kvs.last() {
            Some(last) if more => {
                at = last.key.clone();
                at.push(0);
            }
            _ => return Ok(Page { locks, next: None, revision: mvcc.revision() }),
        }
    }
}

/// Lock `name` as it is: its holders, and how many of its owner keys wait.
fn summary(mvcc: &MvccStore, name: &[u8], permits: usize) -> Result<Summary, MvccError> {
    let prefix = queue_prefix(name);
    let holders: Vec<Owner> = holders_now(mvcc, name, permits)?.into_iter().map(|kv| Owner::of(&prefix, kv)).collect();
    let owners = owner_keys(mvcc, name, None, usize::MAX);
    Ok(Summary { name: name.to_vec(), waiters: owners.saturating_sub(holders.len()), holders })
}

/// Whether lock `name` has an owner key before `before` in key order.
fn has_owner_key_before(mvcc: &MvccStore, name: &[u8], before: &[u8]) -> bool {
    owner_keys(mvcc, name, Some(before), 1) > 0
}

/// How many owner keys lock `name` has before `before` (anywhere: `None`),
/// counting up to `most`. Walks the keys directly under `name/` and jumps
/// over every directory under it (other locks' keys).
fn owner_keys(mvcc: &MvccStore, name: &[u8], before: Option<&[u8]>, most: usize) -> usize {
    let dir = queue_prefix(name);
    let mut end = prefix_end(&dir);
    if let Some(before) = before.filter(|before| *before < end.as_slice()) {
        end = before.to_vec();
    }
    let (mut at, mut count) = (dir.clone(), 0);
    loop {
        if at >= end {
            return count;
        }
        let (kvs, more) = mvcc.first_live(&KeyRange::new(&at, &end), CHUNK);
        let mut jump = None;
        for kv in &kvs {
            if let Some(slash) = kv.key[dir.len()..].iter().position(|&b| b == b'/') {
                // A directory under the lock's: skip all of it.
                jump = Some(prefix_end(&kv.key[..dir.len() + slash + 1]));
                break;
            }
            if lock_name(kv) == Some(name) {
                count += 1;
                if count >= most {
                    return count;
                }
            }
        }
        match (jump, kvs.last()) {
            (Some(jump), _) => at = jump,
            (None, Some(last)) if more => {
                at = last.key.clone();
                at.push(0);
            }
            _ => return count,
        }
    }
}

/// The lock an owner key belongs to: `<name>/<lease hex>` or
/// `<name>/read-<lease hex>`, attached to that very lease.
pub(super) fn lock_name(kv: &KeyValue) -> Option<&[u8]> {
    let name = super::lock_name_of(&kv.key)?;
    let last = &kv.key[name.len() + 1..];
    let owner = last.strip_prefix(super::READER).unwrap_or(last);
    (kv.lease != 0 && owner == format!("{:x}", kv.lease).as_bytes()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mvcc::{LeaseView, PutRequest, RequestOp, TxnRequest};

    struct EveryLease;
    impl LeaseView for EveryLease {
        fn lease_exists(&self, _id: i64) -> bool {
            true
        }
    }

    fn kv(key: &str, lease: i64) -> KeyValue {
        KeyValue { key: key.as_bytes().to_vec(), lease, ..Default::default() }
    }

    #[test]
    fn owner_keys_name_their_lock() {
        assert_eq!(lock_name(&kv("jobs/nightly/694d7", 0x694d7)), Some(&b"jobs/nightly"[..]));
        assert_eq!(lock_name(&kv("/1f", 0x1f)), Some(&b""[..]));
        assert_eq!(lock_name(&kv("jobs/read-694d7", 0x694d7)), Some(&b"jobs"[..]));
        // Hold counts are not owners.
        assert_eq!(lock_name(&kv("jobs/694d7.holds", 0x694d7)), None);
        // Not an owner key: no lease, another lease, or no slash.
        assert_eq!(lock_name(&kv("jobs/694d7", 0)), None);
        assert_eq!(lock_name(&kv("jobs/694d7", 0x694d8)), None);
        assert_eq!(lock_name(&kv("694d7", 0x694d7)), None);
    }

    /// Locks whose names are directories of one another, or sort apart
    /// from their keys (`a` and `a-b`), with hold counts and plain keys
    /// among them: at every page size and prefix, the pages list every lock
    /// with an owner key once, with its waiters counted, and no page holds
    /// more than its limit.
    #[test]
    fn pages_list_every_lock_once_whatever_their_names() {
        let mut s = MvccStore::default();
        let mut lease = 0x100;
        let mut owners: Vec<(&str, usize)> = Vec::new();
        let locks = [
            ("a", 3),
            ("a-b", 1),
            ("a/b", 2),
            ("a/b/c", 4),
            ("a/0", 1),
            ("jobs", 0),
            ("jobs/nightly", 2),
            ("jobs/nightly/x", 1),
            ("z", 5),
        ];
        for (name, n) in locks {
            for i in 0..n {
                lease += 1;
                let owner = if i == 1 { format!("{name}/read-{lease:x}") } else { format!("{name}/{lease:x}") };
                let mut ops =
                    vec![RequestOp::Put(PutRequest { key: owner.clone().into_bytes(), lease, ..Default::default() })];
                if i == 0 {
                    ops.push(RequestOp::Put(PutRequest {
                        key: format!("{owner}.holds").into_bytes(),
                        lease,
                        ..Default::default()
                    }));
                }
                s.txn(&TxnRequest { success: ops, ..Default::default() }, &EveryLease).unwrap();
            }
            owners.push((name, n));
        }
        for plain in ["a/plain", "a/b/plain/deep", "jobs/x", "jobs/nightly/y/z"] {
            let put = RequestOp::Put(PutRequest { key: plain.as_bytes().to_vec(), ..Default::default() });
            s.txn(&TxnRequest { success: vec![put], ..Default::default() }, &EveryLease).unwrap();
        }
        for prefix in ["", "a", "a/", "a/b", "jobs/n", "q"] {
            let mut expected: Vec<(String, usize)> = owners
                .iter()
                .filter(|(name, n)| *n > 0 && name.starts_with(prefix))
                .map(|(name, n)| (name.to_string(), *n))
                .collect();
            expected.sort();
            for limit in 1..=10 {
                let (mut seen, mut start) = (Vec::new(), Vec::new());
                loop {
                    let page = page(&s, prefix.as_bytes(), &start, limit, 1).unwrap();
                    assert!(page.locks.len() <= limit);
                    for lock in page.locks {
                        let name = String::from_utf8(lock.name).unwrap();
                        assert_eq!(lock.holders.len(), 1, "{name}: one permit, no delay: one holder");
                        seen.push((name, lock.waiters + lock.holders.len()));
                    }
                    match page.next {
                        Some(next) => start = next,
                        None => break,
                    }
                }
                seen.sort();
                assert_eq!(seen, expected, "prefix {prefix:?}, limit {limit}");
            }
        }
    }
}
