//! The agent service: node registration, heartbeats, assignment streams and run reports.
//!
//! Assignments are level-triggered: each time the applied state changes, an agent's stream
//! carries the full set of runs its node should have (with a `started` flag so a run is never
//! launched twice, a `kill` flag for cancel, time limits and preemption, and a `suspend` flag). An agent that reconnects
//! simply receives the current set and reconciles.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::Stream;
use kairos_proto::v1 as pb;
use kairos_proto::v1::agent_service_server::AgentService;
use kairos_scheduler::liveness::{self, HeartbeatError, HeartbeatRefused, RegisterRefused, Seat};
use kairos_scheduler::model::HEALTH_CHECK_REASON;
use kairos_scheduler::{ClusterState, Op, Outcome, RunExit};
use tonic::{Request, Response, Status};

use crate::assignments::Wakers;

use kairos_consensus::WriteError;

use crate::context::{rejection_status, write_status, Ctx};
use crate::convert::node_info_from_pb;

pub struct AgentApi {
    pub ctx: Ctx,
    /// Wakes the assignment streams of the nodes whose runs changed (`assignments`).
    wakers: Arc<Wakers>,
    /// Registrations being answered now (`REGISTERING_MAX`).
    registering: Arc<AtomicUsize>,
    /// Registrations shed lately (`ShedRate`).
    sheds: ShedRate,
}

/// Registrations shed in the current second: how far behind the leader is.
struct ShedRate {
    start: std::time::Instant,
    /// The second since `start` in the high 32 bits, the sheds in it in the low.
    window: std::sync::atomic::AtomicU64,
}

impl ShedRate {
    fn new() -> ShedRate {
        ShedRate { start: std::time::Instant::now(), window: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Counts one shed; the sheds in this second so far.
    fn note(&self) -> usize {
        let second = self.start.elapsed().as_secs().min(u64::from(u32::MAX));
        let mut seen = self.window.load(Ordering::SeqCst);
        loop {
            let count = if seen >> 32 == second { (seen & 0xffff_ffff) + 1 } else { 1 };
            match self.window.compare_exchange(
                seen,
                (second << 32) | count,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return count as usize,
                Err(now) => seen = now,
            }
        }
    }
}

/// Most registrations one replica answers at once; more are shed with `UNAVAILABLE` and a
/// `retry-after-ms` the agent waits (jittered) before trying again. A registration that changes
/// the node commits an entry: ten thousand agents registering at once (a cold start) would
/// otherwise queue ten thousand proposals behind the log and time out together.
pub const REGISTERING_MAX: usize = 512;

impl AgentApi {
    /// The agent service of the replica `ctx` serves, with its assignment hub running.
    pub fn new(ctx: Ctx) -> AgentApi {
        let wakers = Arc::new(Wakers::default());
        crate::assignments::spawn_hub(ctx.replica.clone(), wakers.clone());
        AgentApi { ctx, wakers, registering: Arc::new(AtomicUsize::new(0)), sheds: ShedRate::new() }
    }
}

/// Counts a registration in flight while held.
struct Registering(Arc<AtomicUsize>);

impl Drop for Registering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `UNAVAILABLE` for a registration shed, the `recent`th this second: come back after a pause
/// that grows with how many are being turned away (100 ms more per `REGISTERING_MAX` of them,
/// 100 ms to 5 s), which the agent spreads over up to twice as long.
fn shed(recent: usize) -> Status {
    let ms = (100 * (recent / REGISTERING_MAX + 1)).min(5_000);
    let mut status =
        Status::unavailable(format!("{REGISTERING_MAX} registrations in flight; register again in {ms} ms"));
    if let Ok(v) = ms.to_string().parse() {
        status.metadata_mut().insert(kairos_proto::wire::RETRY_AFTER_HEADER, v);
    }
    status
}

/// The replica as the agent checks and the leader loop read it (`kairos_scheduler::liveness::Seat`).
pub struct Desk<'a>(pub &'a Ctx);

impl Seat for Desk<'_> {
    type Error = Status;

    fn is_leader(&self) -> bool {
        self.0.replica.is_leader()
    }

    fn term(&self) -> Option<u64> {
        self.is_leader().then(|| self.0.replica.raft.metrics().borrow().current_term)
    }

    fn leads_confirmed(&self) -> impl std::future::Future<Output = bool> + Send {
        self.0.replica.leads_confirmed()
    }

    fn applied_all_committed(&self) -> bool {
        self.0.replica.applied_all_committed()
    }

    fn read<R>(&self, f: impl FnOnce(&ClusterState, &mut liveness::Liveness) -> R) -> R {
        self.0.replica.read(|a| f(&a.state, &mut self.0.liveness()))
    }

