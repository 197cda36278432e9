//! The discrete-event replay: jobs arrive, the production core decides (`propose`, the same
//! pure function the leader calls each pass) and applies (`ClusterState::apply`, the same state
//! machine every replica runs), and modelled agents start runs at once, end them after their
//! remaining work, and stop preempted ones a short delay after the checkpoint signal.
//!
//! Virtual time only; no IO, no clock, no randomness but the seed's (the order of jobs that
//! arrive at the same millisecond). The leader's loop is modelled too: a pass after every batch
//! of events at one time, and another one tick later whenever a pass changed something.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet};

use kairos_scheduler::model::{Gpu, JobId, JobSpec, JobState, NodeInfo, Profile};
use kairos_scheduler::policy::Policy;
use kairos_scheduler::propose::propose;
use kairos_scheduler::{ClusterState, Command, Op, Outcome, RunExit};

use crate::cloud::BurstSetup;
use crate::history::HistoryTrace;
use crate::report::{Class, Report, Unfinished};
use crate::trace::{TraceJob, TraceNode};

mod burst;
mod estimates;
mod history;
mod teams;

pub use history::trace_jobs as history_jobs;

/// How the replay runs.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Arrivals are compressed by this factor: the trace's arrival times divided by it (1.3:
    /// 30 % denser). None: the trace's own times.
    pub load: Option<f64>,
    /// Orders jobs that arrive in the same millisecond.
    pub seed: u64,
    /// Training jobs save their work this often (s) …
    pub checkpoint_every_s: u64,
    /// … and when they get the checkpoint signal (then a preemption loses nothing).
    pub checkpoint_on_signal: bool,
    /// How long a preempted run takes to stop after the signal (s).
    pub stop_delay_s: u64,
    /// The leader's pass period (ms).
    pub tick_ms: i64,
    /// Inference jobs the trace gives a fraction of one GPU (`gpu_milli`) ask for that fraction
    /// and share GPUs; otherwise each takes a whole GPU.
    pub fractions: bool,
    /// Cloud burst under this configuration, against a simulated cloud (`crate::cloud`).
    pub burst: Option<BurstSetup>,
    /// The topology the planner places by (None: topology-blind).
    pub topology: Option<kairos_scheduler::topology::Topology>,
    /// The level whose domains the report counts gangs across (with or without `topology`).
    pub topology_level: Option<String>,
    /// What every gang of the trace asks of the topology (None: the cluster's default).
    pub gang_topology: Option<kairos_scheduler::topology::TopologyAsk>,
    /// Jobs belong to this many accounts, `a0` … (by a hash of the seed and the job's place in
    /// the trace); accounts the policy lacks are added under its root account, open to all.
    /// 0: every job under the user's default account.
    pub accounts: u32,
    /// Jobs of a trace state ceil(their run time × this) as their time limit (at least 1 s, up
    /// to their QoS's max wall): users overestimate, and backfill and the start estimates plan
    /// by the limit. A history's jobs keep the limits they had.
    pub time_limit_factor: f64,
    /// Record the start estimates (`kairos queue --start`'s) of the waiting jobs and measure
    /// them against the actual starts (`Report::estimates`; `engine::estimates`): a planning
    /// pass more after each pass that followed a change …
    pub estimates: bool,
    /// … or at most once in this many ms (0: after every one), and then this long after a
    /// change at the latest: on large clusters with long queues each such pass is costly.
    pub estimate_every_ms: i64,
}

/// The replay's default `SimConfig::time_limit_factor`.
pub const TIME_LIMIT_FACTOR: f64 = 2.0;

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            load: None,
            seed: 1,
            checkpoint_every_s: 1800,
            checkpoint_on_signal: true,
            stop_delay_s: 5,
            tick_ms: 1000,
            fractions: false,
            burst: None,
            topology: None,
            topology_level: None,
            gang_topology: None,
            accounts: 0,
            time_limit_factor: TIME_LIMIT_FACTOR,
            estimates: false,
            estimate_every_ms: 0,
        }
    }
}

/// The policy of `deploy/sim/replay.toml`, for traces like Alibaba's whose jobs run for months
/// on thousands of GPUs: the shipped policy (`Policy::default()`, what `kairos sim` replays
/// unless given another) with wall-time and group limits lifted, and training and batch work
/// requeueing after a 10 s grace.
pub fn replay_policy() -> Policy {
    let mut policy = Policy::default();
    for q in policy.qos.values_mut() {
        q.max_wall_s = kairos_scheduler::policy::MAX_WALL_S_MAX;
        q.grp_gpus = None;
        q.user_gpus = None;
        q.user_jobs = None;
    }
    for name in ["training", "batch"] {
        if let Some(q) = policy.qos.get_mut(name) {
            q.preempt_mode = kairos_scheduler::policy::PreemptMode::Requeue;
            q.grace_s = 10;
        }
    }
    policy
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    /// The current run of a job has done its remaining work.
    End {
        job: JobId,
        attempt: u32,
    },
    /// A preempted run stops.
    Stop {
        job: JobId,
        attempt: u32,
    },
    Tick,
    /// The leader's burst round (`engine::burst`).
    BurstRound,
    /// A cloud instance's agent joins.
    Join {
        intent: u64,
    },
    /// A spot instance gets its interruption notice …
    SpotNotice {
        intent: u64,
    },
    /// … and is reclaimed.
    Reclaim {
        intent: u64,
    },
    /// A recorded node change of a history (`engine::history`), by index.
    NodeChange(usize),
    /// A recorded cancel of the history's job …
    Cancel(usize),
    /// … and a hold or release.
    Hold {
        job: usize,
        held: bool,
    },
    /// The start estimates catch up with a change (`SimConfig::estimate_every_ms`).
    Estimate,
}

/// What the replay keeps of each job (the state forgets finished ones).
#[derive(Clone, Debug)]
struct Track {
    trace: usize,
    /// Its QoS and account (after the state's defaults).
    qos: String,
    account: String,
    first_start_ms: Option<i64>,
    run_start_ms: i64,
    saved_ms: i64,
    end_ms: Option<i64>,
}

/// Time-weighted sums.
#[derive(Default)]
struct Areas {
    last_ms: i64,
    /// GPU-ms allocated.
    allocated: f64,
    /// Fraction of the free GPUs that sit on partly used nodes, × ms (while any GPU is free).
    fragmented: f64,
    free_time: f64,
    /// CPU-ms and MiB-ms held by runs.
    cpus: f64,
    memory: f64,
}

/// Replays `jobs` on `nodes` under `policy`.
pub fn simulate(nodes: &[TraceNode], jobs: &[TraceJob], policy: &Policy, config: &SimConfig) -> Report {
    simulate_with_series(nodes, jobs, policy, config).0
}

/// `simulate`, with what the plot needs (`crate::plot`).
pub fn simulate_with_series(
    nodes: &[TraceNode],
    jobs: &[TraceJob],
    policy: &Policy,
    config: &SimConfig,
) -> (Report, crate::plot::Series) {
    let mut sim = Sim::new(nodes, jobs, policy, config, None);
    sim.run();
    (sim.report(), sim.series())
}

/// What a replay of a history gives: the figures, the plot's series, and each trace job's
/// replayed first start (Unix ms), by trace index.
pub struct HistoryReplay {
    pub report: Report,
    pub series: crate::plot::Series,
    pub starts: Vec<Option<i64>>,
    pub preemptions: u64,
}

