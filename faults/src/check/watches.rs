//! Watch guarantees, judged for one stream against a replay of the keyspace.
//!
//! After the run the harness replays every event on the stream's prefix from
//! the stream's start revision (a fresh watch from that revision on a healed
//! cluster) and passes it as the reference. Against it, the stream must be:
//! - ordered: event revisions never decrease, across reconnects too;
//! - unique: no (revision, key) is delivered twice;
//! - atomic: the events of one revision arrive in one message;
//! - reliable: the events delivered are exactly the reference's from the start
//!   revision up to the highest revision the stream reached — the highest
//!   delivered, or the highest a progress notification reported — with no gap
//!   and identical kind and key-value fields;
//! - prev_kv-correct, when requested: each event's `prev_kv` is the key's
//!   previous version in the reference, or absent if the key did not exist;
//!   when the reference starts after that version, the fields implied by the
//!   event itself (key, create revision, version, an earlier mod revision)
//!   are checked;
//! - progress-honouring: after a progress notification at revision R, no event
//!   at a revision <= R arrives.
//!
//! A `Canceled` message ends the stream: what came before it is checked,
//! anything recorded after it is ignored. A `Reconnected` message marks the
//! client re-opening the stream; it must resume at one past the highest
//! revision it had seen (delivered or reported by progress), or a gap or
//! duplicates show.
//!
//! Caveats: `start_revision` must be the revision the watch really started
//! at (for a watch created "from now", the creation header's revision + 1),
//! or events before it read as lost. Losses after the last delivered event
//! show only if a progress notification reported a later revision, so the
//! harness should request progress at the end of the run. The reference's
//! own `prev_kv` is not used.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::format_time;
use crate::history::{Anomaly, Time};

const CHECKER: &str = "watches";

/// How many events of one gap an anomaly lists.
const GAP_EVENTS_SHOWN: usize = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: EventKind,
    /// For a delete: `key` and `mod_revision` (the delete's revision) set, the
    /// rest zero, as etcd sends.
    pub kv: KeyValue,
    pub prev_kv: Option<KeyValue>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchMessage {
    Events {
        /// The response header's revision.
        revision: i64,
        events: Vec<WatchEvent>,
        received: Time,
    },
    Progress {
        revision: i64,
        received: Time,
    },
    /// The stream broke and the client re-opened it from `from_revision`.
    Reconnected {
        from_revision: i64,
        received: Time,
    },
    Canceled {
        reason: String,
        compact_revision: i64,
        received: Time,
    },
}

/// Everything one watch stream received, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchStream {
    pub name: String,
    pub prefix: Vec<u8>,
    pub start_revision: i64,
    /// Whether the watch asked for `prev_kv`.
    pub prev_kv: bool,
    pub messages: Vec<WatchMessage>,
}

/// One event as the stream first delivered it.
struct Delivery<'a> {
    event: &'a WatchEvent,
    /// Index of the message that carried it.
    message: usize,
    received: Time,
}

/// A delivered event's identity: its revision and key.
type EventId<'a> = (i64, &'a [u8]);

/// What a stream delivered, each event once, in order of arrival.
struct Received<'a> {
    first_delivery: HashMap<EventId<'a>, Delivery<'a>>,
    in_order: Vec<EventId<'a>>,
    /// The highest revision a progress notification reported.
    progress: Option<i64>,
}

/// Checks one stream against the reference replay; see the module documentation.
pub fn check_watch(stream: &WatchStream, reference: &[WatchEvent]) -> Vec<Anomaly> {
    let mut problems = Vec::new();
    let received = receive(stream, &mut problems);
    check_contents(stream, reference, &received, &mut problems);
    check_no_gaps(stream, reference, &received, &mut problems);
    problems.into_iter().map(|what| Anomaly::new(CHECKER, &stream.name, what)).collect()
}

