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
//! A downgrade (`raftlockctl downgrade`, etcd's `Maintenance.Downgrade`)
//! caps the cluster version at its target release while it is enabled: the
//! setting (`storage::downgrade`) is pushed to every member when enabled or
//! cancelled and travels with every `Version` answer, the newest generation
//! winning, and each member keeps it on disk. It ends by itself
//! ([`Node::settle_downgrade`]): it completes when the last member still
//! above the target sees every other member run the target (its cluster
//! version is the target anyway); and once a member has been seen running
//! the target ("started"), a cluster whose every member runs a later
//! release again has abandoned it (as if cancelled). Before it has
//! started, members all above the target is what `enable` leaves, and the
//! cap holds.
//!
//! Caveats: each member decides on its own, from answers at most
//! [`ASK_EVERY`] old; the decision is not replicated (docs/design/versions.md
//! says what replicating it would add: apply rules switched at one log index
//! on every member). A one-member cluster's downgrade never completes by
//! itself (no other member runs the target): cancel it once the member runs
//! the current release again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::{Node, ServerError};
use crate::base::shutdown::Stopping;
use crate::base::version::{Version, RAFTLOCK};
use crate::storage::downgrade::Setting;

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
                Ok(Some(v)) => {
                    self.adopt_downgrade(&v.downgrade);
                    Version::parse(&v.release)
                }
                Ok(None) => Some(FIRST_RELEASE),
                Err(_) => None,
            };
            if let Some(release) = release {
                self.releases.known.lock().expect("releases lock poisoned").insert(id, release);
            }
        }
        self.settle_downgrade();
        self.cluster_version()
    }

    /// The release a downgrade in progress goes to, if one is.
    pub fn downgrade_target(&self) -> Option<String> {
        self.downgrade.get().target
    }

    /// Take a downgrade setting a member told, if it is newer than ours.
    fn adopt_downgrade(&self, setting: &Setting) {
        match self.downgrade.adopt(setting) {
            Ok(true) => {
                tracing::info!(generation = setting.generation, target = ?setting.target, "downgrade setting taken")
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "could not keep a downgrade setting"),
        }
    }

    /// Move the downgrade in progress on from what the members told (see
    /// the module doc): started, completed or abandoned. Only once every
    /// other member (one at least) has told its release.
    fn settle_downgrade(&self) {
        let held = self.downgrade.get();
        let Some(target) = held.target() else { return };
        let others: Vec<u64> = self.members().into_iter().map(|m| m.id).filter(|id| *id != self.id).collect();
        let known = self.releases.known.lock().expect("releases lock poisoned").clone();
        let Some(releases) = others.iter().map(|id| known.get(id).copied()).collect::<Option<Vec<Version>>>() else {
            return;
        };
        if releases.is_empty() {
            return;
        }
        let at_target = releases.iter().filter(|v| **v == target).count();
        let ended = Setting { generation: held.generation + 1, target: None, started: false };
        if at_target == releases.len() {
            tracing::info!(%target, "every other member runs the downgrade's target: the downgrade is complete");
            self.adopt_downgrade(&ended);
        } else if at_target > 0 && !held.started {
            self.adopt_downgrade(&Setting { started: true, ..held });
        } else if held.started && releases.iter().all(|v| *v > target) {
            tracing::info!(%target, "every member runs a later release again: the downgrade was abandoned");
            self.adopt_downgrade(&ended);
        }
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
        if let Some(target) = self.downgrade.target() {
            lowest = lowest.min(target);
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

/// Why a downgrade request was refused, as etcd words it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DowngradeRefusal {
    #[error("etcdserver: wrong downgrade target version format")]
    WrongFormat,
    /// The target is not the release before the cluster version.
    #[error("etcdserver: invalid downgrade target version")]
    InvalidTarget,
    #[error("etcdserver: cluster has a downgrade job in progress")]
    InProgress,
    #[error("etcdserver: no inflight downgrade job")]
    NoneInProgress,
    /// Not every member has told its release.
    #[error("etcdserver: cluster version not found during downgrade")]
    ClusterVersionUnavailable,
    /// A member could not be given the setting (it learns it within
    /// [`ASK_EVERY`] of coming back; the others hold it already).
    #[error("raftlock: {0}")]
    Unreachable(String),
    /// Lock-delay settings or markers exist, whose ends the target release
    /// would apply otherwise than this one.
    #[error("raftlock: {0}")]
    LockDelaysInUse(String),
}

/// What `Maintenance.Downgrade` asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DowngradeAction {
    Validate,
    Enable,
    Cancel,
}

