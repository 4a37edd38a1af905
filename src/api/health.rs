//! gRPC's standard health service (`grpc.health.v1.Health`, what Kubernetes'
//! gRPC probes and `grpc_health_probe` ask), for the whole server (service
//! name "") and each service by name.
//!
//! A member reports SERVING while it has a leader it can count on
//! (`Node::has_leader`: a follower that hears from one, or a leader that a
//! quorum keeps acknowledging), NOT_SERVING without one and once it begins to
//! stop. The status is re-read every [`HEALTH_INTERVAL`], so a change shows
//! within that much after the member itself notices it (a lost leader takes an
//! election timeout to notice).

use std::sync::Arc;
use std::time::Duration;

use tonic_health::ServingStatus;

use crate::node::Node;

/// How often the reported status follows the member's.
pub const HEALTH_INTERVAL: Duration = Duration::from_millis(200);

/// The health service for `node`, with a task that keeps its status current
/// until the node stops.
pub fn service(
    node: Arc<Node>,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    let mut stopping = node.stopping();
    tokio::spawn(async move {
        let names = [
            "",
            "etcdserverpb.KV",
            "etcdserverpb.Watch",
            "etcdserverpb.Lease",
            "etcdserverpb.Cluster",
            "etcdserverpb.Maintenance",
            "etcdserverpb.Auth",
            "v3lockpb.Lock",
            "v3electionpb.Election",
            "raftlock.v1.Locks",
        ];
        let mut ticks = tokio::time::interval(HEALTH_INTERVAL);
        let mut reported = None;
        loop {
            let status = if node.has_leader() { ServingStatus::Serving } else { ServingStatus::NotServing };
            // Only changes are sent: Watch streams hear of each one once.
            if reported != Some(status) {
                for name in names {
                    reporter.set_service_status(name, status).await;
                }
                reported = Some(status);
            }
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stopping.stopped() => break,
            }
        }
        for name in names {
            reporter.set_service_status(name, ServingStatus::NotServing).await;
        }
    });
    service
}
