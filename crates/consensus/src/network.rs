//! The client side of the Raft RPCs: openraft's network over tonic.
//!
//! Each openraft message travels as JSON inside a `RaftMessage`. A peer that cannot be reached
//! is reported as `Unreachable` so openraft backs off (`backoff_delays`: 50 ms doubling to
//! 500 ms); a call that outlived its deadline is a `Timeout` (retried at once, on the same
//! connection); a remote Raft error is passed through.
//! Snapshots go as openraft's chunked `InstallSnapshot` calls, so no message grows with the state.
//!
//! openraft gives every `AppendEntries` a hard timeout of one heartbeat interval, and sends up to
//! `max_payload_entries` entries in it. A follower far behind on large entries (group commits
//! of large submits) would get the same oversized call, time out, and never catch up — while
//! its elections disrupt the others. So an append carries at most `APPEND_BYTES_BUDGET` of
//! entries (at least one), and a follower that took that prefix is reported as
//! `PartialSuccess`: openraft continues from there.

use kairos_proto::v1::raft_service_client::RaftServiceClient;
use kairos_proto::v1::RaftMessage;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::RPCTypes;
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::types::{NodeId, TypeConfig};

/// Most bytes of entries (as encoded) in one `AppendEntries`; a larger single entry goes alone.
pub const APPEND_BYTES_BUDGET: usize = 256 * 1024;

// openraft fixes the error type; its size is not ours to choose.
#[allow(clippy::result_large_err)]
fn encode<T: Serialize, E>(value: &T) -> RpcResult<Vec<u8>, E>
where
    E: std::error::Error,
{
    serde_json::to_vec(value).map_err(|e| RPCError::Network(NetworkError::new(&e)))
}

/// How many of `entries`, from the first, fit `budget` bytes (at least one).
fn prefix_within<T: Serialize>(entries: &[T], budget: usize) -> usize {
    if entries.len() <= 1 {
        return entries.len();
    }
    let mut used = 0;
    for (i, e) in entries.iter().enumerate() {
        used += serde_json::to_vec(e).map(|v| v.len()).unwrap_or(usize::MAX);
        if used > budget {
            return i.max(1);
        }
    }
    entries.len()
}

/// Largest Raft message accepted (snapshots are chunked well below this).
pub const RAFT_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

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
    /// Where the wall clocks peers answer with are recorded.
    pub clocks: std::sync::Arc<crate::peerclock::PeerClocks>,
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
            unanswered: 0,
            clocks: self.clocks.clone(),
        }
    }
}

/// A lazily connected client to one peer; reconnects after a failed call.
pub struct Connection {
    from: NodeId,
    credential: String,
    tls: Option<ClientTlsConfig>,
    target: NodeId,
    addr: String,
    client: Option<RaftServiceClient<Channel>>,
    /// Calls on `client` in a row that got no answer (openraft dropped them at its timeout); a
    /// connection that stops answering altogether (a peer restarted behind a partition) is
    /// replaced after `UNANSWERED_MAX` of them.
    unanswered: u32,
    clocks: std::sync::Arc<crate::peerclock::PeerClocks>,
}

