//! Lock events: `Observe(name)` streams a lock's holders and waiters, then
//! every change to them — a place queued, a place granted, a grant or place
//! ended (released by a request, or taken by its lease's end) — each with the
//! revision it happened at; resumable from a revision, as a watch is. A
//! holder learns from it that its grant ended without its asking, as soon as
//! its member applies the change that ended it.
//!
//! How: the lock's hub on this member (`super::event_hub`, one for all the
//! lock's streams) follows the changes under the lock's prefix
//! (`AppliedState::follow`, before it reads anything, so nothing slips
//! between), keeps a copy of the queue ([`Queue`], here), applies each
//! change to it and tells what the change did. Who holds is computed as the
//! lock's waiters compute it ([`holders_and_waiters`]), from the front of
//! the queue only.
//!
//! Causes: apply marks the revisions at which a lease's end deleted its keys
//! (`AppliedChanges::lease_ended`), so a live deletion is told exactly as
//! [`EventKind::LeaseEnded`] or [`EventKind::Released`] (any request: a
//! Release, an etcd Unlock, a delete, a waiter giving up). History keeps no
//! cause: a deletion replayed from it (a `start_revision` in the past) is
//! `Released` if its lease still exists when it is replayed, else
//! [`EventKind::Ended`] (either). So is every place that vanished while the
//! observer lost changes (its inbox overflowed or a snapshot replaced the
//! store), told at the revision it looked again.
//!
//! A member that has been without a leader for three election timeouts
//! (`Node::leaderless`, as a watch that requires a leader) ends its streams
//! with "etcdserver: no leader": it would learn of no end while cut off, and
//! the client picks the stream up from its last revision on another member.
//!
//! Caveats: a waiter's position is told when it queues; later positions
//! follow from the events (each place that ends ahead of a waiter moves it
//! up by one). Events are per member: a stream on a member that falls behind
//! tells changes when that member applies them. The first message holds
//! every place of the queue, so a queue of tens of thousands of places makes
//! it megabytes (over a client's usual 4 MiB limit near 40,000); and a
//! revision that changed the queue costs a semaphore's hub a walk of the
//! whole queue (a mutex's, only its front), once for all its streams.

use std::collections::{BTreeMap, HashSet};

use super::{classify, mode_of, Mode, QueueKey};
use crate::model::mvcc::{Change, KeyValue};

/// What happened to one place of a lock's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// In the first answer: it holds the lock.
    Holding,
    /// In the first answer: it waits, at `position`.
    Waiting,
    /// A place was queued behind the others, at `position`.
    Queued,
    /// A place holds the lock from this revision on.
    Granted,
    /// The place's key was deleted by a request.
    Released,
    /// The place's lease ended (expired or revoked), and its key with it.
    LeaseEnded,
    /// The place's key is gone, and how is not known (see the module doc).
    Ended,
    /// The lock is in a lock-delay from this revision on (in the first
    /// answer: it is in one); the event's owner is its marker, whose value
    /// is the delay in ms. Nobody is granted the lock until it ends.
    DelayStarted,
    /// The lock-delay ended: the next in line may be granted.
    DelayEnded,
}

/// One event of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockEvent {
    pub kind: EventKind,
    /// The place's key as it was (its create_revision is its token).
    pub owner: KeyValue,
    pub mode: Mode,
    pub revision: i64,
    /// For `Waiting` and `Queued`: how many waiters are ahead of it.
    pub position: usize,
    /// For the ends: whether the place held the lock when it ended.
    pub was_holding: bool,
}

/// A lock's queue as its hub keeps it: every place (hold counts left
/// out) by create revision, and which of them hold.
pub(super) struct Queue {
    prefix: Vec<u8>,
    permits: usize,
    places: BTreeMap<(i64, Vec<u8>), KeyValue>,
    holding: HashSet<Vec<u8>>,
    /// The lock's delay marker, while it is in a lock-delay.
    delay: Option<KeyValue>,
}

impl Queue {
    pub(super) fn new(prefix: Vec<u8>, permits: usize, kvs: Vec<KeyValue>) -> Queue {
        let mut queue = Queue { prefix, permits, places: BTreeMap::new(), holding: HashSet::new(), delay: None };
        for kv in kvs {
            if classify(&queue.prefix, &kv.key) == QueueKey::Delay {
                queue.delay = Some(kv);
            } else {
                queue.insert(kv);
            }
        }
        queue.holding = queue.holders().into_iter().collect();
        queue
    }

    fn is_place(&self, key: &[u8]) -> bool {
        key.starts_with(&self.prefix)
            && !matches!(classify(&self.prefix, key), QueueKey::HoldCount | QueueKey::DelaySetting | QueueKey::Delay)
    }

