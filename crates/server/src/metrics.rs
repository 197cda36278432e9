//! kairosd's Prometheus metrics (`--metrics-addr`), rendered at every scrape.
//!
//! Per replica: Raft role, term, commit and applied index; the submits its API edge answered
//! (`kairos_submits_total{outcome}`) and the scheduling passes it ran as leader
//! (`kairos_schedule_pass_seconds`). Cluster-wide figures (jobs, GPUs, waits, preemptions,
//! burst) come from the leader only — followers export the same series at 0 — so `sum()` over
//! replicas is right whichever replica leads. Every labelled series with known label values is
//! exported from the start at 0, so rates and alerts work before the first event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use kairos_scheduler::burst::InstanceState;
use kairos_scheduler::{ClusterState, JobState, NodeState};
use kairos_telemetry::{Exposition, Histogram};

/// How a submit ended at this replica's edge.
pub const SUBMIT_OUTCOMES: [&str; 6] =
    ["accepted", "invalid", "rejected", "rate_limited", "unavailable", "error"];

/// Every job state of the replicated state (PREEMPTING is RUNNING there).
const JOB_STATES: [JobState; 8] = [
    JobState::Pending,
    JobState::Running,
    JobState::Suspended,
    JobState::Completed,
    JobState::Failed,
    JobState::Cancelled,
    JobState::Timeout,
    JobState::NodeFail,
];

/// A state's name as the API (and so the CLI) spells it: `PENDING`, `NODE_FAIL`, …
fn state_name(s: JobState) -> &'static str {
    let name = crate::convert::job_state_to_pb(s).as_str_name();
    name.strip_prefix("JOB_STATE_").unwrap_or(name)
}

/// How a preemption treated its victim (`ClusterState::preemption_totals`' keys; `vacate`: stopped
/// to refill the inference headroom).
const PREEMPT_MODES: [&str; 5] = ["cancel", "requeue", "suspend", "shrink", "vacate"];

const INSTANCE_STATES: [InstanceState; 4] =
    [InstanceState::Requested, InstanceState::Launched, InstanceState::Terminating, InstanceState::Gone];

