//! Deterministic simulation testing (DST) of the control plane (issue 14). Named `dst`, not
//! `sim`: `kairos-sim` is the workload simulator behind `kairos sim` (traces and policies).
//!
//! One schedule runs a whole cluster in one thread, on tokio's paused clock: three replicas that
//! are the real `kairos_consensus::Replica` (openraft, the state machine, `ClusterState::apply`,
//! the leader's pass through `kairos_scheduler::propose`), modelled agents that decide through
//! `kairos_agent::decide` (`agent`) and a client with a history (`client`), over a simulated
//! network (`net`) and a simulated disk beneath the production storage (`disk`). Time advances
//! only when every task waits, so minutes of faults take a fraction of a second, and every
//! random choice — the fault schedule, message delays and losses, run times, openraft's election
//! timeouts (`kairos_consensus::runtime`) — comes from the schedule's seed: a failing seed
//! replays alone.
//!
//! After the faults (`faults::schedule`) the director heals everything, lets the cluster settle
//! (bounded) and runs every checker (`crate::check_all`) on what the run recorded.

pub mod agent;
pub mod client;
pub mod cluster;
mod director;
pub mod disk;
pub mod faults;
pub mod net;
#[cfg(test)]
mod quorum_tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_consensus::ReplicaId;
use tokio::time::Instant;

use crate::proxy::Rng;
use crate::{FinalJob, JobId, Operation, ProcessRecord, Violation};
use agent::AgentFault;
use cluster::Slot;
use disk::Disk;
use faults::FaultKind;

/// The replicas' wall clock at the simulation's start (ms since the epoch).
pub const WALL_BASE_MS: i64 = 1_780_000_000_000;

/// A test build may break one safety mechanism on purpose, to show the checkers catch it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Broken {
    /// Agents keep running (and launching) after their lease lapsed; no watchdog.
    pub agents_ignore_lease: bool,
    /// The disks acknowledge syncs before their writes are durable (a lying volatile cache).
    pub disks_lie_about_syncs: bool,
    /// Replicas stamp commands with their wall clock, not the cluster's timeline.
    pub stamp_wall_clock: bool,
    /// The log's recovery cuts damage below the commit record off, instead of refusing.
    pub log_cuts_damage: bool,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub replicas: usize,
    pub nodes: usize,
    pub gpus_per_node: u32,
    /// Submits over the fault window.
    pub jobs: usize,
    /// Faults start within this time.
    pub window: Duration,
    /// After healing, the cluster must elect a leader, finish every job and converge within this.
    pub settle: Duration,
    /// `kairosd --node-timeout`.
    pub node_timeout: Duration,
    /// Snapshot after this many entries (small, so snapshots and their installs happen).
    pub snapshot_logs: u64,
    pub broken: Broken,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            replicas: 3,
            nodes: 4,
            gpus_per_node: 4,
            jobs: 36,
            window: Duration::from_secs(30),
            settle: Duration::from_secs(90),
            node_timeout: Duration::from_secs(3),
            snapshot_logs: 40,
            broken: Broken::default(),
        }
    }
}

impl Config {
    /// The configuration schedule `seed` runs: one in three clusters has five replicas.
    pub fn for_seed(seed: u64) -> Config {
        let replicas = if seed.is_multiple_of(3) { 5 } else { 3 };
        Config { replicas, ..Config::default() }
    }

    /// The agent's lease and fence grace, as `kairosd` derives them (`Timing::lease`,
    /// `Timing::fence_grace`): lease + grace stays below the node timeout.
    pub fn lease(&self) -> Duration {
        kairos_scheduler::liveness::lease(self.node_timeout)
    }

    pub fn fence_grace(&self) -> Duration {
        kairos_scheduler::liveness::fence_grace(self.node_timeout)
    }
}

#[derive(Default)]
struct Records {
    history: Vec<Operation>,
    processes: Vec<ProcessRecord>,
    /// Time-limit stops and placements that committed: (job, ms).
    time_limit_stops: Vec<(JobId, i64)>,
    allocations: Vec<(JobId, i64)>,
    /// Runs ordered to stop, and when the order was first seen committed (ms).
    stop_orders: BTreeMap<(JobId, u32), i64>,
    /// Each look at the leader's state (ms): the teams owed GPUs that reclaim could serve then
    /// (None: no leader to look at).
    owed: Vec<(i64, Option<Vec<String>>)>,
    /// Reclaims (preemptions for a team within its guarantee) the leader's state recorded.
    reclaims: u64,
    /// Finished jobs a leader proposed to purge, as they were then (the checkers judge the ones
    /// the live state no longer holds and its history does).
    purged: BTreeMap<JobId, FinalJob>,
}

