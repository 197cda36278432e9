//! The client side of a chaos run, executed inside the client host's network namespace:
//! concurrent submits (training, inference and urgent jobs of several users), cancels, and the
//! history of every operation with its acknowledgement; then the reads the checkers need.
//!
//! The client follows leader hints, retries a submit with the same request id until it is
//! acknowledged or its deadline passes, and bounds every call, so faults never hang it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_client::AdminServiceClient;
use kairos_proto::v1::job_service_client::JobServiceClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

pub use crate::netns::in_namespace;
use crate::proxy::Rng;
use crate::{FinalJob, Operation};

/// A single-threaded runtime: every task stays on the calling thread, hence in its namespace.
pub fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => panic!("building a tokio runtime: {e}"),
    }
}

/// A client of the controller cluster that follows leader hints.
pub struct Client {
    addrs: Vec<String>,
    token: String,
    leader: Mutex<Option<String>>,
    /// Controller address → the address to dial instead (a fault proxy), also for leader hints.
    via: std::collections::BTreeMap<String, String>,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Answers that say nothing about the request itself (no leader, a broken connection, no
/// answer in time): another controller, or the same one later, may serve it. Every write of the
/// workload is safe to repeat (submits carry a request id; a second cancel changes nothing).
fn retryable(s: &Status) -> bool {
    matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled)
        || (s.code() == Code::Internal && s.message().contains("h2 protocol error"))
}

impl Client {
    pub fn new(addrs: Vec<String>, token: &str) -> Client {
        Client { addrs, token: token.to_string(), leader: Mutex::new(None), via: Default::default() }
    }

    /// Dials `via[addr]` instead of `addr` (leader hints included).
    pub fn through(mut self, via: std::collections::BTreeMap<String, String>) -> Client {
        self.via = via;
        self
    }

    fn request<T>(&self, msg: T, user: Option<&str>) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        kairos_proto::wire::set_bearer(req.metadata_mut(), &self.token);
        if let Some(v) = user.and_then(|u| u.parse().ok()) {
            req.metadata_mut().insert("kairos-user", v);
        }
        req.set_timeout(CALL_TIMEOUT);
        req
    }

    async fn channel(&self, addr: &str) -> Option<Channel> {
        let addr = self.via.get(addr).map(String::as_str).unwrap_or(addr);
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).ok()?.connect_timeout(CALL_TIMEOUT);
        tokio::time::timeout(CALL_TIMEOUT, endpoint.connect()).await.ok()?.ok()
    }

    /// The addresses to try: the known leader first.
    fn order(&self) -> Vec<String> {
        let hint = self.leader.lock().unwrap_or_else(|p| p.into_inner()).clone();
        hint.into_iter().chain(self.addrs.iter().cloned()).collect()
    }

    /// One attempt at `call` on each controller (leader first) until one answers other than
    /// UNAVAILABLE; remembers the leader.
    async fn once<T, F, Fut>(&self, call: &mut F) -> Result<T, Status>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut last = Status::unavailable("no controller reachable");
        for addr in self.order() {
            let Some(ch) = self.channel(&addr).await else { continue };
            match tokio::time::timeout(CALL_TIMEOUT, call(ch)).await {
                Ok(Ok(v)) => {
                    *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
                    return Ok(v);
                }
                Ok(Err(s)) if retryable(&s) => {
                    let hint =
                        s.metadata().get("kairos-leader").and_then(|v| v.to_str().ok()).map(str::to_string);
                    *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = hint;
                    last = s;
                }
                Ok(Err(s)) => return Err(s),
                Err(_) => last = Status::deadline_exceeded(format!("{addr} did not answer")),
            }
        }
        Err(last)
    }

    /// `call` retried (with the same request) until it answers or `within` passes.
    pub async fn retry<T, F, Fut>(&self, within: Duration, mut call: F) -> Result<T, Status>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self.once(&mut call).await {
                Ok(v) => return Ok(v),
                Err(s) if retryable(&s) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(s);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(s) => return Err(s),
            }
        }
    }

    /// Submits as `user` (the admin acting as that user), or as the admin itself.
    pub async fn submit(
        &self,
        request_id: &str,
        user: Option<&str>,
        spec: pb::JobSpec,
    ) -> Result<u64, Status> {
        let resp = self
            .retry(Duration::from_secs(8), |ch| {
                let req = self.request(
                    pb::SubmitRequest { spec: Some(spec.clone()), request_id: request_id.to_string() },
                    user,
                );
                async move { JobServiceClient::new(ch).submit(req).await }
            })
            .await?;
        Ok(resp.into_inner().job_id)
    }

    pub async fn cancel(&self, job: u64) -> Result<(), Status> {
        self.retry(Duration::from_secs(4), |ch| {
            let req = self.request(pb::CancelJobRequest { job_id: job }, None);
            async move { JobServiceClient::new(ch).cancel_job(req).await }
        })
        .await
        .map(|_| ())
    }

    /// Every job, as the leader reports it (every page).
    pub async fn jobs(&self) -> Result<Vec<pb::Job>, Status> {
        let mut jobs = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = self
                .retry(Duration::from_secs(10), |ch| {
                    let list = pb::ListJobsRequest {
                        states: vec![],
                        all: true,
                        limit: 10_000,
                        page_token: page_token.clone(),
                        ..Default::default()
                    };
                    let req = self.request(list, None);
                    async move { JobServiceClient::new(ch).list_jobs(req).await }
                })
                .await?
                .into_inner();
            jobs.extend(page.jobs);
            if page.next_page_token.is_empty() {
                return Ok(jobs);
            }
            page_token = page.next_page_token;
        }
    }

    /// Each controller's own view of the cluster (None: it did not answer).
    pub async fn statuses(&self) -> Vec<Option<pb::ClusterStatusResponse>> {
        let mut out = Vec::new();
        for addr in &self.addrs {
            let status = match self.channel(addr).await {
                Some(ch) => {
                    let req = self.request(pb::ClusterStatusRequest {}, None);
                    let mut admin = AdminServiceClient::new(ch);
                    tokio::time::timeout(CALL_TIMEOUT, admin.cluster_status(req))
                        .await
                        .ok()
                        .and_then(|r| r.ok())
                        .map(|r| r.into_inner())
                }
                None => None,
            };
            out.push(status);
        }
        out
    }
}