/// Upper bounds of the wait histogram, seconds.
const WAIT_BOUNDS: [f64; 12] = [0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0];
/// Upper bounds of the scheduling-pass histogram, seconds.
const PASS_BOUNDS: [f64; 10] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// Counters and histograms of this process (the rest is read from the state at each scrape).
pub struct Metrics {
    submits: [AtomicU64; SUBMIT_OUTCOMES.len()],
    passes: Mutex<Histogram>,
    forwarded: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            submits: Default::default(),
            passes: Mutex::new(Histogram::new(&PASS_BOUNDS)),
            forwarded: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Counts one submit answered with `outcome` (one of `SUBMIT_OUTCOMES`).
    pub fn submit(&self, outcome: &str) {
        if let Some(i) = SUBMIT_OUTCOMES.iter().position(|o| *o == outcome) {
            self.submits[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one call this replica passed to the leader (`forward`).
    pub fn forwarded(&self) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
    }

    /// Records how long one scheduling pass took.
    pub fn pass(&self, seconds: f64) {
        self.passes.lock().unwrap_or_else(|p| p.into_inner()).observe(seconds);
    }
}

/// The outcome label of a submit's answer.
pub fn submit_outcome(result: &Result<(), &tonic::Status>) -> &'static str {
    use tonic::Code;
    match result {
        Ok(()) => "accepted",
        Err(s) => match s.code() {
            Code::InvalidArgument
            | Code::Unimplemented
            | Code::FailedPrecondition
            | Code::NotFound
            | Code::OutOfRange
            | Code::PermissionDenied => "invalid",
            Code::ResourceExhausted => "rejected",
            Code::Unavailable | Code::DeadlineExceeded => "unavailable",
            _ => "error",
        },
    }
}

/// The cluster-wide figures, as the leader's state gives them.
struct Cluster {
    /// (state, QoS) → jobs.
    jobs: std::collections::BTreeMap<(&'static str, String), u64>,
    allocated: u64,
    idle: u64,
    unavailable: u64,
    unhealthy: u64,
    /// QoS → waits of the jobs whose current run started (submit → start).
    waits: std::collections::BTreeMap<String, Histogram>,
    preemptions: std::collections::BTreeMap<String, u64>,
    /// Gangs placed against the topology, and those spread past the fewest domains.
    gangs: (u64, u64),
    instances: std::collections::BTreeMap<&'static str, u64>,
    spend_per_hour: f64,
}

impl Cluster {
    fn of(state: &ClusterState) -> Cluster {
        let mut c = Cluster {
            jobs: Default::default(),
            allocated: 0,
            idle: 0,
            unavailable: 0,
            unhealthy: 0,
            waits: Default::default(),
            preemptions: state.preemption_totals.clone(),
            gangs: (state.gang_spread.placed, state.gang_spread.spread),
            instances: Default::default(),
            spend_per_hour: state.burst.footprint().hourly_milli as f64 / 1000.0,
        };
        for q in state.policy.qos.keys() {
            c.waits.insert(q.clone(), Histogram::new(&WAIT_BOUNDS));
        }
        for job in state.jobs.values() {
            *c.jobs.entry((state_name(job.state), job.spec.qos.clone())).or_default() += 1;
            if let Some(start) = job.start_time_ms {
                let wait = (start - job.submit_time_ms).max(0) as f64 / 1000.0;
                c.waits
                    .entry(job.spec.qos.clone())
                    .or_insert_with(|| Histogram::new(&WAIT_BOUNDS))
                    .observe(wait);
            }
        }
        for node in state.nodes.values() {
            // Every GPU is in one state: an unhealthy one is that (held or not) and nothing else.
            let unhealthy = node.faults.len() as u64;
            let total = u64::from(node.gpu_count()).saturating_sub(unhealthy);
            let held =
                node.allocated.keys().chain(node.shared.keys()).filter(|g| node.healthy(**g)).count() as u64;
            c.unhealthy += unhealthy;
            if node.state == NodeState::Up {
                c.allocated += held;
                c.idle += total.saturating_sub(held);
            } else {
                // Down or draining: what runs there still counts as allocated.
                c.allocated += held;
                c.unavailable += total.saturating_sub(held);
            }
        }
        for i in state.burst.instances.values() {
            *c.instances.entry(i.state.as_str()).or_default() += 1;
        }
        c
    }
}

/// The exposition of one scrape.
pub fn render(replica: &kairos_consensus::Replica, metrics: &Metrics) -> String {
    let mut e = Exposition::new();
    let leads = raft_figures(&mut e, replica);
    let (cluster, qos_names) = replica.read(|a| {
        let qos: Vec<String> = a.state.policy.qos.keys().cloned().collect();
        (leads.then(|| Cluster::of(&a.state)), qos)
    });
    job_figures(&mut e, cluster.as_ref(), &qos_names);
    edge_figures(&mut e, metrics);
    preemption_and_burst_figures(&mut e, cluster.as_ref());
    e.finish()
}

/// The replica's Raft figures; whether it leads.
fn raft_figures(e: &mut Exposition, replica: &kairos_consensus::Replica) -> bool {
    let (term, applied) = {
        let m = replica.raft.metrics();
        let m = m.borrow();
        (m.current_term, m.last_applied.as_ref().map_or(0, |l| l.index))
    };
    let leads = replica.is_leader();
    let commit = replica.commit_index.load(Ordering::Relaxed);
    e.gauge(
        "kairos_raft_is_leader",
        "1 on the replica that leads, else 0.",
        &[(&[], f64::from(u8::from(leads)))],
    );
    e.gauge("kairos_raft_term", "This replica's current Raft term.", &[(&[], term as f64)]);
    e.gauge(
        "kairos_raft_commit_index",
        "The latest log index this replica knows committed.",
        &[(&[], commit as f64)],
    );
    e.gauge(
        "kairos_raft_applied_index",
        "The latest log index this replica applied.",
        &[(&[], applied as f64)],
    );

    leads
}

/// Jobs by state and QoS, GPUs by state, waits by QoS (the leader's; zeros elsewhere).
fn job_figures(e: &mut Exposition, cluster: Option<&Cluster>, qos_names: &[String]) {
    // Jobs: every known state × every QoS, from the start.
    let mut jobs: Vec<(String, String, f64)> = Vec::new();
    for state in JOB_STATES.map(state_name) {
        for q in qos_names {
            let n = cluster.and_then(|c| c.jobs.get(&(state, q.clone()))).copied().unwrap_or(0);
            jobs.push((state.to_string(), q.clone(), n as f64));
        }
    }
    if let Some(c) = cluster {
        // Jobs of a QoS no longer in the policy (finished ones keep their name).
        for ((state, q), n) in &c.jobs {
            if !qos_names.contains(q) {
                jobs.push((state.to_string(), q.clone(), *n as f64));
            }
        }
    }
    let job_labels: Vec<[(&str, &str); 2]> =
        jobs.iter().map(|(s, q, _)| [("state", s.as_str()), ("qos", q.as_str())]).collect();
    let job_samples: Vec<(&[(&str, &str)], f64)> =
        job_labels.iter().zip(&jobs).map(|(l, (_, _, n))| (&l[..], *n)).collect();
    e.gauge("kairos_jobs", "Jobs by state and QoS (leader only; 0 elsewhere).", &job_samples);

    let gpu = |f: fn(&Cluster) -> u64| cluster.map_or(0.0, |c| f(c) as f64);
    e.gauge(
        "kairos_gpus",
        "GPUs by state: allocated, idle (on up nodes), unavailable (on down or draining nodes), unhealthy (never allocated until reset) (leader only).",
        &[
            (&[("state", "allocated")], gpu(|c| c.allocated)),
            (&[("state", "idle")], gpu(|c| c.idle)),
            (&[("state", "unavailable")], gpu(|c| c.unavailable)),
            (&[("state", "unhealthy")], gpu(|c| c.unhealthy)),
        ],
    );

    let empty = Histogram::new(&WAIT_BOUNDS);
    let waits: Vec<(String, &Histogram)> = qos_names
        .iter()
        .map(|q| (q.clone(), cluster.and_then(|c| c.waits.get(q)).unwrap_or(&empty)))
        .collect();
    let wait_labels: Vec<[(&str, &str); 1]> = waits.iter().map(|(q, _)| [("qos", q.as_str())]).collect();
    let wait_series: Vec<(&[(&str, &str)], &Histogram)> =
        wait_labels.iter().zip(&waits).map(|(l, (_, h))| (&l[..], *h)).collect();
    e.histogram(
        "kairos_job_wait_seconds",
        "From submit to the start of the current run, of the jobs that started (leader only).",
        &wait_series,
    );
}

/// What this replica's own edge did: scheduling passes, submits answered, calls forwarded.
fn edge_figures(e: &mut Exposition, metrics: &Metrics) {
    let passes = metrics.passes.lock().unwrap_or_else(|p| p.into_inner()).clone();
    e.histogram(
        "kairos_schedule_pass_seconds",
        "Scheduling passes this replica ran as leader.",
        &[(&[], &passes)],
    );

    let submit_labels: Vec<[(&str, &str); 1]> = SUBMIT_OUTCOMES.iter().map(|o| [("outcome", *o)]).collect();
    let submit_samples: Vec<(&[(&str, &str)], f64)> = submit_labels
        .iter()
        .zip(&metrics.submits)
        .map(|(l, n)| (&l[..], n.load(Ordering::Relaxed) as f64))
        .collect();
    e.counter(
        "kairos_submits_total",
        "Submits this replica's API edge answered, by outcome.",
        &submit_samples,
    );

    e.counter(
        "kairos_forwarded_calls_total",
        "Client calls this replica passed to the leader (writes and reads only the leader answers).",
        &[(&[], metrics.forwarded.load(Ordering::Relaxed) as f64)],
    );
}

/// Preemption victims by mode, burst instances by state and their spend (the leader's).
fn preemption_and_burst_figures(e: &mut Exposition, cluster: Option<&Cluster>) {
    let mode_labels: Vec<[(&str, &str); 1]> = PREEMPT_MODES.iter().map(|m| [("mode", *m)]).collect();
    let mode_samples: Vec<(&[(&str, &str)], f64)> = mode_labels
        .iter()
        .zip(PREEMPT_MODES)
        .map(|(l, m)| (&l[..], cluster.and_then(|c| c.preemptions.get(m)).copied().unwrap_or(0) as f64))
        .collect();
    e.counter(
        "kairos_preemptions_total",
        "Preemption victims by how they were treated (leader only).",
        &mode_samples,
    );
    let gangs = cluster.map_or((0, 0), |c| c.gangs);
    e.counter(
        "kairos_gangs_placed_total",
        "Gangs placed on a cluster whose topology names levels, or asking one (leader only).",
        &[(&[], gangs.0 as f64)],
    );
    e.counter(
        "kairos_gangs_spread_total",
        "Of those, gangs placed across more topology domains than the fewest that could hold them (leader only).",
        &[(&[], gangs.1 as f64)],
    );

    let state_labels: Vec<[(&str, &str); 1]> =
        INSTANCE_STATES.iter().map(|s| [("state", s.as_str())]).collect();
    let state_samples: Vec<(&[(&str, &str)], f64)> = state_labels
        .iter()
        .zip(INSTANCE_STATES)
        .map(|(l, s)| {
            (&l[..], cluster.and_then(|c| c.instances.get(s.as_str())).copied().unwrap_or(0) as f64)
        })
        .collect();
    e.gauge("kairos_burst_instances", "Cloud burst instances by state (leader only).", &state_samples);
    e.gauge(
        "kairos_burst_spend_per_hour",
        "Dollars per hour of the live burst instances (leader only).",
        &[(&[], cluster.map_or(0.0, |c| c.spend_per_hour))],
    );
}
