//! The cluster version as this member sees it: the lowest raftlock release
//! among the members of the configuration it applied, each asked over the
//! peer port (`Peer.Version`; a member that answers Unimplemented runs
//! 0.1.0). Features whose apply rules an older release lacks are refused
//! while the cluster version is below the release that brought them
//! ([`Node::require_release`]), so that a cluster half-way through a rolling
//! upgrade runs on what every member applies alike.
//!
//! A member's release is known once it has answered since this member
//! started, and kept (a member that stops answering is assumed to come back
//! as it was; replacing its binary without answering again is what the
//! downgrade procedure guards against). Until every member has answered, the
//! cluster version is not decided, and such features are refused, as etcd
//! does while its cluster version is "not_decided".
//!
//! Caveats: each member decides on its own, from answers at most
//! [`ASK_EVERY`] old; the decision is not replicated (docs/design/versions.md
//! says what replicating it will add: apply rules switched at one log index
//! on every member, and downgrades).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Node, ServerError};
use crate::base::shutdown::Stopping;
use crate::base::version::{Version, RAFTLOCK};

/// How often every member is asked again.
pub const ASK_EVERY: Duration = Duration::from_secs(5);
/// How long one member's answer is waited for.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// The release of a member that does not know the question.
pub const FIRST_RELEASE: Version = Version::new(0, 1, 0);

/// The members' releases this member knows, by member ID.
#[derive(Default)]
pub struct Releases {
    known: std::sync::Mutex<HashMap<u64, Version>>,
}

/// What this member makes of its members' releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterVersion {
    /// Every member has told its release; the lowest.
    Decided(Version),
    /// These members have not told theirs yet.
    NotDecided(Vec<String>),
}

impl Node {
    /// Ask every member of the configuration for its release now, and tell
    /// the cluster version.
    pub async fn ask_versions(&self) -> ClusterVersion {
        let members = self.members();
        let asks = members.iter().filter(|m| m.id != self.id).map(|m| async move {
            let answer = match m.peer_urls.first() {
                Some(url) => self.replica.peers.version(url, ASK_TIMEOUT).await,
                None => Err(tonic::Status::unavailable("no peer URL")),
            };
            (m.id, answer)
        });
        for (id, answer) in futures::future::join_all(asks).await {
            let release = match answer {
                Ok(Some(v)) => Version::parse(&v),
                Ok(None) => Some(FIRST_RELEASE),
                Err(_) => None,
            };
            if let Some(release) = release {
                self.releases.known.lock().expect("releases lock poisoned").insert(id, release);
            }
        }
        self.cluster_version()
    }

    /// The cluster version from the answers known (see the module doc).
    pub fn cluster_version(&self) -> ClusterVersion {
        let known = self.releases.known.lock().expect("releases lock poisoned");
        let mut lowest = Version::current();
        let mut missing = Vec::new();
        for m in self.members().into_iter().filter(|m| m.id != self.id) {
            match known.get(&m.id) {
                Some(v) => lowest = lowest.min(*v),
                None => missing.push(if m.name.is_empty() { format!("{:x}", m.id) } else { m.name }),
            }
        }
        if missing.is_empty() {
            ClusterVersion::Decided(lowest)
        } else {
            ClusterVersion::NotDecided(missing)
        }
    }

    /// Refuse `feature` unless every member runs `since` or later (asking
    /// them at once if the cluster version is not decided yet).
    pub async fn require_release(&self, feature: &str, since: Version) -> Result<(), ServerError> {
        let version = match self.cluster_version() {
            ClusterVersion::NotDecided(_) => self.ask_versions().await,
            decided => decided,
        };
        match version {
            ClusterVersion::Decided(v) if v >= since => Ok(()),
            ClusterVersion::Decided(v) => Err(ServerError::NeedsRelease(format!(
                "{feature} needs every member at raftlock {since} or later; the oldest runs {v} (this one {RAFTLOCK})"
            ))),
            ClusterVersion::NotDecided(missing) => Err(ServerError::NeedsRelease(format!(
                "{feature} needs every member at raftlock {since} or later, and {} has not told its release \
                 (unreachable)",
                missing.join(", ")
            ))),
        }
    }
}

/// Ask every member every [`ASK_EVERY`], from the start, until the node stops.
pub(super) async fn keep_asking(node: Arc<Node>, mut stopping: Stopping) {
    loop {
        node.ask_versions().await;
        tokio::select! {
            _ = tokio::time::sleep(ASK_EVERY) => {}
            _ = stopping.stopped() => return,
        }
    }
}
