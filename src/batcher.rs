//! Turning many concurrent calls into few batched ones.
//!
//! A [`Batcher`] owns a task that takes every item queued, hands them as one
//! batch to its `run` function, and answers each caller with its own result.
//! While `max_in_flight` batches are running, new items wait in the queue — so
//! the busier the system, the larger the batches. Under no load a batch is a
//! single item and adds only a task hop.
//!
//! Invariants: every item is in exactly one batch, batches start in queue
//! order, and every caller gets exactly one answer (`None` only if the batcher
//! stopped before answering).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

type Item<T, R> = (T, oneshot::Sender<R>);

/// Handle to a batching task; cheap to clone. The task ends with the last handle.
pub struct Batcher<T, R> {
    queue: mpsc::UnboundedSender<Item<T, R>>,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Batcher { queue: self.queue.clone() }
    }
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Start the task. `run` must return one result per item, in order.
    pub fn start<F, Fut>(max_batch: usize, max_in_flight: usize, run: F) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        assert!(max_batch > 0 && max_in_flight > 0);
        let (queue, mut rx) = mpsc::unbounded_channel::<Item<T, R>>();
        tokio::spawn(async move {
            let in_flight = Arc::new(Semaphore::new(max_in_flight));
            loop {
                // Take a slot first, so that items pile up while none is free.
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    return;
                };
                let Some(first) = rx.recv().await else { return };
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(item) => batch.push(item),
                        Err(_) => break,
                    }
                }
                let (items, replies): (Vec<T>, Vec<oneshot::Sender<R>>) = batch.into_iter().unzip();
                let work = run(items);
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
        Batcher { queue }
    }

    /// Queue `item` and wait for its result.
    pub async fn call(&self, item: T) -> Option<R> {
        let (tx, rx) = oneshot::channel();
        self.queue.send((item, tx)).ok()?;
        rx.await.ok()
    }
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
        let doubler = Batcher::start(64, 1, move |items: Vec<u32>| {
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
            assert_eq!(r, Some(i * 2));
        }
        let n = batches.load(Ordering::Relaxed);
        assert!(n < 50, "200 concurrent calls took {n} batches");
    }
}