/// Everything one schedule's tasks share.
pub struct World {
    pub cfg: Config,
    pub seed: u64,
    pub net: net::Net,
    start: Instant,
    slots: Mutex<BTreeMap<ReplicaId, Slot>>,
    rng: Mutex<Rng>,
    records: Mutex<Records>,
    agent_faults: Mutex<BTreeMap<String, AgentFault>>,
    pub(crate) traced: bool,
    /// What the faults did, counted as it happens.
    pub node_downs: std::sync::atomic::AtomicU64,
    pub restarts: std::sync::atomic::AtomicU64,
    /// A replica with a damaged log is being re-added: no second one is damaged meanwhile (two
    /// of three logs lost is a restore from a backup, not a fault the cluster rides out).
    pub(crate) re_adding: std::sync::atomic::AtomicBool,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl World {
    pub fn slots(&self) -> std::sync::MutexGuard<'_, BTreeMap<ReplicaId, Slot>> {
        locked(&self.slots)
    }

    pub fn elapsed_ms(&self) -> i64 {
        self.ms_at(Instant::now())
    }

    fn ms_at(&self, t: Instant) -> i64 {
        t.saturating_duration_since(self.start).as_millis() as i64
    }

    /// Prints `what` at the simulated time when the run is traced (`KAIROS_SIM_TRACE=1`, what
    /// `kairos-chaos --replay` of a failing seed is for).
    pub fn trace(&self, what: impl FnOnce() -> String) {
        if self.traced {
            eprintln!("{:>7} ms  {}", self.elapsed_ms(), what());
        }
    }

    /// A draw in 0..n from the schedule's generator.
    pub fn draw(&self, n: u64) -> u64 {
        locked(&self.rng).below(n)
    }

    pub fn record(&self, op: Operation) {
        self.trace(|| format!("client: {op:?}"));
        locked(&self.records).history.push(op);
    }

    pub fn replica(&self, id: ReplicaId) -> Option<kairos_consensus::Replica> {
        self.slots().get(&id).and_then(|s| s.replica.clone())
    }

    /// The liveness `via` keeps as leader.
    pub fn liveness(&self, via: ReplicaId) -> Arc<Mutex<kairos_scheduler::liveness::Liveness>> {
        self.slots().get(&via).map(|s| s.liveness.clone()).unwrap_or_default()
    }

    /// Whether a reply to an agent or client is lost now.
    pub fn reply_lost(&self) -> bool {
        let mut n = net::lock(&self.net);
        n.lose_replies_per_mille > 0 && n.rng.below(1000) < n.lose_replies_per_mille
    }

    pub fn agent_fault(&self, node: &str) -> AgentFault {
        locked(&self.agent_faults).get(node).copied().unwrap_or_default()
    }

    pub fn clear_agent_fault(&self, node: &str) {
        locked(&self.agent_faults).remove(node);
    }

