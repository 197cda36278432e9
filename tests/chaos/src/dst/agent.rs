//! A modelled node agent: what `kairos-agent` does, on the simulated clock, with processes that
//! are records instead of children.
//!
//! Each tick it registers and heartbeats as the real agent does — the same sequence
//! (`kairos_agent::session::step`: which credential it presents, `sent` read before the call,
//! the lease renewed to `sent + lease` by `fence::LeaseTerms::renewal`) over modelled calls that
//! the replica answers with the server's own checks in the server's order
//! (`kairos_scheduler::liveness::register` and `heartbeat`, on `SimSeat`). It reconciles its
//! runs with the assignments on the leader's applied state, read as the runner reads what the
//! server sends (`kairos_server::assignments::assignments_for`, `kairos_agent::decide::assigned_of`:
//! launch what has not started, stop what is told to stop or no longer listed) and reports
//! starts and exits until they commit. When its lease lapses it stops its runs within the fence
//! grace; its watchdog kills whatever still runs at the hard deadline even while the agent is
//! stalled or crashed. A crashed agent keeps its runs (it adopts them again, as the real agent
//! does from its job map).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kairos_agent::decide::{self, Action, Assigned, Local, RunKey};
use kairos_agent::fence::{LeaseTerms, Renewal};
use kairos_agent::session::step::{self, Controller, Registration};
use kairos_agent::session::Credentials;
use kairos_consensus::{Replica, ReplicaId};
use kairos_scheduler::liveness::{self, HeartbeatError, RegisterRefused};
use kairos_scheduler::{Gpu, NodeInfo, Op, RunExit};
use tokio::time::Instant;

use super::cluster::SimSeat;
use super::World;

const TICK: Duration = Duration::from_millis(100);

struct Proc {
    record: usize,
    gpus: Vec<u32>,
    natural_end: Instant,
    stop_at: Option<Instant>,
    ended: Option<RunExit>,
    suspended: bool,
}

/// What the director does to an agent.
#[derive(Clone, Copy, Debug, Default)]
pub struct AgentFault {
    pub stalled_until: Option<Instant>,
    pub crashed_until: Option<Instant>,
}

/// What the agent of `name` registers: `gpus` fake GPUs.
fn node_info(name: &str, gpus: u32) -> NodeInfo {
    NodeInfo {
        name: name.to_string(),
        addr: format!("{name}:7070"),
        gpus: (0..gpus)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                model: "H100".into(),
                memory_mib: 81920,
                link_group: 0,
                mig_parent: None,
            })
            .collect(),
        cpus: 64,
        memory_mib: 512 * 1024,
        labels: Default::default(),
        gpu_backend: "fake".into(),
        isolation: "simulated".into(),
    }
}

/// The modelled agent of `node`, until the world ends.
pub async fn run(w: Arc<World>, node: String) {
    let info = node_info(&node, w.cfg.gpus_per_node);
    let calls = Calls { w: w.clone(), info, via: 1, answered_by: None };
    let mut agent = SimAgent {
        w,
        node,
        calls,
        creds: Credentials::in_memory(Some(Arc::from("join"))),
        terms: None,
        lease: None,
        procs: BTreeMap::new(),
        was_down: false,
    };
    loop {
        tokio::time::sleep(TICK).await;
        agent.advance(Instant::now());
        if agent.down(Instant::now()) {
            continue;
        }
        agent.fence(Instant::now());
        if agent.terms.is_none() {
            agent.register().await;
            continue;
        }
        let Some(replica) = agent.heartbeat().await else { continue };
        let reports = agent.reconcile(&replica);
        // Reports in order, one call each, until one fails.
        for op in reports {
            if agent.w.write(&mut agent.calls.via, vec![op]).await.is_err() {
                break;
            }
        }
    }
}

/// What one modelled agent knows between its ticks.
struct SimAgent {
    w: Arc<World>,
    node: String,
    calls: Calls,
    creds: Credentials,
    /// The lease terms of its registration (None: it must register).
    terms: Option<LeaseTerms>,
    lease: Option<Renewal<Instant>>,
    procs: BTreeMap<RunKey, Proc>,
    was_down: bool,
}

/// Why a modelled call got no answer the agent can use.
#[derive(Debug)]
enum CallError {
    /// The replica was down or paused, the reply lost, or it did not lead.
    Failed(String),
    /// The registration's credential was refused.
    Refused(String),
    /// The node must register again.
    MustRegister,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Failed(why) => write!(f, "{why}"),
            CallError::Refused(why) => write!(f, "registration refused: {why}"),
            CallError::MustRegister => write!(f, "the node must register again"),
        }
    }
}

/// The agent's calls to the cluster, as `kairosd`'s agent service answers them: a replica
/// (`via`), the server's checks on it (`liveness::register`, `liveness::heartbeat`).
struct Calls {
    w: Arc<World>,
    info: NodeInfo,
    /// The replica it talks to.
    via: ReplicaId,
    /// The leader that answered the last heartbeat.
    answered_by: Option<Replica>,
}

