//! Turning many concurrent calls into few batched ones.
//!
//! A [`Batcher`] owns a task that takes every item queued, hands them as one
//! batch to its `run` function, and answers each caller with its own result.
//! While `max_in_flight` batches are running, new items wait in the queue — so
//! the busier the system, the larger the batches. A call that finds the
//! batcher idle (nothing queued, no batch running) runs its item itself, as
//! a batch of one, in its own task: an idle member answers a lone request
//! without the two task hops (to the batching task, to the batch's task)
//! and their wakeups. Only when idle: under load the hop is where the next
//! items gather, and running each call at once while a slot is free made
//! smaller batches and cost throughput (docs/performance-notes.md).
//!
//! Bounds ([`Limits`]): a batch holds at most `max_batch` items and at most
//! `max_batch_weight` of their weight (but always one item, however heavy);
//! the queue holds at most `max_queued` items and `max_queued_weight` of
//! weight, beyond which a call is refused at once ([`CallError::Overloaded`])
//! instead of growing memory. An item whose caller stopped waiting before its
//! batch formed is dropped unseen: work nobody waits for is not done.
//!
//! Invariants: every item run is in exactly one batch, batches start in queue
//! order, at most `max_in_flight` run at once, and every caller gets exactly
//! one answer. An item counts as queued until its batch holds a slot, so a
//! call runs its own item only when no earlier item waits.
//! Caveat: a batch a caller runs itself ends if the call is cancelled (for
//! the proposer: an entry already handed to Raft stays proposed, as when a
//! caller stops waiting for a batch the task runs).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

/// An item, its weight, and where its answer goes.
type Item<T, R> = (T, u64, oneshot::Sender<R>);

/// How large batches and the queue may grow (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_batch: usize,
    pub max_batch_weight: u64,
    pub max_in_flight: usize,
    pub max_queued: usize,
    pub max_queued_weight: u64,
}

/// Why a call got no result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The queue is full: the call was refused without being queued.
    #[error("too many requests queued")]
    Overloaded,
    /// The batcher stopped before answering.
    #[error("batcher stopped")]
    Stopped,
}

/// What is queued and not yet taken into a batch.
#[derive(Default)]
struct Queued {
    items: AtomicUsize,
    weight: AtomicU64,
}

impl Queued {
    fn taken(&self, weight: u64) {
        self.items.fetch_sub(1, Ordering::Relaxed);
        self.weight.fetch_sub(weight, Ordering::Relaxed);
    }
}

/// A batch's work: `run` applied to its items.
type Run<T, R> = Arc<dyn Fn(Vec<T>) -> Pin<Box<dyn Future<Output = Vec<R>> + Send>> + Send + Sync>;

