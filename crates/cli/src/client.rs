//! Connecting to the controllers: try each listed address, follow leader hints, and turn gRPC
//! failures into one-line messages.

use std::future::Future;
use std::time::Duration;

use kairos_proto::v1::admin_service_client::AdminServiceClient;
use kairos_proto::v1::job_service_client::JobServiceClient;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

/// Header with which an admin acts as another user.
const ACT_AS_HEADER: &str = "kairos-user";
const LEADER_HEADER: &str = "kairos-leader";
/// How long a call keeps following leader hints and waiting for an election.
const LEADER_WAIT: Duration = Duration::from_secs(10);
/// How long one controller may take to start answering a call (streams may then run on). A
/// paused or cut-off controller accepts connections but never answers: the client moves on.
/// Above the controller's own 5 s bound for reaching an agent's log service.
const CALL_TIMEOUT: Duration = Duration::from_secs(8);

pub struct Client {
    addrs: Vec<String>,
    /// The API token (never printed).
    token: Option<String>,
    /// `--as USER`: act as another user (admins only).
    act_as: Option<String>,
    tls: Option<ClientTlsConfig>,
    /// The W3C trace context sent with every call (`traceparent` header), when tracing.
    traceparent: Option<String>,
}

/// Where the token comes from: `--token-file`/KAIROS_TOKEN_FILE, else KAIROS_TOKEN, else the
/// context's token file, else `$XDG_CONFIG_HOME/kairos/token` or `~/.config/kairos/token` when
/// that file exists. `context` is the context whose token file applies (`Config::resolve`),
/// by name: a token file of its that is gone says which context, and how to be rid of it.
pub fn load_token(
    file: Option<&std::path::Path>,
    context: Option<(&str, &std::path::Path)>,
) -> Result<Option<String>, CallError> {
    if let Some(path) = file {
        return kairos_proto::wire::read_credential_file(path).map(Some).map_err(|e| CallError(e.0));
    }
    if let Ok(t) = std::env::var("KAIROS_TOKEN") {
        let t = t.trim().to_string();
        return Ok((!t.is_empty()).then_some(t));
    }
    if let Some((name, path)) = context {
        return read_context_token(name, path).map(Some);
    }
    match default_token_path() {
        Some(path) if path.exists() => {
            kairos_proto::wire::read_credential_file(&path).map(Some).map_err(|e| CallError(e.0))
        }
        _ => Ok(None),
    }
}

/// Context `name`'s token file. One that is not there (its cluster's data directory was
/// removed, say) names the context and the way out.
fn read_context_token(name: &str, path: &std::path::Path) -> Result<String, CallError> {
    if !path.exists() {
        return Err(CallError(format!(
            "context \"{name}\": its token file {} is gone; forget the context with `kairos context delete {name}` \
             (or choose another: `kairos context use NAME`, --context, --token-file)",
            path.display()
        )));
    }
    kairos_proto::wire::read_credential_file(path)
        .map_err(|e| CallError(format!("context \"{name}\": {}", e.0)))
}

/// `$XDG_CONFIG_HOME/kairos/token`, else `$HOME/.config/kairos/token`.
pub fn default_token_path() -> Option<std::path::PathBuf> {
    crate::context::config_dir().map(|d| d.join("token"))
}

/// A failed call, already phrased for the user.
#[derive(Debug)]
pub struct CallError(pub String);

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CallError {}

/// A watching command (`wait`, `logs --follow`) lost its stream and no controller answered for
/// `REACH_WAIT`: the CLI exits `EXIT_UNREACHABLE`, which a job's own outcome reported by
/// `kairos wait` is not confused with by scripts that check for it.
#[derive(Debug)]
pub struct Unreachable(pub String);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreachable {}

/// The exit status when every controller was lost (sysexits' `EX_UNAVAILABLE`).
pub const EXIT_UNREACHABLE: i32 = 69;
/// How long a watching command tries to get its stream back before giving up.
pub const REACH_WAIT: Duration = Duration::from_secs(15);

/// Whether a stream that ended with `status` may be opened again elsewhere: the connection or
/// the replica went away (not an answer about the job or the caller).
pub fn resumable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::Cancelled
            | Code::Aborted
            | Code::DeadlineExceeded
    )
}

/// A plaintext HTTP/2 client talking to a TLS server sees its connection torn down, not a
/// gRPC answer.
fn broken_h2(status: &Status) -> bool {
    let m = status.message();
    matches!(status.code(), Code::Internal | Code::Unknown | Code::Cancelled)
        && ["h2 protocol error", "connection closed", "operation was canceled", "transport error"]
            .iter()
            .any(|s| m.contains(s))
}

fn describe(status: &Status) -> String {
    let msg = status.message().lines().next().unwrap_or("").to_string();
    match status.code() {
        Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition | Code::Unimplemented => msg,
        code => format!("{msg} ({code:?})"),
    }
}

impl Client {
    pub fn new(
        addrs: Vec<String>,
        token: Option<String>,
        act_as: Option<String>,
        tls: Option<ClientTlsConfig>,
    ) -> Self {
        Client { addrs, token, act_as, tls, traceparent: None }
    }