impl Calls {
    /// The replica `via`, once it is up and unpaused (within `wait`).
    async fn reach(&mut self, wait: Duration) -> Result<Replica, CallError> {
        let Some(replica) = self.w.replica(self.via) else {
            self.via = self.w.any_replica();
            return Err(CallError::Failed("replica down".into()));
        };
        if !self.w.wait_unpaused(self.via, wait).await {
            return Err(CallError::Failed("replica paused".into()));
        }
        Ok(replica)
    }

    /// A reply on its way back: lost now and then.
    fn reply<T>(&self, answer: T) -> Result<T, CallError> {
        match self.w.reply_lost() {
            true => Err(CallError::Failed("reply lost".into())),
            false => Ok(answer),
        }
    }
}

impl Controller for Calls {
    type Time = Instant;
    type Error = CallError;

    fn now(&self) -> Instant {
        Instant::now()
    }

    /// The credential is the registration's epoch (the real one is a MAC of it).
    async fn register(
        &mut self,
        with_join: bool,
        credential: Option<&str>,
    ) -> Result<Registration, CallError> {
        let replica = self.reach(Duration::from_secs(2)).await?;
        let presented = if with_join { None } else { credential.and_then(|c| c.parse::<u64>().ok()) };
        let w = self.w.clone();
        let seat = SimSeat::new(&w, self.via, replica);
        let registered = liveness::register(&seat, self.info.clone(), |_| Ok(presented)).await;
        self.via = seat.via();
        let epoch = match registered {
            Ok(epoch) => epoch,
            Err(RegisterRefused::Rejected(r)) => return Err(CallError::Refused(format!("{r:?}"))),
            Err(other) => return Err(CallError::Failed(format!("{other:?}"))),
        };
        let terms = LeaseTerms { lease: w.cfg.lease(), grace: w.cfg.fence_grace() };
        let credential = epoch.to_string();
        self.reply(Registration { node_id: self.info.name.clone(), credential, interval: TICK, terms })
    }

    fn refuses_credential(error: &CallError) -> bool {
        matches!(error, CallError::Refused(_))
    }

    async fn heartbeat(&mut self) -> Result<(), CallError> {
        let replica = self.reach(Duration::from_millis(500)).await?;
        let w = self.w.clone();
        let seat = SimSeat::new(&w, self.via, replica.clone());
        match liveness::heartbeat(&seat, &self.info.name, || Ok(())).await {
            Ok(()) => {
                self.answered_by = Some(replica);
                self.reply(())
            }
            Err(HeartbeatError::NotLeader) => {
                self.via = replica.leader().0.unwrap_or_else(|| w.any_replica());
                Err(CallError::Failed("not the leader".into()))
            }
            Err(HeartbeatError::NotConfirmed) => {
                self.via = w.any_replica();
                Err(CallError::Failed("leadership not confirmed".into()))
            }
            Err(HeartbeatError::Refused(_)) => Err(CallError::MustRegister),
            Err(HeartbeatError::Failed(e)) => Err(CallError::Failed(e)),
        }
    }
}

impl SimAgent {
    /// The processes go on by themselves: each ends naturally, at its stop, or at the lease's
    /// hard deadline (the watchdog), whichever comes first.
    fn advance(&mut self, now: Instant) {
        let w = &self.w;
        let hard = self.lease.map(|l| l.hard_deadline).filter(|_| !w.cfg.broken.agents_ignore_lease);
        for p in self.procs.values_mut().filter(|p| p.ended.is_none()) {
            let mut ends: Vec<(Instant, RunExit)> = vec![(p.natural_end, RunExit::Code(0))];
            ends.extend(p.stop_at.map(|s| (s, RunExit::Signal(15))));
            ends.extend(hard.map(|h| (h, RunExit::Signal(9))));
            if let Some((at, exit)) = ends.into_iter().filter(|(at, _)| *at <= now).min_by_key(|(at, _)| *at)
            {
                w.end_process(p.record, at, !matches!(exit, RunExit::Code(_)));
                p.ended = Some(exit);
            }
        }
    }

    /// Whether a fault holds the agent (stalled or crashed: a crashed one registers again).
    fn down(&mut self, now: Instant) -> bool {
        let fault = self.w.agent_fault(&self.node);
        let down =
            fault.stalled_until.is_some_and(|t| now < t) || fault.crashed_until.is_some_and(|t| now < t);
        if down {
            if fault.crashed_until.is_some() {
                self.terms = None;
            }
            self.was_down = true;
        } else if self.was_down {
            self.was_down = false;
            self.w.clear_agent_fault(&self.node);
        }
        down
    }

    fn leased(&self, now: Instant) -> bool {
        self.lease.is_some_and(|l| now < l.valid_until) || self.w.cfg.broken.agents_ignore_lease
    }