/// What the workload submits: training jobs (requeued when preempted), inference jobs and
/// urgent jobs that preempt training.
fn spec(rng: &mut Rng, request_id: &str) -> pb::JobSpec {
    let (qos, secs, gpus) = match rng.below(20) {
        0..=11 => ("training", 0.6 + rng.below(8) as f64 / 10.0, 1 + rng.below(2) as u32),
        12..=16 => ("inference", 0.3, 1),
        _ => ("urgent", 0.4, 1),
    };
    pb::JobSpec {
        name: request_id.to_string(),
        argv: vec!["sleep".into(), format!("{secs:.1}")],
        qos: qos.into(),
        requeue: Some(true),
        resources: Some(pb::Resources { gpus, ..Default::default() }),
        ..Default::default()
    }
}

/// What a workload run recorded.
pub struct Recorded {
    pub history: Vec<Operation>,
    /// The longest time between consecutive acknowledged submits (and from the start).
    pub longest_gap: Duration,
}

/// Runs the workload for `duration`: `submitters` concurrent submit loops and one cancel loop.
pub async fn run(client: Arc<Client>, duration: Duration, submitters: usize, seed: u64) -> Recorded {
    let history = Arc::new(Mutex::new(Vec::new()));
    let ack_times = Arc::new(Mutex::new(vec![tokio::time::Instant::now()]));
    let acked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let end = tokio::time::Instant::now() + duration;
    let mut tasks = Vec::new();
    for s in 0..submitters {
        let (client, history, acked) = (client.clone(), history.clone(), acked.clone());
        let ack_times = ack_times.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed.wrapping_add(s as u64 + 1));
            let mut n = 0u64;
            while tokio::time::Instant::now() < end {
                n += 1;
                let request_id = format!("s{s}-{n}");
                let user = format!("u{}", rng.below(4));
                let spec = spec(&mut rng, &request_id);
                // Urgent work comes from the on-call operator: the shipped policy leaves the
                // urgent QoS to operators.
                let user = (spec.qos != "urgent").then_some(user.as_str());
                let result = client.submit(&request_id, user, spec).await.ok();
                if let Some(job) = result {
                    acked.lock().unwrap_or_else(|p| p.into_inner()).push(job);
                    ack_times.lock().unwrap_or_else(|p| p.into_inner()).push(tokio::time::Instant::now());
                }
                history
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Operation::Submit { request_id, acked: result });
                tokio::time::sleep(Duration::from_millis(150 + rng.below(200))).await;
            }
        }));
    }
    {
        let (client, history, acked) = (client.clone(), history.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed ^ 0xC0FFEE);
            while tokio::time::Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(400 + rng.below(400))).await;
                let pick = {
                    let a = acked.lock().unwrap_or_else(|p| p.into_inner());
                    (!a.is_empty()).then(|| a[rng.below(a.len() as u64) as usize])
                };
                if let Some(job) = pick {
                    let ok = client.cancel(job).await.is_ok();
                    history
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(Operation::Cancel { job, acked: ok });
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let history = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut times = ack_times.lock().unwrap_or_else(|p| p.into_inner()).clone();
    times.sort();
    let longest_gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    Recorded { history, longest_gap }
}

impl Client {
    /// A write that commits and changes nothing: cancelling a job that does not exist is
    /// answered NOT_FOUND by the state machine, after the command went through Raft.
    pub async fn probe_write(&self) -> bool {
        let result = self
            .retry(Duration::from_secs(2), |ch| {
                let req = self.request(pb::CancelJobRequest { job_id: u64::MAX }, None);
                async move { JobServiceClient::new(ch).cancel_job(req).await }
            })
            .await;
        matches!(result, Err(s) if s.code() == Code::NotFound)
    }
}

/// The final jobs in the checkers' terms.
pub fn final_jobs(jobs: &[pb::Job]) -> Vec<FinalJob> {
    jobs.iter()
        .map(|j| FinalJob {
            id: j.id,
            name: j.spec.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
            state: pb::JobState::try_from(j.state)
                .map(|s| s.as_str_name().trim_start_matches("JOB_STATE_").to_string())
                .unwrap_or_default(),
            events: j.events.iter().map(|e| e.kind.clone()).collect(),
            time_limit_ms: j
                .spec
                .as_ref()
                .filter(|s| s.time_limit_s > 0)
                .map(|s| s.time_limit_s as i64 * 1000),
        })
        .collect()
}
