//! A modelled node agent: what `kairos-agent` does, on the simulated clock, with processes that
//! are records instead of children.
//!
//! Each tick it registers (`JoinNode`, with its credential's epoch after the first time),
//! heartbeats the leader (which answers only while a quorum confirms it, and renews the lease to
//! `sent + lease`), reconciles its runs with the assignments on the leader's applied state
//! (`kairos_scheduler::orders::runs_on`: launch what has not started, stop what is told to stop
//! or no longer listed) and reports starts and exits until they commit. When its lease lapses it
//! stops its runs within the fence grace; its watchdog kills whatever still runs at
//! `lease + grace` even while the agent is stalled or crashed. A crashed agent keeps its runs
//! (it adopts them again, as the real agent does from its job map).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kairos_agent::decide::{self, Action, Assigned, Local, RunKey};
use kairos_consensus::ReplicaId;
use kairos_scheduler::orders::{runs_on, RunAction};
use kairos_scheduler::{Gpu, NodeInfo, Op, Outcome, RunExit};
use tokio::time::Instant;

use super::{locked, World};

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
    let mut agent = SimAgent {
        w,
        node,
        info,
        via: 1,
        epoch: None,
        registered: false,
        lease_until: None,
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
        if !agent.registered {
            agent.register().await;
            continue;
        }
        let Some(replica) = agent.heartbeat().await else { continue };
        let reports = agent.reconcile(&replica);
        // Reports in order, one call each, until one fails.
        for op in reports {
            if agent.w.write(&mut agent.via, vec![op]).await.is_err() {
                break;
            }
        }
    }
}

/// What one modelled agent knows between its ticks.
struct SimAgent {
    w: Arc<World>,
    node: String,
    info: NodeInfo,
    /// The replica it talks to.
    via: ReplicaId,
    epoch: Option<u64>,
    registered: bool,
    lease_until: Option<Instant>,
    procs: BTreeMap<RunKey, Proc>,
    was_down: bool,
}

impl SimAgent {
    /// The processes go on by themselves: each ends naturally, at its stop, or at the lease's
    /// hard deadline (the watchdog), whichever comes first.
    fn advance(&mut self, now: Instant) {
        let w = &self.w;
        let hard =
            self.lease_until.map(|l| l + w.cfg.fence_grace()).filter(|_| !w.cfg.broken.agents_ignore_lease);
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
                self.registered = false;
            }
            self.was_down = true;
        } else if self.was_down {
            self.was_down = false;
            self.w.clear_agent_fault(&self.node);
        }
        down
    }

    fn leased(&self, now: Instant) -> bool {
        self.lease_until.is_some_and(|l| now < l) || self.w.cfg.broken.agents_ignore_lease
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

    /// Registers (`JoinNode`, with its credential's epoch after the first time), as the agent
    /// service's `register` admits it (`kairos_scheduler::liveness`); the lease runs from when
    /// it was sent.
    async fn register(&mut self) {
        let (w, node, via) = (self.w.clone(), self.node.clone(), self.via);
        let may =
            w.replica(via).is_none_or(|r| r.read(|a| locked(&w.liveness(via)).may_register(&a.state, &node)));
        if !may {
            return;
        }
        let sent = Instant::now();
        let join = Op::JoinNode { info: self.info.clone(), credential_epoch: self.epoch };
        let Ok(outcomes) = w.write(&mut self.via, vec![join]).await else { return };
        match outcomes.first() {
            Some(Outcome::NodeRegistered { epoch: e, .. }) => {
                self.epoch = Some(*e);
                let (now, via) = (Instant::now().into_std(), self.via);
                let stands = w.replica(via).is_some_and(|r| {
                    r.read(|a| locked(&w.liveness(via)).registration_stands(&a.state, &node, now, 0))
                });
                if stands && !w.reply_lost() {
                    self.registered = true;
                    self.lease_until = Some(sent + w.cfg.lease());
                }
            }
            // A registration of another epoch (a stale credential): join afresh.
            Some(Outcome::Rejected(_)) => self.epoch = None,
            _ => {}
        }
    }

    /// A heartbeat: only a leader a quorum still follows counts it. The leader it renewed the
    /// lease with (to `sent + lease`), if it did.
    async fn heartbeat(&mut self) -> Option<kairos_consensus::Replica> {
        let w = self.w.clone();
        let Some(replica) = w.replica(self.via) else {
            self.via = w.any_replica();
            return None;
        };
        if !w.wait_unpaused(self.via, Duration::from_millis(500)).await {
            return None;
        }
        if !replica.is_leader() {
            self.via = replica.leader().0.unwrap_or_else(|| w.any_replica());
            return None;
        }
        let sent = Instant::now();
        if !replica.leads_confirmed().await {
            self.via = w.any_replica();
            return None;
        }
        let admitted = replica.read(|a| {
            locked(&w.liveness(self.via)).admit_heartbeat(&a.state, &self.node, Instant::now().into_std(), 0)
        });
        if admitted.is_err() {
            self.registered = false;
            return None;
        }
        if w.reply_lost() {
            return None;
        }
        self.lease_until = Some(sent + w.cfg.lease());
        Some(replica)
    }

    /// Reconciles with the assignments on the leader's state, as the real agent decides
    /// (`kairos_agent::decide`), carried out on the modelled processes; the reports to send.
    fn reconcile(&mut self, replica: &kairos_consensus::Replica) -> Vec<Op> {
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

/// The runs the state assigns `node`, as `decide` reads them (the same orders the server sends
/// its agents, `orders::runs_on`), and their jobs' names (what their run times derive from).
fn assignments(
    state: &kairos_scheduler::ClusterState,
    node: &str,
) -> (Vec<Assigned>, BTreeMap<RunKey, String>) {
    runs_on(state, node)
        .into_iter()
        .map(|o| {
            let stop = match &o.action {
                RunAction::Stop { signal, grace_s } => Some((signal.clone(), *grace_s)),
                RunAction::Run | RunAction::Suspend => None,
            };
            let key = (o.job.id, o.attempt);
            let assigned = Assigned {
                key,
                gpus: o.gpus.clone(),
                milli: o.job.spec.gpu_milli,
                started: o.started,
                stop,
                suspend: o.action == RunAction::Suspend,
            };
            (assigned, (key, o.job.spec.name.clone()))
        })
        .unzip()
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