/// The release a cluster at `version` may be downgraded to: the one
/// before, by minor (etcd's rule), patch 0.
pub fn allowed_downgrade(version: Version) -> Option<Version> {
    let Version { major, minor, .. } = version;
    (minor > 0).then(|| Version::new(major, minor - 1, 0))
}

impl Node {
    /// `Maintenance.Downgrade`: validate, enable or cancel a downgrade to
    /// `target` ("major.minor" or "major.minor.patch"). Returns the cluster
    /// version (after the change).
    pub async fn downgrade(&self, action: DowngradeAction, target: &str) -> Result<Version, DowngradeRefusal> {
        let cluster = match self.ask_versions().await {
            ClusterVersion::Decided(v) => v,
            ClusterVersion::NotDecided(_) => return Err(DowngradeRefusal::ClusterVersionUnavailable),
        };
        let held = self.downgrade.get();
        if action == DowngradeAction::Cancel {
            if held.target.is_none() {
                return Err(DowngradeRefusal::NoneInProgress);
            }
            self.push_downgrade(Setting { generation: held.generation + 1, target: None, started: false }).await?;
            return Ok(self.cluster_version_or(cluster));
        }
        let target = parse_target(target).ok_or(DowngradeRefusal::WrongFormat)?;
        if held.target.is_some() {
            return Err(DowngradeRefusal::InProgress);
        }
        if allowed_downgrade(cluster) != Some(target) {
            return Err(DowngradeRefusal::InvalidTarget);
        }
        self.refuse_lock_delays_in_use_now(target).await?;
        if action == DowngradeAction::Enable {
            let generation = held.generation + 1;
            let target = Some(target.to_string());
            self.push_downgrade(Setting { generation, target, started: false }).await?;
            // Looked at again now that no member grants a new lock-delay
            // (one granted meanwhile would otherwise slip through).
            if let Err(refusal) = self.refuse_lock_delays_in_use_now(FIRST_RELEASE).await {
                let _ = self.push_downgrade(Setting { generation: generation + 1, target: None, started: false }).await;
                return Err(refusal);
            }
            return Ok(self.cluster_version_or(cluster));
        }
        Ok(cluster)
    }

    /// [`Node::refuse_lock_delays_in_use`] on a state that holds every
    /// write committed before the call (a read barrier first): a lease
    /// revoked through another member just before is seen as revoked.
    async fn refuse_lock_delays_in_use_now(&self, target: Version) -> Result<(), DowngradeRefusal> {
        if target >= crate::model::lock_delay::SINCE {
            return Ok(());
        }
        self.read_barrier()
            .await
            .map_err(|e| DowngradeRefusal::Unreachable(format!("could not read the cluster's state: {e}")))?;
        self.refuse_lock_delays_in_use(target)
    }