/// Replays a cluster's own history under `policy`.
pub fn simulate_history(trace: &HistoryTrace, policy: &Policy, config: &SimConfig) -> HistoryReplay {
    let jobs = history::trace_jobs(trace);
    let mut sim = Sim::new(&[], &jobs, policy, config, Some(trace));
    sim.run();
    HistoryReplay {
        report: sim.report(),
        series: sim.series(),
        starts: sim.first_starts(),
        preemptions: sim.preemptions,
    }
}

struct Sim<'a> {
    jobs: &'a [TraceJob],
    /// The longest time limit a job of each class may ask under the policy (inference, training).
    max_wall_s: (u64, u64),
    config: &'a SimConfig,
    state: ClusterState,
    events: BinaryHeap<Reverse<(i64, u64, Event)>>,
    seq: u64,
    tracks: BTreeMap<JobId, Track>,
    /// Node capacity and GPUs in use (by the replay's runs).
    capacity: BTreeMap<String, u32>,
    used: HashMap<String, u32>,
    /// GPUs of each node fractions share (counted in `used`).
    shared_gpus: HashMap<String, u32>,
    allocated: u32,
    /// All nodes' CPUs and memory (MiB), when the trace says them; what runs hold of them.
    share_totals: Option<(u64, u64)>,
    share_used: (u64, u64),
    /// Free GPUs on partly used nodes.
    partial_free: u32,
    total_gpus: u32,
    areas: Areas,
    next_tick: Option<i64>,
    preemptions: u64,
    redone_gpu_ms: f64,
    finished: Vec<JobId>,
    first_submit_ms: i64,
    last_submit_ms: i64,
    last_end_ms: i64,
    /// When each job arrives in the replay.
    arrivals: Vec<i64>,
    /// (time, GPUs allocated) at every change, for the plot.
    allocation: Vec<(i64, u32)>,
    /// Cloud burst, when the replay has it.
    cloud: Option<burst::CloudSide>,
    /// The time of the last event.
    last_event_ms: i64,
    /// Trace jobs the state refused at submit, with its words.
    refused: Vec<(usize, String)>,
    /// Runs stopped at their time limit (the job ended TIMEOUT, its work cut short).
    timed_out: usize,
    /// Replaying a cluster's own history (`engine::history`).
    history: Option<history::Side<'a>>,
    /// Runs asked to stop whose stop is scheduled.
    stopping: HashSet<(JobId, u32)>,
    /// What each running job holds.
    held: HashMap<JobId, Held>,
    /// Per QoS and per account: preemption victims and the GPU-ms they lost.
    victims: BTreeMap<(bool, String), (u64, f64)>,
    /// Per gang's first start: (domains of the topology level it got, the fewest it could, wait s).
    gang_starts: Vec<(usize, usize, f64)>,
    /// The most nodes one domain of the measured topology level has.
    largest_domain: usize,
    /// Team guarantees measured over the replay (a policy with guarantees).
    teams: Option<teams::TeamSide>,
    /// The start estimates recorded (`SimConfig::estimates`).
    estimates: Option<estimates::EstimateSide>,
}

/// A modelled node's registration: `gpus` GPUs of `model`; CPUs or memory of 0 (not said by
/// the trace or the instance type) bind nothing.
fn node_info(
    name: &str,
    gpus: u32,
    model: &str,
    cpus: u32,
    mem_mib: u64,
    labels: BTreeMap<String, String>,
) -> NodeInfo {
    NodeInfo {
        name: name.to_string(),
        addr: format!("{name}:1"),
        gpus: (0..gpus)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                model: model.to_string(),
                memory_mib: 1,
                link_group: i / 4,
                mig_parent: None,
            })
            .collect(),
        cpus: if cpus == 0 { u32::MAX / 2 } else { cpus },
        memory_mib: if mem_mib == 0 { u64::MAX / 4 } else { mem_mib },
        labels,
        gpu_backend: "sim".into(),
        isolation: String::new(),
    }
}

/// What a running job holds: each task's node and GPUs, (CPUs, MiB), whether a fraction.
type Held = (Vec<(String, u32)>, (u64, u64), bool);

/// Each task's node and GPU count of a run.
fn task_gpus(a: &kairos_scheduler::Allocation) -> Vec<(String, u32)> {
    a.tasks().map(|(_, node, gpus)| (node.to_string(), gpus.len() as u32)).collect()
}

/// Arrival times: the trace's divided by `load` (1.3: arrivals 30 % denser).
fn arrivals(jobs: &[TraceJob], load: Option<f64>) -> Vec<i64> {
    let load = load.filter(|l| *l > 0.0 && l.is_finite()).unwrap_or(1.0);
    jobs.iter().map(|j| (j.submit_ms as f64 / load) as i64).collect()
}

