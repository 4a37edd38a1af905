//! Stopping a node, one way for everything (the idiom of tokio's mini-redis):
//! a signal every long-lived task and stream watches, and a count of those
//! still running that the stop waits for.
//!
//! - [`Shutdown`] is the node's: [`Shutdown::stop`] raises the signal, then
//!   waits until every [`Stopping`] handed out has been dropped.
//! - [`Stopping`] is a task's: it `select!`s on [`Stopping::stopped`], ends,
//!   and dropping its `Stopping` tells the node it has.
//!
//! Invariant: a task that holds a `Stopping` ends soon after the signal (it
//! selects on it wherever it waits), so the stop's wait is short; it is
//! bounded all the same, so that a task stuck elsewhere (a client that does
//! not read its stream) cannot hold the process up.
//! Caveat: a unary request in flight holds none; it finishes inside the gRPC
//! server's graceful stop, which the listening tasks (holders) wait for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

struct Running {
    count: AtomicUsize,
    /// Notified each time a holder goes.
    gone: Notify,
}

/// The node's side: the signal, and the wait for every holder.
pub struct Shutdown {
    signal: watch::Sender<bool>,
    running: Arc<Running>,
}

/// A task's side: resolves [`Stopping::stopped`] once the node stops; its
/// drop tells the node that the task has ended.
pub struct Stopping {
    signal: watch::Receiver<bool>,
    running: Arc<Running>,
}

impl Shutdown {
    pub fn new() -> Shutdown {
        let (signal, _) = watch::channel(false);
        Shutdown { signal, running: Arc::new(Running { count: AtomicUsize::new(0), gone: Notify::new() }) }
    }

    /// A handle for one task or stream (see the module doc).
    pub fn subscribe(&self) -> Stopping {
        self.running.count.fetch_add(1, Ordering::SeqCst);
        Stopping { signal: self.signal.subscribe(), running: self.running.clone() }
    }

    /// Whether the stop has begun.
    pub fn is_stopping(&self) -> bool {
        *self.signal.borrow()
    }

    /// Raise the signal, then wait until every holder has ended, at most
    /// `within`; returns how many had not.
    pub async fn stop(&self, within: Duration) -> usize {
        self.signal.send_replace(true);
        let all_gone = async {
            loop {
                let gone = self.running.gone.notified();
                if self.running.count.load(Ordering::SeqCst) == 0 {
                    return;
                }
                gone.await;
            }
        };
        let _ = tokio::time::timeout(within, all_gone).await;
        self.running.count.load(Ordering::SeqCst)
    }
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new()
    }
}

impl Stopping {
    /// Resolves once the node has begun to stop (at once if it has).
    pub async fn stopped(&mut self) {
        // An error means the node is gone: stopped too.
        let _ = self.signal.wait_for(|stopping| *stopping).await;
    }
}

impl Clone for Stopping {
    fn clone(&self) -> Stopping {
        self.running.count.fetch_add(1, Ordering::SeqCst);
        Stopping { signal: self.signal.clone(), running: self.running.clone() }
    }
}

impl Drop for Stopping {
    fn drop(&mut self) {
        self.running.count.fetch_sub(1, Ordering::SeqCst);
        self.running.gone.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stop_waits_for_every_holder_and_no_longer_than_told() {
        let shutdown = Shutdown::new();
        let mut quick = shutdown.subscribe();
        let task = tokio::spawn(async move {
            quick.stopped().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        });
        let started = std::time::Instant::now();
        assert_eq!(shutdown.stop(Duration::from_secs(5)).await, 0);
        assert!(started.elapsed() >= Duration::from_millis(50), "stop waited for the task");
        task.await.unwrap();

        let shutdown = Shutdown::new();
        let _stuck = shutdown.subscribe();
        assert_eq!(shutdown.stop(Duration::from_millis(20)).await, 1, "the stuck holder is counted");
        let mut late = shutdown.subscribe();
        tokio::time::timeout(Duration::from_secs(1), late.stopped()).await.expect("a late subscriber sees the stop");
    }
}