    /// Refuse a downgrade to a release without lock-delays while any grant
    /// carries a lock-delay setting or any lock is in a delay: the older
    /// release would apply the grant's end without the delay's marker, and
    /// the members' states would part (`model::lock_delay`).
    fn refuse_lock_delays_in_use(&self, target: Version) -> Result<(), DowngradeRefusal> {
        use crate::model::lock_delay::{is_marker, SETTING_SUFFIX};
        if target >= crate::model::lock_delay::SINCE {
            return Ok(());
        }
        let (settings, markers): (Vec<Vec<u8>>, Vec<Vec<u8>>) = {
            let mvcc = self.state.mvcc();
            let candidates = mvcc.live_where(|k| k.ends_with(SETTING_SUFFIX) || is_marker(k));
            let (markers, settings): (Vec<_>, Vec<_>) =
                candidates.into_iter().map(|kv| kv.key.clone()).partition(|k| is_marker(k));
            // A setting counts beside its owner key only (else it is any key
            // that happens to end so).
            let owners: HashSet<Vec<u8>> =
                settings.iter().map(|k| k[..k.len() - SETTING_SUFFIX.len()].to_vec()).collect();
            let live: HashSet<Vec<u8>> =
                mvcc.live_where(|k| owners.contains(k)).iter().map(|kv| kv.key.clone()).collect();
            let settings =
                settings.into_iter().filter(|k| live.contains(&k[..k.len() - SETTING_SUFFIX.len()])).collect();
            (settings, markers)
        };
        if settings.is_empty() && markers.is_empty() {
            return Ok(());
        }
        let named: Vec<String> =
            settings.iter().chain(&markers).take(5).map(|k| String::from_utf8_lossy(k).into_owned()).collect();
        Err(DowngradeRefusal::LockDelaysInUse(format!(
            "{} grant(s) hold a lock-delay setting and {} lock(s) are in a lock-delay ({}{}); raftlock {target} \
             has no lock-delays and would apply their ends otherwise: release those grants, let the delays end, \
             and ask again",
            settings.len(),
            markers.len(),
            named.join(", "),
            if settings.len() + markers.len() > named.len() { ", ..." } else { "" }
        )))
    }

    fn cluster_version_or(&self, fallback: Version) -> Version {
        match self.cluster_version() {
            ClusterVersion::Decided(v) => v,
            ClusterVersion::NotDecided(_) => fallback,
        }
    }

    /// Keep `setting` here, then give it to every other member; the ones
    /// that could not be reached are named in the error.
    async fn push_downgrade(&self, setting: Setting) -> Result<(), DowngradeRefusal> {
        self.downgrade.adopt(&setting).map_err(|e| DowngradeRefusal::Unreachable(format!("{e:#}")))?;
        let members = self.members();
        let pushes = members.iter().filter(|m| m.id != self.id).map(|m| {
            let setting = setting.clone();
            async move {
                let answer = match m.peer_urls.first() {
                    Some(url) => self.replica.peers.set_downgrade(url, &setting, ASK_TIMEOUT).await,
                    None => Err(tonic::Status::unavailable("no peer URL")),
                };
                (m, answer)
            }
        });
        let mut unreached = Vec::new();
        for (m, answer) in futures::future::join_all(pushes).await {
            match answer {
                Ok(v) => self.adopt_downgrade(&v.downgrade),
                Err(e) => unreached.push(format!("{} ({})", m.name, e.message())),
            }
        }
        if unreached.is_empty() {
            Ok(())
        } else {
            Err(DowngradeRefusal::Unreachable(format!(
                "the downgrade setting is kept here but could not be given to {}; they take it within {} s of \
                 answering again",
                unreached.join(", "),
                ASK_EVERY.as_secs()
            )))
        }
    }
}

/// "0.1" or "0.1.0" (etcd takes "major.minor"; a patch must be 0).
fn parse_target(target: &str) -> Option<Version> {
    let parts: Vec<&str> = target.trim_start_matches('v').split('.').collect();
    let full = match parts.len() {
        2 => format!("{target}.0"),
        3 => target.to_string(),
        _ => return None,
    };
    let v = Version::parse(full.trim_start_matches('v'))?;
    (v.patch == 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_may_go_back_one_minor_release_only() {
        assert_eq!(allowed_downgrade(Version::new(0, 2, 0)), Some(Version::new(0, 1, 0)));
        assert_eq!(allowed_downgrade(Version::new(0, 2, 3)), Some(Version::new(0, 1, 0)));
        assert_eq!(allowed_downgrade(Version::new(1, 0, 0)), None);
        assert_eq!(parse_target("0.1"), Some(Version::new(0, 1, 0)));
        assert_eq!(parse_target("v0.1.0"), Some(Version::new(0, 1, 0)));
        assert_eq!(parse_target("0.1.2"), None);
        assert_eq!(parse_target("one"), None);
    }
}
