//! Streams waiting for their lock hub's next message (`super::event_hub`),
//! and how the hub wakes them: a chunk at a time, so that a thousand of
//! them do not all sit in the runtime's queue ahead of other work.
//!
//! A stream lists itself ([`WakeList::listen`]) when it finds no message,
//! then looks once more; the hub broadcasts, then takes the list
//! ([`WakeList::take`]) into a [`WakingRound`], which wakes
//! [`WAKE_CHUNK`] streams each time it is asked.
//!
//! Invariants: a message broadcast is either seen by a stream's second look
//! or followed by a wake of that stream, since the stream lists itself
//! before that look and the hub takes the list after the broadcast. A
//! listener is marked unlisted before it is woken, so a woken stream that
//! waits again lists itself again; a listener is in the list at most once
//! while it is marked listed. A round dropped before it woke everyone (its
//! task ended) wakes the rest.
//!
//! Caveat: a stream dropped while listed leaves its listener in the list
//! (its waker emptied by the stream's drop, [`Listener::forget`]) until the
//! next round takes it, or until the list doubles past 64 and drops every
//! listener nobody else holds: a lock that never changes while observers
//! come and go keeps at most about twice as many listeners as it has
//! streams.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;

/// How many waiting streams a round wakes each time it is asked.
pub const WAKE_CHUNK: usize = 16;

/// How long a round may pace its waking before it wakes every stream still
/// waiting at once (a stream is late by this at most).
pub const WAKE_ROUND_LIMIT: Duration = Duration::from_millis(50);

/// A stream's place in its hub's list.
#[derive(Default)]
pub struct Listener {
    waker: AtomicWaker,
    /// In the list (or in a round that has not woken it yet).
    listed: AtomicBool,
}

impl Listener {
    /// The stream is gone: its listener keeps no waker (a task's waker
    /// keeps the task's memory).
    pub fn forget(&self) {
        drop(self.waker.take());
    }

    fn wake(&self) {
        // Unlisted first: a stream woken lists itself again when it waits.
        self.listed.store(false, Ordering::SeqCst);
        self.waker.wake();
    }
}

/// The streams waiting for a hub's next message.
#[derive(Default)]
pub struct WakeList(Mutex<Vec<Arc<Listener>>>);

impl WakeList {
    /// List a stream that found no message, to be woken by the next one.
    pub fn listen(&self, listener: &Arc<Listener>, waker: &Waker) {
        listener.waker.register(waker);
        if !listener.listed.swap(true, Ordering::SeqCst) {
            let mut list = self.list();
            if list.len() >= 64 && list.len().is_power_of_two() {
                // Listeners of streams that were dropped (held by the list alone).
                list.retain(|listed| Arc::strong_count(listed) > 1);
            }
            list.push(listener.clone());
        }
    }

    /// The streams listed so far, taken from the list.
    pub fn take(&self) -> Vec<Arc<Listener>> {
        std::mem::take(&mut *self.list())
    }

    /// Wake every listed stream at once (the hub ended: they are to end).
    pub fn wake_all(&self) {
        for listener in self.take() {
            listener.wake();
        }
    }

    fn list(&self) -> MutexGuard<'_, Vec<Arc<Listener>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Streams a hub's task is waking, a chunk at a time.
pub struct WakingRound {
    listeners: Vec<Arc<Listener>>,
    woken: usize,
    began: Instant,
}

impl WakingRound {
    /// A round of waking `listeners`, begun now.
    pub fn new(listeners: Vec<Arc<Listener>>) -> WakingRound {
        WakingRound { listeners, woken: 0, began: Instant::now() }
    }

    /// True once every stream of the round was woken.
    pub fn is_done(&self) -> bool {
        self.woken == self.listeners.len()
    }

    /// Wake the next chunk, or every one left once the round has gone on
    /// for [`WAKE_ROUND_LIMIT`].
    pub fn wake_next(&mut self) {
        let left = self.listeners.len() - self.woken;
        let chunk = if self.began.elapsed() >= WAKE_ROUND_LIMIT { left } else { left.min(WAKE_CHUNK) };
        for listener in &self.listeners[self.woken..self.woken + chunk] {
            listener.wake();
        }
        self.woken += chunk;
    }
}

impl Drop for WakingRound {
    fn drop(&mut self) {
        for listener in &self.listeners[self.woken..] {
            listener.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use super::*;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// `n` streams listed, each with a waker counting its wakes.
    fn listed(list: &WakeList, n: usize) -> Vec<(Arc<Listener>, Arc<Count>)> {
        (0..n)
            .map(|_| {
                let (listener, count) = (Arc::new(Listener::default()), Arc::new(Count(AtomicUsize::new(0))));
                list.listen(&listener, &Waker::from(count.clone()));
                (listener, count)
            })
            .collect()
    }

    fn woken(streams: &[(Arc<Listener>, Arc<Count>)]) -> usize {
        streams.iter().map(|(_, c)| c.0.load(Ordering::SeqCst)).sum()
    }

    #[test]
    fn a_round_wakes_a_chunk_at_a_time_then_the_rest_once_late() {
        let list = WakeList::default();
        let streams = listed(&list, 3 * WAKE_CHUNK + 5);
        // Listing twice before being woken lists once.
        list.listen(&streams[0].0, &Waker::from(streams[0].1.clone()));
        let mut round = WakingRound::new(list.take());
        assert!(list.take().is_empty());
        round.wake_next();
        assert_eq!(woken(&streams), WAKE_CHUNK);
        round.wake_next();
        assert_eq!(woken(&streams), 2 * WAKE_CHUNK);
        assert!(!round.is_done());
        round.began = Instant::now() - WAKE_ROUND_LIMIT;
        round.wake_next();
        assert_eq!(woken(&streams), 3 * WAKE_CHUNK + 5, "a late round wakes all that are left");
        assert!(round.is_done());
    }

    #[test]
    fn a_woken_stream_lists_itself_again_and_a_dropped_round_wakes_the_rest() {
        let list = WakeList::default();
        let streams = listed(&list, WAKE_CHUNK + 3);
        let mut round = WakingRound::new(list.take());
        round.wake_next();
        // A stream woken waits again: it is listed anew.
        list.listen(&streams[0].0, &Waker::from(streams[0].1.clone()));
        assert_eq!(list.take().len(), 1);
        // One not yet woken, listing again, is not listed twice.
        list.listen(&streams[WAKE_CHUNK].0, &Waker::from(streams[WAKE_CHUNK].1.clone()));
        assert!(list.take().is_empty());
        drop(round);
        assert_eq!(woken(&streams), WAKE_CHUNK + 3, "the round's task ended: the rest are woken");
        list.wake_all();
    }

    #[test]
    fn listeners_of_dropped_streams_do_not_pile_up() {
        let list = WakeList::default();
        let live = listed(&list, 10);
        for _ in 0..1000 {
            let gone = Arc::new(Listener::default());
            list.listen(&gone, &Waker::from(Arc::new(Count(AtomicUsize::new(0)))));
            gone.forget();
        }
        let kept = list.take();
        assert!(kept.len() <= 2 * 64, "{} listeners kept for 10 live streams", kept.len());
        assert!(
            live.iter().all(|(l, _)| kept.iter().any(|k| Arc::ptr_eq(k, l))),
            "a live stream's listener was dropped"
        );
    }
}
