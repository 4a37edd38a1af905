//! Peer authentication: every peer RPC says which cluster and which member
//! it comes from, and a member answers only members of its own cluster.
//!
//! The asking side (`identity::PeerIdentity`, a tonic interceptor on every peer
//! channel) puts two metadata entries on each request: the cluster ID
//! (derived from `--initial-cluster-token`) and the sender's member ID. The
//! answering side ([`PeerGate`]) refuses, before it decodes anything:
//! - a request without them, or from another cluster (another token, or a
//!   reused address): `FailedPrecondition`, "cluster ID mismatch";
//! - a request from an ID that is not a member: `PermissionDenied`.
//!
//! Who is a member: the configuration this member holds (voters, learners,
//! both halves of a joint one), or, before it holds one, the members named
//! by `--initial-cluster`. A member that lags behind can hold a
//! configuration from before a newer member was added — that member may even
//! lead by now, and must be let in to bring the laggard up to date. So a
//! sender this member does not know is vouched for by the members it does
//! know: if one of them holds a configuration naming the sender, the sender
//! is let in (and remembered for [`VOUCH_TTL`]). A rogue with a made-up ID
//! finds nobody to vouch for it.
//!
//! Each refused (cluster, member) pair is logged once, so that a
//! misconfigured peer that retries every few milliseconds does not flood the
//! log; at most [`MAX_LOGGED`] pairs are remembered.
//!
//! Caveat: the IDs are claims. Without peer TLS anybody who knows the token
//! and a member's peer URLs (from which IDs derive) can claim that member's
//! ID; with `--peer-client-cert-auth` only holders of a certificate from the
//! peer CA can connect at all, which is what makes the claim trustworthy.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::{Request, Status};

use crate::raft::peer::client::PeerClients;
use crate::raft::peer::identity::{CLUSTER_ID_KEY, MEMBER_ID_KEY};
use crate::raft::peer::messages::ControlRequest;
use crate::raft::types::Raft;

/// How long a member vouched for by another stays admitted without asking again.
pub const VOUCH_TTL: Duration = Duration::from_secs(10);
/// How long a sender nobody vouched for is refused without asking again (so
/// that a rogue's requests do not each become questions to every member).
const REFUSAL_TTL: Duration = Duration::from_secs(1);
/// How many verdicts on unknown senders are remembered at most.
const MAX_VERDICTS: usize = 4096;
/// How many refused (cluster, member) pairs are remembered for logging once.
const MAX_LOGGED: usize = 1024;

/// The answering side's check of every peer request (see the module doc).
#[derive(Clone)]
pub struct PeerGate {
    cluster_id: u64,
    /// `--initial-cluster`'s members: who is a member before a configuration is held.
    initial: Arc<HashSet<u64>>,
    raft: Raft,
    /// This member's peer clients, to ask the members it knows to vouch.
    peers: PeerClients,
    /// Verdicts on senders this member did not know: vouched for or not, and when.
    verdicts: Arc<Mutex<HashMap<u64, (bool, Instant)>>>,
    /// Refused (cluster, member) pairs already logged.
    logged: Arc<Mutex<HashSet<(u64, u64)>>>,
}

/// Why a request was refused.
#[derive(Debug)]
enum Refusal {
    NoIdentity,
    OtherCluster { cluster: u64, member: u64 },
    NotMember { member: u64 },
}

impl PeerGate {
    pub fn new(cluster_id: u64, initial: impl IntoIterator<Item = u64>, raft: Raft, peers: PeerClients) -> PeerGate {
        PeerGate {
            cluster_id,
            initial: Arc::new(initial.into_iter().collect()),
            raft,
            peers,
            verdicts: Arc::default(),
            logged: Arc::default(),
        }
    }

    /// Admit a request from a member of this cluster (one this member knows,
    /// or one a member it knows vouches for); returns the sender's ID.
    pub async fn admit<T>(&self, req: &Request<T>) -> Result<u64, Status> {
        let member = self.admit_cluster(req)?;
        self.admit_member(member).await
    }