/// Unanswered calls in a row after which a peer's connection is replaced.
const UNANSWERED_MAX: u32 = 3;

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl Connection {
    async fn call<Req, Resp, E>(&mut self, kind: RpcKind, req: &Req, option: &RPCOption) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload = encode(req)?;
        self.call_encoded(kind, payload, option).await
    }

    /// `call` for a request already encoded as `payload`.
    async fn call_encoded<Resp, E>(
        &mut self,
        kind: RpcKind,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let mut client = self.client(option.hard_ttl()).await.map_err(RPCError::Unreachable)?;
        let msg = self.message(payload, option.hard_ttl());
        // Counted as unanswered until it answers (a call dropped midway never does).
        self.unanswered += 1;
        let result = match kind {
            RpcKind::Append => client.append_entries(msg).await,
            RpcKind::Vote => client.vote(msg).await,
            RpcKind::Snapshot => client.install_snapshot(msg).await,
        };
        self.unanswered = 0;
        let reply = match result {
            Ok(r) => {
                let wall = r.metadata().get(crate::peerclock::WALL_HEADER);
                if let Some(wall) = wall.and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()) {
                    self.clocks.record(self.target, wall);
                }
                r.into_inner()
            }
            Err(status) if timed_out(&status) => {
                // A slow answer, not a lost peer: no back-off, and the connection stays.
                return Err(RPCError::Timeout(Timeout {
                    action: kind.rpc_type(),
                    id: self.from,
                    target: self.target,
                    timeout: option.hard_ttl(),
                }));
            }
            Err(status) => {
                self.client = None;
                return Err(RPCError::Unreachable(Unreachable::new(&status)));
            }
        };
        let decoded: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&reply.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        decoded.map_err(|e| {
            RPCError::RemoteError(RemoteError::new_with_node(self.target, BasicNode::new(&self.addr), e))
        })
    }

    /// The client to the peer: the one kept, or a new connection (made within `ttl`).
    ///
    /// The connection is kept across calls, also when openraft drops a call at its timeout: a
    /// follower that is slow to answer must not also pay a new connection on every retry.
    async fn client(&mut self, ttl: std::time::Duration) -> Result<RaftServiceClient<Channel>, Unreachable> {
        if self.unanswered >= UNANSWERED_MAX {
            self.client = None;
            self.unanswered = 0;
        }
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", self.addr))
            .map_err(|e| Unreachable::new(&e))?
            .connect_timeout(ttl);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(|e| Unreachable::new(&e))?;
        }
        let channel = endpoint.connect().await.map_err(|e| Unreachable::new(&e))?;
        let client = RaftServiceClient::new(channel).max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX);
        self.client = Some(client.clone());
        Ok(client)
    }

    /// The request carrying `payload`, with its deadline `ttl`, who sends it and its credential.
    fn message(&self, payload: Vec<u8>, ttl: std::time::Duration) -> tonic::Request<RaftMessage> {
        let mut msg = tonic::Request::new(RaftMessage { payload });
        // Each kind of call has its own deadline (a snapshot chunk's is longer than an append's).
        msg.set_timeout(ttl);
        if let Ok(v) = self.from.to_string().parse() {
            msg.metadata_mut().insert(FROM_HEADER, v);
        }
        crate::auth::set_bearer(msg.metadata_mut(), &self.credential);
        msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_append_carries_entries_up_to_the_budget_and_at_least_one() {
        let entries: Vec<String> = (0..10).map(|_| "x".repeat(100)).collect();
        // Each encodes to 102 bytes (with its quotes).
        assert_eq!(prefix_within(&entries, 10_000), 10);
        assert_eq!(prefix_within(&entries, 350), 3);
        assert_eq!(prefix_within(&entries, 50), 1, "a larger entry goes alone");
        assert_eq!(prefix_within(&entries[..1], 50), 1);
        assert_eq!(prefix_within::<String>(&[], 50), 0);
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_is_a_timeout_and_a_refused_connection_is_unreachable() {
        // A real tonic call to a peer that accepts but never answers, with a short deadline.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                kept.push(s);
            }
        });
        let channel = Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
        let mut client = RaftServiceClient::new(channel);
        let mut msg = tonic::Request::new(RaftMessage { payload: Vec::new() });
        msg.set_timeout(std::time::Duration::from_millis(50));
        let status = client.append_entries(msg).await.unwrap_err();
        assert!(timed_out(&status), "{status:?}");
        held.abort();

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone = closed.local_addr().unwrap();
        drop(closed);
        let channel = Endpoint::from_shared(format!("http://{gone}")).unwrap().connect_lazy();
        let status = RaftServiceClient::new(channel)
            .append_entries(tonic::Request::new(RaftMessage { payload: Vec::new() }))
            .await
            .unwrap_err();
        assert!(!timed_out(&status), "{status:?}");
        assert!(timed_out(&tonic::Status::deadline_exceeded("peer's deadline")));
    }

    #[test]
    fn an_unreachable_peer_is_retried_within_an_election_timeout_then_every_half_second() {
        let delays: Vec<u64> = backoff_delays().take(6).map(|d| d.as_millis() as u64).collect();
        assert_eq!(delays, [50, 100, 200, 400, 500, 500]);
    }
}

#[derive(Clone, Copy)]
enum RpcKind {
    Append,
    Vote,
    Snapshot,
}

impl RpcKind {
    fn rpc_type(self) -> RPCTypes {
        match self {
            RpcKind::Append => RPCTypes::AppendEntries,
            RpcKind::Vote => RPCTypes::Vote,
            RpcKind::Snapshot => RPCTypes::InstallSnapshot,
        }
    }
}

/// Whether a failed call ran out of its deadline (this side's timer or the peer's), as opposed to
/// finding no peer. openraft backs off from an unreachable peer for as long as `backoff` says,
/// sending it nothing, not even heartbeats: an append that is merely slower than its deadline
/// (one heartbeat interval — a follower's fsync under load) must not be reported so, or the
/// follower hears nothing for the back-off and calls an election.
fn timed_out(status: &tonic::Status) -> bool {
    if status.code() == tonic::Code::DeadlineExceeded {
        return true;
    }
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.downcast_ref::<tonic::TimeoutExpired>().is_some() {
            return true;
        }
        source = e.source();
    }
    false
}

/// How long openraft waits before calling an unreachable peer again: soon at first (a peer that
/// restarts is back within an election timeout), then at most every `BACKOFF_MAX`.
fn backoff_delays() -> impl Iterator<Item = std::time::Duration> + Send + 'static {
    std::iter::successors(Some(BACKOFF_FIRST), |d| Some((*d * 2).min(BACKOFF_MAX)))
}

const BACKOFF_FIRST: std::time::Duration = std::time::Duration::from_millis(50);
const BACKOFF_MAX: std::time::Duration = std::time::Duration::from_millis(500);

impl RaftNetwork<TypeConfig> for Connection {
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(backoff_delays())
    }

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        // Encoded once; only an append over the budget is measured entry by entry and cut.
        let mut payload = encode(&rpc)?;
        let mut cut = None;
        if payload.len() > APPEND_BYTES_BUDGET && rpc.entries.len() > 1 {
            let sent = prefix_within(&rpc.entries, APPEND_BYTES_BUDGET);
            if sent < rpc.entries.len() {
                cut = Some(rpc.entries[sent - 1].log_id);
                rpc.entries.truncate(sent);
                payload = encode(&rpc)?;
            }
        }
        match (self.call_encoded(RpcKind::Append, payload, &option).await?, cut) {
            (AppendEntriesResponse::Success, Some(last_sent)) => {
                Ok(AppendEntriesResponse::PartialSuccess(Some(last_sent)))
            }
            (resp, _) => Ok(resp),
        }
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