impl<'a> Sim<'a> {
    fn new(
        nodes: &[TraceNode],
        jobs: &'a [TraceJob],
        policy: &Policy,
        config: &'a SimConfig,
        history: Option<&'a HistoryTrace>,
    ) -> Sim<'a> {
        let mut state = ClusterState::new();
        state.apply(&Command {
            skipped_ms: 0,
            now_ms: 0,
            op: Op::SetPolicy { policy: with_accounts(policy, config.accounts), audit: None },
        });
        if let Some(topology) = &config.topology {
            state.apply(&Command {
                skipped_ms: 0,
                now_ms: 0,
                op: Op::SetTopology { topology: topology.clone() },
            });
        }
        let mut capacity = BTreeMap::new();
        for n in nodes {
            let info = node_info(&n.name, n.gpus, &n.model, n.cpus, n.mem_mib, n.labels.clone());
            state.apply(&Command { skipped_ms: 0, now_ms: 0, op: Op::RegisterNode { info } });
            capacity.insert(n.name.clone(), n.gpus);
        }
        let share_totals = nodes
            .iter()
            .all(|n| n.cpus > 0 && n.mem_mib > 0)
            .then(|| (nodes.iter().map(|n| u64::from(n.cpus)).sum(), nodes.iter().map(|n| n.mem_mib).sum()));
        let total_gpus = capacity.values().sum();
        let wall = |profile: Profile| {
            policy.default_qos(profile).map_or(kairos_scheduler::policy::MAX_WALL_S_MAX, |q| q.max_wall_s)
        };
        let mut sim = Sim {
            jobs,
            max_wall_s: (wall(Profile::Inference), wall(Profile::Training)),
            config,
            state,
            events: BinaryHeap::new(),
            seq: 0,
            tracks: BTreeMap::new(),
            capacity,
            used: HashMap::new(),
            shared_gpus: HashMap::new(),
            allocated: 0,
            share_totals,
            share_used: (0, 0),
            partial_free: 0,
            total_gpus,
            areas: Areas::default(),
            next_tick: None,
            preemptions: 0,
            redone_gpu_ms: 0.0,
            finished: Vec::new(),
            first_submit_ms: i64::MAX,
            last_submit_ms: i64::MIN,
            last_end_ms: 0,
            arrivals: Vec::new(),
            allocation: Vec::new(),
            cloud: config.burst.as_ref().map(|b| burst::CloudSide::new(b, config.seed)),
            last_event_ms: 0,
            refused: Vec::new(),
            timed_out: 0,
            history: history.map(history::Side::new),
            stopping: HashSet::new(),
            held: HashMap::new(),
            victims: BTreeMap::new(),
            gang_starts: Vec::new(),
            largest_domain: 0,
            teams: None,
            estimates: config.estimates.then(|| estimates::EstimateSide::new(config.estimate_every_ms)),
        };
        sim.teams = teams::TeamSide::new(&sim.state);
        sim.largest_domain = sim.largest_domain();
        sim.start_history();
        // Same-millisecond arrivals in an order drawn from the seed.
        let mut rng = SplitMix(kairos_scheduler::seeded::SplitMix64::new(config.seed));
        sim.arrivals = arrivals(jobs, config.load);
        for (i, at) in sim.arrivals.clone().into_iter().enumerate() {
            sim.first_submit_ms = sim.first_submit_ms.min(at);
            sim.last_submit_ms = sim.last_submit_ms.max(at);
            // A history's jobs arrive in their recorded order (ids break ties).
            let order = if sim.history.is_some() { i as u64 } else { rng.next() };
            sim.events.push(Reverse((at, order, Event::Arrival(i))));
        }
        sim.seq = 1 << 63;
        if let Some(b) = &config.burst {
            let op = Op::SetBurstConfig { config: b.config.clone() };
            sim.apply(0, op);
        }
        sim
    }

    fn push(&mut self, at: i64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, event)));
    }

    fn apply(&mut self, now: i64, op: Op) -> Outcome {
        self.state.apply(&Command { skipped_ms: 0, now_ms: now, op })
    }

    fn run(&mut self) {
        while let Some(Reverse((now, _, event))) = self.events.peek().copied() {
            if self.is_stale(event) {
                // A spot notice or reclaim of an instance already gone: no time passes for it.
                self.events.pop();
                continue;
            }
            if event == Event::Estimate {
                // Nor for the estimates catching up (the state has not changed since).
                self.events.pop();
                self.handle(now, event);
                self.estimate(now);
                continue;
            }
            self.advance(now);
            if let Some(t) = self.teams.as_mut() {
                t.advance(now);
            }
            self.last_event_ms = now;
            // `moved`: an event other than the tick changed something.
            let (mut changed, mut moved) = (false, false);
            while let Some(Reverse((at, _, event))) = self.events.peek().copied() {
                if at != now {
                    break;
                }
                self.events.pop();
                let change = self.handle(now, event);
                changed |= change;
                moved |= change && event != Event::Tick;
            }
            if changed {
                let acted = self.pass(now);
                self.wake_burst(now);
                if let Some(t) = self.teams.as_mut() {
                    t.observe(&self.state, now);
                }
                // Estimates change with the state: a tick's pass that did nothing leaves them.
                if let Some(e) = self.estimates.as_mut() {
                    e.passed(moved || acted);
                }
            }
            self.estimate(now);
            if self.finished.len() >= 512 {
                let jobs = std::mem::take(&mut self.finished);
                let retention = kairos_scheduler::history::Retention {
                    job_ms: 0,
                    history_max_jobs: 0,
                    history_max_age_ms: 0,
                };
                self.apply(now, Op::PurgeJobs { jobs, retention });
            }
        }
    }

    /// Accumulates the time-weighted figures up to `now`.
    fn advance(&mut self, now: i64) {
        let dt = (now - self.areas.last_ms).max(0) as f64;
        // Utilisation counts while jobs arrive (the offered load's window).
        // (No arrivals at all: the window is empty, from MAX to MIN.)
        let (from, to) = (self.areas.last_ms.max(self.first_submit_ms), now.min(self.last_submit_ms));
        let window = to.saturating_sub(from).max(0) as f64;
        self.areas.allocated += f64::from(self.allocated) * window;
        self.areas.cpus += self.share_used.0 as f64 * window;
        self.areas.memory += self.share_used.1 as f64 * window;
        let free = self.total_gpus - self.allocated;
        if free > 0 {
            self.areas.fragmented += f64::from(self.partial_free) / f64::from(free) * dt;
            self.areas.free_time += dt;
        }
        self.areas.last_ms = now;
    }

    /// One event; whether it may let the leader do something.
    fn handle(&mut self, now: i64, event: Event) -> bool {
        match event {
            Event::Arrival(i) => self.arrival(now, i),
            Event::End { job, attempt } => self.run_exited(now, job, attempt, RunExit::Code(0)),
            Event::Stop { job, attempt } => self.run_exited(now, job, attempt, RunExit::Signal(15)),
            Event::Tick => {
                self.next_tick = None;
                true
            }
            Event::BurstRound => self.burst_round(now),
            Event::Join { intent } => self.burst_join(now, intent),
            Event::SpotNotice { intent } => self.spot_notice(now, intent),
            Event::Reclaim { intent } => self.reclaim(now, intent),
            Event::NodeChange(k) => self.node_change(now, k),
            Event::Cancel(i) => self.cancel(now, i),
            Event::Hold { job, held } => self.hold(now, job, held),
            Event::Estimate => {
                if let Some(e) = self.estimates.as_mut() {
                    e.scheduled = None;
                }
                false
            }
        }
    }

    /// The trace's job `i` arrives: submitted, and tracked when accepted.
    fn arrival(&mut self, now: i64, i: usize) -> bool {
        let spec = self.spec(i);
        let hold = self.history.as_ref().is_some_and(|h| h.submitted_held(i));
        match self.apply(now, Op::Submit { spec, request_id: None, hold, limits: None }) {
            Outcome::Submitted { job } => {
                let (qos, account) = self
                    .state
                    .jobs
                    .get(&job)
                    .map(|j| (j.spec.qos.clone(), j.spec.account.clone()))
                    .unwrap_or_default();
                self.tracks.insert(
                    job,
                    Track {
                        trace: i,
                        qos,
                        account,
                        first_start_ms: None,
                        run_start_ms: 0,
                        saved_ms: 0,
                        end_ms: None,
                    },
                );
                if let Some(h) = self.history.as_mut() {
                    h.submitted(i, job);
                }
                if let Some(e) = self.estimates.as_mut() {
                    e.submitted(job, now);
                }
                true
            }
            // Refused (say, larger than any node): never runs; the report says why.
            Outcome::Rejected(why) => {
                self.refused.push((i, why.to_string()));
                false
            }
            _ => false,
        }
    }

    /// The run `attempt` of `job` exited with `exit` (it did its work, or it was stopped):
    /// its resources freed, and the job's end recorded when it is over. Nothing when that run
    /// is no longer running.
    fn run_exited(&mut self, now: i64, job: JobId, attempt: u32, exit: RunExit) -> bool {
        let Some(j) = self.state.jobs.get(&job) else { return false };
        let (node, tasks) = match (&j.allocation, j.state) {
            (Some(a), JobState::Running) if j.attempt == attempt => (a.node.clone(), task_gpus(a)),
            _ => return false,
        };
        let gpus = j.total_gpus();
        let share = (u64::from(j.spec.cpus) * u64::from(j.tasks()), j.spec.mem_mib * u64::from(j.tasks()));
        let fraction = j.spec.gpu_milli > 0;
        self.held.remove(&job);
        self.stopping.remove(&(job, attempt));
        // A history's job exits as its last run did.
        let exit = match (&self.history, self.tracks.get(&job), exit) {
            (Some(h), Some(t), RunExit::Code(0)) => RunExit::Code(h.job(t.trace).exit_code),
            (_, _, exit) => exit,
        };
        // Every task of a gang exits (its GPUs are counted per node).
        for (n, _) in &tasks {
            self.apply(now, Op::JobExited { job, attempt, node: n.clone(), exit: exit.clone() });
        }
        match (self.cloud.as_mut().filter(|c| c.is_cloud_node(&node)), fraction) {
            (Some(cloud), _) => cloud.run_ended(now, job, attempt),
            (None, true) => self.sync_shared(&node),
            (None, false) if tasks.len() > 1 => tasks.iter().for_each(|(n, g)| self.release(n, *g)),
            (None, false) => self.release(&node, gpus),
        }
        self.share_used =
            (self.share_used.0.saturating_sub(share.0), self.share_used.1.saturating_sub(share.1));
        self.allocation.push((now, self.allocated));
        self.settle_end(now, job);
        true
    }

    /// Records the end of job `job` when the state has ended it.
    fn settle_end(&mut self, now: i64, job: JobId) {
        let state = self.state.jobs.get(&job).map(|j| j.state);
        if state == Some(JobState::Timeout) {
            self.timed_out += 1;
        }
        if state.is_some_and(|s| s.is_terminal()) {
            if let Some(t) = self.tracks.get_mut(&job).filter(|t| t.end_ms.is_none()) {
                if let Some(e) = self.estimates.as_mut() {
                    e.gone(job);
                }
                t.end_ms = Some(now);
                self.last_end_ms = self.last_end_ms.max(now);
                self.finished.push(job);
            }
        }
    }

    /// The job the trace's job `i` is submitted as.
    fn spec(&self, i: usize) -> JobSpec {
        if let Some(h) = &self.history {
            return h.spec(i);
        }
        let j = &self.jobs[i];
        let mut spec = JobSpec::new(&j.name, "trace", vec!["true".into()], j.gpus);
        spec.tasks = j.tasks.max(1);
        if spec.tasks > 1 {
            spec.topology = self.config.gang_topology.clone().map(Box::new);
        }
        spec.cpus = j.cpus;
        spec.mem_mib = j.mem_mib;
        spec.gpu_model = j.gpu_spec.clone();
        spec.profile = if j.inference { Profile::Inference } else { Profile::Training };
        if self.config.fractions && j.inference {
            spec.gpu_milli = j.gpu_milli;
        }
        spec.requeue = true;
        if self.config.accounts > 0 {
            spec.account = account_of(self.config.seed, i, self.config.accounts);
        }
        // Jobs state their run time × the factor as their limit, up to what the policy allows
        // (past it a run is stopped as TIMEOUT, as on a cluster).
        let limit_s = (j.duration_ms.max(0) as f64 / 1000.0 * self.config.time_limit_factor).ceil() as u64;
        let wall = if j.inference { self.max_wall_s.0 } else { self.max_wall_s.1 };
        spec.time_limit_s = Some(limit_s.min(wall).max(1));
        spec
    }

    /// Every job the replay did not finish, with why: the constraint no node meets (refused at
    /// submit, or pending with nothing left to wait for), else why it still waits (the
    /// planner's reason) or the refusal's words.
    fn unfinished(&self) -> Vec<Unfinished> {
        let pending = kairos_scheduler::plan(&self.state).pending;
        let class = |i: usize| if self.jobs[i].inference { "inference" } else { "training" };
        let mut out = Vec::new();
        for (i, refusal) in &self.refused {
            let (constraint, reason) = match kairos_scheduler::never_placeable(&self.state, &self.spec(*i)) {
                Some(u) => (u.constraint().to_string(), u.to_string()),
                None => ("refused".to_string(), refusal.clone()),
            };
            out.push(Unfinished {
                name: self.jobs[*i].name.clone(),
                class: class(*i),
                never_placeable: true,
                constraint,
                reason,
            });
        }
        for (id, t) in &self.tracks {
            if t.end_ms.is_some() {
                continue;
            }
            let (name, class) = (self.jobs[t.trace].name.clone(), class(t.trace));
            let Some(job) = self.state.jobs.get(id) else {
                let reason = "left the state unfinished".to_string();
                out.push(Unfinished {
                    name,
                    class,
                    never_placeable: false,
                    constraint: "gone".into(),
                    reason,
                });
                continue;
            };
            let never = (job.state == JobState::Pending)
                .then(|| kairos_scheduler::never_placeable(&self.state, &job.spec))
                .flatten();
            out.push(match never {
                Some(u) => Unfinished {
                    name,
                    class,
                    never_placeable: true,
                    constraint: u.constraint().to_string(),
                    reason: u.to_string(),
                },
                None => {
                    let reason = match (job.state, pending.get(id)) {
                        (JobState::Pending, Some(r)) => r.to_string(),
                        (state, _) => format!("{state:?}"),
                    };
                    let waiting = reason.split(':').next().unwrap_or_default().to_string();
                    Unfinished { name, class, never_placeable: false, constraint: waiting, reason }
                }
            });
        }
        out.sort_by(|a, b| (a.class, &a.name).cmp(&(b.class, &b.name)));
        out
    }

    /// Records the start estimates when a change is due for it, or schedules when it may.
    fn estimate(&mut self, now: i64) {
        let Some(e) = self.estimates.as_mut() else { return };
        match e.due_at() {
            Some(at) if at <= now => e.observe(&self.state, now),
            Some(at) if e.scheduled.is_none() => {
                e.scheduled = Some(at);
                self.push(at, Event::Estimate);
            }
            _ => {}
        }
    }

    /// The leader's pass at `now`: what the core proposes, applied, with the agents' part;
    /// whether it did anything.
    fn pass(&mut self, now: i64) -> bool {
        let ops = propose(&self.state, now, &BTreeSet::new(), 0);
        let acted = !ops.is_empty();
        for op in ops {
            self.apply_and_follow(now, op);
        }
        if acted {
            let at = now + self.config.tick_ms;
            if self.next_tick.is_none_or(|t| t > at) {
                self.next_tick = Some(at);
                self.push(at, Event::Tick);
            }
        }
        acted
    }

    /// Applies `op` with the agents' part: placed jobs start, preempted or drained ones stop
    /// after the stop delay, as does a run stopped for its time limit.
    fn apply_and_follow(&mut self, now: i64, op: Op) -> Outcome {
        let limited = match &op {
            Op::EnforceTimeLimit { job, attempt } => Some((*job, *attempt)),
            _ => None,
        };
        let outcome = self.apply(now, op);
        match &outcome {
            Outcome::PlanApplied { accepted, .. } => {
                for job in accepted.clone() {
                    self.start(now, job);
                }
            }
            Outcome::Preempted { victims, .. } | Outcome::Vacated { victims } => {
                for victim in victims.clone() {
                    self.preempted(now, victim);
                }
            }
            Outcome::RunUpdated { .. } => {
                // A run stopped for its time limit ends after the stop delay.
                if let Some((job, attempt)) = limited {
                    self.push(now + self.config.stop_delay_s as i64 * 1000, Event::Stop { job, attempt });
                }
            }
            _ => {}
        }
        outcome
    }

    /// A placed job's agent starts it at once.
    fn start(&mut self, now: i64, job: JobId) {
        let Some(j) = self.state.jobs.get(&job) else { return };
        let Some((node, tasks)) = j.allocation.as_ref().map(|a| (a.node.clone(), task_gpus(a))) else {
            return;
        };
        let (attempt, gpus) = (j.attempt, j.total_gpus());
        let share = (u64::from(j.spec.cpus) * u64::from(j.tasks()), j.spec.mem_mib * u64::from(j.tasks()));
        let fraction = j.spec.gpu_milli > 0;
        self.apply(now, Op::JobStarted { job, attempt, node: node.clone() });
        match (self.cloud.as_mut().filter(|c| c.is_cloud_node(&node)), fraction) {
            (Some(cloud), _) => cloud.run_started(now, &node, job, attempt, gpus),
            (None, true) => self.sync_shared(&node),
            (None, false) if tasks.len() > 1 => tasks.iter().for_each(|(n, g)| self.take(n, *g)),
            (None, false) => self.take(&node, gpus),
        }
        self.share_used = (self.share_used.0 + share.0, self.share_used.1 + share.1);
        self.allocation.push((now, self.allocated));
        if self.history.is_some() {
            self.held.insert(job, (tasks.clone(), share, fraction));
        }
        let Some(t) = self.tracks.get(&job) else { return };
        if t.first_start_ms.is_none() && tasks.len() > 1 {
            let wait_s = (now - self.arrivals[t.trace]) as f64 / 1000.0;
            self.note_gang(&tasks, wait_s);
        }
        let Some(t) = self.tracks.get_mut(&job) else { return };
        if t.first_start_ms.is_none() {
            if let Some(e) = self.estimates.as_mut() {
                e.started(job, now);
            }
        }
        t.first_start_ms.get_or_insert(now);
        t.run_start_ms = now;
        let remaining = (self.jobs[t.trace].duration_ms - t.saved_ms).max(1);
        self.push(now + remaining, Event::End { job, attempt });
        // A run its limit stops before it is done: the leader's tick notices right after.
        let limit_ms = self.state.jobs.get(&job).and_then(|j| j.spec.time_limit_s).map(|s| s as i64 * 1000);
        if let Some(limit_ms) = limit_ms.filter(|l| *l < remaining) {
            self.push(now + limit_ms + self.config.tick_ms, Event::Tick);
        }
    }

    /// The most nodes in one domain of the measured topology level.
    fn largest_domain(&self) -> usize {
        let Some(level) = &self.config.topology_level else { return 0 };
        let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
        for (name, n) in &self.state.nodes {
            if let Some(d) = self.state.topology.domain(name, &n.info.labels, level) {
                *sizes.entry(d).or_default() += 1;
            }
        }
        sizes.into_values().max().unwrap_or(0)
    }

    /// A gang's first start on `tasks`' nodes, against the measured topology level.
    fn note_gang(&mut self, tasks: &[(String, u32)], wait_s: f64) {
        let Some(level) = &self.config.topology_level else { return };
        let mut domains: Vec<&str> = Vec::new();
        for (name, _) in tasks {
            let d = self
                .state
                .nodes
                .get(name)
                .and_then(|n| self.state.topology.domain(name, &n.info.labels, level));
            let d = d.unwrap_or(name.as_str());
            if !domains.contains(&d) {
                domains.push(d);
            }
        }
        let least = tasks.len().div_ceil(self.largest_domain.max(1));
        self.gang_starts.push((domains.len(), least, wait_s));
    }

    /// A preemption victim saves what it can and stops after the stop delay.
    fn preempted(&mut self, now: i64, job: JobId) {
        self.preemptions += 1;
        let Some(attempt) = self.state.jobs.get(&job).map(|j| j.attempt) else { return };
        if self.tracks.contains_key(&job) {
            let stop_at = now + self.stop_ms(job);
            self.stopping.insert((job, attempt));
            self.save_progress(job, stop_at, true);
            self.push(stop_at, Event::Stop { job, attempt });
        }
    }

    /// A run of `job` that stops at `stop_at` keeps what it saved (all of it when it
    /// checkpoints on the signal; else its last periodic checkpoint, none for a history's job);
    /// the rest is redone. `victim`: a preemption, counted against its QoS and account.
    fn save_progress(&mut self, job: JobId, stop_at: i64, victim: bool) {
        let gpus = self.state.jobs.get(&job).map_or(0, |j| j.total_gpus());
        let on_signal = self.checkpoints_on_signal(job);
        let history = self.history.is_some();
        let Some(t) = self.tracks.get_mut(&job) else { return };
        let progress = (stop_at - t.run_start_ms).max(0);
        let every = if history { i64::MAX } else { (self.config.checkpoint_every_s * 1000).max(1) as i64 };
        let saved = if on_signal { progress } else { progress - progress % every };
        let lost = ((progress - saved) * i64::from(gpus)) as f64;
        self.redone_gpu_ms += lost;
        t.saved_ms = (t.saved_ms + saved).min(self.jobs[t.trace].duration_ms);
        if victim {
            for key in [(false, t.qos.clone()), (true, t.account.clone())] {
                let v = self.victims.entry(key).or_default();
                v.0 += 1;
                v.1 += lost;
            }
        }
    }

    /// A GPU shared by fractions counts as allocated while any fraction holds it: the count of
    /// `node`'s shared GPUs is taken from the state after each change.
    fn sync_shared(&mut self, node: &str) {
        let now_shared = self.state.nodes.get(node).map_or(0, |n| n.shared.len() as u32);
        let before = self.shared_gpus.insert(node.to_string(), now_shared).unwrap_or(0);
        if now_shared > before {
            self.take(node, now_shared - before);
        } else {
            self.release(node, before - now_shared);
        }
    }

    fn take(&mut self, node: &str, gpus: u32) {
        let cap = self.capacity.get(node).copied().unwrap_or(0);
        let used = self.used.entry(node.to_string()).or_insert(0);
        let before = *used;
        *used = (*used + gpus).min(cap);
        self.allocated += *used - before;
        self.partial_free = self.partial_free - partial(cap, before) + partial(cap, *used);
    }

    fn release(&mut self, node: &str, gpus: u32) {
        let cap = self.capacity.get(node).copied().unwrap_or(0);
        let used = self.used.entry(node.to_string()).or_insert(0);
        let before = *used;
        *used = used.saturating_sub(gpus);
        self.allocated -= before - *used;
        self.partial_free = self.partial_free - partial(cap, before) + partial(cap, *used);
    }

    /// Waits per QoS and per account, with the preemptions their jobs suffered.
    fn groups(&self) -> (BTreeMap<String, crate::report::Group>, BTreeMap<String, crate::report::Group>) {
        let mut classes: BTreeMap<(bool, String), Class> = BTreeMap::new();
        for t in self.tracks.values() {
            let Some(start) = t.first_start_ms else { continue };
            let submit = self.arrivals[t.trace];
            let (wait, completion) =
                ((start - submit) as f64 / 1000.0, (t.end_ms.unwrap_or(start) - submit) as f64 / 1000.0);
            for key in [(false, t.qos.clone()), (true, t.account.clone())] {
                classes.entry(key).or_default().add(
                    wait,
                    completion,
                    self.jobs[t.trace].duration_ms as f64 / 1000.0,
                );
            }
        }
        for key in self.victims.keys() {
            classes.entry(key.clone()).or_default();
        }
        let (mut by_qos, mut by_account) = (BTreeMap::new(), BTreeMap::new());
        for ((account, name), class) in classes {
            let (preempted, lost) = self.victims.get(&(account, name.clone())).copied().unwrap_or_default();
            let group = crate::report::Group {
                summary: class.summary(),
                preempted,
                lost_gpu_hours: lost / 3_600_000.0,
            };
            if account {
                by_account.insert(name, group)
            } else {
                by_qos.insert(name, group)
            };
        }
        (by_qos, by_account)
    }

    fn series(&self) -> crate::plot::Series {
        let mut series = crate::plot::Series { total_gpus: self.total_gpus, ..Default::default() };
        for t in self.tracks.values() {
            let Some(start) = t.first_start_ms else { continue };
            let wait = (start - self.arrivals[t.trace]) as f64 / 1000.0;
            if self.jobs[t.trace].inference {
                series.inference_waits.push(wait);
            } else {
                series.training_waits.push(wait);
            }
        }
        let first = self.first_submit_ms.min(self.last_end_ms);
        series.allocation = self.allocation.iter().map(|(t, a)| (t - first, *a)).collect();
        series
    }

    fn report(&self) -> Report {
        let mut inference = Class::default();
        let mut training = Class::default();
        let mut whole_node = Class::default();
        let largest = self.capacity.values().copied().max().unwrap_or(0);
        for t in self.tracks.values() {
            let j = &self.jobs[t.trace];
            let class = if j.inference { &mut inference } else { &mut training };
            let submit = self.arrivals[t.trace];
            // Unfinished ones are named by `unfinished`.
            if let (Some(start), Some(end)) = (t.first_start_ms, t.end_ms) {
                let (wait, completion) = ((start - submit) as f64 / 1000.0, (end - submit) as f64 / 1000.0);
                class.add(wait, completion, j.duration_ms as f64 / 1000.0);
                if j.gpus >= largest {
                    whole_node.add(wait, completion, j.duration_ms as f64 / 1000.0);
                }
            }
        }
        let (by_qos, by_account) = self.groups();
        let unfinished_jobs = self.unfinished();
        let unfinished =
            unfinished_jobs.len() + self.jobs.len().saturating_sub(self.tracks.len() + self.refused.len());
        let makespan_ms = (self.last_end_ms - self.first_submit_ms.min(self.last_end_ms)).max(1);
        // The arrivals' window (none at all: empty, not MIN - MAX).
        let arrivals_ms = self.last_submit_ms.saturating_sub(self.first_submit_ms).max(0);
        Report {
            jobs: self.jobs.len(),
            unfinished,
            unfinished_by: crate::report::by_class(&unfinished_jobs),
            unfinished_jobs,
            timed_out: self.timed_out,
            gpus: self.total_gpus,
            offered_load: offered_load(self.jobs, self.total_gpus, self.config.load),
            load: self.config.load.unwrap_or(1.0),
            arrival_window_s: arrivals_ms as f64 / 1000.0,
            inference: inference.summary(),
            training: training.summary(),
            whole_node: whole_node.summary(),
            utilization: self.areas.allocated
                / (f64::from(self.total_gpus.max(1)) * arrivals_ms.max(1) as f64),
            cpu_utilization: self
                .share_totals
                .map(|(cpus, _)| self.areas.cpus / (cpus.max(1) as f64 * arrivals_ms.max(1) as f64)),
            memory_utilization: self
                .share_totals
                .map(|(_, mem)| self.areas.memory / (mem.max(1) as f64 * arrivals_ms.max(1) as f64)),
            preemptions: self.preemptions,
            redone_gpu_hours: self.redone_gpu_ms / 3_600_000.0,
            fragmentation: if self.areas.free_time > 0.0 {
                self.areas.fragmented / self.areas.free_time
            } else {
                0.0
            },
            makespan_s: makespan_ms as f64 / 1000.0,
            by_qos,
            by_account,
            shares: self.shares(),
            burst: self.cloud.as_ref().map(|c| {
                c.report(self.state.burst.spent_milli(self.last_event_ms), self.last_event_ms, arrivals_ms)
            }),
            gangs: self
                .config
                .topology_level
                .as_deref()
                .map(|l| crate::report::GangReport::of(l, &self.gang_starts)),
            teams: self.teams.as_ref().map(|t| t.report(self.last_event_ms)).unwrap_or_default(),
            estimates: self.estimates.as_ref().map(|e| e.report()),
        }
        .rounded()
    }
}