/// Replays the stream as the client saw it, checking order, uniqueness,
/// atomicity and progress on the way.
fn receive<'a>(stream: &'a WatchStream, problems: &mut Vec<String>) -> Received<'a> {
    let mut received = Received { first_delivery: HashMap::new(), in_order: Vec::new(), progress: None };
    let mut progress_at: Time = 0;
    let mut previous: Option<(i64, Time)> = None;
    let mut reconnected: Option<(i64, Time)> = None;
    let mut split_revisions = HashSet::new();
    let mut message_of_revision: HashMap<i64, (usize, Time)> = HashMap::new();
    for (number, message) in stream.messages.iter().enumerate() {
        let (events, at) = match message {
            WatchMessage::Canceled { .. } => break,
            WatchMessage::Reconnected { from_revision, received } => {
                reconnected = Some((*from_revision, *received));
                continue;
            }
            WatchMessage::Progress { revision, received: at } => {
                if received.progress.is_none_or(|highest| *revision > highest) {
                    (received.progress, progress_at) = (Some(*revision), *at);
                }
                continue;
            }
            WatchMessage::Events { events, received, .. } => (events, *received),
        };
        for event in events {
            let revision = event.kv.mod_revision;
            let id = (revision, event.kv.key.as_slice());
            if let Some(first) = received.first_delivery.get(&id) {
                let after_reconnect = match reconnected {
                    Some((from, when)) => {
                        format!(" (the stream was re-opened from revision {from} at {})", format_time(when))
                    }
                    None => String::new(),
                };
                problems.push(format!(
                    "duplicate: {} was delivered at {} and again at {}{after_reconnect}",
                    describe_event(event),
                    format_time(first.received),
                    format_time(at)
                ));
                continue;
            }
            if let Some((previous_revision, previous_at)) = previous.filter(|&(last, _)| revision < last) {
                problems.push(format!(
                    "out of order: {} arrived at {} after an event at revision {previous_revision} (at {})",
                    describe_event(event),
                    format_time(at),
                    format_time(previous_at)
                ));
            }
            if let Some(reported) = received.progress.filter(|&reported| revision <= reported) {
                problems.push(format!(
                    "progress broken: {} arrived at {}, after a progress notification at {} said every event up to \
                     revision {reported} had been sent",
                    describe_event(event),
                    format_time(at),
                    format_time(progress_at)
                ));
            }
            let (first_message, first_at) = *message_of_revision.entry(revision).or_insert((number, at));
            if first_message != number && split_revisions.insert(revision) {
                problems.push(format!(
                    "not atomic: the events of revision {revision} arrived in separate messages, at {} and at {} ({})",
                    format_time(first_at),
                    format_time(at),
                    describe_event(event)
                ));
            }
            previous = Some((revision, at));
            received.first_delivery.insert(id, Delivery { event, message: number, received: at });
            received.in_order.push(id);
        }
    }
    received
}

/// Each delivered event must be in the reference, identical, with the right
/// `prev_kv` when it was requested.
fn check_contents(stream: &WatchStream, reference: &[WatchEvent], received: &Received, problems: &mut Vec<String>) {
    let reference_index: HashMap<EventId, usize> = reference
        .iter()
        .enumerate()
        .map(|(index, event)| ((event.kv.mod_revision, event.kv.key.as_slice()), index))
        .collect();
    let mut last_of_key: HashMap<&[u8], usize> = HashMap::new();
    let previous_of_key: Vec<Option<usize>> =
        reference.iter().enumerate().map(|(index, event)| last_of_key.insert(&event.kv.key, index)).collect();

    for id in &received.in_order {
        let Some(delivery) = received.first_delivery.get(id) else { continue };
        let (event, at) = (delivery.event, format_time(delivery.received));
        if id.0 < stream.start_revision {
            problems.push(format!(
                "too early: {} was delivered at {at}, but the watch started at revision {}",
                describe_event(event),
                stream.start_revision
            ));
            continue;
        }
        let Some(&index) = reference_index.get(id) else {
            let why = if event.kv.key.starts_with(&stream.prefix) {
                "the replay has no such event"
            } else {
                "its key lies outside the watched prefix"
            };
            problems.push(format!("phantom: {} was delivered at {at}, but {why}", describe_event(event)));
            continue;
        };
        let expected = &reference[index];
        if expected.kind != event.kind || expected.kv != event.kv {
            problems.push(format!(
                "altered: {} was delivered at {at} as {:?} {}, but the replay has {:?} {}",
                describe_event(event),
                event.kind,
                describe_kv(&event.kv),
                expected.kind,
                describe_kv(&expected.kv)
            ));
        }
        if stream.prev_kv {
            if let Some(problem) = prev_kv_problem(event, previous_of_key[index].map(|previous| &reference[previous])) {
                problems.push(format!("wrong prev_kv: {} (delivered at {at}) {problem}", describe_event(event)));
            }
        }
    }
}

