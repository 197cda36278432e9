//! Any replica serves any call: a follower passes a client's call that it cannot serve itself
//! (a write, a read that must see the leader's state, a token it cannot settle) to the leader,
//! and returns the leader's answer, so clients need no redirect code of their own.
//!
//! How: the user-facing services (jobs, admin) are wrapped in `Forwarded`. On the leader a call
//! goes straight to the service. On any other replica the request body (unary in every
//! user-facing call, bounded by the API's message limit) is kept, and:
//! - a write or a read whose answer must include every acknowledged write (read-your-writes:
//!   `ListJobs` right after `Submit`) goes to the leader at once when one is known — the same
//!   request, headers, credentials, trace context and body, over one kept HTTP/2 connection;
//! - the rest (`ClusterStatus`, this replica's own view; the long streams `WatchJob` and
//!   `StreamLogs`), and everything when no leader is known or it does not answer in time
//!   (`READ_WAIT`, `WRITE_WAIT`), is served locally — reads from this replica's state when it has
//!   caught up (the promise of reads without a quorum), writes refused `UNAVAILABLE`;
//! - a local answer `UNAVAILABLE` with the leader's address (`kairos-leader`: only the leader
//!   can answer this, e.g. a token this replica cannot settle) goes to the leader too, unless
//!   that was just tried.
//!
//! The leader's answer (also a stream) is relayed as is.
//!
//! Callers are checked from the headers before any body is read (`Forwarder::gate`, the same
//! check as the services' own): a call without valid credentials is refused at once, and one
//! whose token this replica cannot settle (too new, or its state too stale to vouch) is passed to
//! the leader unread — streamed, not kept — so a follower never buffers an unauthenticated body.
//!
//! A forwarded call carries `kairos-forwarded`; a replica never forwards such a call again
//! (leadership moved meanwhile: the client gets `UNAVAILABLE` with the new leader, as before).
//! The hint header stays on every `UNAVAILABLE`, and a relayed answer carries it too (the
//! leader's address in `kairos-leader`), so a client may go to the leader itself and save the
//! hop (`kairos-bench` does; plain clients need not).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use kairos_consensus::Replica;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tower_service::Service;

use crate::status::LEADER_HEADER;

/// Marks a call one replica passed to another.
pub const FORWARDED_HEADER: &str = "kairos-forwarded";
/// gRPC's code for `UNAVAILABLE`.
const UNAVAILABLE: &str = "14";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a forwarded read may take to answer before this replica answers it itself.
const READ_WAIT: Duration = Duration::from_secs(2);
/// Likewise for a write: the leader's commit wait, and a margin.
const WRITE_WAIT: Duration = Duration::from_secs(kairos_consensus::WRITE_TIMEOUT.as_secs() + 2);

/// How a follower treats a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Answered from its own state, never forwarded first: its own view of the cluster, and long
    /// streams that would tie a connection to the leader for their whole life.
    Local,
    /// Served here as it arrives, never read whole first: a stream the client keeps writing to
    /// (a session), which a follower's collect-then-route would hold forever.
    Stream,
    /// Forwarded; a read (its answer comes without a commit wait).
    Read,
    /// Forwarded; a write (the leader's commit wait).
    Write,
}

