//! What a watcher wants, and the events it gets: the deterministic half of
//! watches (no tokio, no tonic). `crate::api::watch` runs the streams.
//!
//! A watcher names a key range, the revision it needs next, filters (no puts,
//! no deletes) and whether it wants each event's previous value. It receives
//! every change in its range once, in revision order: [`Watcher::take`] picks
//! the changes of history read to catch up that it has not seen yet and
//! moves its position past them; [`Watcher::event`] turns one change of an
//! applied batch into its event, given its position (which its session may
//! know to be past `next_revision`).
//!
//! Invariant: `next_revision` only grows; a change with a revision below a
//! watcher's position is never delivered again.

use std::sync::Arc;

use crate::model::mvcc::{Change, KeyRange, KeyValue, Revision};

/// One event as a watcher receives it. Its key-values are shared with the
/// change it comes from (many watchers may take the same change).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub revision: Revision,
    /// `None` for a deletion; then `key` names the key.
    pub kv: Option<Arc<KeyValue>>,
    pub key: Vec<u8>,
    pub prev_kv: Option<Arc<KeyValue>>,
}

impl Event {
    /// Bytes this event adds to a response (for fragmenting; an estimate).
    pub fn size(&self) -> usize {
        let kv = |kv: &Option<Arc<KeyValue>>| kv.as_ref().map_or(0, |kv| kv.key.len() + kv.value.len() + 48);
        self.key.len() + kv(&self.kv) + kv(&self.prev_kv) + 16
    }
}

#[derive(Clone, Debug)]
pub struct Watcher {
    pub id: i64,
    pub range: KeyRange,
    /// The next revision this watcher has not seen.
    pub next_revision: Revision,
    pub no_put: bool,
    pub no_delete: bool,
    pub prev_kv: bool,
    pub progress_notify: bool,
    pub fragment: bool,
}

impl Watcher {
    /// The changes in `changes` (revision order) this watcher has not seen,
    /// as events; its position moves to just after `through`, the revision the
    /// caller has now covered.
    pub fn take(&mut self, changes: &[Change], through: Revision) -> Vec<Event> {
        let from = self.next_revision;
        let events = changes.iter().filter(|c| c.revision <= through).filter_map(|c| self.event(c, from)).collect();
        self.next_revision = self.next_revision.max(through + 1);
        events
    }

    /// `change` as this watcher's event, if it is in its range, passes its
    /// filters and is at or after `from` (its position, which a caller that
    /// knows more than `next_revision` may have moved on).
    pub fn event(&self, c: &Change, from: Revision) -> Option<Event> {
        if c.revision < from || !self.range.contains(&c.key) {
            return None;
        }
        if if c.kv.is_some() { self.no_put } else { self.no_delete } {
            return None;
        }
        Some(Event {
            revision: c.revision,
            kv: c.kv.clone(),
            key: c.key.clone(),
            prev_kv: if self.prev_kv { c.prev.clone() } else { None },
        })
    }
}

/// Split events into responses of at most `max_bytes` each (a single event
/// larger than that travels alone). Events of one revision may be split.
pub fn fragments(events: Vec<Event>, max_bytes: usize) -> Vec<Vec<Event>> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    let mut size = 0;
    for e in events {
        let s = e.size();
        if !current.is_empty() && size + s > max_bytes {
            out.push(std::mem::take(&mut current));
            size = 0;
        }
        size += s;
        current.push(e);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Group events by revision, keeping order.
pub fn by_revision(events: Vec<Event>) -> Vec<(Revision, Vec<Event>)> {
    let mut out: Vec<(Revision, Vec<Event>)> = Vec::new();
    for e in events {
        match out.last_mut() {
            Some((r, group)) if *r == e.revision => group.push(e),
            _ => out.push((e.revision, vec![e])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(rev: Revision, key: &str, put: bool) -> Change {
        let kv = Arc::new(KeyValue { key: key.into(), mod_revision: rev, ..Default::default() });
        Change { revision: rev, sub: 0, key: key.into(), kv: put.then(|| kv.clone()), prev: Some(kv) }
    }

    fn watcher(range: KeyRange, next: Revision) -> Watcher {
        Watcher {
            id: 0,
            range,
            next_revision: next,
            no_put: false,
            no_delete: false,
            prev_kv: false,
            progress_notify: false,
            fragment: false,
        }
    }

    #[test]
    fn each_change_once_in_range_and_filtered() {
        let changes = vec![change(5, "a", true), change(6, "b", true), change(7, "a", false), change(8, "c", true)];
        let mut w = watcher(KeyRange::new(b"a", b"c"), 6);
        let got: Vec<_> = w.take(&changes, 7).iter().map(|e| (e.revision, e.key.clone())).collect();
        assert_eq!(got, vec![(6, b"b".to_vec()), (7, b"a".to_vec())]);
        assert_eq!(w.next_revision, 8);
        assert!(w.take(&changes, 8).is_empty(), "seen changes are not delivered again");
        let mut no_delete = Watcher { no_delete: true, ..watcher(KeyRange::new(b"a", b""), 0) };
        assert_eq!(no_delete.take(&changes, 8).len(), 1);
        assert!(no_delete.take(&changes, 8).is_empty());
    }

    #[test]
    fn fragments_respect_the_size_limit() {
        let events: Vec<Event> =
            (0..10).map(|i| Event { revision: i, kv: None, key: vec![b'k'; 100], prev_kv: None }).collect();
        let parts = fragments(events, 300);
        assert!(parts.len() > 3);
        assert!(parts.iter().all(|p| p.iter().map(Event::size).sum::<usize>() <= 300));
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 10);
    }
}