    /// [`PeerGate::admit`] for a sender already admitted to the cluster.
    pub async fn admit_member(&self, member: u64) -> Result<u64, Status> {
        if self.is_member(member) || self.vouched_for(member).await {
            return Ok(member);
        }
        Err(self.refuse(Refusal::NotMember { member }))
    }

    /// Admit a request from a member this member knows itself, without asking
    /// others: for the vouching question itself, so that it never cascades.
    pub fn admit_known(&self, member: u64) -> Result<u64, Status> {
        if self.is_member(member) {
            return Ok(member);
        }
        Err(self.refuse(Refusal::NotMember { member }))
    }

    /// Admit a request from this cluster, member or not; returns the sender's
    /// ID. Only for questions a member asks about itself whose answer is
    /// harmless to anyone: whether it has been removed or has published.
    pub fn admit_cluster<T>(&self, req: &Request<T>) -> Result<u64, Status> {
        let id = |key: &str| {
            req.metadata().get(key).and_then(|v| v.to_str().ok()).and_then(|s| u64::from_str_radix(s, 16).ok())
        };
        let (Some(cluster), Some(member)) = (id(CLUSTER_ID_KEY), id(MEMBER_ID_KEY)) else {
            return Err(self.refuse(Refusal::NoIdentity));
        };
        if cluster != self.cluster_id {
            return Err(self.refuse(Refusal::OtherCluster { cluster, member }));
        }
        Ok(member)
    }

    /// Whether `id` is in the configuration this member holds (or, before it
    /// holds one, in `--initial-cluster`).
    pub fn is_member(&self, id: u64) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if m.membership_config.log_id().is_none() {
            return self.initial.contains(&id);
        }
        m.membership_config.membership().get_node(&id).is_some()
    }

    /// Whether a member this one knows holds a configuration naming `id`.
    async fn vouched_for(&self, id: u64) -> bool {
        {
            let mut verdicts = self.verdicts.lock().expect("peer gate lock poisoned");
            verdicts.retain(|_, (yes, at)| at.elapsed() < if *yes { VOUCH_TTL } else { REFUSAL_TTL });
            if let Some((yes, _)) = verdicts.get(&id) {
                return *yes;
            }
        }
        let urls: Vec<String> = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            let own = m.id;
            m.membership_config
                .membership()
                .nodes()
                .filter(|(n, _)| **n != own)
                .map(|(_, n)| n.peer_url.clone())
                .collect()
        };
        let ask = ControlRequest::IsMember { id };
        let answers = urls.iter().map(|url| self.peers.admin(url, &ask, Duration::from_millis(500)));
        let vouched = futures::future::join_all(answers).await.into_iter().any(|a| matches!(a, Ok(true)));
        let mut verdicts = self.verdicts.lock().expect("peer gate lock poisoned");
        if verdicts.len() < MAX_VERDICTS {
            verdicts.insert(id, (vouched, Instant::now()));
        }
        vouched
    }

    fn refuse(&self, why: Refusal) -> Status {
        let (pair, status) = match why {
            Refusal::NoIdentity => {
                ((0, 0), Status::failed_precondition("raftlock: peer request without a cluster ID and member ID"))
            }
            Refusal::OtherCluster { cluster, member } => (
                (cluster, member),
                Status::failed_precondition(format!(
                    "raftlock: cluster ID mismatch (local {:x}, remote {cluster:x})",
                    self.cluster_id
                )),
            ),
            Refusal::NotMember { member } => (
                (self.cluster_id, member),
                Status::permission_denied(format!("raftlock: {member:x} is not a member of this cluster")),
            ),
        };
        let mut logged = self.logged.lock().expect("peer gate lock poisoned");
        if logged.len() < MAX_LOGGED && logged.insert(pair) {
            tracing::warn!(
                cluster = format!("{:x}", pair.0),
                member = format!("{:x}", pair.1),
                reason = status.message(),
                "refusing peer requests (logged once per sender)"
            );
        }
        status
    }
}