/// Every method of the services a follower forwards, and its route (a test checks the table
/// against the protos: a new method cannot go unrouted).
const ROUTES: [(&str, Route); 44] = [
    ("/kairos.v1.JobService/Submit", Route::Write),
    ("/kairos.v1.JobService/GetJob", Route::Read),
    ("/kairos.v1.JobService/ListJobs", Route::Read),
    ("/kairos.v1.JobService/CancelJob", Route::Write),
    ("/kairos.v1.JobService/WatchJob", Route::Local),
    ("/kairos.v1.JobService/StreamLogs", Route::Local),
    // Asked of the job's agent by whichever replica is called (as logs are).
    ("/kairos.v1.JobService/JobUsage", Route::Local),
    ("/kairos.v1.JobService/Session", Route::Stream),
    ("/kairos.v1.JobService/HoldJob", Route::Write),
    ("/kairos.v1.JobService/ReleaseJob", Route::Write),
    ("/kairos.v1.JobService/ListHistory", Route::Read),
    // A token created a moment ago is known to the leader first.
    ("/kairos.v1.JobService/WhoAmI", Route::Read),
    ("/kairos.v1.AdminService/ListNodes", Route::Read),
    ("/kairos.v1.AdminService/ClusterStatus", Route::Local),
    ("/kairos.v1.AdminService/AddReplica", Route::Write),
    ("/kairos.v1.AdminService/RemoveReplica", Route::Write),
    ("/kairos.v1.AdminService/SaveSnapshot", Route::Write),
    ("/kairos.v1.AdminService/GetPolicy", Route::Read),
    ("/kairos.v1.AdminService/ApplyPolicy", Route::Write),
    ("/kairos.v1.AdminService/PutQos", Route::Write),
    ("/kairos.v1.AdminService/DeleteQos", Route::Write),
    ("/kairos.v1.AdminService/PutAccount", Route::Write),
    ("/kairos.v1.AdminService/DeleteAccount", Route::Write),
    ("/kairos.v1.AdminService/PutPartition", Route::Write),
    ("/kairos.v1.AdminService/DeletePartition", Route::Write),
    ("/kairos.v1.AdminService/GetPriorities", Route::Read),
    ("/kairos.v1.AdminService/GetShares", Route::Read),
    ("/kairos.v1.AdminService/ListPreemptions", Route::Read),
    ("/kairos.v1.AdminService/GetBurstConfig", Route::Read),
    ("/kairos.v1.AdminService/SetBurstConfig", Route::Write),
    ("/kairos.v1.AdminService/BurstStatus", Route::Read),
    ("/kairos.v1.AdminService/CreateToken", Route::Write),
    ("/kairos.v1.AdminService/ListTokens", Route::Read),
    ("/kairos.v1.AdminService/RevokeToken", Route::Write),
    ("/kairos.v1.AdminService/DrainNode", Route::Write),
    ("/kairos.v1.AdminService/RemoveNode", Route::Write),
    ("/kairos.v1.AdminService/ResumeNode", Route::Write),
    ("/kairos.v1.AdminService/ResetGpu", Route::Write),
    ("/kairos.v1.AdminService/ListClusterEvents", Route::Read),
    ("/kairos.v1.AdminService/GetTopology", Route::Read),
    ("/kairos.v1.AdminService/SetTopology", Route::Write),
    ("/kairos.v1.AdminService/PutReservation", Route::Write),
    ("/kairos.v1.AdminService/DeleteReservation", Route::Write),
    ("/kairos.v1.AdminService/ListReservations", Route::Read),
];

/// The route of the call at `path` (one not in the table: a write, the longer wait).
fn route(path: &str) -> Route {
    ROUTES.iter().find(|(p, _)| *p == path).map_or(Route::Write, |(_, r)| *r)
}

/// How long a forwarded call may take to answer before this replica answers it itself.
fn wait_for(path: &str) -> Duration {
    if route(path) == Route::Read {
        READ_WAIT
    } else {
        WRITE_WAIT
    }
}

/// The caller check from the headers (`context::user_gate`'s): `Ok` for a caller this replica
/// knows, `UNAVAILABLE` naming the leader for one only the leader can settle, else the refusal.
pub type Gate = Arc<dyn Fn(&http::HeaderMap) -> Result<(), tonic::Status> + Send + Sync>;

/// What every wrapped service shares: the replica (who leads) and the connection to the leader.
#[derive(Clone)]
pub struct Forwarder {
    replica: Replica,
    gate: Gate,
    tls: Option<ClientTlsConfig>,
    /// Largest request body kept for forwarding (the API's decoding limit plus gRPC framing).
    body_max: usize,
    /// The leader's address and a lazily connected channel to it.
    leader: Arc<Mutex<Option<(String, Channel)>>>,
    forwarded: Arc<crate::metrics::Metrics>,
}