/// Every reference event from the start revision up to the highest revision
/// the stream reached must have been delivered; each run of missing ones is
/// one problem.
fn check_no_gaps(stream: &WatchStream, reference: &[WatchEvent], received: &Received, problems: &mut Vec<String>) {
    let highest_delivered = received.in_order.iter().map(|&(revision, _)| revision).max();
    let Some(horizon) = highest_delivered.max(received.progress) else { return };
    let mut gap: Vec<&WatchEvent> = Vec::new();
    let mut delivered_before_gap = None;
    for event in reference.iter().filter(|event| (stream.start_revision..=horizon).contains(&event.kv.mod_revision)) {
        match received.first_delivery.get(&(event.kv.mod_revision, event.kv.key.as_slice())) {
            None => gap.push(event),
            Some(delivery) => {
                if !gap.is_empty() {
                    problems.push(describe_gap(&gap, delivered_before_gap, Some(delivery), horizon));
                    gap.clear();
                }
                delivered_before_gap = Some(delivery);
            }
        }
    }
    if !gap.is_empty() {
        problems.push(describe_gap(&gap, delivered_before_gap, None, horizon));
    }
}

/// What is wrong with `event.prev_kv`, given the key's previous event in the
/// reference (`None` if the reference starts after it).
fn prev_kv_problem(event: &WatchEvent, previous: Option<&WatchEvent>) -> Option<String> {
    let got = event.prev_kv.as_ref();
    let got_text = || got.map_or("none".to_string(), describe_kv);
    match previous {
        Some(previous) => {
            let expected = (previous.kind == EventKind::Put).then_some(&previous.kv);
            (got != expected).then(|| {
                let expected_text = expected.map_or("none (the key had been deleted)".to_string(), describe_kv);
                format!("carries {}, but the key's previous version was {expected_text}", got_text())
            })
        }
        None if event.kind == EventKind::Put && event.kv.version == 1 => {
            got.map(|got| format!("carries {}, but the event created the key", describe_kv(got)))
        }
        None => {
            let Some(got) = got else {
                return Some("carries none, but the key existed before this event".to_string());
            };
            let revision = event.kv.mod_revision;
            let consistent = got.key == event.kv.key
                && got.mod_revision < revision
                && (event.kind == EventKind::Delete
                    || (got.create_revision == event.kv.create_revision && got.version == event.kv.version - 1));
            (!consistent).then(|| {
                format!(
                    "carries {}, which cannot be the version before it (same key and create revision, version one \
                     less, an earlier mod revision)",
                    describe_kv(got)
                )
            })
        }
    }
}

