//! A lock's events, as the client follows them: [`Client::observe`] opens
//! the stream, and [`Client::grant_ended`] follows one grant until it ends,
//! picking the stream up again where it was when it breaks (on whichever
//! endpoint answers), which is what `Guard::lost` and `MultiGuard::lost`
//! wait on.
//!
//! How soon an end is told: as soon as the stream's member applies it, if
//! that member is live and in touch with the leader; if it is cut off from
//! the leader, within three election timeouts (the member then ends its
//! streams, and the stream is picked up on another endpoint); if it is
//! frozen, or its host gone, once a ping goes unanswered (`PING_INTERVAL`
//! and `PING_TIMEOUT`, 9 s at most). The fault suite's check 11 holds it to
//! that.
//!
//! Caveat: a grant whose history was compacted away before the call is
//! judged from the lock as it is (present: followed from then on; absent:
//! ended, cause unknown).

use std::time::Duration;

use super::{locks, Client, ClientError};

impl Client {
    /// The events of lock `name` (of `permits`): the first message holds its
    /// holders and waiters (or, from `start_revision` > 0, the changes since
    /// then), each later one the changes of one or more revisions (each
    /// event carries its revision; the header's is the last one's).
    pub async fn observe(
        &self,
        name: &[u8],
        permits: u32,
        start_revision: i64,
    ) -> Result<tonic::Streaming<locks::ObserveResponse>, ClientError> {
        let req = locks::ObserveRequest { name: name.to_vec(), permits, start_revision };
        Ok(self.locks().observe(req).await?.into_inner())
    }

    /// Resolves when the grant `key` made with `token` ends, with how it
    /// ended (`Released`, `LeaseEnded` or `Ended`): it follows the lock's
    /// events from the grant's own revision on, so an end that came before
    /// the call is told at once, and it picks the stream up again from where
    /// it was (on any endpoint) if it breaks. Only an error that says the
    /// request itself is wrong ends it early.
    pub async fn grant_ended(&self, key: &[u8], token: i64) -> Result<locks::lock_event::Kind, ClientError> {
        use locks::lock_event::Kind;
        let name = crate::locks::lock_name_of(key).unwrap_or(key);
        let ours = |e: &locks::LockEvent| e.owner.as_ref().is_some_and(|o| o.key == key && o.token == token);
        // From the grant's revision; 0 once history was compacted past it:
        // then the lock as it is, which must still hold the grant.
        let mut from = token.max(1);
        loop {
            let mut stream = match self.observe(name, 0, from).await {
                Ok(stream) => stream,
                Err(ClientError::Status(s)) if s.code() == tonic::Code::OutOfRange && from > 0 => {
                    from = 0;
                    continue;
                }
                Err(ClientError::Status(s)) if !retryable(&s) => return Err(s.into()),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            loop {
                match stream.message().await {
                    Ok(Some(message)) => {
                        if from == 0 && !message.events.iter().any(ours) {
                            return Ok(Kind::Ended);
                        }
                        let ended = |e: &&locks::LockEvent| {
                            matches!(e.kind(), Kind::Released | Kind::LeaseEnded | Kind::Ended) && ours(e)
                        };
                        if let Some(e) = message.events.iter().find(ended) {
                            return Ok(e.kind());
                        }
                        if let Some(h) = message.header {
                            from = from.max(h.revision + 1);
                        }
                    }
                    Ok(None) => break,
                    Err(s) if !retryable(&s) => return Err(s.into()),
                    Err(_) => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Whether a failed call may succeed if made again (elsewhere, or later).
fn retryable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    )
}