    /// How long the run of the job named `name` takes when nothing stops it (1–10 s, from the
    /// name, so a requeued job runs as long again).
    pub fn run_time(&self, name: &str) -> Duration {
        let h = name.bytes().fold(self.seed, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
        Duration::from_millis(1_000 + Rng::new(h).below(9_000))
    }

    pub fn start_process(&self, node: &str, job: JobId, attempt: u32, gpus: &[u32], at: Instant) -> usize {
        let mut r = locked(&self.records);
        r.processes.push(ProcessRecord {
            node: node.to_string(),
            job,
            attempt,
            gpus: gpus.to_vec(),
            start_ms: self.ms_at(at),
            end_ms: None,
            killed: false,
        });
        self.trace(|| format!("{node}: start job {job} attempt {attempt} on GPUs {gpus:?}"));
        r.processes.len() - 1
    }

    /// What a leader's pass proposed at `proposed_ms` committed, that the time-limit checker
    /// needs: placements at the proposal (they cannot have committed sooner), time-limit stops
    /// now (not later) — bounds that never make the checker stricter than the truth.
    pub fn committed(
        &self,
        proposed_ms: i64,
        outcomes: &[kairos_scheduler::Outcome],
        limits: &[Option<JobId>],
    ) {
        let at = self.elapsed_ms();
        let mut r = locked(&self.records);
        for (outcome, limit) in outcomes.iter().zip(limits) {
            match (outcome, limit) {
                (kairos_scheduler::Outcome::RunUpdated { .. }, Some(job)) => {
                    r.time_limit_stops.push((*job, at))
                }
                (kairos_scheduler::Outcome::PlanApplied { accepted, .. }, _) => {
                    r.allocations.extend(accepted.iter().map(|j| (*j, proposed_ms)));
                }
                _ => {}
            }
        }
    }

    /// A leader proposes to purge these finished jobs.
    pub fn purging(&self, jobs: Vec<FinalJob>) {
        let mut r = locked(&self.records);
        for j in jobs {
            r.purged.insert(j.id, j);
        }
    }

    pub fn end_process(&self, record: usize, at: Instant, killed: bool) {
        let at = self.ms_at(at);
        if let Some(p) = locked(&self.records).processes.get_mut(record) {
            p.end_ms = Some(at);
            p.killed = killed;
            if self.traced {
                eprintln!(
                    "{:>7} ms  {}: end job {} attempt {} (at {at} ms)",
                    self.elapsed_ms(),
                    p.node,
                    p.job,
                    p.attempt
                );
            }
        }
    }
}

/// What one schedule did and found.
#[derive(Clone, Debug)]
pub struct ScheduleReport {
    pub seed: u64,
    pub faults: Vec<FaultKind>,
    pub operations: usize,
    pub acknowledged: usize,
    pub processes: usize,
    pub violations: Vec<Violation>,
    /// A digest of everything recorded: equal on every replay of the seed.
    pub fingerprint: String,
    /// Simulated time the schedule took, ms.
    pub simulated_ms: i64,
    pub observed: Observed,
}

/// What the faults did to the cluster in one schedule: evidence that they bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Observed {
    /// Nodes marked down (fencing ran).
    pub node_downs: u64,
    /// Runs requeued (after a node failure or preemption).
    pub requeues: u64,
    pub preemptions: u64,
    /// Preemptions that reclaimed a team's guarantee (the most the leader's state recorded).
    pub reclaims: u64,
    /// The highest Raft term reached (elections).
    pub max_term: u64,
    /// Replica starts after the first (crashes, power losses, fail-stops).
    pub restarts: u64,
    /// Unsynced writes that crashes lost, torn entries dropped at open, writes a full disk refused.
    pub unsynced_lost: u64,
    pub torn_dropped: u64,
    pub disk_refused: u64,
}

impl Observed {
    pub fn add(&mut self, o: &Observed) {
        self.node_downs += o.node_downs;
        self.requeues += o.requeues;
        self.preemptions += o.preemptions;
        self.reclaims += o.reclaims;
        self.max_term = self.max_term.max(o.max_term);
        self.restarts += o.restarts;
        self.unsynced_lost += o.unsynced_lost;
        self.torn_dropped += o.torn_dropped;
        self.disk_refused += o.disk_refused;
    }
}

/// Runs schedule `seed` on this thread and checks it.
pub fn run_schedule(seed: u64, cfg: &Config) -> ScheduleReport {
    kairos_consensus::runtime::seed_thread_rng(seed);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build();
    match runtime {
        Ok(rt) => rt.block_on(simulate(seed, cfg.clone())),
        Err(e) => ScheduleReport {
            seed,
            faults: Vec::new(),
            operations: 0,
            acknowledged: 0,
            processes: 0,
            violations: vec![Violation::Harness { what: format!("building the runtime: {e}") }],
            fingerprint: String::new(),
            simulated_ms: 0,
            observed: Observed::default(),
        },
    }
}