fn describe_gap(gap: &[&WatchEvent], before: Option<&Delivery>, after: Option<&Delivery>, horizon: i64) -> String {
    let shown: Vec<String> = gap.iter().take(GAP_EVENTS_SHOWN).map(|event| describe_event(event)).collect();
    let more = if gap.len() > GAP_EVENTS_SHOWN {
        format!(" and {} more", gap.len() - GAP_EVENTS_SHOWN)
    } else {
        String::new()
    };
    let around = |delivery: Option<&Delivery>, side: &str| match delivery {
        Some(delivery) => format!(
            "{side} revision {} (message {}, received {})",
            delivery.event.kv.mod_revision,
            delivery.message,
            format_time(delivery.received)
        ),
        None => format!("{side} nothing"),
    };
    format!(
        "lost {} event(s): {}{more} never arrived, though the stream reached revision {horizon}; delivered {}, {}",
        gap.len(),
        shown.join(", "),
        around(before, "just before:"),
        around(after, "just after:")
    )
}

fn describe_event(event: &WatchEvent) -> String {
    let kind = match event.kind {
        EventKind::Put => "PUT",
        EventKind::Delete => "DELETE",
    };
    format!("the {kind} of {} at revision {}", show_bytes(&event.kv.key), event.kv.mod_revision)
}

fn describe_kv(kv: &KeyValue) -> String {
    format!(
        "{}={} (create {}, mod {}, version {})",
        show_bytes(&kv.key),
        show_bytes(&kv.value),
        kv.create_revision,
        kv.mod_revision,
        kv.version
    )
}

