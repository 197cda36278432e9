//! The job service: submit, get, list, cancel, watch and logs.
//!
//! Writes go through Raft and answer only once committed; reads are served from this replica's
//! applied state. Pending reasons are derived on read by running the (pure) planner, so they
//! never need log entries of their own.

use std::pin::Pin;

use futures::Stream;
use kairos_proto::v1 as pb;
use kairos_proto::v1::agent_log_service_client::AgentLogServiceClient;
use kairos_proto::v1::job_service_server::JobService;
use kairos_scheduler::priority::Prioritizer;
use kairos_scheduler::{ClusterState, JobId, JobState, Op, Outcome};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use crate::auth::Principal;
use crate::context::{rejection_status, Ctx, PendingReasons};
use crate::convert::{job_spec_from_pb, job_to_pb, job_view_state};

/// Most jobs one list answer carries.
/// How often a long stream (`WatchJob`, `StreamLogs`) checks its caller's token again.
const RECHECK: std::time::Duration = std::time::Duration::from_secs(2);
const LIST_LIMIT_MAX: usize = 10_000;
const LIST_LIMIT_DEFAULT: usize = 1_000;
/// A page of jobs stays under this many encoded bytes (clients decode up to 4 MiB).
const LIST_PAGE_BYTES_MAX: usize = 2 * 1024 * 1024;

pub struct JobApi {
    pub ctx: Ctx,
    pub limiter: std::sync::Arc<crate::ratelimit::SubmitLimiter>,
}

/// The API view of job `id`, with its pending reason from `reasons` when it waits.
fn job_view(state: &ClusterState, reasons: &PendingReasons, id: JobId) -> Result<pb::Job, Status> {
    let Some(job) = state.jobs.get(&id) else {
        return match state.history.get(id) {
            Some(record) => Ok(crate::convert::purged_job_to_pb(record)),
            None => Err(Status::not_found(format!("job {id} not found"))),
        };
    };
    let pending = if job.state == JobState::Pending { reasons.get(&id) } else { None };
    // Only this job's account's fairshare factor: every account's would cost each answer (a
    // submit's included) time that grows with the account tree, under the state's read lock.
    let priority = Prioritizer::for_account(state, &job.spec.account).shown(job);
    let mut view = job_to_pb(job, pending, priority);
    view.effective_time_limit_s = state.time_limit_s(job).unwrap_or(0);
    if job.state == JobState::Pending {
        reasons.estimate_into(&mut view);
    }
    Ok(view)
}