impl Forwarder {
    pub fn new(
        replica: Replica,
        gate: Gate,
        tls: Option<ClientTlsConfig>,
        message_max: usize,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Forwarder {
        Forwarder {
            replica,
            gate,
            tls,
            body_max: message_max + 5,
            leader: Arc::default(),
            forwarded: metrics,
        }
    }

    /// `service`, forwarding what only the leader can answer.
    pub fn wrap<S>(&self, service: S) -> Forwarded<S> {
        Forwarded { inner: service, forwarder: Arc::new(self.clone()) }
    }

    /// The channel to the leader at `addr` (kept while the leader stays there).
    fn channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let mut leader = self.leader.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((known, channel)) = leader.as_ref() {
            if known == addr {
                return Ok(channel.clone());
            }
        }
        let mut endpoint = Endpoint::from_shared(kairos_proto::wire::url(addr, self.tls.is_some()))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10));
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let channel = endpoint.connect_lazy();
        *leader = Some((addr.to_string(), channel.clone()));
        Ok(channel)
    }

    /// The leader's address when this replica knows another replica leads.
    fn leader_addr(&self) -> Option<String> {
        match self.replica.leader() {
            (Some(id), Some(addr)) if id != self.replica.id => Some(addr),
            _ => None,
        }
    }

    /// Sends the kept request to the leader at `addr`; `None` when it cannot be reached or does
    /// not answer within `wait`.
    async fn to_leader(
        &self,
        addr: &str,
        head: &Head,
        body: Body,
        wait: Duration,
    ) -> Option<http::Response<Body>> {
        let mut channel = match self.channel(addr) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(leader = %addr, error = %e, "cannot forward to the leader");
                return None;
            }
        };
        let mut request = http::Request::new(body);
        *request.method_mut() = head.method.clone();
        *request.uri_mut() = head.uri.clone();
        *request.headers_mut() = head.headers.clone();
        request.headers_mut().insert(FORWARDED_HEADER, http::HeaderValue::from_static("1"));
        let sent = async {
            futures::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
            channel.call(request).await
        };
        match tokio::time::timeout(wait, sent).await {
            Ok(Ok(mut response)) => {
                self.forwarded.forwarded();
                if let Ok(value) = http::HeaderValue::from_str(addr) {
                    response.headers_mut().entry(LEADER_HEADER).or_insert(value);
                }
                Some(response)
            }
            Err(_) => {
                tracing::warn!(leader = %addr, ?wait, "the leader did not answer a forwarded call in time");
                None
            }
            Ok(Err(e)) => {
                tracing::warn!(leader = %addr, error = %e, "forwarding to the leader failed");
                // A broken connection is replaced on the next call.
                self.leader.lock().unwrap_or_else(|p| p.into_inner()).take();
                None
            }
        }
    }
}

/// The parts of a request that are sent again to the leader.
struct Head {
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
}

/// A user-facing service behind the forwarder.
#[derive(Clone)]
pub struct Forwarded<S> {
    inner: S,
    /// Shared: the router clones this service for every call.
    forwarder: Arc<Forwarder>,
}

impl<S: NamedService> NamedService for Forwarded<S> {
    const NAME: &'static str = S::NAME;
}

/// The leader's address from an `UNAVAILABLE` answer that names one.
fn leader_hint(response: &http::Response<Body>) -> Option<String> {
    let headers = response.headers();
    if headers.get("grpc-status").and_then(|v| v.to_str().ok()) != Some(UNAVAILABLE) {
        return None;
    }
    headers.get(LEADER_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string)
}

