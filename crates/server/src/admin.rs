//! The admin service: nodes and the controller cluster's status.

use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_server::AdminService;
use tonic::{Request, Response, Status};

use crate::context::Ctx;
use crate::convert::node_to_pb;

pub struct Admin {
    pub ctx: Ctx,
}

#[tonic::async_trait]
impl AdminService for Admin {
    async fn list_nodes(
        &self,
        _request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let heartbeats = self.ctx.heartbeats.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let nodes = self.ctx.replica.read(|a| {
            a.state
                .nodes
                .values()
                .map(|n| node_to_pb(n, heartbeats.get(&n.info.name).map(|(_, ms)| *ms).unwrap_or(0)))
                .collect()
        });
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn cluster_status(
        &self,
        _request: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let s = self.ctx.replica.status();
        Ok(Response::new(pb::ClusterStatusResponse {
            id: s.id,
            leader: s.leader,
            leader_addr: s.leader_addr.unwrap_or_default(),
            term: s.term,
            last_log_index: s.last_log_index,
            applied_index: s.applied_index,
            state_digest: s.state_digest,
            replicas: s.replicas.into_iter().map(|(id, addr, role)| pb::Replica { id, addr, role }).collect(),
        }))
    }
}