/// Handle to a batching task; cheap to clone. The task ends with the last handle.
pub struct Batcher<T, R> {
    queue: mpsc::UnboundedSender<Item<T, R>>,
    queued: Arc<Queued>,
    /// A slot per batch that may run at once.
    in_flight: Arc<Semaphore>,
    run: Run<T, R>,
    weigh: fn(&T) -> u64,
    limits: Limits,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Batcher {
            queue: self.queue.clone(),
            queued: self.queued.clone(),
            in_flight: self.in_flight.clone(),
            run: self.run.clone(),
            weigh: self.weigh,
            limits: self.limits,
        }
    }
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Start the task. `weigh` tells an item's weight (for the weight
    /// bounds); `run` must return one result per item, in order.
    pub fn start<F, Fut>(limits: Limits, weigh: fn(&T) -> u64, run: F) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        assert!(limits.max_batch > 0 && limits.max_in_flight > 0);
        let (queue, mut rx) = mpsc::unbounded_channel::<Item<T, R>>();
        let queued = Arc::new(Queued::default());
        let in_flight = Arc::new(Semaphore::new(limits.max_in_flight));
        let run: Run<T, R> = Arc::new(move |items| Box::pin(run(items)));
        let (counts, slots, task_run) = (queued.clone(), in_flight.clone(), run.clone());
        tokio::spawn(async move {
            // An item taken from the queue that did not fit the last batch.
            let mut carried: Option<Item<T, R>> = None;
            loop {
                let first = match carried.take() {
                    Some(item) => item,
                    None => {
                        let Some(item) = rx.recv().await else { return };
                        item
                    }
                };
                // Then a slot, so that items pile up while none is free.
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                // (A first item whose caller left meanwhile, carried or not,
                // is dropped unseen.)
                if first.2.is_closed() {
                    counts.taken(first.1);
                    drop(permit);
                    continue;
                }
                let mut weight = first.1;
                let mut batch = vec![first];
                while batch.len() < limits.max_batch {
                    let Ok(item) = rx.try_recv() else { break };
                    if item.2.is_closed() {
                        counts.taken(item.1);
                        continue;
                    }
                    if weight + item.1 > limits.max_batch_weight {
                        carried = Some(item);
                        break;
                    }
                    weight += item.1;
                    batch.push(item);
                }
                // Taken only now that the batch holds its slot (see `call`).
                for item in &batch {
                    counts.taken(item.1);
                }
                let (items, replies): (Vec<T>, Vec<oneshot::Sender<R>>) =
                    batch.into_iter().map(|(item, _, reply)| (item, reply)).unzip();
                let work = task_run(items);
                tokio::spawn(async move {
                    let results = work.await;
                    assert_eq!(results.len(), replies.len(), "a batch answers every item");
                    for (reply, result) in replies.into_iter().zip(results) {
                        let _ = reply.send(result);
                    }
                    drop(permit);
                });
            }
        });
        Batcher { queue, queued, in_flight, run, weigh, limits }
    }

    /// Items queued and not yet taken into a batch.
    pub fn queued(&self) -> usize {
        self.queued.items.load(Ordering::Relaxed)
    }

    /// Queue `item` and wait for its result; refused at once while the queue
    /// is full.
    pub async fn call(&self, item: T) -> Result<R, CallError> {
        // Idle (nothing waits, no batch runs): this item would be a batch
        // of one at once; run it here (see the module doc).
        if self.queued.items.load(Ordering::Relaxed) == 0
            && self.in_flight.available_permits() == self.limits.max_in_flight
        {
            if let Ok(_slot) = self.in_flight.clone().try_acquire_owned() {
                let mut results = (self.run)(vec![item]).await;
                assert_eq!(results.len(), 1, "a batch answers every item");
                return Ok(results.pop().expect("one result"));
            }
        }
        self.call_queued(item).await
    }

    /// [`Batcher::call`] for items that arrive together: one may run at once
    /// as `call`'s does; more are queued together, so that they share a
    /// batch (the first must not run alone). Results in `items`' order.
    pub async fn call_all(&self, mut items: Vec<T>) -> Vec<Result<R, CallError>> {
        if items.len() == 1 {
            let item = items.pop().expect("one item");
            return vec![self.call(item).await];
        }
        futures::future::join_all(items.into_iter().map(|item| self.call_queued(item))).await
    }

    /// [`Batcher::call`] through the queue always.
    async fn call_queued(&self, item: T) -> Result<R, CallError> {
        let weight = (self.weigh)(&item);
        let items = self.queued.items.fetch_add(1, Ordering::Relaxed);
        let queued_weight = self.queued.weight.fetch_add(weight, Ordering::Relaxed);
        // An item alone in the queue is always taken, however heavy.
        if items >= self.limits.max_queued || (items > 0 && queued_weight + weight > self.limits.max_queued_weight) {
            self.queued.taken(weight);
            return Err(CallError::Overloaded);
        }
        let (tx, rx) = oneshot::channel();
        if self.queue.send((item, weight, tx)).is_err() {
            self.queued.taken(weight);
            return Err(CallError::Stopped);
        }
        rx.await.map_err(|_| CallError::Stopped)
    }
}