impl JobApi {
    /// A submit past the rate limit: validated, committed, answered.
    async fn submit_as(
        &self,
        user: &str,
        any_qos: bool,
        req: pb::SubmitRequest,
        trace: &opentelemetry::Context,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let hold = req.spec.as_ref().is_some_and(|s| s.hold);
        let mut spec = job_spec_from_pb(req.spec, user)?;
        spec.traceparent = kairos_telemetry::traces::traceparent(trace).map(Into::into);
        let request_id = (!req.request_id.is_empty()).then_some(req.request_id);
        let limits = Some(kairos_scheduler::quota::SubmitLimits { any_qos, ..self.ctx.submit_limits });
        let commit = kairos_telemetry::traces::start("commit", trace, Vec::new());
        let written = self.ctx.write(Op::Submit { spec, request_id, hold, limits }).await;
        kairos_telemetry::traces::end(&commit);
        match written? {
            Outcome::Submitted { job } => {
                self.ctx.kick.notify_one();
                // No pending reason in the answer: a submit must not pay for a planning pass.
                let view = self.ctx.replica.read(|a| job_view(&a.state, &PendingReasons::new(), job))?;
                Ok(Response::new(pb::SubmitResponse { job_id: job, job: Some(view) }))
            }
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn set_held(
        &self,
        request: Request<pb::HoldJobRequest>,
        held: bool,
    ) -> Result<Response<pb::Job>, Status> {
        let me = self.ctx.principal(&request)?;
        let id = check_id(request.get_ref().job_id)?;
        self.authorize(&me, id)?;
        let by = me.user.clone();
        let op = if held { Op::Hold { job: id, by } } else { Op::Release { job: id, by } };
        match self.job_write(&me, op, if held { "hold" } else { "release" }).await? {
            Outcome::HoldChanged { .. } => {
                self.ctx.kick.notify_one();
                let reasons = self.ctx.pending_reasons();
                Ok(Response::new(self.ctx.replica.read(|a| job_view(&a.state, &reasons, id))?))
            }
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// A hold, release or cancel: within the caller's write rate, judged on the applied state
    /// first (`ClusterState::precheck`: a refused or already-done call costs no log entry), then
    /// written (and judged again by apply).
    async fn job_write(&self, me: &Principal, op: Op, what: &str) -> Result<Outcome, Status> {
        self.limiter.take(&me.user, std::time::Instant::now(), what)?;
        match self.ctx.replica.read(|a| a.state.precheck(&op)) {
            Err(r) => Err(rejection_status(r)),
            Ok(Some(already)) => Ok(already),
            Ok(None) => self.ctx.write(op).await,
        }
    }

    /// `PERMISSION_DENIED` unless `me` may see and act on job `id` (its owner, or an operator).
    fn authorize(&self, me: &Principal, id: JobId) -> Result<(), Status> {
        let owner = self.ctx.replica.read(|a| {
            a.state
                .jobs
                .get(&id)
                .map(|j| j.spec.user.clone())
                .or_else(|| a.state.history.get(id).map(|r| r.user.clone()))
                .ok_or_else(|| Status::not_found(format!("job {id} not found")))
        });
        me.check_job(id, &self.redirect_unknown(owner)?)
    }

    /// A client of the agent of `node` (its log and usage service, TLS when configured) and
    /// `body` as a request to it: the agent serves only a controller, which proves itself with
    /// the node's credential.
    pub(crate) async fn to_agent<T>(
        &self,
        node: &kairos_scheduler::model::NodeInfo,
        epoch: u64,
        body: T,
        what: &str,
    ) -> Result<(AgentLogServiceClient<tonic::transport::Channel>, Request<T>), Status> {
        let bad_addr = |e: tonic::transport::Error| {
            Status::internal(format!("node \"{}\" has a bad address: {e}", node.name))
        };
        let url = kairos_proto::wire::url(&node.addr, self.ctx.agent_tls.is_some());
        let mut endpoint = tonic::transport::Endpoint::from_shared(url)
            .map_err(bad_addr)?
            .connect_timeout(std::time::Duration::from_secs(5));
        if let Some(tls) = &self.ctx.agent_tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(bad_addr)?;
        }
        let channel = endpoint.connect().await.map_err(|e| {
            Status::unavailable(format!(
                "cannot reach node \"{}\" at {} for {what}: {e}",
                node.name, node.addr
            ))
        })?;
        let mut req = Request::new(body);
        let credential = self.ctx.auth.key.node_credential(&node.name, epoch);
        kairos_consensus::auth::set_bearer(req.metadata_mut(), &credential);
        Ok((AgentLogServiceClient::new(channel), req))
    }

    /// Reads are served by any replica; a follower that does not know a job yet (it may have
    /// been submitted a moment ago through the leader) sends the client to the leader rather
    /// than answer "not found", so a client always reads its own writes.
    pub(crate) fn redirect_unknown<T>(&self, result: Result<T, Status>) -> Result<T, Status> {
        match result {
            Err(s) if s.code() == tonic::Code::NotFound && !self.ctx.replica.is_leader() => {
                match self.ctx.replica.leader().1 {
                    Some(_) => Err(self.ctx.not_leader()),
                    None => Err(s),
                }
            }
            other => other,
        }
    }
}

fn check_id(id: u64) -> Result<u64, Status> {
    if id == 0 {
        return Err(Status::invalid_argument("job_id: required"));
    }
    Ok(id)
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Job states from their API numbers (`INVALID_ARGUMENT` naming an unknown one).
fn states_of(numbers: &[i32]) -> Result<Vec<pb::JobState>, Status> {
    numbers
        .iter()
        .map(|s| match pb::JobState::try_from(*s) {
            Ok(pb::JobState::Unspecified) | Err(_) => {
                Err(Status::invalid_argument(format!("states: unknown job state {s}")))
            }
            Ok(state) => Ok(state),
        })
        .collect()
}

/// A listing's page size (0: the default; at most the maximum) and where it continues: the
/// token is the id of the last job of the previous page.
fn page(limit: u32, token: &str) -> Result<(usize, u64), Status> {
    let limit = match limit as usize {
        0 => LIST_LIMIT_DEFAULT,
        n => n.min(LIST_LIMIT_MAX),
    };
    let after = match token {
        "" => 0,
        t => t.parse().map_err(|_| Status::invalid_argument("page_token: not a token this server gave"))?,
    };
    Ok((limit, after))
}

/// Whether a job submitted at `submit` and ended at `end` (0: not yet) was live in the window.
fn in_window(submit: i64, end: i64, since: i64, until: i64) -> bool {
    (until == 0 || submit <= until) && (since == 0 || end == 0 || end >= since)
}

#[tonic::async_trait]
impl JobService for JobApi {
    type SessionStream = BoxStream<pb::SessionOutput>;

    async fn session(
        &self,
        request: Request<tonic::Streaming<pb::SessionInput>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let me = self.ctx.principal(&request)?;
        let credentials = request.metadata().clone();
        let stream = self.open_session(me, credentials, request.into_inner()).await?;
        Ok(Response::new(Box::pin(stream)))
    }

    async fn who_am_i(
        &self,
        request: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::WhoAmIResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        Ok(Response::new(pb::WhoAmIResponse { user: me.user, role: me.role.as_str().into() }))
    }

    async fn job_usage(
        &self,
        request: Request<pb::JobUsageRequest>,
    ) -> Result<Response<pb::UsageSeries>, Status> {
        let me = self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let id = check_id(request.get_ref().job_id)?;
        self.authorize(&me, id)?;
        let found = self.ctx.replica.read(|a| {
            let job = started_job(&a.state, id, "nothing measured")?;
            let (node, epoch) = node_of(&a.state, &job.last_node)?;
            Ok((node, epoch, job.attempt, job.submit_time_ms))
        });
        let (node, epoch, attempt, submit_time_ms) = self.redirect_unknown(found)?;
        let body = pb::UsageRequest { job_id: id, attempt, submit_time_ms };
        let (mut agent, req) = self.to_agent(&node, epoch, body, "usage").await?;
        Ok(Response::new(agent.read_usage(req).await?.into_inner()))
    }

    async fn list_history(
        &self,
        request: Request<pb::ListHistoryRequest>,
    ) -> Result<Response<pb::ListHistoryResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let req = request.into_inner();
        let (limit, after) = page(req.limit, &req.page_token)?;
        let states = states_of(&req.states)?;
        let now = self.ctx.cluster_now();
        let (records, next_page_token) = self.ctx.replica.read(|a| {
            // Purged records and live jobs, merged by id (an id is in one or the other).
            let purged = a.state.history.after(after).map(|r| (r.id, crate::convert::record_to_pb(r, true)));
            let live = a.state.jobs.range(after.saturating_add(1)..).map(|(id, j)| {
                (*id, crate::convert::live_record(j, now, a.state.time_limit_s(j).unwrap_or(0)))
            });
            let mut merged = merge_by_id(purged, live)
                .map(|(_, r)| r)
                .filter(|r| me.owns_or_operates(&r.user))
                .filter(|r| req.user.is_empty() || r.user == req.user)
                .filter(|r| req.account.is_empty() || r.account == req.account)
                .filter(|r| states.is_empty() || states.iter().any(|s| *s as i32 == r.state))
                .filter(|r| in_window(r.submit_time_ms, r.end_time_ms, req.since_ms, req.until_ms));
            let page: Vec<pb::JobRecord> = merged.by_ref().take(limit).collect();
            let more = merged.next().is_some();
            let token = match (more, page.last()) {
                (true, Some(last)) => last.id.to_string(),
                _ => String::new(),
            };
            (page, token)
        });
        Ok(Response::new(pb::ListHistoryResponse { records, next_page_token }))
    }

    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        let user = me.user;
        // Operators may submit with any QoS; users with those their accounts allow.
        let any_qos = me.role >= kairos_scheduler::tokens::Role::Operator;
        // Before anything else: a flood costs neither validation nor a log entry.
        if let Err(refused) = self.limiter.take(&user, std::time::Instant::now(), "submit") {
            self.ctx.metrics.submit("rate_limited");
            return Err(refused);
        }
        // The client's trace (W3C traceparent header) continues here, and is kept with the job.
        let parent = request
            .metadata()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(kairos_telemetry::traces::context_of)
            .unwrap_or_default();
        let span = kairos_telemetry::traces::start("submit", &parent, Vec::new());
        let answer = self.submit_as(&user, any_qos, request.into_inner(), &span).await;
        kairos_telemetry::traces::end(&span);
        self.ctx.metrics.submit(crate::metrics::submit_outcome(&answer.as_ref().map(|_| ())));
        answer
    }

    async fn get_job(&self, request: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        let me = self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let id = check_id(request.into_inner().job_id)?;
        self.authorize(&me, id)?;
        let reasons = self.ctx.pending_reasons();
        let view = self.ctx.replica.read(|a| job_view(&a.state, &reasons, id));
        Ok(Response::new(self.redirect_unknown(view)?))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let req = request.into_inner();
        let (limit, after) = page(req.limit, &req.page_token)?;
        let states = states_of(&req.states)?;
        let reasons = self.ctx.pending_reasons();
        let (jobs, next_page_token) = self.ctx.replica.read(|a| {
            let prioritizer = Prioritizer::new(&a.state);
            let mut matching = a
                .state
                .jobs
                .range(after.saturating_add(1)..)
                .map(|(_, j)| j)
                .filter(|j| me.owns_or_operates(&j.spec.user))
                .filter(|j| !req.mine || j.spec.user == me.user)
                .filter(|j| req.user.is_empty() || j.spec.user == req.user)
                .filter(|j| {
                    req.partition.is_empty()
                        || a.state.partition_of(j).is_some_and(|p| p.name == req.partition)
                })
                .filter(|j| req.qos.is_empty() || j.spec.qos == req.qos)
                .filter(|j| req.name.is_empty() || j.spec.name == req.name)
                .filter(|j| {
                    let s = job_view_state(j);
                    if states.is_empty() {
                        req.all || !j.state.is_terminal()
                    } else {
                        states.contains(&s)
                    }
                })
                .peekable();
            let (mut page, mut bytes) = (Vec::new(), 0usize);
            while let Some(j) = matching.next_if(|_| page.len() < limit) {
                let mut job = job_to_pb(j, reasons.get(&j.id), prioritizer.shown(j));
                job.effective_time_limit_s = a.state.time_limit_s(j).unwrap_or(0);
                if j.state == JobState::Pending {
                    reasons.estimate_into(&mut job);
                }
                bytes += prost::Message::encoded_len(&job);
                page.push(job);
                if bytes >= LIST_PAGE_BYTES_MAX {
                    break;
                }
            }
            let more = matching.peek().is_some();
            let next =
                if more { page.last().map(|j| j.id.to_string()).unwrap_or_default() } else { String::new() };
            (page, next)
        });
        Ok(Response::new(pb::ListJobsResponse { jobs, next_page_token }))
    }

    async fn cancel_job(&self, request: Request<pb::CancelJobRequest>) -> Result<Response<pb::Job>, Status> {
        let me = self.ctx.principal(&request)?;
        let id = check_id(request.into_inner().job_id)?;
        self.authorize(&me, id)?;
        match self.job_write(&me, Op::Cancel { job: id, by: me.user.clone() }, "cancel").await? {
            Outcome::Cancelled { .. } => {
                let reasons = self.ctx.pending_reasons();
                Ok(Response::new(self.ctx.replica.read(|a| job_view(&a.state, &reasons, id))?))
            }
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn hold_job(&self, request: Request<pb::HoldJobRequest>) -> Result<Response<pb::Job>, Status> {
        self.set_held(request, true).await
    }

    async fn release_job(&self, request: Request<pb::HoldJobRequest>) -> Result<Response<pb::Job>, Status> {
        self.set_held(request, false).await
    }

    type WatchJobStream = BoxStream<pb::Job>;

    async fn watch_job(
        &self,
        request: Request<pb::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let me = self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let credentials = request.metadata().clone();
        let id = check_id(request.into_inner().job_id)?;
        self.authorize(&me, id)?;
        let mut applied = self.ctx.replica.applied.clone();
        let first = self.redirect_unknown(
            self.ctx.replica.read(|a| job_view(&a.state, &self.ctx.pending_reasons(), id)),
        )?;
        let ctx = self.ctx.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut last = first;
            if tx.send(Ok(last.clone())).await.is_err() {
                return;
            }
            loop {
                if is_terminal(&last) {
                    return;
                }
                // Wake on the next apply, or end as soon as the client goes away; a revoked or
                // expired token ends the stream within `RECHECK`.
                tokio::select! {
                    changed = applied.changed() => if changed.is_err() { return },
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(RECHECK) => {}
                }
                if let Some(refused) = ctx.revoked(&credentials) {
                    let _ = tx.send(Err(refused)).await;
                    return;
                }
                let reasons = ctx.pending_reasons();
                let Ok(view) = ctx.replica.read(|a| job_view(&a.state, &reasons, id)) else { return };
                if view != last {
                    last = view;
                    if tx.send(Ok(last.clone())).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type StreamLogsStream = BoxStream<pb::LogChunk>;

    async fn stream_logs(
        &self,
        request: Request<pb::LogsRequest>,
    ) -> Result<Response<Self::StreamLogsStream>, Status> {
        let me = self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let credentials = request.metadata().clone();
        let mut req = request.into_inner();
        let id = check_id(req.job_id)?;
        self.authorize(&me, id)?;
        let found = self.ctx.replica.read(|a| {
            let job = started_job(&a.state, id, "it has no logs")?;
            let (attempt, ran_on) = match req.read_attempt {
                None => (job.attempt, &job.last_node),
                Some(n) if n > job.attempt => {
                    return Err(Status::invalid_argument(format!(
                        "job {id} has had attempts 0 to {} only",
                        job.attempt
                    )))
                }
                Some(n) => match job.attempt_nodes.get(&n) {
                    Some(node) => (n, node),
                    None if n == job.attempt => (n, &job.last_node),
                    None => {
                        return Err(Status::not_found(format!(
                            "job {id} attempt {n} never ran, or ran too long ago to be recorded"
                        )))
                    }
                },
            };
            let (node, epoch) = node_of(&a.state, ran_on)?;
            Ok((node, epoch, attempt, job.attempt, job.submit_time_ms))
        });
        let (node, epoch, attempt, current, submit_time_ms) = self.redirect_unknown(found)?;
        req.attempt = attempt;
        // An earlier attempt's log is complete: read, never followed.
        req.follow &= attempt == current;
        req.submit_time_ms = submit_time_ms;
        let (mut agent, req) = self.to_agent(&node, epoch, req, "logs").await?;
        let mut stream = agent.read_logs(req).await?.into_inner();
        // Relayed while the caller's token holds: a revoked or expired one ends a followed log
        // within `RECHECK`.
        let ctx = self.ctx.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    chunk = stream.next() => match chunk {
                        Some(chunk) => if tx.send(chunk).await.is_err() { return },
                        None => return,
                    },
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(RECHECK) => {}
                }
                if let Some(refused) = ctx.revoked(&credentials) {
                    let _ = tx.send(Err(refused)).await;
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Job `id` in the live state, once it has run somewhere (else why not: `nothing`, e.g. "it
/// has no logs").
fn started_job<'a>(
    state: &'a kairos_scheduler::ClusterState,
    id: JobId,
    nothing: &str,
) -> Result<&'a kairos_scheduler::model::Job, Status> {
    let job = state.jobs.get(&id).ok_or_else(|| Status::not_found(format!("job {id} not found")))?;
    if job.last_node.is_empty() {
        return Err(Status::failed_precondition(format!("job {id} has not started yet; {nothing}")));
    }
    Ok(job)
}

/// Node `name`'s address and credential epoch, to reach its agent.
fn node_of(
    state: &kairos_scheduler::ClusterState,
    name: &str,
) -> Result<(kairos_scheduler::model::NodeInfo, u64), Status> {
    let node =
        state.nodes.get(name).ok_or_else(|| Status::unavailable(format!("node \"{name}\" is unknown")))?;
    Ok((node.info.clone(), node.epoch))
}

fn is_terminal(job: &pb::Job) -> bool {
    !matches!(
        pb::JobState::try_from(job.state),
        Ok(pb::JobState::Pending
            | pb::JobState::Running
            | pb::JobState::Preempting
            | pb::JobState::Suspended)
    )
}

/// Merges two id-ascending sequences into one, by id.
fn merge_by_id<T>(
    a: impl Iterator<Item = (JobId, T)>,
    b: impl Iterator<Item = (JobId, T)>,
) -> impl Iterator<Item = (JobId, T)> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some((x, _)), Some((y, _))) if x <= y => a.next(),
        (Some(_), Some(_)) => b.next(),
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}
