//! The server side of the Raft RPCs: hands peers' messages to the local openraft instance.

use kairos_proto::v1::raft_service_server::RaftService;
use kairos_proto::v1::RaftMessage;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::KairosRaft;

/// Largest Raft message accepted (snapshots are chunked well below this).
pub const RAFT_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

pub struct RaftRpc {
    raft: KairosRaft,
}

impl RaftRpc {
    pub fn new(raft: KairosRaft) -> Self {
        RaftRpc { raft }
    }
}

fn decode<T: DeserializeOwned>(msg: &RaftMessage) -> Result<T, Status> {
    serde_json::from_slice(&msg.payload)
        .map_err(|e| Status::invalid_argument(format!("decoding raft message: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftMessage>, Status> {
    let payload =
        serde_json::to_vec(value).map_err(|e| Status::internal(format!("encoding raft reply: {e}")))?;
    Ok(Response::new(RaftMessage { payload }))
}

#[tonic::async_trait]
impl RaftService for RaftRpc {
    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let req = decode(request.get_ref())?;
        encode(&self.raft.append_entries(req).await)
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let req = decode(request.get_ref())?;
        encode(&self.raft.vote(req).await)
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let req = decode(request.get_ref())?;
        encode(&self.raft.install_snapshot(req).await)
    }
}