    fn is_marker(&self, key: &[u8]) -> bool {
        key.starts_with(&self.prefix) && classify(&self.prefix, key) == QueueKey::Delay
    }

    fn insert(&mut self, kv: KeyValue) {
        if self.is_place(&kv.key) {
            self.places.insert((kv.create_revision, kv.key.clone()), kv);
        }
    }

    /// The keys that hold, as [`super::holders_and_waiters`] decides (the
    /// same rules, tested against it below); with one permit it looks only
    /// at the front of the queue, up to the first waiter.
    fn holders(&self) -> Vec<Vec<u8>> {
        let (mut ahead, mut writers_ahead) = (0, 0);
        let mut holders = Vec::new();
        if self.delay.is_some() {
            // Nobody is granted a lock in a lock-delay.
            return holders;
        }
        for kv in self.places.values() {
            let holds = match classify(&self.prefix, &kv.key) {
                QueueKey::HoldCount | QueueKey::DelaySetting | QueueKey::Delay => continue,
                QueueKey::Shared => writers_ahead == 0,
                QueueKey::Exclusive => {
                    writers_ahead += 1;
                    ahead < self.permits
                }
            };
            ahead += 1;
            if holds {
                holders.push(kv.key.clone());
            } else if self.permits == 1 {
                // With one permit, every place behind a waiter waits too (a
                // writer has someone ahead; a reader, a writer ahead). With
                // more, a writer behind a waiting reader may still hold.
                break;
            }
        }
        holders
    }

    fn event(&self, kind: EventKind, kv: &KeyValue, revision: i64) -> LockEvent {
        LockEvent {
            kind,
            mode: mode_of(&self.prefix, &kv.key),
            owner: kv.clone(),
            revision,
            position: 0,
            was_holding: false,
        }
    }

    /// The queue as it is: its holders, then its waiters in order.
    pub(super) fn snapshot(&self, revision: i64) -> Vec<LockEvent> {
        let mut waiting = 0;
        let delay = self.delay.iter().map(|m| self.event(EventKind::DelayStarted, m, m.mod_revision));
        delay
            .chain(self.places.values().map(|kv| {
                if self.holding.contains(&kv.key) {
                    self.event(EventKind::Holding, kv, revision)
                } else {
                    waiting += 1;
                    LockEvent { position: waiting - 1, ..self.event(EventKind::Waiting, kv, revision) }
                }
            }))
            .collect()
    }

    /// Apply the changes of one revision; `ended` tells a deletion's kind.
    pub(super) fn apply_revision<'c>(
        &mut self,
        revision: i64,
        changes: impl Iterator<Item = &'c Change>,
        ended: &dyn Fn(&KeyValue) -> EventKind,
        out: &mut Vec<LockEvent>,
    ) {
        let mut created = Vec::new();
        let mut touched = false;
        for c in changes {
            if self.is_marker(&c.key) {
                touched = true;
                match &c.kv {
                    Some(marker) => {
                        self.delay = Some(marker.as_ref().clone());
                        out.push(self.event(EventKind::DelayStarted, marker, revision));
                    }
                    None => {
                        if let Some(marker) = self.delay.take() {
                            out.push(self.event(EventKind::DelayEnded, &marker, revision));
                        }
                    }
                }
                continue;
            }
            if !self.is_place(&c.key) {
                continue;
            }
            touched = true;
            match &c.kv {
                Some(kv) if kv.create_revision == c.revision => {
                    created.push((kv.create_revision, kv.key.clone()));
                    self.insert(kv.as_ref().clone());
                }
                // A place's value changed: keep it, nothing to tell.
                Some(kv) => {
                    if let Some(place) = self.places.get_mut(&(kv.create_revision, kv.key.clone())) {
                        *place = kv.as_ref().clone();
                    }
                }
                None => {
                    let Some(prev) = &c.prev else { continue };
                    if let Some(kv) = self.places.remove(&(prev.create_revision, prev.key.clone())) {
                        let was_holding = self.holding.remove(&kv.key);
                        out.push(LockEvent { was_holding, ..self.event(ended(&kv), &kv, revision) });
                    }
                }
            }
        }
        // A revision that changed no place changes nobody's turn.
        if touched {
            self.settle(revision, &created, out);
        }
    }

    /// After a revision's changes: tell the places that hold now and did
    /// not, and the new places that wait.
    fn settle(&mut self, revision: i64, created: &[(i64, Vec<u8>)], out: &mut Vec<LockEvent>) {
        let holders = self.holders();
        for key in &holders {
            if !self.holding.contains(key) {
                if let Some(kv) = self.places.values().find(|kv| &kv.key == key) {
                    out.push(self.event(EventKind::Granted, kv, revision));
                }
            }
        }
        self.holding = holders.into_iter().collect();
        // New places are the last of the queue (the highest create
        // revision), so the waiting ones among them are its last waiters.
        let waiting: Vec<&KeyValue> = created
            .iter()
            .filter_map(|place| self.places.get(place))
            .filter(|kv| !self.holding.contains(&kv.key))
            .collect();
        let waiters = self.places.len() - self.holding.len();
        for (i, kv) in waiting.iter().enumerate() {
            let position = waiters - waiting.len() + i;
            out.push(LockEvent { position, ..self.event(EventKind::Queued, kv, revision) });
        }
    }

    /// Changes were lost: take the queue as it is now (read at `revision`),
    /// telling the places that went (as [`EventKind::Ended`]) and came.
    pub(super) fn resync(&mut self, kvs: Vec<KeyValue>, revision: i64, out: &mut Vec<LockEvent>) {
        let marker = kvs.iter().find(|kv| self.is_marker(&kv.key)).cloned();
        match (self.delay.take(), &marker) {
            (None, Some(m)) => out.push(self.event(EventKind::DelayStarted, m, revision)),
            (Some(old), None) => out.push(self.event(EventKind::DelayEnded, &old, revision)),
            (Some(old), Some(m)) if old.mod_revision != m.mod_revision => {
                out.push(self.event(EventKind::DelayStarted, m, revision))
            }
            _ => {}
        }
        self.delay = marker;
        let fresh: BTreeMap<(i64, Vec<u8>), KeyValue> = kvs
            .into_iter()
            .filter(|kv| self.is_place(&kv.key))
            .map(|kv| ((kv.create_revision, kv.key.clone()), kv))
            .collect();
        let gone: Vec<_> = self.places.keys().filter(|k| !fresh.contains_key(*k)).cloned().collect();
        for place in gone {
            let kv = self.places.remove(&place).expect("listed above");
            let was_holding = self.holding.remove(&kv.key);
            out.push(LockEvent { was_holding, ..self.event(EventKind::Ended, &kv, revision) });
        }
        let created: Vec<_> = fresh.keys().filter(|k| !self.places.contains_key(*k)).cloned().collect();
        self.places = fresh;
        self.settle(revision, &created, out);
    }
}