    /// The lease lapsed: every run stops within the fence's grace.
    fn fence(&mut self, now: Instant) {
        if self.leased(now) {
            return;
        }
        let grace = self.w.cfg.fence_grace();
        for p in self.procs.values_mut().filter(|p| p.ended.is_none() && p.stop_at.is_none()) {
            p.stop_at = Some(now + grace);
        }
    }

    /// Registers as the real agent does (`session::step::register`); the lease runs from when
    /// it was sent.
    async fn register(&mut self) {
        if let Ok(r) = step::register(&mut self.calls, &self.creds).await {
            self.terms = Some(r.registration.terms);
            self.lease = Some(r.renewal);
        }
    }

    /// A heartbeat as the real agent sends it (`session::step::heartbeat`): the leader that
    /// renewed the lease, if one did.
    async fn heartbeat(&mut self) -> Option<Replica> {
        let terms = self.terms?;
        match step::heartbeat(&mut self.calls, terms).await {
            Ok(renewal) => {
                self.lease = Some(renewal);
                self.calls.answered_by.take()
            }
            Err(CallError::MustRegister) => {
                self.terms = None;
                None
            }
            Err(_) => None,
        }
    }

    /// Reconciles with the assignments on the leader's state, as the real agent decides
    /// (`kairos_agent::decide`), carried out on the modelled processes; the reports to send.
    fn reconcile(&mut self, replica: &Replica) -> Vec<Op> {
        let (assigned, names) = replica.read(|a| assignments(&a.state, &self.node));
        let now = Instant::now();
        let node = self.node.clone();
        let mut reports: Vec<Op> = Vec::new();
        for action in decide::reconcile(&assigned, &local_view(&self.procs)) {
            let procs = &mut self.procs;
            match action {
                Action::Freeze(key, frozen) => {
                    if let Some(p) = procs.get_mut(&key) {
                        p.suspended = frozen;
                    }
                }
                Action::ReportStarted((job, attempt)) => {
                    reports.push(Op::JobStarted { job, attempt, node: node.clone() })
                }
                Action::ReportExit(key) => {
                    if let Some(exit) = procs.get(&key).and_then(|p| p.ended.clone()) {
                        reports.push(Op::JobExited { job: key.0, attempt: key.1, node: node.clone(), exit });
                    }
                }
                // A run it should have but does not (it ended unreported across a crash, or
                // was never launched): reported lost, so its GPUs come back.
                Action::ReportLost((job, attempt), _) => reports.push(Op::JobExited {
                    job,
                    attempt,
                    node: node.clone(),
                    exit: RunExit::Lost("not running on the agent".into()),
                }),
                Action::Stop { key, grace_s, .. } => {
                    if let Some(p) = procs.get_mut(&key) {
                        p.stop_at = Some(now + Duration::from_millis(u64::from(grace_s).min(2) * 500));
                    }
                }
                Action::Kill(key) => {
                    if let Some(p) = procs.get_mut(&key) {
                        p.stop_at = Some(p.stop_at.map_or(now, |s| s.min(now)));
                    }
                }
                Action::Forget(key) => {
                    procs.remove(&key);
                }
            }
        }
        for key in decide::launches(&assigned, &local_view(&self.procs), self.leased(now)) {
            let Some(a) = assigned.iter().find(|a| a.key == key) else { continue };
            let record = self.w.start_process(&node, key.0, key.1, &a.gpus, now);
            let name = names.get(&key).map(String::as_str).unwrap_or_default();
            let natural_end = now + self.w.run_time(name);
            let p = Proc {
                record,
                gpus: a.gpus.clone(),
                natural_end,
                stop_at: None,
                ended: None,
                suspended: false,
            };
            self.procs.insert(key, p);
            reports.push(Op::JobStarted { job: key.0, attempt: key.1, node: node.clone() });
        }
        reports
    }
}

/// The runs the state assigns `node` as the agent reads them: what the server sends
/// (`kairos_server::assignments::assignments_for`), read as the runner reads it
/// (`decide::assigned_of`); and their jobs' names (what their run times derive from).
fn assignments(
    state: &kairos_scheduler::ClusterState,
    node: &str,
) -> (Vec<Assigned>, BTreeMap<RunKey, String>) {
    let runs = kairos_server::assignments::assignments_for(state, node);
    let names = runs
        .iter()
        .filter_map(|a| Some(((a.job_id, a.attempt), state.jobs.get(&a.job_id)?.spec.name.clone())))
        .collect();
    (decide::assigned_of(&runs), names)
}

/// The modelled processes as `decide` reads a node's runs.
fn local_view(procs: &BTreeMap<RunKey, Proc>) -> BTreeMap<RunKey, Local> {
    procs
        .iter()
        .map(|(key, p)| {
            let local = Local {
                gpus: p.gpus.clone(),
                // The chaos workload asks for whole GPUs only.
                milli: 0,
                spawned: true,
                ended: p.ended.is_some(),
                stopping: p.stop_at.is_some(),
                suspended: p.suspended,
            };
            (*key, local)
        })
        .collect()
}