impl<S, B> Service<http::Request<Body>> for Forwarded<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The service that was polled ready serves this call; a clone takes its place.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        if self.forwarder.replica.is_leader()
            || request.headers().contains_key(FORWARDED_HEADER)
            || route(request.uri().path()) == Route::Stream
        {
            let served = inner.call(request);
            return Box::pin(async move { Ok(served.await?.map(Body::new)) });
        }
        let forwarder = self.forwarder.clone();
        match (forwarder.gate)(request.headers()) {
            Ok(()) => {}
            Err(refused) if refused.code() != tonic::Code::Unavailable => {
                return Box::pin(async move { Ok(refused.into_http()) });
            }
            // Only the leader can settle this caller: its call goes there unread.
            Err(unsettled) => {
                return Box::pin(async move {
                    let addr = forwarder.leader_addr();
                    let (parts, body) = request.into_parts();
                    let head = Head { method: parts.method, uri: parts.uri, headers: parts.headers };
                    let wait = wait_for(head.uri.path());
                    let answer = match addr {
                        Some(addr) => forwarder.to_leader(&addr, &head, body, wait).await,
                        None => None,
                    };
                    Ok(answer.unwrap_or_else(|| unsettled.into_http()))
                });
            }
        }
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = match Limited::new(body, forwarder.body_max).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    let status = tonic::Status::resource_exhausted(format!("request body: {e}"));
                    return Ok(status.into_http());
                }
            };
            let head =
                Head { method: parts.method.clone(), uri: parts.uri.clone(), headers: parts.headers.clone() };
            let path = head.uri.path();
            let wait = wait_for(path);
            let mut tried = None;
            if route(path) != Route::Local {
                if let Some(addr) = forwarder.leader_addr() {
                    let kept = Body::new(Full::new(body.clone()));
                    if let Some(answer) = forwarder.to_leader(&addr, &head, kept, wait).await {
                        return Ok(answer);
                    }
                    tried = Some(addr);
                }
            }
            let local = inner
                .call(http::Request::from_parts(parts, Body::new(Full::new(body.clone()))))
                .await?
                .map(Body::new);
            match leader_hint(&local).filter(|addr| tried.as_ref() != Some(addr)) {
                Some(addr) => {
                    let kept = Body::new(Full::new(body));
                    Ok(forwarder.to_leader(&addr, &head, kept, wait).await.unwrap_or(local))
                }
                None => Ok(local),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every method of the forwarded services as the protos declare them.
    fn declared() -> Vec<String> {
        let protos = [
            ("JobService", include_str!("../../../proto/kairos/v1/job.proto")),
            ("AdminService", include_str!("../../../proto/kairos/v1/admin.proto")),
        ];
        let mut out = Vec::new();
        for (service, text) in protos {
            for line in text.lines() {
                let Some(rest) = line.trim().strip_prefix("rpc ") else { continue };
                let name = rest.split('(').next().unwrap_or_default().trim();
                out.push(format!("/kairos.v1.{service}/{name}"));
            }
        }
        out
    }

    #[test]
    fn every_forwarded_method_has_its_route_and_no_route_names_a_method_that_is_gone() {
        let declared = declared();
        assert!(declared.len() > 20, "{declared:?}");
        let routed: Vec<&str> = ROUTES.iter().map(|(p, _)| *p).collect();
        for method in &declared {
            assert!(routed.contains(&method.as_str()), "{method} has no route in forward::ROUTES");
        }
        for path in &routed {
            assert!(declared.iter().any(|d| d == path), "{path} is routed but no longer declared");
        }
        assert_eq!(route("/kairos.v1.JobService/GetJob"), Route::Read);
        assert_eq!(route("/kairos.v1.JobService/StreamLogs"), Route::Local);
        assert_eq!(
            route("/kairos.v1.JobService/Session"),
            Route::Stream,
            "a client stream is never read whole"
        );
        assert_eq!(route("/kairos.v1.JobService/Submit"), Route::Write);
        assert_eq!(route("/kairos.v1.JobService/Unknown"), Route::Write, "unknown: the longer wait");
        assert_eq!(wait_for("/kairos.v1.AdminService/BurstStatus"), READ_WAIT);
    }
}