/// The simulated machines of schedule `seed`: each replica's disk (replicas 1..=n are the
/// cluster; one more is the spare a membership change adds) and the network. Nothing runs yet.
fn world(seed: u64, cfg: Config) -> Arc<World> {
    let mut rng = Rng::new(seed);
    let mut slots = BTreeMap::new();
    for id in 1..=(cfg.replicas as ReplicaId + 1) {
        // fsync latency: a fast SSD to a slow disk.
        let sync = Duration::from_millis(1 + rng.below(20));
        // Small log segments (2–64 KiB): crashes meet logs of many.
        let mut disk = Disk::new(sync, 2048 << rng.below(6));
        disk.lies_about_syncs = cfg.broken.disks_lie_about_syncs;
        disk.cuts_damage = cfg.broken.log_cuts_damage;
        slots.insert(id, Slot::new(disk, id <= cfg.replicas as ReplicaId));
    }
    Arc::new(World {
        net: net::new_net(rng.next_u64()),
        rng: Mutex::new(Rng::new(rng.next_u64())),
        seed,
        start: Instant::now(),
        slots: Mutex::new(slots),
        records: Mutex::default(),
        agent_faults: Mutex::default(),
        traced: std::env::var_os("KAIROS_SIM_TRACE").is_some(),
        node_downs: Default::default(),
        restarts: Default::default(),
        re_adding: Default::default(),
        cfg,
    })
}

async fn simulate(seed: u64, cfg: Config) -> ScheduleReport {
    let w = world(seed, cfg);
    let mut violations = Vec::new();
    for id in 1..=w.cfg.replicas as ReplicaId {
        if let Err(e) = w.start_replica(id, false).await {
            violations.push(Violation::Harness { what: format!("starting replica {id}: {e}") });
        }
    }
    let mut tasks = Vec::new();
    let mut injected = Vec::new();
    tasks.push(tokio::spawn(supervise(w.clone())));
    tasks.push(tokio::spawn(watch_stop_orders(w.clone())));
    tasks.push(tokio::spawn(watch_guarantees(w.clone())));
    for n in 0..w.cfg.nodes {
        tasks.push(tokio::spawn(agent::run(w.clone(), format!("node-{n}"))));
    }
    let client = tokio::spawn(client::run(w.clone()));
    let window_ms = w.cfg.window.as_millis() as u64;
    for fault in faults::schedule(seed, window_ms, w.cfg.node_timeout.as_millis() as u64) {
        tokio::time::sleep_until(w.start + Duration::from_millis(fault.at_ms)).await;
        w.trace(|| format!("fault {} for {} ms", fault.kind.name(), fault.hold_ms));
        if w.inject(&fault).await {
            injected.push(fault.kind);
        }
    }
    tokio::time::sleep_until(w.start + w.cfg.window + Duration::from_secs(6)).await;
    let _ = tokio::time::timeout(Duration::from_secs(120), client).await;
    w.heal_all().await;
    let healed = Instant::now();
    let settled = w.settle(healed).await;
    for t in &tasks {
        t.abort();
    }
    let events = |kind: &str| -> u64 {
        settled.finals.iter().map(|j| j.events.iter().filter(|e| *e == kind).count() as u64).sum()
    };
    let mut observed = Observed {
        node_downs: w.node_downs.load(std::sync::atomic::Ordering::Relaxed),
        requeues: events("requeued"),
        preemptions: events("preempted"),
        reclaims: locked(&w.records).reclaims,
        restarts: w.restarts.load(std::sync::atomic::Ordering::Relaxed),
        ..Observed::default()
    };
    for (_, r) in w.running() {
        observed.max_term = observed.max_term.max(r.raft.metrics().borrow().current_term);
    }
    for s in w.slots().values() {
        let d = s.disk.state.lock().unwrap_or_else(|p| p.into_inner());
        observed.unsynced_lost += d.lost;
        observed.torn_dropped += d.torn_dropped;
        observed.disk_refused += d.refused;
    }
    let found = w.check(settled);
    violations.extend(found.0);
    for (id, _) in w.running() {
        w.crash_replica(id, 0, false).await;
    }
    let records = locked(&w.records);
    let acknowledged = records
        .history
        .iter()
        .filter(|o| {
            matches!(o, Operation::Submit { acked: Some(_), .. } | Operation::Cancel { acked: true, .. })
        })
        .count();
    let fingerprint = crate::fnv64(
        format!("{:?}{:?}{:?}{:?}", records.history, records.processes, found.1, injected).as_bytes(),
    );
    ScheduleReport {
        seed,
        faults: injected,
        operations: records.history.len(),
        acknowledged,
        processes: records.processes.len(),
        violations,
        fingerprint: format!("{fingerprint:016x}"),
        simulated_ms: w.elapsed_ms(),
        observed,
    }
}

