//! Waking a lock's observers off the request path: when a hub
//! (`super::event_hub`) has told a change, the streams that were waiting
//! for it are not woken all at once. They are handed to this member's
//! pacer, a thread at idle CPU priority (`SCHED_IDLE`) that wakes them a
//! few at a time ([`CHUNK`]), and wakes the next few only once the runtime
//! has run those (or [`CHUNK_WAIT`] has passed). A woken stream runs on
//! the runtime like any task; but the pacer puts no more than a chunk of
//! them ahead of a request that arrives meanwhile, and while the machine's
//! cores are busy with normal-priority work (a handoff's apply, its answer,
//! another member's append) the pacer does not run at all.
//! Observers are told when there is CPU to spare, and lock traffic keeps
//! its latency: a thousand observers of one lock woken together would queue
//! several milliseconds of work ahead of the next handoff.
//!
//! Bound: what the pacer has not woken of a batch within [`DEADLINE`] its
//! hub's task wakes, at normal priority, still a chunk at a time with the
//! runtime's other tasks between, so that a saturated machine delays
//! observers by about that much (and they do not fall a broadcast buffer
//! behind because of the pacer). A stream woken late sends what it missed
//! in one go: its messages share HTTP/2 frames and socket writes.
//!
//! Invariants: a stream first lists itself ([`Parked::list`]), then looks
//! for a message again; a hub first broadcasts, then takes its list. So a
//! stream that found nothing is either in the list a later take hands over,
//! or sees the message on its second look: no wake-up is lost. A stream is
//! listed at most once at a time (`listed`), so a list holds at most one
//! entry per stream; a stream that has gone ([`Parked::gone`]) keeps no
//! task alive, and the list drops such entries whenever it has doubled
//! since it last did, so streams opened and closed on a lock that does not
//! change do not pile up in it.
//!
//! Caveat: where `SCHED_IDLE` cannot be set, the thread runs at the lowest
//! `nice`; where neither can, at normal priority, and the chunks still
//! interleave observers with requests.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use futures::task::AtomicWaker;

/// How many streams the pacer wakes before it yields the CPU.
pub const CHUNK: usize = 16;

/// How long the pacer waits for a chunk it woke to have run.
pub const CHUNK_WAIT: Duration = Duration::from_millis(1);

/// How long a batch may wait for the pacer before its hub wakes the rest.
pub const DEADLINE: Duration = Duration::from_millis(50);

/// One stream's place in a hub's list of streams waiting for a message.
#[derive(Default)]
pub struct Parked {
    waker: AtomicWaker,
    listed: AtomicBool,
    /// Woken, and not yet run since.
    woken: AtomicBool,
}

/// A hub's list of the streams waiting for its next message.
#[derive(Default)]
pub struct Waiting(Mutex<WaitingList>);

#[derive(Default)]
struct WaitingList {
    parked: Vec<Arc<Parked>>,
    /// Its length after gone streams were last dropped from it.
    pruned_at: usize,
}

/// Below this length a list is not pruned.
const PRUNE_FROM: usize = 64;

impl Waiting {
    fn push(&self, parked: Arc<Parked>) {
        let mut list = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if list.parked.len() >= PRUNE_FROM.max(2 * list.pruned_at) {
            // Held by the list alone: the stream has gone.
            list.parked.retain(|p| Arc::strong_count(p) > 1);
            list.pruned_at = list.parked.len();
        }
        list.parked.push(parked);
    }

    fn take(&self) -> Vec<Arc<Parked>> {
        let mut list = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        list.pruned_at = 0;
        std::mem::take(&mut list.parked)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().parked.len()
    }
}

impl Parked {
    /// Remember `waker`, and put this stream on `list` unless it is on one
    /// already (see the module doc: the caller looks for a message again).
    pub fn list(self: &Arc<Self>, waker: &std::task::Waker, list: &Waiting) {
        self.waker.register(waker);
        if !self.listed.swap(true, Ordering::AcqRel) {
            list.push(self.clone());
        }
    }

    /// The stream runs (is polled): what it was woken for is under way.
    pub fn running(&self) {
        self.woken.store(false, Ordering::Release);
    }

    /// The stream has gone: let go of its task's waker.
    pub fn gone(&self) {
        drop(self.waker.take());
        self.running();
    }

    fn wake(&self) {
        self.listed.store(false, Ordering::Release);
        if let Some(waker) = self.waker.take() {
            self.woken.store(true, Ordering::Release);
            waker.wake();
        }
    }
}

/// Streams to wake for one broadcast, shared by the pacer (a chunk at a
/// time) and the hub's deadline (the rest at once).
#[derive(Default)]
pub struct Batch {
    left: Mutex<Vec<Arc<Parked>>>,
}

impl Batch {
    /// Wake up to `n` of the streams left; false once none is left.
    pub fn wake_some(&self, n: usize) -> bool {
        !self.wake_chunk(n).is_empty()
    }

    /// Wake up to `n` of the streams left, and say which.
    fn wake_chunk(&self, n: usize) -> Vec<Arc<Parked>> {
        let chunk: Vec<Arc<Parked>> = {
            let mut left = self.left.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let from = left.len().saturating_sub(n);
            left.split_off(from)
        };
        chunk.iter().for_each(|p| p.wake());
        chunk
    }

    /// Wake every stream left (the deadline, or the hub's end).
    pub fn wake_all(&self) {
        while self.wake_some(usize::MAX) {}
    }

    pub fn is_done(&self) -> bool {
        self.left.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty()
    }
}

/// The batches a hub handed to the pacer, oldest first, with when: its
/// task wakes what the pacer left once [`DEADLINE`] has passed, and all of
/// it when the task ends (so that no stream of an ended hub waits for an
/// idle thread to learn it has ended).
#[derive(Default)]
pub struct Handed(VecDeque<(tokio::time::Instant, Arc<Batch>)>);