/// Changes grouped by revision, in order.
pub(super) fn by_revision(changes: &[Change]) -> Vec<(i64, &[Change])> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < changes.len() {
        let revision = changes[start].revision;
        let end = changes[start..].iter().position(|c| c.revision != revision).map_or(changes.len(), |n| start + n);
        groups.push((revision, &changes[start..end]));
        start = end;
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn kv(key: &str, create_revision: i64, lease: i64) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision,
            mod_revision: create_revision,
            version: 1,
            lease,
            ..Default::default()
        }
    }

    fn put(kv: &KeyValue) -> Change {
        Change { revision: kv.create_revision, sub: 0, key: kv.key.clone(), kv: Some(Arc::new(kv.clone())), prev: None }
    }

    fn delete(kv: &KeyValue, revision: i64) -> Change {
        Change { revision, sub: 0, key: kv.key.clone(), kv: None, prev: Some(Arc::new(kv.clone())) }
    }

    fn kinds(events: &[LockEvent]) -> Vec<(EventKind, String, usize)> {
        events.iter().map(|e| (e.kind, String::from_utf8_lossy(&e.owner.key).into_owned(), e.position)).collect()
    }

    fn released(_: &KeyValue) -> EventKind {
        EventKind::Released
    }

    #[test]
    fn a_mutex_queue_tells_grants_waits_and_ends_in_order() {
        let (a, b, c) = (kv("m/a", 2, 0xa), kv("m/b", 3, 0xb), kv("m/c", 4, 0xc));
        let mut q = Queue::new(b"m/".to_vec(), 1, vec![a.clone(), b.clone()]);
        use EventKind::*;
        assert_eq!(kinds(&q.snapshot(3)), [(Holding, "m/a".into(), 0), (Waiting, "m/b".into(), 0)]);
        let mut out = Vec::new();
        q.apply_revision(4, [put(&c)].iter(), &released, &mut out);
        assert_eq!(kinds(&out), [(Queued, "m/c".into(), 1)]);
        // The holder's lease ends: its end, then the next in line's grant.
        let mut out = Vec::new();
        q.apply_revision(5, [delete(&a, 5)].iter(), &|_| LeaseEnded, &mut out);
        assert_eq!(kinds(&out), [(LeaseEnded, "m/a".into(), 0), (Granted, "m/b".into(), 0)]);
        assert!(out[0].was_holding && out[0].revision == 5);
        // A waiter gives up: no grant.
        let mut out = Vec::new();
        q.apply_revision(6, [delete(&c, 6)].iter(), &released, &mut out);
        assert_eq!(kinds(&out), [(Released, "m/c".into(), 0)]);
        assert!(!out[0].was_holding);
        // Hold counts and keys of other locks tell nothing.
        let mut out = Vec::new();
        let count = kv("m/b.holds", 7, 0xb);
        q.apply_revision(7, [put(&count), put(&kv("n/x", 7, 1))].iter(), &released, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn readers_are_granted_together_and_a_resync_tells_what_went() {
        use EventKind::*;
        let (r1, w, r2) = (kv("l/read-1", 2, 1), kv("l/2", 3, 2), kv("l/read-3", 4, 3));
        let mut q = Queue::new(b"l/".to_vec(), 1, vec![r1.clone(), w.clone()]);
        let mut out = Vec::new();
        q.apply_revision(4, [put(&r2)].iter(), &released, &mut out);
        assert_eq!(kinds(&out), [(Queued, "l/read-3".into(), 1)], "a reader behind a writer waits");
        // Lost changes: the reader and writer went; the last reader holds.
        let mut out = Vec::new();
        q.resync(vec![r2.clone()], 9, &mut out);
        assert_eq!(
            kinds(&out),
            [(Ended, "l/read-1".into(), 0), (Ended, "l/2".into(), 0), (Granted, "l/read-3".into(), 0)]
        );
        assert!(out[0].was_holding && !out[1].was_holding);
    }

    #[test]
    fn a_semaphore_grants_up_to_its_permits() {
        use EventKind::*;
        let mut q = Queue::new(b"s/".to_vec(), 2, Vec::new());
        let places: Vec<_> = (1..=3).map(|i| kv(&format!("s/{i}"), i + 1, i)).collect();
        let mut out = Vec::new();
        q.apply_revision(4, places.iter().map(put).collect::<Vec<_>>().iter(), &released, &mut out);
        assert_eq!(kinds(&out), [(Granted, "s/1".into(), 0), (Granted, "s/2".into(), 0), (Queued, "s/3".into(), 0)]);
        assert_eq!(by_revision(&[put(&places[0]), put(&places[1])]).len(), 2);
    }

    #[test]
    fn a_lock_delay_holds_back_the_next_grant_until_it_ends() {
        use EventKind::*;
        let (a, b) = (kv("m/a", 2, 0xa), kv("m/b", 3, 0xb));
        let setting = kv("m/a.delay", 4, 0xa);
        let mut q = Queue::new(b"m/".to_vec(), 1, vec![a.clone(), b.clone(), setting.clone()]);
        assert_eq!(kinds(&q.snapshot(4)), [(Holding, "m/a".into(), 0), (Waiting, "m/b".into(), 0)]);
        // The holder's lease ends: its key and setting go, the marker comes; nobody is granted.
        let marker = KeyValue { value: b"1500".to_vec(), ..kv("m/.lock-delay", 5, 0) };
        let mut out = Vec::new();
        let changes = [delete(&a, 5), delete(&setting, 5), Change { sub: 2, ..put(&marker) }];
        q.apply_revision(5, changes.iter(), &|_| LeaseEnded, &mut out);
        assert_eq!(kinds(&out), [(LeaseEnded, "m/a".into(), 0), (DelayStarted, "m/.lock-delay".into(), 0)]);
        assert_eq!(kinds(&q.snapshot(5))[0].0, DelayStarted);
        // The delay ends: the next in line is granted.
        let mut out = Vec::new();
        q.apply_revision(6, [delete(&marker, 6)].iter(), &released, &mut out);
        assert_eq!(kinds(&out), [(DelayEnded, "m/.lock-delay".into(), 0), (Granted, "m/b".into(), 0)]);
    }

    #[test]
    fn holders_are_those_the_waiters_see() {
        let queues = [
            vec![kv("q/read-1", 1, 1), kv("q/read-2", 2, 2), kv("q/3", 3, 3), kv("q/read-4", 4, 4)],
            vec![kv("q/1", 1, 1), kv("q/1.holds", 2, 1), kv("q/read-2", 3, 2), kv("q/3", 4, 3)],
            vec![kv("q/1", 1, 1), kv("q/2", 2, 2), kv("q/read-3", 3, 3), kv("q/x/y", 4, 4)],
            vec![kv("q/1", 1, 1), kv("q/1.delay", 2, 1), kv("q/2", 3, 2)],
            vec![kv("q/1", 1, 1), kv("q/.lock-delay", 2, 0), kv("q/2", 3, 2)],
        ];
        for queue in queues {
            for permits in 1..=3 {
                let ours = Queue::new(b"q/".to_vec(), permits, queue.clone()).holders();
                let theirs: Vec<Vec<u8>> = super::super::holders_and_waiters(b"q/", queue.clone(), permits)
                    .0
                    .into_iter()
                    .map(|kv| kv.key)
                    .collect();
                assert_eq!(ours, theirs, "permits {permits}");
            }
        }
    }
}