/// Keys and values as quoted text, escaped where they are not.
fn show_bytes(bytes: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, create_revision: i64, mod_revision: i64, version: i64) -> KeyValue {
        KeyValue { key: key.into(), value: value.into(), create_revision, mod_revision, version }
    }

    fn put(key: &str, value: &str, create_revision: i64, mod_revision: i64, version: i64) -> WatchEvent {
        WatchEvent { kind: EventKind::Put, kv: kv(key, value, create_revision, mod_revision, version), prev_kv: None }
    }

    fn delete(key: &str, revision: i64) -> WatchEvent {
        WatchEvent { kind: EventKind::Delete, kv: kv(key, "", 0, revision, 0), prev_kv: None }
    }

    fn with_prev(event: WatchEvent, prev_kv: Option<KeyValue>) -> WatchEvent {
        WatchEvent { prev_kv, ..event }
    }

    /// r2: put a; r3: put a and put b in one txn; r4: delete a; r5: put a
    /// again; r6: put b.
    fn reference() -> Vec<WatchEvent> {
        vec![
            put("p/a", "1", 2, 2, 1),
            put("p/a", "2", 2, 3, 2),
            put("p/b", "1", 3, 3, 1),
            delete("p/a", 4),
            put("p/a", "3", 5, 5, 1),
            put("p/b", "2", 3, 6, 2),
        ]
    }

    /// The reference's events with the prev_kv a watch should attach.
    fn delivered() -> Vec<WatchEvent> {
        let [r2, r3a, r3b, r4, r5, r6]: [WatchEvent; 6] = reference().try_into().expect("six events");
        vec![
            r2.clone(),
            with_prev(r3a.clone(), Some(r2.kv.clone())),
            r3b.clone(),
            with_prev(r4, Some(r3a.kv.clone())),
            r5,
            with_prev(r6, Some(r3b.kv.clone())),
        ]
    }

    fn events(revision: i64, events: Vec<WatchEvent>, received: Time) -> WatchMessage {
        WatchMessage::Events { revision, events, received }
    }

    fn progress(revision: i64, received: Time) -> WatchMessage {
        WatchMessage::Progress { revision, received }
    }

    fn stream(messages: Vec<WatchMessage>) -> WatchStream {
        WatchStream { name: "watch-1".into(), prefix: "p/".into(), start_revision: 2, prev_kv: true, messages }
    }

    /// A clean stream: one message per revision, a progress notification, a
    /// reconnect that resumes at the next revision.
    fn clean_messages() -> Vec<WatchMessage> {
        let d = delivered();
        vec![
            events(2, vec![d[0].clone()], 10),
            events(3, vec![d[1].clone(), d[2].clone()], 20),
            progress(3, 25),
            events(4, vec![d[3].clone()], 30),
            WatchMessage::Reconnected { from_revision: 5, received: 40 },
            events(5, vec![d[4].clone()], 50),
            progress(5, 55),
            events(7, vec![d[5].clone()], 60),
            progress(7, 70),
        ]
    }

    fn only(anomalies: Vec<Anomaly>) -> Anomaly {
        assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
        let anomaly = anomalies.into_iter().next().expect("one anomaly");
        assert_eq!((anomaly.checker.as_str(), anomaly.subject.as_str()), ("watches", "watch-1"));
        anomaly
    }

    #[test]
    fn a_clean_stream_with_reconnects_passes() {
        assert_eq!(check_watch(&stream(clean_messages()), &reference()), vec![]);
        // Without prev_kv requested and none sent.
        let bare: Vec<WatchMessage> = clean_messages()
            .into_iter()
            .map(|message| match message {
                WatchMessage::Events { revision, events, received } => WatchMessage::Events {
                    revision,
                    events: events.into_iter().map(|event| with_prev(event, None)).collect(),
                    received,
                },
                other => other,
            })
            .collect();
        assert_eq!(check_watch(&WatchStream { prev_kv: false, ..stream(bare) }, &reference()), vec![]);
    }

    #[test]
    fn a_stream_that_starts_mid_history_passes() {
        let d = delivered();
        let late = WatchStream {
            start_revision: 3,
            ..stream(vec![events(3, vec![d[1].clone(), d[2].clone()], 20), events(4, vec![d[3].clone()], 30)])
        };
        assert_eq!(check_watch(&late, &reference()[1..]), vec![]);
    }

    #[test]
    fn events_out_of_order() {
        let d = delivered();
        let messages = vec![events(3, vec![d[1].clone(), d[2].clone()], 20), events(3, vec![d[0].clone()], 30)];
        let anomaly = only(check_watch(&stream(messages), &reference()));
        assert!(anomaly.what.starts_with("out of order: the PUT of \"p/a\" at revision 2 arrived at"), "{anomaly}");
    }

    #[test]
    fn duplicate_after_a_careless_reconnect() {
        let mut messages = clean_messages();
        messages.insert(5, events(4, vec![delivered()[3].clone()], 45));
        messages[4] = WatchMessage::Reconnected { from_revision: 4, received: 40 };
        let anomaly = only(check_watch(&stream(messages), &reference()));
        assert!(anomaly.what.starts_with("duplicate: the DELETE of \"p/a\" at revision 4"), "{anomaly}");
        assert!(anomaly.what.contains("re-opened from revision 4"), "{anomaly}");
    }

    #[test]
    fn a_revision_split_across_messages() {
        let d = delivered();
        let messages = vec![
            events(2, vec![d[0].clone()], 10),
            events(3, vec![d[1].clone()], 20),
            events(3, vec![d[2].clone()], 21),
        ];
        let anomaly = only(check_watch(&stream(messages), &reference()));
        assert!(anomaly.what.starts_with("not atomic: the events of revision 3 arrived in separate messages"));
    }

    #[test]
    fn a_gap() {
        let mut messages = clean_messages();
        messages.remove(3);
        let anomaly = only(check_watch(&stream(messages), &reference()));
        assert!(anomaly.what.starts_with("lost 1 event(s): the DELETE of \"p/a\" at revision 4 never arrived"));
        assert!(anomaly.what.contains("just before: revision 3") && anomaly.what.contains("just after: revision 5"));
    }

    #[test]
    fn a_lost_tail_shows_through_progress() {
        let mut messages = clean_messages();
        messages.remove(7);
        let anomaly = only(check_watch(&stream(messages), &reference()));
        assert!(anomaly.what.contains("the PUT of \"p/b\" at revision 6 never arrived"), "{anomaly}");
        assert!(anomaly.what.contains("reached revision 7") && anomaly.what.contains("just after: nothing"));
    }

    #[test]
    fn altered_and_phantom_events() {
        let mut messages = clean_messages();
        if let WatchMessage::Events { events, .. } = &mut messages[5] {
            events[0].kv.value = b"tampered".to_vec();
        }
        messages.push(events(8, vec![put("p/c", "1", 8, 8, 1), put("q/x", "1", 8, 8, 1)], 80));
        let anomalies = check_watch(&stream(messages), &reference());
        assert_eq!(anomalies.len(), 3, "{anomalies:#?}");
        assert!(anomalies[0].what.starts_with("altered: the PUT of \"p/a\" at revision 5"), "{}", anomalies[0]);
        assert!(anomalies[0].what.contains("\"p/a\"=\"tampered\"") && anomalies[0].what.contains("\"p/a\"=\"3\""));
        assert!(anomalies[1].what.contains("the replay has no such event"), "{}", anomalies[1]);
        assert!(anomalies[2].what.contains("outside the watched prefix"), "{}", anomalies[2]);
    }

    #[test]
    fn an_event_before_the_start_revision() {
        let d = delivered();
        let late = WatchStream { start_revision: 3, ..stream(vec![events(3, d[..3].to_vec(), 20)]) };
        let anomaly = only(check_watch(&late, &reference()));
        assert!(anomaly.what.starts_with("too early: the PUT of \"p/a\" at revision 2"), "{anomaly}");
    }

    #[test]
    fn wrong_prev_kv() {
        let mut messages = clean_messages();
        if let WatchMessage::Events { events, .. } = &mut messages[1] {
            events[0].prev_kv = None;
        }
        if let WatchMessage::Events { events, .. } = &mut messages[5] {
            events[0].prev_kv = Some(kv("p/a", "2", 2, 3, 2));
        }
        let anomalies = check_watch(&stream(messages), &reference());
        assert_eq!(anomalies.len(), 2, "{anomalies:#?}");
        assert!(anomalies[0].what.contains("revision 3 (delivered at 0.000000020s) carries none"), "{}", anomalies[0]);
        assert!(anomalies[1].what.contains("none (the key had been deleted)"), "{}", anomalies[1]);
    }

    #[test]
    fn prev_kv_before_the_reference_window() {
        let d = delivered();
        let mut wrong = d[1].clone();
        wrong.prev_kv = Some(kv("p/a", "1", 1, 2, 1));
        let late = WatchStream { start_revision: 3, ..stream(vec![events(3, vec![wrong, d[2].clone()], 20)]) };
        let anomaly = only(check_watch(&late, &reference()[1..]));
        assert!(anomaly.what.contains("cannot be the version before it"), "{anomaly}");
    }

    #[test]
    fn an_event_after_progress_covered_it() {
        let d = delivered();
        let messages = vec![
            events(2, vec![d[0].clone()], 10),
            events(3, vec![d[1].clone(), d[2].clone()], 20),
            progress(4, 25),
            events(4, vec![d[3].clone()], 30),
        ];
        let anomaly = only(check_watch(&stream(messages), &reference()));
        assert!(anomaly.what.starts_with("progress broken: the DELETE of \"p/a\" at revision 4 arrived"), "{anomaly}");
    }

    #[test]
    fn cancel_ends_the_stream() {
        let d = delivered();
        let messages = vec![
            events(2, vec![d[0].clone()], 10),
            events(3, vec![d[2].clone()], 20),
            WatchMessage::Canceled { reason: "compacted".into(), compact_revision: 3, received: 25 },
            events(3, vec![d[2].clone()], 30),
        ];
        // The event before the cancel still counts: revision 3's put of p/a is missing.
        let anomaly = only(check_watch(&stream(messages), &reference()));
        assert!(anomaly.what.starts_with("lost 1 event(s): the PUT of \"p/a\" at revision 3"), "{anomaly}");
    }
}
