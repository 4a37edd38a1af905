//! Forwarded writes answered from their own member's apply.
//!
//! A follower forwards its clients' writes to the leader
//! (`raft::write::forward`), each with a tag this member chose. The leader
//! proposes each one as a [`Command::Forwarded`](crate::model::command::Command)
//! naming the member it came from (`origin`, the peer the leader
//! authenticated) and the tag, and tells the follower only which ones
//! failed. Every member applies every entry; the member a write came from
//! finds its own ID and the tag there, and hands the apply result to the
//! write's waiter ([`ForwardedAnswers::deliver`]). So a successful batch
//! costs no answer message from the leader (the commit index that lets the
//! follower apply reaches it with replication anyway), and a client that
//! gets its answer from a member can read its write there at once: the
//! member answered from its own apply, as etcd's followers do.
//!
//! The applied term is published too: a waiter whose way to the leader broke
//! (the leader died, or closed the stream) cannot tell whether its write
//! reached the log; once this member has applied an entry of a later term
//! than the one it had applied when the write left, every entry the old
//! leader had committed, or that a later leader kept, has been applied
//! here: a write still unanswered then is reported unknown.
//!
//! Invariants:
//! - A tag is handed out once per process (a random start, then counted), so
//!   a forwarded write of an earlier run of this member, applied late, finds
//!   no waiter, and neither does a write of another member.
//! - A waiter gets at most one result, after the apply call that produced it
//!   has been persisted and its changes published, and before the applied
//!   term moves past that call's last entry.
//!
//! Caveat: members of raftlocks before this one cannot apply a
//! `Command::Forwarded` (see its doc): finish a rolling upgrade quickly.
//!
//! Caveat: a snapshot install replaces the state without applying the
//! entries it covers; every waiter is then told its result is unknown
//! (its sender is dropped), whether its write was among them or not.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::{oneshot, watch};

use crate::model::command::CommandResult;

/// The waiters of this member's forwarded writes (see the module doc).
pub struct ForwardedAnswers {
    me: u64,
    next_tag: AtomicU64,
    /// std Mutex: held to insert, remove or hand out, never across an await.
    waiting: Mutex<HashMap<u64, oneshot::Sender<CommandResult>>>,
    /// The term of the last entry this member applied.
    applied_term: watch::Sender<u64>,
}

/// Tags handed out for one forwarded batch, and a receiver per command for
/// its result. Dropped, it forgets the tags still waiting.
pub struct Expected<'a> {
    answers: &'a ForwardedAnswers,
    pub first_tag: u64,
    count: u64,
    pub receivers: Vec<oneshot::Receiver<CommandResult>>,
    /// The term this member had applied when the tags were handed out.
    pub applied_term: u64,
}

impl ForwardedAnswers {
    /// The waiters of member `me`, whose state machine has applied up to an
    /// entry of `applied_term`.
    pub fn new(me: u64, applied_term: u64) -> ForwardedAnswers {
        ForwardedAnswers {
            me,
            // A random start (seeded from the OS): two runs of a member, or two
            // members, draw ranges that do not meet.
            next_tag: AtomicU64::new(rand::random()),
            waiting: Mutex::default(),
            applied_term: watch::Sender::new(applied_term),
        }
    }

    /// This member's ID: the `origin` whose writes it answers.
    pub fn me(&self) -> u64 {
        self.me
    }