/// Unit weight: for batchers bounded by item counts only.
pub fn unweighed<T>(_: &T) -> u64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_calls_share_batches_and_get_their_own_answers() {
        let batches = Arc::new(AtomicUsize::new(0));
        let counted = batches.clone();
        let limits = Limits { max_batch: 64, max_in_flight: 1, ..LOOSE };
        let doubler = Batcher::start(limits, unweighed, move |items: Vec<u32>| {
            counted.fetch_add(1, Ordering::Relaxed);
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                items.into_iter().map(|i| i * 2).collect()
            }
        });
        let calls: Vec<_> = (0..200u32)
            .map(|i| {
                let d = doubler.clone();
                tokio::spawn(async move { (i, d.call(i).await) })
            })
            .collect();
        for c in calls {
            let (i, r) = c.await.unwrap();
            assert_eq!(r, Ok(i * 2));
        }
        let n = batches.load(Ordering::Relaxed);
        assert!(n < 50, "200 concurrent calls took {n} batches");
    }

    /// A call that finds nothing queued and a slot free runs its item in
    /// its own task; while the only slot is taken, calls are queued and
    /// run together by the batching task.
    #[tokio::test]
    async fn an_idle_batcher_runs_a_lone_call_in_the_callers_task() {
        let (batcher, gate_tx, ran_in_all) = gated(Limits { max_in_flight: 1, ..LOOSE }, unweighed::<u32>);
        let first = tokio::spawn({
            let b = batcher.clone();
            async move { (tokio::task::id(), b.call(1).await) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let later: Vec<_> = (2..=4u32)
            .map(|i| {
                let b = batcher.clone();
                tokio::spawn(async move { (tokio::task::id(), b.call(i).await) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        gate_tx.send(true).unwrap();
        let (first_task, answer) = first.await.unwrap();
        assert_eq!(answer, Ok(1));
        let mut later_tasks = Vec::new();
        for (call, i) in later.into_iter().zip(2..=4u32) {
            let (task, answer) = call.await.unwrap();
            assert_eq!(answer, Ok(i));
            later_tasks.push(task);
        }
        let ran_in = ran_in_all.lock().unwrap().clone();
        assert_eq!(ran_in.len(), 2, "a batch of one, then the three queued behind it: {ran_in:?}");
        assert_eq!(ran_in[0], (vec![1], Some(first_task)), "the lone call ran in its caller's task");
        assert_eq!(ran_in[1].0, vec![2, 3, 4]);
        assert!(ran_in[1].1.is_some_and(|t| !later_tasks.contains(&t)), "queued calls ran in the batching task");
        // Items that arrive together share a batch, even on an idle batcher.
        assert_eq!(batcher.call_all(vec![5, 6]).await, vec![Ok(5), Ok(6)]);
        assert_eq!(ran_in_all.lock().unwrap().last().expect("a batch ran").0, vec![5, 6]);
    }

    /// A batcher whose batches answer each item with itself once the gate
    /// opens, recording each batch's items and the task it was started in.
    #[allow(clippy::type_complexity)]
    fn gated<T: Clone + Send + 'static>(
        limits: Limits,
        weigh: fn(&T) -> u64,
    ) -> (Batcher<T, T>, tokio::sync::watch::Sender<bool>, Arc<std::sync::Mutex<Vec<(Vec<T>, Option<tokio::task::Id>)>>>)
    {
        let (gate_tx, gate_rx) = tokio::sync::watch::channel(false);
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let batcher = Batcher::start(limits, weigh, move |items: Vec<T>| {
            record.lock().unwrap().push((items.clone(), tokio::task::try_id()));
            let mut gate = gate_rx.clone();
            async move {
                let _ = gate.wait_for(|open| *open).await;
                items
            }
        });
        (batcher, gate_tx, seen)
    }

    const LOOSE: Limits = Limits {
        max_batch: usize::MAX,
        max_batch_weight: u64::MAX,
        max_in_flight: 1,
        max_queued: usize::MAX,
        max_queued_weight: u64::MAX,
    };

    /// A batch stops at its weight bound (an item heavier than the bound
    /// travels alone); a full queue refuses calls at once; an item whose
    /// caller left is never run.
    #[tokio::test]
    async fn batches_and_the_queue_are_bounded_and_abandoned_items_are_not_run() {
        let limits = Limits { max_batch_weight: 10, max_queued: 5, max_queued_weight: 100, ..LOOSE };
        let (batcher, gate_tx, seen) = gated(limits, |w: &u64| *w);
        // The first call forms a batch alone and holds the only slot.
        let first = tokio::spawn({
            let b = batcher.clone();
            async move { b.call(1).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Queue five more: 4, 4, 30 (heavier than a batch), 2, and one whose caller leaves.
        let mut calls = Vec::new();
        for w in [4u64, 4, 30, 2] {
            let b = batcher.clone();
            calls.push(tokio::spawn(async move { b.call(w).await }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let abandoned = tokio::spawn({
            let b = batcher.clone();
            async move { b.call(7).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(batcher.call(1).await, Err(CallError::Overloaded), "a sixth queued call is refused");
        abandoned.abort();
        let _ = abandoned.await;
        gate_tx.send(true).unwrap();
        assert_eq!(first.await.unwrap(), Ok(1));
        for (call, w) in calls.into_iter().zip([4u64, 4, 30, 2]) {
            assert_eq!(call.await.unwrap(), Ok(w));
        }
        let batches: Vec<Vec<u64>> = seen.lock().unwrap().iter().map(|(items, _)| items.clone()).collect();
        assert_eq!(batches, vec![vec![1], vec![4, 4], vec![30], vec![2]], "weight-bounded batches, 7 never run");
        // The queue drained, its counts back to zero: calls are taken again.
        assert_eq!(batcher.queued(), 0);
        assert_eq!(batcher.queued.weight.load(Ordering::Relaxed), 0);
        assert_eq!(batcher.call(3).await, Ok(3));
    }
}
