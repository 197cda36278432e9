//! The server side of the Raft RPCs: hands peers' messages to the local openraft instance.

use kairos_proto::v1::raft_service_server::{RaftService, RaftServiceServer};
use kairos_proto::v1::RaftMessage;
use openraft::raft::AppendEntriesResponse;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use std::collections::BTreeSet;

use std::sync::Arc;

use crate::auth::{bearer, ClusterKey};
use crate::freshness::LeaderContact;
use crate::network::{FROM_HEADER, RAFT_MESSAGE_BYTES_MAX};
use crate::types::{KairosRaft, ReplicaId};

/// Serves Raft RPCs, only to cluster members.
///
/// A caller must name itself (`kairos-replica-from`), prove it with the peer credential the
/// cluster secret derives for that id (else `UNAUTHENTICATED`), and be a member of the current
/// membership or of the configured peers (else `PERMISSION_DENIED`). A replica with no
/// membership yet (waiting to be added) accepts any authenticated replica, since it cannot
/// know the cluster yet.
pub struct RaftRpc {
    raft: KairosRaft,
    peers: BTreeSet<ReplicaId>,
    key: ClusterKey,
    /// Where accepted appends from the leader are recorded (`freshness`).
    contact: Arc<LeaderContact>,
}

impl RaftRpc {
    pub fn new(
        raft: KairosRaft,
        peers: BTreeSet<ReplicaId>,
        key: ClusterKey,
        contact: Arc<LeaderContact>,
    ) -> Self {
        RaftRpc { raft, peers, key, contact }
    }

    /// The Raft service as kairosd serves it: senders checked from the headers before a body is
    /// decoded, messages at most `RAFT_MESSAGE_BYTES_MAX`.
    pub fn server(
        raft: KairosRaft,
        peers: BTreeSet<ReplicaId>,
        key: ClusterKey,
        contact: Arc<LeaderContact>,
    ) -> tonic::service::interceptor::InterceptedService<RaftServiceServer<RaftRpc>, RaftGate> {
        let gate = RaftGate { raft: raft.clone(), peers: peers.clone(), key: key.clone() };
        let rpc = RaftServiceServer::new(RaftRpc::new(raft, peers, key, contact))
            .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX);
        tonic::service::interceptor::InterceptedService::new(rpc, gate)
    }

    fn check_member<T>(&self, request: &Request<T>) -> Result<(), Status> {
        check_member(&self.raft, &self.peers, &self.key, request.metadata())
    }
}

/// A Raft RPC's sender must name itself, prove it with its peer credential, and be a member
/// (or a configured peer; anyone authenticated while this replica has no membership yet).
fn check_member(
    raft: &KairosRaft,
    peers: &BTreeSet<ReplicaId>,
    key: &ClusterKey,
    metadata: &tonic::metadata::MetadataMap,
) -> Result<(), Status> {
    let from: ReplicaId = metadata
        .get(FROM_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Status::unauthenticated("raft: the caller does not name its replica id"))?;
    let proven = bearer(metadata).is_some_and(|c| key.verify(&format!("raft:{from}"), c));
    if !proven {
        return Err(Status::unauthenticated(format!(
            "raft: no valid peer credential for replica {from} (is the cluster secret the same?)"
        )));
    }
    // Judged under the metrics' borrow, nothing copied: every append from the leader comes here.
    let member = {
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        let mut nodes = metrics.membership_config.nodes().map(|(id, _)| *id).peekable();
        nodes.peek().is_none() || nodes.any(|id| id == from)
    };
    if member || peers.contains(&from) {
        Ok(())
    } else {
        Err(Status::permission_denied(format!("raft: replica {from} is not a member of this cluster")))
    }
}

/// Checks a Raft RPC's sender from its headers, before its body is read or decoded: a caller
/// without the peer credential costs no memory for what it sends (`RaftRpc::server`).
#[derive(Clone)]
pub struct RaftGate {
    raft: KairosRaft,
    peers: BTreeSet<ReplicaId>,
    key: ClusterKey,
}

impl tonic::service::Interceptor for RaftGate {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        check_member(&self.raft, &self.peers, &self.key, request.metadata())?;
        Ok(request)
    }
}

fn decode<T: DeserializeOwned>(msg: &RaftMessage) -> Result<T, Status> {
    serde_json::from_slice(&msg.payload)
        .map_err(|e| Status::invalid_argument(format!("decoding raft message: {e}")))
}

/// A reply, with this replica's wall clock in its metadata (`peerclock`).
fn encode<T: Serialize>(value: &T) -> Result<Response<RaftMessage>, Status> {
    let payload =
        serde_json::to_vec(value).map_err(|e| Status::internal(format!("encoding raft reply: {e}")))?;
    let mut reply = Response::new(RaftMessage { payload });
    if let Ok(wall) = crate::peerclock::wall_now_ms().to_string().parse() {
        reply.metadata_mut().insert(crate::peerclock::WALL_HEADER, wall);
    }
    Ok(reply)
}

#[tonic::async_trait]
impl RaftService for RaftRpc {
    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_member(&request)?;
        let req: openraft::raft::AppendEntriesRequest<crate::types::TypeConfig> = decode(request.get_ref())?;
        let sent_commit = req.leader_commit.map(|l| l.index).unwrap_or(0);
        let reply = self.raft.append_entries(req).await;
        if let Ok(AppendEntriesResponse::Success | AppendEntriesResponse::PartialSuccess(_)) = &reply {
            self.contact.record(std::time::Instant::now(), sent_commit);
        }
        encode(&reply)
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_member(&request)?;
        let req = decode(request.get_ref())?;
        encode(&self.raft.vote(req).await)
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_member(&request)?;
        let req = decode(request.get_ref())?;
        encode(&self.raft.install_snapshot(req).await)
    }
}

#[cfg(test)]
mod tests {
    use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
    use proptest::prelude::*;

    use super::*;
    use crate::types::TypeConfig;

    proptest! {
        /// Whatever bytes arrive as a Raft message, decoding gives a message or INVALID_ARGUMENT.
        #[test]
        fn any_payload_decodes_or_is_an_invalid_argument(payload in proptest::collection::vec(any::<u8>(), 0..256)) {
            let msg = RaftMessage { payload };
            for code in [
                decode::<AppendEntriesRequest<TypeConfig>>(&msg).err().map(|s| s.code()),
                decode::<VoteRequest<ReplicaId>>(&msg).err().map(|s| s.code()),
                decode::<InstallSnapshotRequest<TypeConfig>>(&msg).err().map(|s| s.code()),
            ]
            .into_iter()
            .flatten()
            {
                prop_assert_eq!(code, tonic::Code::InvalidArgument);
            }
        }
    }

    #[test]
    fn a_truncated_vote_is_refused() {
        let msg = RaftMessage { payload: br#"{"vote":{"leader_id":{"term":1,"#.to_vec() };
        assert_eq!(decode::<VoteRequest<ReplicaId>>(&msg).unwrap_err().code(), tonic::Code::InvalidArgument);
    }
}
