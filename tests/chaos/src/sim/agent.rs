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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kairos_consensus::ReplicaId;
use kairos_scheduler::orders::{runs_on, RunAction};
use kairos_scheduler::{Gpu, JobId, NodeInfo, Op, Outcome, RunExit};
use tokio::time::Instant;

use super::{locked, World};

const TICK: Duration = Duration::from_millis(100);

struct Proc {
    record: usize,
    gpus: Vec<u32>,
    natural_end: Instant,
    stop_at: Option<Instant>,
    ended: Option<RunExit>,
    started_reported: bool,
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
    let mut procs: BTreeMap<(JobId, u32), Proc> = BTreeMap::new();
    let mut lost_reported: BTreeSet<(JobId, u32)> = BTreeSet::new();
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
        // Reconcile with the assignments on the leader's state.
        let orders: Vec<(JobId, u32, Vec<u32>, bool, RunAction, String)> = replica.read(|a| {
            runs_on(&a.state, &node)
                .into_iter()
                .map(|o| {
                    (
                        o.job.id,
                        o.attempt,
                        o.gpus.clone(),
                        o.started,
                        o.action.clone(),
                        o.job.spec.name.clone(),
                    )
                })
                .collect()
        });
        let now = Instant::now();
        let listed: BTreeSet<(JobId, u32)> = orders.iter().map(|o| (o.0, o.1)).collect();
        for (_, p) in procs.iter_mut().filter(|(k, p)| !listed.contains(k) && p.ended.is_none()) {
            if p.stop_at.is_none_or(|s| s > now) {
                p.stop_at = Some(now);
            }
        }
        let mut reports: Vec<Op> = Vec::new();
        for (job, attempt, gpus, started, action, name) in orders {
            let key = (job, attempt);
            match (&action, procs.get_mut(&key)) {
                (RunAction::Stop { grace_s, .. }, Some(p)) => {
                    if p.ended.is_none() && p.stop_at.is_none() {
                        let grace = Duration::from_millis(u64::from(*grace_s).min(2) * 500);
                        p.stop_at = Some(now + grace);
                    }
                }
                (_, Some(_)) => {}
                // A run it should have but does not (it ended unreported across a crash, or
                // was never launched): reported lost, so its GPUs come back.
                (RunAction::Stop { .. }, None) | (_, None)
                    if started || matches!(action, RunAction::Stop { .. }) =>
                {
                    if !lost_reported.contains(&key) {
                        reports.push(Op::JobExited {
                            job,
                            attempt,
                            node: node.clone(),
                            exit: RunExit::Lost("not running on the agent".into()),
                        });
                    }
                }
                (_, None) => {
                    let busy =
                        procs.values().any(|p| p.ended.is_none() && p.gpus.iter().any(|g| gpus.contains(g)));
                    if busy {
                        continue;
                    }
                    let record = w.start_process(&node, job, attempt, &gpus, now);
                    let natural_end = now + w.run_time(&name);
                    procs.insert(
                        key,
                        Proc {
                            record,
                            gpus,
                            natural_end,
                            stop_at: None,
                            ended: None,
                            started_reported: false,
                        },
                    );
                }
            }
        }
        for (&(job, attempt), p) in &procs {
            if !p.started_reported {
                reports.push(Op::JobStarted { job, attempt, node: node.clone() });
            }
            if let Some(exit) = &p.ended {
                reports.push(Op::JobExited { job, attempt, node: node.clone(), exit: exit.clone() });
            }
        }
        // Reports in order, one call each, until one fails.
        for op in reports {
            let key = match &op {
                Op::JobStarted { job, attempt, .. } | Op::JobExited { job, attempt, .. } => (*job, *attempt),
                _ => continue,
            };
            let is_start = matches!(op, Op::JobStarted { .. });
            if w.write(&mut via, vec![op]).await.is_err() {
                break;
            }
            match procs.get_mut(&key) {
                Some(p) if is_start => p.started_reported = true,
                Some(p) if p.started_reported => {
                    procs.remove(&key);
                }
                Some(_) => {}
                // A run reported lost: once committed, not again.
                None => {
                    lost_reported.insert(key);
                }
            }
        }
    }
}
