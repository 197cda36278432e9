//! The standard gRPC health service (`grpc.health.v1`): SERVING while this replica can reach a
//! quorum — it leads and a quorum acknowledged it recently, or it follows a leader it heard from
//! recently (`Replica::quorum_reachable`) — NOT_SERVING otherwise, for the whole server (`""`)
//! and each client-facing service. Load balancers and orchestrators take a cut-off replica out
//! of rotation this way; its reads would be stale and its writes could not commit.
//! The same loop keeps `Replica::caught_up` current.

use std::time::Duration;

use kairos_consensus::Replica;
use kairos_proto::v1::admin_service_server::AdminServiceServer;
use kairos_proto::v1::job_service_server::JobServiceServer;
use tonic::server::NamedService;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// How often the status is re-evaluated.
const PERIOD: Duration = Duration::from_millis(250);

/// The services whose status is reported ("" is the server as a whole).
const SERVICES: [&str; 3] = [
    "",
    <JobServiceServer<crate::jobs::JobApi> as NamedService>::NAME,
    <AdminServiceServer<crate::admin::AdminApi> as NamedService>::NAME,
];

/// Keeps the health service's answers current; runs until aborted.
pub async fn run(replica: Replica, health: HealthReporter) {
    let mut last = None;
    loop {
        // Also latches `caught_up` as soon as the state is fresh, whether or not a read asked:
        // on a follower that passes reads to the leader, no local read may come before it is
        // cut off, and it must still serve what it has then.
        replica.caught_up();
        let status =
            if replica.quorum_reachable() { ServingStatus::Serving } else { ServingStatus::NotServing };
        if last != Some(status) {
            tracing::info!(?status, "health");
            for service in SERVICES {
                health.set_service_status(service, status).await;
            }
            last = Some(status);
        }
        tokio::time::sleep(PERIOD).await;
    }
}