/// The account of the trace's job `i` among `count` (`SimConfig::accounts`): a seeded hash.
pub(crate) fn account_of(seed: u64, i: usize, count: u32) -> String {
    let mut h = kairos_scheduler::seeded::SplitMix64::new(seed ^ (i as u64).wrapping_mul(0x9e37_79b9));
    format!("a{}", h.next_u64() % u64::from(count.max(1)))
}

/// `policy` with the accounts `a0` … `a{count-1}` it lacks, under its first root account.
fn with_accounts(policy: &Policy, count: u32) -> Policy {
    let mut p = policy.clone();
    let Some(root) = p.accounts.values().find(|a| a.parent.is_none()).cloned() else { return p };
    for i in 0..count {
        let name = format!("a{i}");
        p.accounts.entry(name.clone()).or_insert_with(|| kairos_scheduler::policy::Account {
            name,
            parent: Some(root.name.clone()),
            shares: 1,
            users: Default::default(),
            qos: Default::default(),
            user_qos: Default::default(),
            guarantee: None,
        });
    }
    p
}

/// Free GPUs of a node with `used` of `cap` in use, if it is partly used.
fn partial(cap: u32, used: u32) -> u32 {
    if used > 0 && used < cap {
        cap - used
    } else {
        0
    }
}

/// The trace inflated (or thinned) the way the FGD paper's experiments do: tasks drawn from it,
/// with the seed, until the GPUs they ask for are `factor` × the cluster's `total_gpus` — all
/// of the trace's tasks and then copies of drawn ones (named `NAME#k`), or, below the trace's
/// own share, a drawn subset. Each copy keeps its task's arrival and run time.
pub fn inflate(jobs: &[TraceJob], total_gpus: u32, factor: f64, seed: u64) -> Vec<TraceJob> {
    let target = (f64::from(total_gpus) * factor.max(0.0)).ceil() as u64;
    let mut rng = SplitMix(kairos_scheduler::seeded::SplitMix64::new(seed ^ 0x5EED_1F1A_7E00_0000));
    let asked: u64 = jobs.iter().map(|j| u64::from(j.total_gpus())).sum();
    if jobs.is_empty() {
        return Vec::new();
    }
    if asked >= target {
        // A drawn subset: shuffle the order (Fisher-Yates), keep a prefix reaching the target,
        // then restore the trace's order.
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        for i in (1..order.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let mut kept = Vec::new();
        let mut sum = 0u64;
        for i in order {
            if sum >= target {
                break;
            }
            sum += u64::from(jobs[i].total_gpus());
            kept.push(i);
        }
        kept.sort_unstable();
        return kept.into_iter().map(|i| jobs[i].clone()).collect();
    }
    let mut out = jobs.to_vec();
    let mut sum = asked;
    let mut copy = 0u64;
    while sum < target {
        let j = &jobs[(rng.next() % jobs.len() as u64) as usize];
        copy += 1;
        out.push(TraceJob { name: format!("{}#{copy}", j.name), ..j.clone() });
        sum += u64::from(j.total_gpus());
    }
    out
}

/// The offered load of `jobs` on `total_gpus` with arrivals compressed by `load`: the GPU time
/// they ask for inside the arrival window (a run past its end counts up to it) / (GPUs × the
/// window). Above 1 the cluster cannot keep up while jobs arrive.
pub fn offered_load(jobs: &[TraceJob], total_gpus: u32, load: Option<f64>) -> f64 {
    let at = arrivals(jobs, load);
    let (Some(first), Some(last)) = (at.iter().min().copied(), at.iter().max().copied()) else { return 0.0 };
    let span = (last - first).max(1);
    let asked: f64 = jobs
        .iter()
        .zip(&at)
        .map(|(j, a)| f64::from(j.total_gpus()) * j.duration_ms.min(last - a).max(0) as f64)
        .sum();
    asked / (f64::from(total_gpus.max(1)) * span as f64)
}

/// The least arrival compression (`SimConfig::load`) that gives `jobs` an offered load of
/// `target` on `total_gpus` (see `offered_load`: it rises with compression, then falls once the
/// window is shorter than the runs), found by a scan and bisection; None when none reaches it.
pub fn load_for(jobs: &[TraceJob], total_gpus: u32, target: f64) -> Option<f64> {
    let at = |log2: f64| offered_load(jobs, total_gpus, Some(log2.exp2()));
    let steps = (-80..=160).map(|k| f64::from(k) / 4.0);
    let mut hi = steps.clone().find(|l| at(*l) >= target)?;
    let mut lo = hi - 0.25;
    for _ in 0..40 {
        let mid = (lo + hi) / 2.0;
        if at(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi.exp2())
}

/// The seed's stream (`kairos_scheduler::seeded`), 63 bits a draw.
struct SplitMix(kairos_scheduler::seeded::SplitMix64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0.next_u64() >> 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize, gpus: u32) -> Vec<TraceNode> {
        (0..n)
            .map(|i| TraceNode { name: format!("n{i}"), gpus, model: "T4".into(), ..TraceNode::default() })
            .collect()
    }

    use kairos_scheduler::topology::TopologyAsk as TopologyAskOf;

    fn job(name: &str, submit_s: i64, duration_s: i64, gpus: u32, inference: bool) -> TraceJob {
        TraceJob {
            name: name.into(),
            submit_ms: submit_s * 1000,
            duration_ms: duration_s * 1000,
            gpus,
            inference,
            ..TraceJob::default()
        }
    }

    /// Training fills both nodes; inference arrives a minute later.
    fn saturated() -> Vec<TraceJob> {
        let mut jobs: Vec<TraceJob> = (0..4).map(|i| job(&format!("t{i}"), 0, 3600, 4, false)).collect();
        jobs.extend((0..3).map(|i| job(&format!("i{i}"), 60 + i, 120, 2, true)));
        jobs
    }

    /// Two blocks of four 1-GPU nodes; single-GPU jobs then 3-node gangs arrive while they run.
    /// Topology-blind, the small jobs land in both blocks and gangs straddle them; aware (the
    /// cluster names the level), small jobs fill one block first and gangs fit in the other.
    #[test]
    fn gangs_stay_inside_one_block_when_the_cluster_names_the_level_and_spread_when_blind() {
        let nodes: Vec<TraceNode> = (0..8)
            .map(|i| TraceNode {
                name: format!("n{i}"),
                gpus: 1,
                model: "T4".into(),
                labels: [("block".to_string(), format!("b{}", i % 2))].into(),
                ..TraceNode::default()
            })
            .collect();
        let mut jobs: Vec<TraceJob> = (0..3).map(|i| job(&format!("s{i}"), i, 600, 1, false)).collect();
        jobs.extend(
            (0..3).map(|i| TraceJob { tasks: 3, ..job(&format!("g{i}"), 10 + i * 100, 60, 1, false) }),
        );
        let blind = SimConfig { topology_level: Some("block".into()), ..SimConfig::default() };
        let topology =
            kairos_scheduler::topology::Topology { levels: vec!["block".into()], ..Default::default() };
        let aware = SimConfig { topology: Some(topology), ..blind.clone() };
        let report = |c: &SimConfig| simulate(&nodes, &jobs, &Policy::default(), c).gangs.unwrap();
        let (b, a) = (report(&blind), report(&aware));
        assert_eq!((b.gangs, a.gangs), (3, 3));
        assert!(b.spread > 0, "blind: {b:?}");
        assert_eq!(a.spread, 0, "aware: {a:?}");
        let required = TopologyAskOf::parse("block=required").unwrap();
        let r = report(&SimConfig { gang_topology: Some(required), ..aware });
        assert_eq!((r.gangs, r.spread), (3, 0));
    }

    #[test]
    fn the_offered_load_counts_work_inside_the_arrival_window_and_load_for_reaches_a_target() {
        // One GPU; arrivals at 0 and 100 s, 100 s each: the first fills the window, the second
        // arrives at its end (nothing of it inside).
        let jobs = [job("a", 0, 100, 1, false), job("b", 100, 100, 1, false)];
        assert_eq!(offered_load(&jobs, 1, None), 1.0);
        assert_eq!(offered_load(&jobs, 2, None), 0.5);
        // Work past the window's end is not counted: a 1000-s job at 0 offers the window's 100 s.
        let long = [job("a", 0, 1000, 1, false), job("b", 100, 100, 1, false)];
        assert_eq!(offered_load(&long, 1, None), 1.0);
        // Many short jobs spread over a day: compression finds any load they can offer.
        let spread: Vec<TraceJob> =
            (0..200).map(|i| job(&format!("j{i}"), i * 432, 600, 1 + (i % 3) as u32, i % 2 == 0)).collect();
        for target in [0.5, 1.0, 1.3, 2.0] {
            let load = load_for(&spread, 8, target).expect("reachable");
            let got = offered_load(&spread, 8, Some(load));
            assert!((got - target).abs() < 1e-3, "target {target}: compression {load} gave {got}");
        }
        // More than all of them at once can offer is refused.
        assert_eq!(load_for(&spread, 8, 1e6), None);
    }

    #[test]
    fn the_replay_runs_the_production_core_and_a_policy_change_shows() {
        let config = SimConfig::default();
        let preempting = simulate(&nodes(2, 8), &saturated(), &replay_policy(), &config);
        assert_eq!((preempting.jobs, preempting.unfinished), (7, 0), "{preempting:?}");
        assert!(preempting.preemptions >= 1, "{preempting:?}");
        assert!(
            preempting.inference.wait_s.max < 30.0,
            "inference waits for the preemption only: {preempting:?}"
        );
        assert_eq!(preempting.redone_gpu_hours, 0.0, "victims checkpoint on the signal");
        // The same trace where inference may not preempt: it waits for training to end.
        let mut policy = replay_policy();
        policy.qos.get_mut("inference").unwrap().preempt.clear();
        let waiting = simulate(&nodes(2, 8), &saturated(), &policy, &config);
        assert_eq!(waiting.preemptions, 0);
        assert!(waiting.inference.wait_s.max > 3000.0, "{waiting:?}");
        // Victims that save only every 30 min lose what they did since.
        let lossy = SimConfig { checkpoint_on_signal: false, ..config };
        let lost = simulate(&nodes(2, 8), &saturated(), &replay_policy(), &lossy);
        assert!(lost.redone_gpu_hours > 0.0, "{lost:?}");
    }

    #[test]
    fn the_same_seed_gives_byte_identical_output() {
        let jobs: Vec<TraceJob> = (0..200)
            .map(|i| {
                job(&format!("j{i}"), (i % 17) * 30, 60 + (i * 37) % 900, 1 + (i % 4) as u32, i % 3 == 0)
            })
            .collect();
        let run = |seed| {
            let config = SimConfig { seed, load: Some(1.5), ..SimConfig::default() };
            serde_json::to_string(&simulate(&nodes(4, 8), &jobs, &replay_policy(), &config)).unwrap()
        };
        assert_eq!(run(7), run(7));
        let report: Report = simulate(&nodes(4, 8), &jobs, &replay_policy(), &SimConfig::default());
        assert_eq!(report.unfinished, 0);
        assert!(report.utilization > 0.0 && report.utilization <= 1.0, "{report:?}");
    }
}

#[cfg(test)]
mod inflate_tests {
    use super::*;

    #[test]
    fn inflation_draws_tasks_to_the_target_share_of_the_gpus() {
        let jobs: Vec<TraceJob> = (0..10)
            .map(|i| TraceJob {
                name: format!("t{i}"),
                submit_ms: i * 1000,
                duration_ms: 1000,
                gpus: 1 + (i % 2) as u32,
                inference: false,
                ..TraceJob::default()
            })
            .collect(); // 15 GPUs asked
        let up = inflate(&jobs, 10, 3.0, 1);
        assert!(up.len() > 10 && up.iter().map(|j| j.gpus).sum::<u32>() >= 30);
        assert_eq!(&up[..10], &jobs[..], "every task of the trace, then copies");
        assert!(up[10..].iter().all(|j| j.name.contains('#')));
        assert_eq!(inflate(&jobs, 10, 3.0, 1), up, "the same seed, the same draw");
        let down = inflate(&jobs, 10, 0.5, 1);
        let asked: u32 = down.iter().map(|j| j.gpus).sum();
        assert!(
            (5..=6).contains(&asked) && down.windows(2).all(|w| w[0].submit_ms <= w[1].submit_ms),
            "{down:?}"
        );
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    /// A small excerpt of the Alibaba v2023 trace: pods with `gpu_spec` sets and CPU and memory
    /// requests, on nodes of two models.
    #[test]
    fn the_trace_gpu_spec_and_cpu_memory_requests_are_honoured() {
        let (nodes_csv, pods_csv) = (
            "sn,cpu_milli,memory_mib,gpu,model\nn-p100,64000,262144,2,P100\nn-v100,16000,65536,4,V100M32\n",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
             a,4000,8192,1,1000,V100M32,BE,Succeeded,0,100,0\n\
             b,4000,8192,1,1000,V100M16|V100M32,BE,Succeeded,0,100,0\n\
             c,4000,8192,1,1000,P100,LS,Succeeded,0,100,0\n\
             d,12000,8192,1,1000,V100M32,BE,Succeeded,0,100,0\n\
             e,2000,4096,1,1000,,LS,Succeeded,150,250,150\n",
        );
        let nodes = crate::trace::alibaba_nodes("n.csv", nodes_csv).unwrap();
        let (jobs, _) = crate::trace::alibaba_pods("p.csv", pods_csv).unwrap();
        let config = SimConfig::default();
        let policy = kairos_scheduler::policy::Policy::default();
        let mut sim = Sim::new(&nodes, &jobs, &policy, &config, None);
        sim.run();
        let node_of = |name: &str| {
            let live = sim.state.jobs.values().find(|j| j.spec.name == name).map(|j| j.last_node.clone());
            live.or_else(|| sim.state.history.iter().find(|r| r.name == name).map(|r| r.node.clone()))
        };
        for (pod, allowed) in [("a", "n-v100"), ("b", "n-v100"), ("c", "n-p100"), ("d", "n-v100")] {
            assert_eq!(node_of(pod).as_deref(), Some(allowed), "pod {pod} ran outside its gpu_spec");
        }
        // a, b and d fill the V100 node's 16 CPUs together (4 + 4 + 12 > 16): one of them waited.
        let report = sim.report();
        assert_eq!(report.unfinished, 0, "{report:?}");
        assert!(report.training.wait_s.max >= 99.0, "a V100 pod waited for CPUs: {report:?}");
        let (cpu, mem) = (report.cpu_utilization.unwrap(), report.memory_utilization.unwrap());
        assert!(cpu > 0.0 && cpu <= 1.0 && mem > 0.0 && mem <= 1.0, "{report:?}");
    }

    /// Five quarter-GPU inference pods on one GPU: shared, four run at once and the fifth waits
    /// one run; whole, each waits for the one before.
    #[test]
    fn gpu_fractions_share_one_gpu_only_when_asked() {
        let nodes =
            vec![TraceNode { name: "n0".into(), gpus: 1, model: "T4".into(), ..TraceNode::default() }];
        let jobs: Vec<TraceJob> = (0..5)
            .map(|i| TraceJob {
                name: format!("q{i}"),
                submit_ms: 0,
                duration_ms: 100_000,
                gpus: 1,
                gpu_milli: 250,
                inference: true,
                ..TraceJob::default()
            })
            .collect();
        let policy = kairos_scheduler::policy::Policy::default();
        let shared = simulate(&nodes, &jobs, &policy, &SimConfig { fractions: true, ..SimConfig::default() });
        let whole = simulate(&nodes, &jobs, &policy, &SimConfig::default());
        assert_eq!((shared.unfinished, whole.unfinished), (0, 0));
        assert!(shared.makespan_s < 250.0, "four together, then the fifth: {shared:?}");
        assert!(whole.makespan_s >= 500.0, "one at a time: {whole:?}");
        assert!(shared.inference.wait_s.max >= 99.0, "the fifth waited for room: {shared:?}");
        assert!(whole.inference.wait_s.max >= 399.0, "the last waited for four runs: {whole:?}");
    }

    #[test]
    fn a_run_past_its_qos_wall_time_is_stopped_as_timeout() {
        let nodes =
            vec![TraceNode { name: "n0".into(), gpus: 8, model: "T4".into(), ..TraceNode::default() }];
        // Inference may run 2 h under the shipped policy; this one would run 3 h.
        let jobs = vec![TraceJob {
            name: "long".into(),
            submit_ms: 0,
            duration_ms: 3 * 3_600_000,
            gpus: 1,
            inference: true,
            ..TraceJob::default()
        }];
        let report =
            simulate(&nodes, &jobs, &kairos_scheduler::policy::Policy::default(), &SimConfig::default());
        assert_eq!(report.unfinished, 0);
        assert!(
            (report.makespan_s - 7_206.0).abs() < 2.0,
            "stopped at its 2 h limit (+ tick and stop delay): {report:?}"
        );
    }
}
