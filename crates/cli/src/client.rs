//! Connecting to the controllers: try each listed address, follow leader hints, and turn gRPC
//! failures into one-line messages.

use std::future::Future;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// Header naming the calling user (until token authentication lands).
const USER_HEADER: &str = "kairos-user";
const LEADER_HEADER: &str = "kairos-leader";
/// How long a call keeps following leader hints and waiting for an election.
const LEADER_WAIT: Duration = Duration::from_secs(10);

pub struct Client {
    addrs: Vec<String>,
    user: String,
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

fn current_user() -> String {
    let from_env = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_default();
    if !from_env.is_empty() {
        return from_env;
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    format!("uid{}", unsafe { libc::getuid() })
}

fn describe(status: &Status) -> String {
    let msg = status.message().lines().next().unwrap_or("").to_string();
    match status.code() {
        Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition | Code::Unimplemented => msg,
        code => format!("{msg} ({code:?})"),
    }
}

impl Client {
    pub fn new(addrs: Vec<String>) -> Self {
        Client { addrs, user: current_user() }
    }

    /// Adds the caller's identity to a request.
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Ok(v) = self.user.parse() {
            req.metadata_mut().insert(USER_HEADER, v);
        }
        req
    }

    async fn connect(addr: &str) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|_| format!("\"{addr}\" is not a valid controller address"))?
            .connect_timeout(Duration::from_secs(3));
        endpoint.connect().await.map_err(|e| {
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
                let channel = match Self::connect(addr).await {
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
