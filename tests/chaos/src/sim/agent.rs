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
    let mut via: ReplicaId = 1;
    let mut epoch: Option<u64> = None;
    let mut registered = false;
    let mut lease_until: Option<Instant> = None;
    let mut procs: BTreeMap<RunKey, Proc> = BTreeMap::new();
    let mut was_down = false;
    loop {
        tokio::time::sleep(TICK).await;
        let now = Instant::now();
        // The processes go on by themselves; the watchdog holds the lease's hard deadline.
        let hard = lease_until.map(|l| l + w.cfg.fence_grace());
        for p in procs.values_mut().filter(|p| p.ended.is_none()) {
            let mut ends: Vec<(Instant, RunExit)> = vec![(p.natural_end, RunExit::Code(0))];
            if let Some(s) = p.stop_at {
                ends.push((s, RunExit::Signal(15)));
            }
            if let Some(h) = hard {
                if !w.cfg.broken.agents_ignore_lease {
                    ends.push((h, RunExit::Signal(9)));
                }
            }
            if let Some((at, exit)) = ends.into_iter().filter(|(at, _)| *at <= now).min_by_key(|(at, _)| *at)
            {
                w.end_process(p.record, at, !matches!(exit, RunExit::Code(_)));
                p.ended = Some(exit);
            }
        }
        let fault = w.agent_fault(&node);
        let down =
            fault.stalled_until.is_some_and(|t| now < t) || fault.crashed_until.is_some_and(|t| now < t);
        if down {
            if fault.crashed_until.is_some() {
                registered = false;
            }
            was_down = true;
            continue;
        }
        if was_down {
            was_down = false;
            w.clear_agent_fault(&node);
        }
        // The lease lapsed: stop every run within the grace, launch nothing.
        let leased = lease_until.is_some_and(|l| now < l) || w.cfg.broken.agents_ignore_lease;
        if !leased {
            for p in procs.values_mut().filter(|p| p.ended.is_none() && p.stop_at.is_none()) {
                p.stop_at = Some(now + w.cfg.fence_grace());
            }
        }
        if !registered {
            // As the agent service's `register` does (`kairos_scheduler::liveness`).
            let may = w
                .replica(via)
                .is_none_or(|r| r.read(|a| locked(&w.liveness(via)).may_register(&a.state, &node)));
            if !may {
                continue;
            }
            let sent = Instant::now();
            if let Ok(outcomes) =
                w.write(&mut via, vec![Op::JoinNode { info: info.clone(), credential_epoch: epoch }]).await
            {
                match outcomes.first() {
                    Some(Outcome::NodeRegistered { epoch: e, .. }) => {
                        epoch = Some(*e);
                        let now = Instant::now().into_std();
                        let stands = w.replica(via).is_some_and(|r| {
                            r.read(|a| locked(&w.liveness(via)).registration_stands(&a.state, &node, now, 0))
                        });
                        if stands && !w.reply_lost() {
                            registered = true;
                            lease_until = Some(sent + w.cfg.lease());
                        }
                    }
                    // A registration of another epoch (a stale credential): join afresh.
                    Some(Outcome::Rejected(_)) => epoch = None,
                    _ => {}
                }
            }
            continue;
        }
        // Heartbeat: only a leader a quorum still follows counts it.
        let Some(replica) = w.replica(via) else {
            via = w.any_replica();
            continue;
        };
        if !w.wait_unpaused(via, Duration::from_millis(500)).await {
            continue;
        }
        if !replica.is_leader() {
            via = replica.leader().0.unwrap_or_else(|| w.any_replica());
            continue;
        }
        let sent = Instant::now();
        if !replica.leads_confirmed().await {
            via = w.any_replica();
            continue;
        }
        let admitted = replica.read(|a| {
            locked(&w.liveness(via)).admit_heartbeat(&a.state, &node, Instant::now().into_std(), 0)
        });
        if admitted.is_err() {
            registered = false;
            continue;
        }
        if w.reply_lost() {
            continue;
        }
        lease_until = Some(sent + w.cfg.lease());
        // Reconcile with the assignments on the leader's state, as the real agent decides
        // (`kairos_agent::decide`), carried out on the modelled processes.
        let (assigned, names): (Vec<Assigned>, BTreeMap<RunKey, String>) = replica.read(|a| {
            runs_on(&a.state, &node)
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
                        started: o.started,
                        stop,
                        suspend: o.action == RunAction::Suspend,
                    };
                    (assigned, (key, o.job.spec.name.clone()))
                })
                .unzip()
        });
        let now = Instant::now();
        let mut reports: Vec<Op> = Vec::new();
        for action in decide::reconcile(&assigned, &local_view(&procs)) {
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
        for key in decide::launches(&assigned, &local_view(&procs), leased) {
            let Some(a) = assigned.iter().find(|a| a.key == key) else { continue };
            let record = w.start_process(&node, key.0, key.1, &a.gpus, now);
            let name = names.get(&key).map(String::as_str).unwrap_or_default();
            let natural_end = now + w.run_time(name);
            let p = Proc {
                record,
                gpus: a.gpus.clone(),
                natural_end,
                stop_at: None,
                ended: None,
                suspended: false,
            };
            procs.insert(key, p);
            reports.push(Op::JobStarted { job: key.0, attempt: key.1, node: node.clone() });
        }
        // Reports in order, one call each, until one fails.
        for op in reports {
            if w.write(&mut via, vec![op]).await.is_err() {
                break;
            }
        }
    }
}

/// The modelled processes as `decide` reads a node's runs.
fn local_view(procs: &BTreeMap<RunKey, Proc>) -> BTreeMap<RunKey, Local> {
    procs
        .iter()
        .map(|(key, p)| {
            let local = Local {
                gpus: p.gpus.clone(),
                spawned: true,
                ended: p.ended.is_some(),
                stopping: p.stop_at.is_some(),
                suspended: p.suspended,
            };
            (*key, local)
        })
        .collect()
}