    /// Tags for `n` writes, one after the other, each with its waiter.
    pub fn expect(&self, n: usize) -> Expected<'_> {
        let first_tag = self.next_tag.fetch_add(n as u64, Ordering::Relaxed);
        let mut receivers = Vec::with_capacity(n);
        let mut waiting = self.waiting.lock().expect("forwarded answers lock poisoned");
        for i in 0..n as u64 {
            let (tx, rx) = oneshot::channel();
            waiting.insert(first_tag.wrapping_add(i), tx);
            receivers.push(rx);
        }
        drop(waiting);
        Expected { answers: self, first_tag, count: n as u64, receivers, applied_term: *self.applied_term.borrow() }
    }

    /// Hand each result to the waiter of its tag, if it still waits.
    pub fn deliver(&self, answered: Vec<(u64, CommandResult)>) {
        if answered.is_empty() {
            return;
        }
        let mut waiting = self.waiting.lock().expect("forwarded answers lock poisoned");
        let senders: Vec<_> =
            answered.into_iter().filter_map(|(tag, result)| waiting.remove(&tag).map(|tx| (tx, result))).collect();
        drop(waiting);
        for (tx, result) in senders {
            let _ = tx.send(result);
        }
    }

    /// Every waiter is told its result is unknown (a snapshot was installed).
    pub fn forget_all(&self) {
        let forgotten = std::mem::take(&mut *self.waiting.lock().expect("forwarded answers lock poisoned"));
        drop(forgotten);
    }

    /// This member has applied an entry of `term`.
    pub fn applied(&self, term: u64) {
        // Almost every call repeats the term already published: a read
        // (shared) lock answers it, and only a rise takes the write lock.
        if *self.applied_term.borrow() >= term {
            return;
        }
        self.applied_term.send_if_modified(|applied| {
            let later = term > *applied;
            if later {
                *applied = term;
            }
            later
        });
    }

    /// Wait until this member has applied an entry of a term after `term`.
    pub async fn applied_past(&self, term: u64) {
        let mut applied = self.applied_term.subscribe();
        // The sender lives as long as `self`.
        let _ = applied.wait_for(|applied| *applied > term).await;
    }

    /// Forget the waiter of `tag` (its write failed at the leader).
    pub fn forget(&self, tag: u64) {
        self.waiting.lock().expect("forwarded answers lock poisoned").remove(&tag);
    }

    /// How many writes wait for their result.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiting.lock().expect("forwarded answers lock poisoned").len()
    }
}

impl Drop for Expected<'_> {
    fn drop(&mut self) {
        let mut waiting = self.answers.waiting.lock().expect("forwarded answers lock poisoned");
        for i in 0..self.count {
            waiting.remove(&self.first_tag.wrapping_add(i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mvcc::PutResult;

    fn put(revision: i64) -> CommandResult {
        CommandResult::Put(PutResult { revision, ..Default::default() })
    }

    #[tokio::test]
    async fn each_waiter_gets_its_own_result_once_and_unknown_tags_are_ignored() {
        let answers = ForwardedAnswers::new(1, 3);
        let mut expected = answers.expect(2);
        let (first, second) = (expected.first_tag, expected.first_tag.wrapping_add(1));
        answers.deliver(vec![(second, put(8)), (first.wrapping_sub(1), put(6)), (first, put(7))]);
        assert_eq!(expected.receivers.remove(0).await.expect("a result"), put(7));
        assert_eq!(expected.receivers.remove(0).await.expect("a result"), put(8));
        assert_eq!(answers.waiting(), 0);
    }

    #[tokio::test]
    async fn dropped_expectations_and_a_snapshot_leave_no_waiter() {
        let answers = ForwardedAnswers::new(1, 3);
        drop(answers.expect(3));
        assert_eq!(answers.waiting(), 0, "a batch that stopped waiting forgets its tags");
        let mut expected = answers.expect(1);
        answers.forget_all();
        assert!(expected.receivers.remove(0).await.is_err(), "after a snapshot the result is unknown");
    }

    #[tokio::test]
    async fn the_applied_term_only_rises() {
        let answers = ForwardedAnswers::new(1, 3);
        answers.applied(2);
        assert_eq!(answers.expect(0).applied_term, 3);
        let past = answers.applied_past(3);
        tokio::pin!(past);
        assert!(futures::poll!(past.as_mut()).is_pending());
        answers.applied(4);
        past.await;
    }
}