impl Handed {
    pub fn push(&mut self, batch: Arc<Batch>) {
        self.0.retain(|(_, b)| !b.is_done());
        self.0.push_back((tokio::time::Instant::now(), batch));
    }

    /// When the oldest batch is due, if there is one.
    pub fn due(&self) -> Option<tokio::time::Instant> {
        self.0.front().map(|(at, _)| *at + DEADLINE)
    }

    /// Wake what is left of the batches due, a chunk at a time, each
    /// behind what the runtime has to run by then (requests included).
    pub async fn wake_overdue(&mut self) {
        let now = tokio::time::Instant::now();
        while self.due().is_some_and(|due| due <= now) {
            let Some((_, batch)) = self.0.pop_front() else { break };
            while batch.wake_some(CHUNK) {
                tokio::task::yield_now().await;
            }
        }
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        self.0.iter().for_each(|(_, batch)| batch.wake_all());
    }
}

/// The pacer's queue of batches, and its thread's signal.
struct Pacer {
    batches: Mutex<VecDeque<Arc<Batch>>>,
    work: Condvar,
}

fn pacer() -> &'static Pacer {
    static PACER: OnceLock<&'static Pacer> = OnceLock::new();
    PACER.get_or_init(|| {
        let pacer: &'static Pacer = Box::leak(Box::new(Pacer { batches: Mutex::default(), work: Condvar::new() }));
        std::thread::Builder::new()
            .name("raftlock-observer-pacer".into())
            .spawn(move || {
                lower_priority();
                pacer.run()
            })
            .expect("starting the observer pacer");
        pacer
    })
}

/// Hand the streams of `list` to the pacer; the batch returned is for the
/// hub's deadline. None when the list was empty.
pub fn hand_over(list: &Waiting) -> Option<Arc<Batch>> {
    let batch = take(list)?;
    let pacer = pacer();
    pacer.batches.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push_back(batch.clone());
    pacer.work.notify_one();
    Some(batch)
}

/// The streams of `list` as a batch, not handed to the pacer (to wake at
/// once); None when the list was empty.
pub fn take(list: &Waiting) -> Option<Arc<Batch>> {
    let taken = list.take();
    (!taken.is_empty()).then(|| Arc::new(Batch { left: Mutex::new(taken) }))
}

impl Pacer {
    fn run(&self) {
        loop {
            let batch = {
                let mut batches = self.batches.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                loop {
                    match batches.front() {
                        Some(b) if b.is_done() => {
                            batches.pop_front();
                        }
                        Some(b) => break b.clone(),
                        None => batches = self.work.wait(batches).unwrap_or_else(std::sync::PoisonError::into_inner),
                    }
                }
            };
            loop {
                let chunk = batch.wake_chunk(CHUNK);
                if chunk.is_empty() {
                    break;
                }
                let woke = std::time::Instant::now();
                while chunk.iter().any(|p| p.woken.load(Ordering::Acquire)) && woke.elapsed() < CHUNK_WAIT {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
    }
}

/// Put the calling thread at idle priority (see the module doc's caveat).
fn lower_priority() {
    // SAFETY: plain system calls on the calling thread, with a parameter
    // that lives across the call.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            if libc::setpriority(libc::PRIO_PROCESS, tid, 19) != 0 {
                tracing::debug!("the observer pacer runs at normal priority");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Wake, Waker};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_stream_is_listed_once_and_woken_by_the_pacer() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let list = Waiting::default();
        let streams: Vec<Arc<Parked>> = (0..100).map(|_| Arc::new(Parked::default())).collect();
        for p in &streams {
            p.list(&waker, &list);
            p.list(&waker, &list);
        }
        assert_eq!(list.len(), 100, "each stream listed once");
        let batch = hand_over(&list).expect("a batch");
        assert!(hand_over(&list).is_none(), "the list was taken");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !batch.is_done() || count.0.load(Ordering::SeqCst) < 100 {
            assert!(std::time::Instant::now() < deadline, "the pacer woke {:?}", count.0);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 100);
        // Woken streams may be listed again.
        streams[0].list(&waker, &list);
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn streams_that_went_do_not_pile_up_in_a_list() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let list = Waiting::default();
        let live: Vec<Arc<Parked>> = (0..10).map(|_| Arc::new(Parked::default())).collect();
        live.iter().for_each(|p| p.list(&waker, &list));
        for _ in 0..100_000 {
            let p = Arc::new(Parked::default());
            p.list(&waker, &list);
            p.gone();
        }
        assert!(list.len() <= 2 * PRUNE_FROM, "{} entries for 10 live streams", list.len());
        // The live ones are still there, and woken.
        let batch = take(&list).expect("a batch");
        batch.wake_all();
        assert_eq!(count.0.load(Ordering::SeqCst), 10);
    }

    #[test]
    fn the_deadline_wakes_what_the_pacer_left() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let batch = Batch::default();
        let streams: Vec<Arc<Parked>> = (0..40).map(|_| Arc::new(Parked::default())).collect();
        for p in &streams {
            p.waker.register(&waker);
            p.listed.store(true, Ordering::SeqCst);
            batch.left.lock().unwrap().push(p.clone());
        }
        assert!(batch.wake_some(CHUNK));
        assert_eq!(count.0.load(Ordering::SeqCst), CHUNK);
        batch.wake_all();
        assert_eq!(count.0.load(Ordering::SeqCst), 40);
        assert!(batch.is_done() && !batch.wake_some(CHUNK));
        assert!(streams.iter().all(|p| !p.listed.load(Ordering::SeqCst)), "all may list again");
    }
}