/// `systemd`'s part: a replica whose Raft stopped (a storage error: fail-stop) is restarted
/// once its disk takes writes again.
async fn supervise(w: Arc<World>) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let failed: Vec<ReplicaId> = w
            .running()
            .into_iter()
            .filter(|(_, r)| r.raft.metrics().borrow().running_state.is_err())
            .map(|(id, _)| id)
            .collect();
        for id in failed {
            w.crash_replica(id, 0, false).await;
        }
        let down: Vec<(ReplicaId, bool)> = w
            .slots()
            .iter()
            .filter(|(_, s)| s.member && s.replica.is_none())
            .map(|(id, s)| (*id, s.disk.state.lock().unwrap_or_else(|p| p.into_inner()).full))
            .collect();
        for (id, full) in down {
            if !full && w.restart_due(id) {
                let _ = w.start_replica(id, w.joins(id)).await;
            }
        }
    }
}

/// The harness's own look, each tick, at the stop orders on the leader's applied state (so
/// committed): when each run was first ordered to stop, for the `stops_honoured` checker.
async fn watch_stop_orders(w: Arc<World>) {
    use kairos_scheduler::orders::{runs_on, RunAction};
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some((_, leader)) = w.leader() else { continue };
        let orders: Vec<(JobId, u32)> = leader.read(|a| {
            let nodes = a.state.nodes.keys();
            nodes
                .flat_map(|node| runs_on(&a.state, node))
                .filter(|o| matches!(o.action, RunAction::Stop { .. }))
                .map(|o| (o.job.id, o.attempt))
                .collect()
        });
        let now = w.elapsed_ms();
        let mut records = locked(&w.records);
        for key in orders {
            records.stop_orders.entry(key).or_insert(now);
        }
    }
}

/// How often the harness looks at the leader's teams (`watch_guarantees`), ms.
pub const OWED_LOOK_MS: i64 = 100;

/// The harness's own look, each tick, at what the teams are owed on the current leader's
/// applied state (`ClusterState::team_needs`), for the `guarantees_honoured`
/// checker. A leader cut off from the rest (no replica past its term yet) still counts: a
/// new leader's election is part of the bound. Time while links are slowed or replies lost
/// does not: the bound is two passes' commits at the links' own latency, and a degraded
/// network stretches each commit by up to a second (seen: 3.1 s owed under both).
async fn watch_guarantees(w: Arc<World>) {
    loop {
        tokio::time::sleep(Duration::from_millis(OWED_LOOK_MS as u64)).await;
        let degraded = {
            let n = net::lock(&w.net);
            n.slow_ms > 0 || n.lose_replies_per_mille > 0
        };
        let leader = if degraded { None } else { w.current_leader() };
        let look = leader.map(|(_, leader)| {
            leader.read(|a| {
                let owed = a.state.team_needs();
                let owed: Vec<String> = owed.into_iter().filter(|n| n.reclaimable).map(|n| n.team).collect();
                let reclaims =
                    a.state.preemptions.iter().filter(|r| r.reclaimed_for.is_some()).count() as u64;
                (owed, reclaims)
            })
        });
        let now = w.elapsed_ms();
        let mut records = locked(&w.records);
        if let Some((_, reclaims)) = &look {
            records.reclaims = records.reclaims.max(*reclaims);
        }
        records.owed.push((now, look.map(|(owed, _)| owed)));
    }
}

/// The settled cluster as the checkers see it.
pub struct Settled {
    pub finals: Vec<FinalJob>,
    /// (replica, applied index, digest) of every member.
    pub replicas: Vec<(ReplicaId, u64, String)>,
    /// Each running member's own invariant check.
    pub invariants: Vec<(ReplicaId, Result<(), String>)>,
    pub leader_after_ms: Option<i64>,
    pub unfinished: usize,
    /// How far the time the leader would stamp is behind the (healed) clocks, when one leads.
    pub timeline_lag_ms: Option<i64>,
}
