//! The admin service: nodes and the controller cluster's status.

use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_server::AdminService;
use tonic::{Request, Response, Status};

use kairos_consensus::membership::MembershipError;
use kairos_consensus::WriteError;

use crate::context::{write_status, Ctx};
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
        Ok(Response::new(self.status()))
    }

    async fn add_replica(
        &self,
        request: Request<pb::AddReplicaRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let req = request.into_inner();
        self.ctx.replica.add_replica(req.id, &req.addr).await.map_err(membership_status)?;
        Ok(Response::new(self.status()))
    }

    async fn remove_replica(
        &self,
        request: Request<pb::RemoveReplicaRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let req = request.into_inner();
        self.ctx.replica.remove_replica(req.id).await.map_err(membership_status)?;
        Ok(Response::new(self.status()))
    }
}

fn membership_status(e: MembershipError) -> Status {
    match e {
        MembershipError::NotLeader { leader_addr } => {
            write_status(WriteError::NotLeader { leader: None, leader_addr })
        }
        MembershipError::BadAddr(_) | MembershipError::ZeroId => Status::invalid_argument(e.to_string()),
        MembershipError::NotMember(_) => Status::not_found(e.to_string()),
        MembershipError::IdTaken { .. }
        | MembershipError::AddrTaken { .. }
        | MembershipError::LastVoter(_) => Status::failed_precondition(e.to_string()),
        MembershipError::CatchUpTimeout(_) => Status::deadline_exceeded(e.to_string()),
        MembershipError::Raft(_) => Status::unavailable(e.to_string()),
    }
}

impl Admin {
    fn status(&self) -> pb::ClusterStatusResponse {
        let s = self.ctx.replica.status();
        pb::ClusterStatusResponse {
            id: s.id,
            leader: s.leader,
            leader_addr: s.leader_addr.unwrap_or_default(),
            term: s.term,
            last_log_index: s.last_log_index,
            applied_index: s.applied_index,
            commit_index: s.commit_index,
            state_digest: s.state_digest,
            snapshot_index: s.snapshot_index,
            replicas: s.replicas.into_iter().map(|(id, addr, role)| pb::Replica { id, addr, role }).collect(),
        }
    }
}