    /// This client, sending `traceparent` with every call.
    pub fn traced(&self, traceparent: Option<String>) -> Client {
        Client {
            addrs: self.addrs.clone(),
            token: self.token.clone(),
            act_as: self.act_as.clone(),
            tls: self.tls.clone(),
            traceparent,
        }
    }

    /// Adds the caller's credentials to a request.
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Some(t) = &self.token {
            kairos_proto::wire::set_bearer(req.metadata_mut(), t);
        }
        if let Some(v) = self.act_as.as_deref().and_then(|u| u.parse().ok()) {
            req.metadata_mut().insert(ACT_AS_HEADER, v);
        }
        if let Some(v) = self.traceparent.as_deref().and_then(|t| t.parse().ok()) {
            req.metadata_mut().insert("traceparent", v);
        }
        req
    }

    async fn connect(&self, addr: &str) -> Result<Channel, String> {
        let mut endpoint = Endpoint::from_shared(kairos_proto::wire::url(addr, self.tls.is_some()))
            .map_err(|_| format!("\"{addr}\" is not a valid controller address"))?
            .connect_timeout(Duration::from_secs(3))
            .timeout(CALL_TIMEOUT);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(|e| format!("TLS settings: {e}"))?;
        }
        let connecting = tokio::time::timeout(Duration::from_secs(4), endpoint.connect());
        let connected = connecting.await.map_err(|_| format!("controller at {addr} did not answer"))?;
        connected.map_err(|e| {
            // The innermost cause says what happened ("Connection refused").
            let mut cause: &dyn std::error::Error = &e;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            format!("cannot reach controller at {addr}: {cause}")
        })
    }

    /// Runs `call` against a controller: the first reachable one, then wherever leader hints
    /// point while the answer is `UNAVAILABLE`.
    /// One admin-service call: `req` goes (with this client's credentials) to whichever
    /// controller answers, retried as `call` retries; `rpc` names the method, e.g.
    /// `client.admin(req, |mut c, r| async move { c.list_nodes(r).await })`.
    pub async fn admin<Req, Resp, F, Fut>(&self, req: Req, rpc: F) -> Result<tonic::Response<Resp>, CallError>
    where
        Req: Clone,
        F: Fn(AdminServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        self.call(|ch| rpc(AdminServiceClient::new(ch), self.request(req.clone()))).await
    }

    /// One job-service call, as `admin`.
    pub async fn jobs<Req, Resp, F, Fut>(&self, req: Req, rpc: F) -> Result<tonic::Response<Resp>, CallError>
    where
        Req: Clone,
        F: Fn(JobServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        self.call(|ch| rpc(JobServiceClient::new(ch), self.request(req.clone()))).await
    }

    pub async fn call<T, F, Fut>(&self, mut call: F) -> Result<T, CallError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut hint: Option<String> = None;
        // What a replica answered beats "cannot connect": it says why (no quorum, no leader).
        let mut answered: Option<String> = None;
        let mut unreachable = String::from("no controller address given");
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        let mut delay = Duration::from_millis(50);
        loop {
            let candidates: Vec<String> = hint.take().into_iter().chain(self.addrs.iter().cloned()).collect();
            let mut reached = false;
            for addr in &candidates {
                let channel = match self.connect(addr).await {
                    Ok(c) => c,
                    Err(e) => {
                        unreachable = e;
                        continue;
                    }
                };
                reached = true;
                match call(channel).await {
                    Ok(v) => return Ok(v),
                    Err(status) if status.code() == Code::Unavailable => {
                        answered = Some(describe(&status));
                        let leader = status.metadata().get(LEADER_HEADER).and_then(|v| v.to_str().ok());
                        if let Some(h) = leader.filter(|h| *h != addr) {
                            hint = Some(h.to_string());
                            break;
                        }
                    }
                    Err(status)
                        if status.code() == Code::Cancelled && status.message() == "Timeout expired" =>
                    {
                        // Silent controller: try the others (every call here may be repeated).
                        answered =
                            Some(format!("controller at {addr} did not answer within {CALL_TIMEOUT:?}"));
                    }
                    Err(status) if self.tls.is_none() && broken_h2(&status) => {
                        return Err(CallError(format!(
                            "controller at {addr} broke the connection ({}); does it serve TLS? (--ca)",
                            status.message()
                        )))
                    }
                    Err(status) => return Err(CallError(describe(&status))),
                }
            }
            // Nothing answers at all: say so at once rather than wait for an election.
            if !reached || tokio::time::Instant::now() >= deadline {
                return Err(CallError(answered.unwrap_or(unreachable)));
            }
            // A leader may be being elected: wait a little (longer each time) and try again.
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(500));
        }
    }
}

/// The cluster's scheduling policy.
pub async fn get_policy(client: &Client) -> Result<kairos_proto::v1::Policy, CallError> {
    client
        .admin(kairos_proto::v1::GetPolicyRequest {}, |mut c, r| async move { c.get_policy(r).await })
        .await
        .map(|r| r.into_inner())
}