    fn commit(&self, op: Op) -> impl std::future::Future<Output = Result<Outcome, Status>> + Send {
        self.0.write(op)
    }

    fn now(&self) -> (std::time::Instant, i64) {
        (std::time::Instant::now(), crate::context::now_ms())
    }
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let in_flight = self.registering.fetch_add(1, Ordering::SeqCst);
        let _counted = Registering(self.registering.clone());
        if in_flight >= REGISTERING_MAX {
            return Err(shed(self.sheds.note()));
        }
        let (metadata, _, req) = request.into_parts();
        let info = node_info_from_pb(req.node)?;
        let name = info.name.clone();
        // The order of checks is the core's (`liveness::register`), as the simulation's.
        let check = |epoch| self.ctx.auth.check_join(&metadata, &name, epoch);
        let epoch = match liveness::register(&Desk(&self.ctx), info, check).await {
            Ok(epoch) => epoch,
            Err(RegisterRefused::BeingMarkedDown) => {
                return Err(Status::unavailable(format!(
                    "node \"{name}\" is being marked down; register again shortly"
                )))
            }
            Err(RegisterRefused::MarkedDownMeanwhile) => {
                return Err(Status::unavailable(format!(
                    "node \"{name}\" was marked down meanwhile; register again"
                )))
            }
            Err(RegisterRefused::Rejected(r)) => return Err(rejection_status(r)),
            Err(RegisterRefused::Unexpected(other)) => {
                return Err(Status::internal(format!("unexpected outcome {other:?}")))
            }
            Err(RegisterRefused::Failed(status)) => return Err(status),
        };
        self.ctx.kick.notify_one();
        tracing::info!(node = %name, "node registered");
        Ok(Response::new(pb::RegisterResponse {
            node_credential: self.ctx.auth.key.node_credential(&name, epoch),
            node_id: name,
            heartbeat_interval_ms: self.ctx.timing.heartbeat_interval.as_millis() as u64,
            lease_ms: self.ctx.timing.lease().as_millis() as u64,
            fence_grace_ms: self.ctx.timing.fence_grace().as_millis() as u64,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let (metadata, _, req) = request.into_parts();
        heartbeat(&self.ctx, &metadata, &req.node_id).await.map(Response::new)
    }

    type HeartbeatsStream = Pin<Box<dyn Stream<Item = Result<pb::HeartbeatResponse, Status>> + Send>>;

    async fn heartbeats(
        &self,
        request: Request<tonic::Streaming<pb::HeartbeatRequest>>,
    ) -> Result<Response<Self::HeartbeatsStream>, Status> {
        let (metadata, _, mut inbound) = request.into_parts();
        let ctx = self.ctx.clone();
        // A stream silent for a node timeout is ended (its agent would be judged down anyway).
        let idle = ctx.timing.node_timeout;
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            // Each heartbeat is checked as a unary one is (credential, leader, node), all for
            // the node of the first; a refusal is the stream's last message. The task ends as
            // soon as the agent goes away, even while a heartbeat is being checked.
            let mut node: Option<String> = None;
            loop {
                let next = tokio::select! {
                    next = tokio::time::timeout(idle, inbound.message()) => next,
                    _ = tx.closed() => return,
                };
                let Ok(Ok(Some(req))) = next else { return };
                let answer = match node.get_or_insert_with(|| req.node_id.clone()) {
                    n if *n != req.node_id => {
                        Err(Status::invalid_argument("a heartbeat stream is for one node"))
                    }
                    n => tokio::select! {
                        answer = heartbeat(&ctx, &metadata, n) => answer,
                        _ = tx.closed() => return,
                    },
                };
                let refused = answer.is_err();
                if tx.send(answer).await.is_err() || refused {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    type AssignmentsStream = Pin<Box<dyn Stream<Item = Result<pb::AssignmentSet, Status>> + Send>>;

    async fn assignments(
        &self,
        request: Request<pb::AssignmentsRequest>,
    ) -> Result<Response<Self::AssignmentsStream>, Status> {
        self.ctx.authenticate_agent(request.metadata(), &request.get_ref().node_id)?;
        let node = request.into_inner().node_id;
        self.ctx.check_node(&node)?;
        let stream = crate::assignments::stream(self.ctx.replica.clone(), &self.wakers, node);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn drain(&self, request: Request<pb::DrainRequest>) -> Result<Response<pb::DrainResponse>, Status> {
        self.ctx.authenticate_agent(request.metadata(), &request.get_ref().node_id)?;
        let r = request.into_inner();
        let reason = match r.health_check {
            true => format!("{HEALTH_CHECK_REASON}{}", r.reason),
            false => r.reason,
        };
        // A health check that keeps failing is told each run: no write for a drain it has.
        let has =
            |n: &kairos_scheduler::Node| n.reason.starts_with(&format!("draining: {HEALTH_CHECK_REASON}"));
        if r.health_check
            && !r.requeue
            && self.ctx.replica.read(|a| a.state.nodes.get(&r.node_id).is_some_and(has))
        {
            return Ok(Response::new(pb::DrainResponse {}));
        }
        self.ctx.drain_node(r.node_id, &reason, r.health_check && !r.requeue).await?;
        Ok(Response::new(pb::DrainResponse {}))
    }

    async fn health_check_passed(
        &self,
        request: Request<pb::HealthCheckPassedRequest>,
    ) -> Result<Response<pb::HealthCheckPassedResponse>, Status> {
        self.ctx.authenticate_agent(request.metadata(), &request.get_ref().node_id)?;
        let node = request.into_inner().node_id;
        self.ctx.check_node(&node)?;
        let draining = self.ctx.replica.read(|a| {
            a.state
                .nodes
                .get(&node)
                .is_some_and(|n| n.reason.starts_with(&format!("draining: {HEALTH_CHECK_REASON}")))
        });
        if draining {
            tracing::info!(%node, "health check passes again; node resumes");
            let op = Op::ResumeNode { node, only_reason: Some(HEALTH_CHECK_REASON.to_string()) };
            self.ctx.node_write(op).await?;
        }
        Ok(Response::new(pb::HealthCheckPassedResponse {}))
    }

    async fn report_gpu_fault(
        &self,
        request: Request<pb::GpuFaultReport>,
    ) -> Result<Response<pb::GpuFaultAck>, Status> {
        self.ctx.authenticate_agent(request.metadata(), &request.get_ref().node_id)?;
        let r = request.into_inner();
        self.ctx.check_node(&r.node_id)?;
        if r.uuid.len() > 128 || r.reason.len() > 1024 {
            return Err(Status::invalid_argument("GPU fault report: uuid or reason too long"));
        }
        // A GPU already known to be unhealthy needs no write (an agent repeats a GPU that
        // keeps failing its queries).
        let known = self
            .ctx
            .replica
            .read(|a| a.state.nodes.get(&r.node_id).is_some_and(|n| n.faults.contains_key(&r.gpu)));
        if !known {
            tracing::error!(node = %r.node_id, gpu = r.gpu, uuid = %r.uuid, reason = %r.reason, "GPU unhealthy");
            let op = Op::GpuFault { node: r.node_id, gpu: r.gpu, uuid: r.uuid, reason: r.reason };
            self.ctx.node_write(op).await?;
        }
        Ok(Response::new(pb::GpuFaultAck {}))
    }

    async fn report_status(
        &self,
        request: Request<pb::StatusReport>,
    ) -> Result<Response<pb::StatusAck>, Status> {
        self.ctx.authenticate_agent(request.metadata(), &request.get_ref().node_id)?;
        let r = request.into_inner();
        self.ctx.check_node(&r.node_id)?;
        let op = match pb::RunStatus::try_from(r.status) {
            Ok(pb::RunStatus::Started) => {
                Op::JobStarted { job: r.job_id, attempt: r.attempt, node: r.node_id }
            }
            Ok(pb::RunStatus::Exited) => {
                let usage = run_usage(&r);
                let nothing =
                    kairos_scheduler::model::RunUsage { oom_attempt: r.attempt, ..Default::default() };
                if usage != nothing {
                    // Recorded first, so the exit is judged with it (OUT_OF_MEMORY): one record
                    // per task and attempt.
                    let op =
                        Op::RunUsage { job: r.job_id, attempt: r.attempt, node: r.node_id.clone(), usage };
                    self.ctx.write(op).await?;
                }
                let exit = if r.signal != 0 { RunExit::Signal(r.signal) } else { RunExit::Code(r.exit_code) };
                Op::JobExited { job: r.job_id, attempt: r.attempt, node: r.node_id, exit }
            }
            Ok(s @ (pb::RunStatus::Idle | pb::RunStatus::Busy)) => idle_op(r, s == pb::RunStatus::Idle)?,
            Ok(pb::RunStatus::Checkpointed) => {
                Op::Checkpointed { job: r.job_id, attempt: r.attempt, node: r.node_id }
            }
            Ok(pb::RunStatus::LogTruncated) => Op::RunNote {
                job: r.job_id,
                attempt: r.attempt,
                node: r.node_id,
                kind: "log truncated".into(),
                message: r.message.chars().take(256).collect(),
            },
            Ok(pb::RunStatus::Image) => Op::RunNote {
                job: r.job_id,
                attempt: r.attempt,
                node: r.node_id,
                kind: "image".into(),
                message: r.message.chars().take(512).collect(),
            },
            Ok(pb::RunStatus::Lost) => {
                let message: String = r.message.chars().take(512).collect();
                Op::JobExited {
                    job: r.job_id,
                    attempt: r.attempt,
                    node: r.node_id,
                    exit: RunExit::Lost(message),
                }
            }
            _ => return Err(Status::invalid_argument(format!("status: unknown run status {}", r.status))),
        };
        let exited = matches!(op, Op::JobExited { .. });
        match self.ctx.write(op).await? {
            Outcome::Rejected(rej) => Err(rejection_status(rej)),
            outcome => {
                if let Outcome::Ignored(why) = &outcome {
                    tracing::debug!(%why, "stale run report");
                }
                if exited {
                    self.ctx.kick.notify_one();
                }
                Ok(Response::new(pb::StatusAck {}))
            }
        }
    }
}

/// A heartbeat from `node`'s agent, unary or on its stream: the credential of the node's current
/// registration, then the core's checks in the core's order (`liveness::heartbeat`, as the
/// simulation's).
async fn heartbeat(
    ctx: &Ctx,
    metadata: &tonic::metadata::MetadataMap,
    node: &str,
) -> Result<pb::HeartbeatResponse, Status> {
    ctx.authenticate_agent(metadata, node)?;
    match liveness::heartbeat(&Desk(ctx), node, || ctx.check_node(node)).await {
        Ok(()) => Ok(pb::HeartbeatResponse {}),
        Err(HeartbeatError::NotLeader) => Err(ctx.not_leader()),
        Err(HeartbeatError::NotConfirmed) => {
            Err(write_status(WriteError::NotLeader { leader: None, leader_addr: None }))
        }
        Err(HeartbeatError::Failed(status)) => Err(status),
        Err(HeartbeatError::Refused(HeartbeatRefused::Down)) => {
            Err(Status::failed_precondition(format!("node \"{node}\" is down; register again")))
        }
        Err(HeartbeatError::Refused(HeartbeatRefused::Condemned)) => Err(Status::failed_precondition(
            format!("node \"{node}\" missed its heartbeats and is being marked down; register again"),
        )),
    }
}

/// What an exit report says the run used: its cgroup's figures and the agent's aggregates.
fn run_usage(r: &pb::StatusReport) -> kairos_scheduler::model::RunUsage {
    let m = r.usage.unwrap_or_default();
    kairos_scheduler::model::RunUsage {
        max_rss_kib: r.max_rss_kib,
        cpu_ms: r.cpu_time_ms,
        oom_kills: r.oom_kills,
        oom_attempt: r.attempt,
        wall_ms: m.wall_ms,
        gpu_ms: m.gpu_ms,
        gpu_busy_ms: m.gpu_busy_ms,
        gpu_util_max_pct: m.gpu_util_max_pct.min(100),
        gpu_util_p95_pct: m.gpu_util_p95_pct.min(100),
        gpu_mem_max_mib: m.gpu_mem_max_mib,
        gpu_mem_device_mib: m.gpu_mem_device_mib,
        samples: m.samples,
    }
}

/// An idle (or busy again) report as its op; apply caps the agent's time at the cluster's.
fn idle_op(r: pb::StatusReport, idle: bool) -> Result<Op, Status> {
    if idle && r.idle_since_ms <= 0 {
        return Err(Status::invalid_argument("idle_since_ms: required with RUN_STATUS_IDLE"));
    }
    let since_ms = idle.then_some(r.idle_since_ms);
    Ok(Op::RunIdle { job: r.job_id, attempt: r.attempt, node: r.node_id, since_ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_registration_says_when_to_come_back_and_the_pause_grows_with_the_sheds() {
        let after = |n| -> u64 {
            let s = shed(n);
            assert_eq!(s.code(), tonic::Code::Unavailable);
            let v = s.metadata().get(kairos_proto::wire::RETRY_AFTER_HEADER).expect("a retry-after");
            v.to_str().unwrap().parse().unwrap()
        };
        assert_eq!(after(1), 100);
        assert_eq!(after(4 * REGISTERING_MAX), 500);
        assert_eq!(after(1_000 * REGISTERING_MAX), 5_000, "bounded");
        let rate = ShedRate::new();
        assert_eq!((rate.note(), rate.note(), rate.note()), (1, 2, 3), "counted within the second");
    }
}
