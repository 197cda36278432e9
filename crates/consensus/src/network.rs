//! The client side of the Raft RPCs: openraft's network over tonic.
//!
//! Each openraft message travels as JSON inside a `RaftMessage`. A peer that cannot be reached
//! is reported as `Unreachable` so openraft backs off; a remote Raft error is passed through.
//! Snapshots go as openraft's chunked `InstallSnapshot` calls, so no message grows with the state.

use kairos_proto::v1::raft_service_client::RaftServiceClient;
use kairos_proto::v1::RaftMessage;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::{NodeId, TypeConfig};

/// Metadata key naming the sending replica on every Raft RPC.
pub const FROM_HEADER: &str = "kairos-replica-from";

/// Creates one connection per peer.
#[derive(Clone)]
pub struct Network {
    /// This replica, named on every RPC so peers can refuse non-members.
    pub from: NodeId,
    /// Signs this replica's peer credential.
    pub key: crate::auth::ClusterKey,
    /// TLS towards peers, when the cluster uses it.
    pub tls: Option<ClientTlsConfig>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Connection {
        Connection {
            from: self.from,
            credential: self.key.peer_credential(self.from),
            tls: self.tls.clone(),
            target,
            addr: node.addr.clone(),
            client: None,
        }
    }
}

/// A lazily connected client to one peer; reconnects after a failure.
pub struct Connection {
    from: NodeId,
    credential: String,
    tls: Option<ClientTlsConfig>,
    target: NodeId,
    addr: String,
    client: Option<RaftServiceClient<Channel>>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl Connection {
    async fn call<Req, Resp, E>(&mut self, kind: RpcKind, req: &Req, option: &RPCOption) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = match self.client.take() {
            Some(c) => c,
            None => {
                let scheme = if self.tls.is_some() { "https" } else { "http" };
                let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", self.addr))
                    .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?
                    .connect_timeout(option.hard_ttl())
                    .timeout(option.hard_ttl());
                if let Some(tls) = &self.tls {
                    endpoint = endpoint
                        .tls_config(tls.clone())
                        .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
                }
                let channel =
                    endpoint.connect().await.map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
                RaftServiceClient::new(channel)
                    .max_decoding_message_size(crate::service::RAFT_MESSAGE_BYTES_MAX)
            }
        };
        let mut msg = tonic::Request::new(RaftMessage { payload });
        if let Ok(v) = self.from.to_string().parse() {
            msg.metadata_mut().insert(FROM_HEADER, v);
        }
        crate::auth::set_bearer(msg.metadata_mut(), &self.credential);
        let result = match kind {
            RpcKind::Append => client.append_entries(msg).await,
            RpcKind::Vote => client.vote(msg).await,
            RpcKind::Snapshot => client.install_snapshot(msg).await,
        };
        let reply = match result {
            Ok(r) => r.into_inner(),
            Err(status) => return Err(RPCError::Unreachable(Unreachable::new(&status))),
        };
        self.client = Some(client);
        let decoded: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&reply.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        decoded.map_err(|e| {
            RPCError::RemoteError(RemoteError::new_with_node(self.target, BasicNode::new(&self.addr), e))
        })
    }
}

#[derive(Clone, Copy)]
enum RpcKind {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        self.call(RpcKind::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(RpcKind::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(RpcKind::Vote, &rpc, &option).await
    }
}
