//! kairos chaos testing — the invariant checkers (issue 7).
//!
//! A chaos run records a client-side *history* (every operation, when it was invoked and whether
//! and how it was acknowledged), every agent's *process log* (each process start/exit with its
//! job, attempt, node, GPUs and timestamps) and the cluster's final state; one checker per
//! invariant then judges the run. Each checker is a pure function over those records, and each
//! is shown able to fail (the tests below feed it a history with the violation).
//!
//! `proxy` is the fault injector for links (delay, one- and two-way partitions, reordering across
//! connections), since this kernel has no `netem`.
//!
//! `netns` builds separate hosts, `cluster` runs kairosd/agents on them with the process fault
//! injectors, `workload` is the client (inside the client host) and `scenario` ties a seeded
//! fault schedule, the workload and every checker together (`tests/suite.rs` runs them).

pub mod cluster;
pub mod dst;
pub mod netns;
pub mod proxy;
pub mod scenario;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

pub type JobId = u64;

/// One client operation and its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A submit with its request id; acknowledged with the job id it created.
    Submit { request_id: String, acked: Option<JobId> },
    /// A cancel of `job`; `acked` when the cluster answered OK.
    Cancel { job: JobId, acked: bool },
}

/// A process one agent ran: [start_ms, end_ms) on `gpus` of `node` (end None = still running
/// when the run ended).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRecord {
    pub node: String,
    pub job: JobId,
    pub attempt: u32,
    pub gpus: Vec<u32>,
    pub start_ms: i64,
    pub end_ms: Option<i64>,
    /// It ended because it was stopped (a signal, a kill, the watchdog), not by itself.
    pub killed: bool,
}

/// A job as the healed cluster reports it at the end of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalJob {
    pub id: JobId,
    /// The workload names each job after the request id of its submit.
    pub name: String,
    /// PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ...
    pub state: String,
    /// Kinds of its events, oldest first ("submitted", "completed", ...).
    pub events: Vec<String>,
    /// Its wall-clock limit, when it asked for one.
    pub time_limit_ms: Option<i64>,
}

impl FinalJob {
    /// A job of the state as the checkers judge it.
    pub fn of(j: &kairos_scheduler::Job) -> FinalJob {
        FinalJob {
            id: j.id,
            name: j.spec.name.clone(),
            state: j.state.as_str().to_string(),
            events: j.events.iter().map(|e| e.kind.to_string()).collect(),
            time_limit_ms: j.spec.time_limit_s.map(|s| s as i64 * 1000),
        }
    }
}

/// One line of an agent's process log (`kairos-agent --process-log`).
#[derive(serde::Deserialize)]
struct ProcessLine {
    t_ms: i64,
    event: String,
    node: String,
    job: JobId,
    attempt: u32,
    #[serde(default)]
    gpus: Vec<u32>,
    /// How an exit came about: "exit 0", "signal 9", "ended by the lease deadline (watchdog)", ...
    #[serde(default)]
    how: String,
}

/// Pairs the start and exit lines of agents' process logs into process records (a start with no
/// exit is still running), and counts the non-empty lines that do not parse (a run treats any
/// as a failure: records it cannot read are records the checkers never saw).
pub fn parse_process_log(text: &str) -> (Vec<ProcessRecord>, usize) {
    let mut records: Vec<ProcessRecord> = Vec::new();
    let mut open: BTreeMap<(String, JobId, u32), usize> = BTreeMap::new();
    let mut unparsed = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(l) = serde_json::from_str::<ProcessLine>(line) else {
            unparsed += 1;
            continue;
        };
        let key = (l.node.clone(), l.job, l.attempt);
        match l.event.as_str() {
            "start" => {
                open.insert(key, records.len());
                records.push(ProcessRecord {
                    node: l.node,
                    job: l.job,
                    attempt: l.attempt,
                    gpus: l.gpus,
                    start_ms: l.t_ms,
                    end_ms: None,
                    killed: false,
                });
            }
            "exit" => {
                if let Some(i) = open.remove(&key) {
                    records[i].end_ms = Some(l.t_ms);
                    records[i].killed = !l.how.starts_with("exit");
                }
            }
            _ => {}
        }
    }
    (records, unparsed)
}

/// What a checker found wrong.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Violation {
    #[error("acknowledged submit {request_id} (job {job}) is missing from the cluster")]
    LostSubmit { request_id: String, job: JobId },
    #[error("GPU {gpu} of {node} held by job {a} and job {b} at the same time ({at_ms} ms)")]
    GpuDoubleHeld { node: String, gpu: u32, a: JobId, b: JobId, at_ms: i64 },
    #[error("job {job}: attempt {attempt} ran twice at once on {node} ({at_ms} ms)")]
    AttemptTwice { job: JobId, attempt: u32, node: String, at_ms: i64 },
    #[error("job {job}: attempt {later} started ({at_ms} ms) before attempt {earlier} ended")]
    AttemptsOverlap { job: JobId, earlier: u32, later: u32, at_ms: i64 },
    #[error("job {job} ended {count} times ({states:?})")]
    TerminalStates { job: JobId, count: usize, states: Vec<String> },
    #[error("job {job} is {state} but no event ended it")]
    TerminalWithoutEvent { job: JobId, state: String },
    #[error("replicas disagree at applied index {index}: digests {digests:?}")]
    DigestsDiffer { index: u64, digests: Vec<String> },
    #[error("submit {name} created {} jobs: {jobs:?}", jobs.len())]
    SubmitAppliedTwice { name: String, jobs: Vec<JobId> },
    #[error("no leader {waited_ms} ms after healing (bound {bound_ms} ms)")]
    NoLeader { waited_ms: i64, bound_ms: i64 },
    #[error("{pending} jobs still queued after healing and draining")]
    QueueNotDrained { pending: usize },
    #[error("replicas did not converge after healing (need {expected}): (replica, applied index, digest) {replicas:?}")]
    NotConverged { expected: usize, replicas: Vec<(u64, u64, String)> },
    #[error("job {job}: its cancel was acknowledged but it ended {state}")]
    CancelNotHonoured { job: JobId, state: String },
    #[error("job {job} started (its events say so) but no process of it was recorded")]
    NoProcessRecord { job: JobId },
    #[error("replica {replica}: the state breaks its own invariants: {what}")]
    StateInvariant { replica: u64, what: String },
    #[error("job {job} was stopped for its time limit after {ran_ms} ms of its {limit_ms} ms")]
    EarlyTimeout { job: JobId, ran_ms: i64, limit_ms: i64 },
    #[error("job {job}: attempt {attempt} was ordered to stop at {ordered_ms} ms and still ran at {ran_ms} ms (at most {bound_ms} ms later)")]
    StopIgnored { job: JobId, attempt: u32, ordered_ms: i64, ran_ms: i64, bound_ms: i64 },
    #[error("after healing, the cluster's timeline is {lag_ms} ms behind the clocks (at most {TIMELINE_LAG_MAX_MS} ms)")]
    TimelineBehind { lag_ms: i64 },
    #[error("team {team} was owed GPUs reclaim could serve for {owed_ms} ms of leadership from {from_ms} ms (at most {bound_ms} ms)")]
    GuaranteeOwed { team: String, from_ms: i64, owed_ms: i64, bound_ms: i64 },
    #[error("the run itself failed: {what}")]
    Harness { what: String },
}

const TERMINAL: [&str; 5] = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"];

fn is_terminal_event(kind: &str) -> bool {
    TERMINAL.iter().any(|t| t.eq_ignore_ascii_case(kind))
}

/// Every acknowledged submit's job exists in the final state.
pub fn no_acknowledged_submit_lost(history: &[Operation], jobs: &[FinalJob]) -> Result<(), Violation> {
    let known: BTreeSet<JobId> = jobs.iter().map(|j| j.id).collect();
    for op in history {
        if let Operation::Submit { request_id, acked: Some(job) } = op {
            if !known.contains(job) {
                return Err(Violation::LostSubmit { request_id: request_id.clone(), job: *job });
            }
        }
    }
    Ok(())
}

/// No submit created two jobs: the workload names every job after its submit's request id,
/// and a retried submit (a lost reply, a leader change) must return the first job.
pub fn no_submit_applied_twice(jobs: &[FinalJob]) -> Result<(), Violation> {
    let mut by_name: BTreeMap<&str, Vec<JobId>> = BTreeMap::new();
    for j in jobs {
        by_name.entry(j.name.as_str()).or_default().push(j.id);
    }
    match by_name.into_iter().find(|(_, ids)| ids.len() > 1) {
        Some((name, jobs)) => Err(Violation::SubmitAppliedTwice { name: name.to_string(), jobs }),
        None => Ok(()),
    }
}

/// Half-open intervals [start, end) overlap; a missing end is "still running".
fn overlap(a: &ProcessRecord, b: &ProcessRecord) -> Option<i64> {
    let (a_end, b_end) = (a.end_ms.unwrap_or(i64::MAX), b.end_ms.unwrap_or(i64::MAX));
    let start = a.start_ms.max(b.start_ms);
    (start < a_end.min(b_end)).then_some(start)
}

/// No GPU is held by two live processes of different jobs at the same time.
pub fn no_gpu_held_twice(processes: &[ProcessRecord]) -> Result<(), Violation> {
    let mut by_gpu: BTreeMap<(&str, u32), Vec<&ProcessRecord>> = BTreeMap::new();
    for p in processes {
        for g in &p.gpus {
            by_gpu.entry((p.node.as_str(), *g)).or_default().push(p);
        }
    }
    for ((node, gpu), list) in by_gpu {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if let Some(at_ms) = overlap(a, b) {
                    if a.job != b.job {
                        return Err(Violation::GpuDoubleHeld {
                            node: node.to_string(),
                            gpu,
                            a: a.job,
                            b: b.job,
                            at_ms,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// No job attempt runs twice at once on a node, and attempt N+1 starts only after attempt N's
/// processes ended.
pub fn no_attempt_runs_twice(processes: &[ProcessRecord]) -> Result<(), Violation> {
    let mut by_job: BTreeMap<JobId, Vec<&ProcessRecord>> = BTreeMap::new();
    for p in processes {
        by_job.entry(p.job).or_default().push(p);
    }
    for (job, list) in by_job {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                let Some(at_ms) = overlap(a, b) else { continue };
                if a.attempt == b.attempt && a.node == b.node {
                    return Err(Violation::AttemptTwice {
                        job,
                        attempt: a.attempt,
                        node: a.node.clone(),
                        at_ms,
                    });
                }
                if a.attempt != b.attempt {
                    let (earlier, later) = (a.attempt.min(b.attempt), a.attempt.max(b.attempt));
                    return Err(Violation::AttemptsOverlap { job, earlier, later, at_ms });
                }
            }
        }
    }
    Ok(())
}

/// Each job ends at most once, and a job in a terminal state has exactly one ending event.
pub fn one_terminal_state_each(jobs: &[FinalJob]) -> Result<(), Violation> {
    for j in jobs {
        let endings: Vec<String> = j.events.iter().filter(|k| is_terminal_event(k)).cloned().collect();
        if endings.len() > 1 {
            return Err(Violation::TerminalStates { job: j.id, count: endings.len(), states: endings });
        }
        if TERMINAL.contains(&j.state.as_str()) && endings.is_empty() {
            return Err(Violation::TerminalWithoutEvent { job: j.id, state: j.state.clone() });
        }
    }
    Ok(())
}

/// All replicas that report the same applied index report the same state digest.
pub fn digests_agree(replicas: &[(u64, String)]) -> Result<(), Violation> {
    let mut by_index: BTreeMap<u64, BTreeSet<&str>> = BTreeMap::new();
    for (index, digest) in replicas {
        by_index.entry(*index).or_default().insert(digest);
    }
    match by_index.into_iter().find(|(_, d)| d.len() > 1) {
        Some((index, d)) => {
            Err(Violation::DigestsDiffer { index, digests: d.into_iter().map(str::to_string).collect() })
        }
        None => Ok(()),
    }
}

/// After healing at `healed_ms`, a leader was seen by `leader_ms` within `bound_ms`, and the
/// queue drained (`pending` jobs left).
/// After healing, every replica (at least `expected`) reports the same applied index and
/// digest. A replica that is down, behind or missing is a violation — not skipped.
pub fn replicas_converged(expected: usize, replicas: &[(u64, u64, String)]) -> Result<(), Violation> {
    let same = replicas.windows(2).all(|w| w[0].1 == w[1].1 && w[0].2 == w[1].2);
    if replicas.len() >= expected && same {
        return Ok(());
    }
    let at_index: Vec<(u64, String)> = replicas.iter().map(|(_, i, d)| (*i, d.clone())).collect();
    digests_agree(&at_index)?;
    Err(Violation::NotConverged { expected, replicas: replicas.to_vec() })
}

/// A cancel the cluster acknowledged ends its job `CANCELLED` (a cancel of a job that had
/// already ended is refused, so it is never acknowledged).
pub fn acked_cancels_hold(history: &[Operation], jobs: &[FinalJob]) -> Result<(), Violation> {
    for op in history {
        let Operation::Cancel { job, acked: true } = op else { continue };
        let state =
            jobs.iter().find(|j| j.id == *job).map(|j| j.state.clone()).unwrap_or_else(|| "missing".into());
        if state != "CANCELLED" {
            return Err(Violation::CancelNotHonoured { job: *job, state });
        }
    }
    Ok(())
}

/// Every job whose events say it started has a process record: the GPU and attempt checkers
/// cannot pass on process logs that are empty or unread.
pub fn processes_recorded(jobs: &[FinalJob], processes: &[ProcessRecord]) -> Result<(), Violation> {
    let recorded: BTreeSet<JobId> = processes.iter().map(|p| p.job).collect();
    match jobs.iter().find(|j| j.events.iter().any(|e| e == "started") && !recorded.contains(&j.id)) {
        Some(j) => Err(Violation::NoProcessRecord { job: j.id }),
        None => Ok(()),
    }
}

/// The cluster stops a run for its time limit only once the run has had its limit in real
/// time — counted, as the limit is, from the allocation — however wrong a replica's wall clock.
/// `stops` are the time-limit stops that committed, (job, real ms); `allocations` the
/// placements that committed, (job, real ms). Tolerance: the cluster clock's own bound
/// (`kairos_scheduler::clock`: 1 s offset, 1 % slew).
pub fn no_early_timeout(
    stops: &[(JobId, i64)],
    allocations: &[(JobId, i64)],
    jobs: &[FinalJob],
) -> Result<(), Violation> {
    for &(job, at_ms) in stops {
        let Some(limit_ms) = jobs.iter().find(|j| j.id == job).and_then(|j| j.time_limit_ms) else {
            continue;
        };
        let Some(allocated) =
            allocations.iter().filter(|(j, t)| *j == job && *t <= at_ms).map(|(_, t)| *t).max()
        else {
            continue;
        };
        let ran_ms = at_ms - allocated;
        if ran_ms < limit_ms - 1_000 - limit_ms / 100 {
            return Err(Violation::EarlyTimeout { job, ran_ms, limit_ms });
        }
    }
    Ok(())
}

/// A run the cluster ordered to stop ends within `bound_ms` of the order — a stop's grace, or
/// (its agent cut off or stalled) its lease and the fence's grace: what an agent that ignores
/// a stop, or a fence that does not hold, breaks. `orders` are (job, attempt, ms first seen
/// committed); a process still running at `end_ms` ran to it.
pub fn stops_honoured(
    orders: &[(JobId, u32, i64)],
    processes: &[ProcessRecord],
    bound_ms: i64,
    end_ms: i64,
) -> Result<(), Violation> {
    for &(job, attempt, ordered_ms) in orders {
        let runs =
            processes.iter().filter(|p| p.job == job && p.attempt == attempt && p.start_ms <= ordered_ms);
        for p in runs {
            let ran_ms = p.end_ms.unwrap_or(end_ms);
            if ran_ms > ordered_ms + bound_ms {
                return Err(Violation::StopIgnored { job, attempt, ordered_ms, ran_ms, bound_ms });
            }
        }
    }
    Ok(())
}

/// How far behind the clocks the timeline may be once they are all right and a leader leads:
/// the catch-up after an outage (`kairos_scheduler::clock`) must have happened.
pub const TIMELINE_LAG_MAX_MS: i64 = 2_000;

/// The cluster's time meets the (right) clocks after healing, however long everything was down.
pub fn timeline_caught_up(lag_ms: Option<i64>) -> Result<(), Violation> {
    match lag_ms {
        Some(lag_ms) if lag_ms > TIMELINE_LAG_MAX_MS => Err(Violation::TimelineBehind { lag_ms }),
        _ => Ok(()),
    }
}

/// Every replica's state passed its own invariant check.
pub fn states_hold_their_invariants(checked: &[(u64, Result<(), String>)]) -> Result<(), Violation> {
    match checked.iter().find_map(|(r, c)| c.as_ref().err().map(|e| (*r, e.clone()))) {
        Some((replica, what)) => Err(Violation::StateInvariant { replica, what }),
        None => Ok(()),
    }
}

/// Everything one run recorded, for `check_all`.
pub struct Run<'a> {
    pub history: &'a [Operation],
    pub processes: &'a [ProcessRecord],
    pub finals: &'a [FinalJob],
    /// (replica, applied index, digest) after healing.
    pub replicas: &'a [(u64, u64, String)],
    pub expected_replicas: usize,
    /// When a leader was first seen after healing (ms after), if ever.
    pub leader_after_ms: Option<i64>,
    pub bound_ms: i64,
    /// Jobs not finished at the end.
    pub unfinished: usize,
    /// `ClusterState::check_invariants` of each replica's state, where the run can read it.
    pub invariants: &'a [(u64, Result<(), String>)],
    /// Time-limit stops and placements that committed: (job, real ms), where the run sees them.
    pub time_limit_stops: &'a [(JobId, i64)],
    pub allocations: &'a [(JobId, i64)],
    /// Runs the cluster ordered to stop: (job, attempt, real ms when the order was first seen
    /// committed), where the run sees them; and how long after that a run may still go on.
    pub stop_orders: &'a [(JobId, u32, i64)],
    pub stop_bound_ms: i64,
    /// When the run ended (a process still running then counts as running to it).
    pub end_ms: i64,
    /// After healing (every clock right): how far the time the leader would stamp now is
    /// behind the clocks, where the run can ask.
    pub timeline_lag_ms: Option<i64>,
    /// Looks at the leader's teams (`dst::watch_guarantees`): (ms, teams owed GPUs reclaim
    /// could serve; None: no leader), and how long one may stay owed while a leader leads.
    pub owed: &'a [(i64, Option<Vec<String>>)],
    pub owed_bound_ms: i64,
}

/// Every checker over one run.
pub fn check_all(run: &Run) -> Vec<Violation> {
    [
        no_acknowledged_submit_lost(run.history, run.finals),
        no_submit_applied_twice(run.finals),
        no_gpu_held_twice(run.processes),
        no_attempt_runs_twice(run.processes),
        one_terminal_state_each(run.finals),
        replicas_converged(run.expected_replicas, run.replicas),
        acked_cancels_hold(run.history, run.finals),
        processes_recorded(run.finals, run.processes),
        recovered(0, run.leader_after_ms, run.bound_ms, run.unfinished),
        states_hold_their_invariants(run.invariants),
        no_early_timeout(run.time_limit_stops, run.allocations, run.finals),
        timeline_caught_up(run.timeline_lag_ms),
        stops_honoured(run.stop_orders, run.processes, run.stop_bound_ms, run.end_ms),
        guarantees_honoured(run.owed, run.owed_bound_ms),
    ]
    .into_iter()
    .filter_map(Result::err)
    .collect()
}

/// A team owed GPUs that reclaim could serve gets them within the bound, across failovers:
/// between two looks the time counts while it stays owed and a leader led at both (a look
/// without a leader neither counts nor ends the wait).
pub fn guarantees_honoured(looks: &[(i64, Option<Vec<String>>)], bound_ms: i64) -> Result<(), Violation> {
    // Per team owed: (its first look owed, the leader time owed so far).
    let mut open: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    let mut prev: Option<(i64, bool)> = None;
    for (at, owed) in looks {
        let led_since = match prev {
            Some((p, true)) => at - p,
            _ => 0,
        };
        prev = Some((*at, owed.is_some()));
        let Some(owed) = owed else { continue };
        open.retain(|team, _| owed.iter().any(|t| t == team));
        for team in owed {
            let entry = match open.get_mut(team.as_str()) {
                Some(e) => {
                    e.1 += led_since;
                    *e
                }
                None => *open.entry(team.as_str()).or_insert((*at, 0)),
            };
            if entry.1 > bound_ms {
                let (team, from_ms, owed_ms) = (team.clone(), entry.0, entry.1);
                return Err(Violation::GuaranteeOwed { team, from_ms, owed_ms, bound_ms });
            }
        }
    }
    Ok(())
}

/// FNV-1a 64.
pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

pub fn recovered(
    healed_ms: i64,
    leader_ms: Option<i64>,
    bound_ms: i64,
    pending: usize,
) -> Result<(), Violation> {
    match leader_ms {
        Some(t) if t - healed_ms <= bound_ms => {}
        Some(t) => return Err(Violation::NoLeader { waited_ms: t - healed_ms, bound_ms }),
        None => return Err(Violation::NoLeader { waited_ms: i64::MAX, bound_ms }),
    }
    if pending > 0 {
        return Err(Violation::QueueNotDrained { pending });
    }
    Ok(())
}

/// One line of the end-of-suite summary table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub scenario: String,
    pub seed: u64,
    pub faults: usize,
    pub operations: usize,
    pub acknowledged: usize,
    pub lost: usize,
    pub double_allocations: usize,
    /// From healing the last fault until a write commits again.
    pub recover_ms: i64,
    /// The longest time without an acknowledged submit while the workload ran (the outage a
    /// client saw).
    pub longest_gap_ms: i64,
    /// Jobs preempted at least once (urgent over training).
    pub preempted: usize,
}

/// The summary table printed at the end of a chaos suite.
pub fn summary_table(rows: &[Summary]) -> String {
    let mut out = format!(
        "{:<28} {:>10} {:>7} {:>6} {:>6} {:>8} {:>5} {:>7} {:>11} {:>11}\n",
        "SCENARIO",
        "SEED",
        "FAULTS",
        "OPS",
        "ACKED",
        "PREEMPTS",
        "LOST",
        "DOUBLE",
        "RECOVER_MS",
        "MAX_GAP_MS"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<28} {:>10} {:>7} {:>6} {:>6} {:>8} {:>5} {:>7} {:>11} {:>11}\n",
            r.scenario,
            r.seed,
            r.faults,
            r.operations,
            r.acknowledged,
            r.preempted,
            r.lost,
            r.double_allocations,
            r.recover_ms,
            r.longest_gap_ms
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(
        node: &str,
        job: JobId,
        attempt: u32,
        gpus: &[u32],
        start: i64,
        end: Option<i64>,
    ) -> ProcessRecord {
        ProcessRecord {
            node: node.into(),
            job,
            attempt,
            gpus: gpus.to_vec(),
            start_ms: start,
            end_ms: end,
            killed: false,
        }
    }

    fn job(id: JobId, state: &str, events: &[&str]) -> FinalJob {
        FinalJob {
            id,
            name: format!("r{id}"),
            state: state.into(),
            events: events.iter().map(|e| e.to_string()).collect(),
            time_limit_ms: None,
        }
    }

    #[test]
    fn a_submit_applied_twice_is_reported() {
        let mut jobs = vec![job(1, "COMPLETED", &["completed"]), job(2, "PENDING", &[])];
        assert_eq!(no_submit_applied_twice(&jobs), Ok(()));
        jobs[1].name = jobs[0].name.clone();
        assert_eq!(
            no_submit_applied_twice(&jobs),
            Err(Violation::SubmitAppliedTwice { name: "r1".into(), jobs: vec![1, 2] })
        );
    }

    #[test]
    fn process_logs_pair_starts_with_exits() {
        let log = r#"{"t_ms":10,"event":"start","node":"n0","job":1,"attempt":0,"gpus":[0,1]}
{"t_ms":12,"event":"start","node":"n1","job":2,"attempt":0,"gpus":[0]}
not json
{"t_ms":20,"event":"exit","node":"n0","job":1,"attempt":0,"how":"exit 0"}
{"t_ms":21,"event":"exit","node":"n0","job":9,"attempt":0,"how":"orphan killed"}
"#;
        let (records, unparsed) = parse_process_log(log);
        assert_eq!(records, vec![proc("n0", 1, 0, &[0, 1], 10, Some(20)), proc("n1", 2, 0, &[0], 12, None)]);
        assert_eq!(unparsed, 1, "the line that is not JSON is counted");
    }

    #[test]
    fn a_lost_acknowledged_submit_is_reported() {
        let history = vec![
            Operation::Submit { request_id: "r1".into(), acked: Some(1) },
            Operation::Submit { request_id: "r2".into(), acked: None },
            Operation::Submit { request_id: "r3".into(), acked: Some(3) },
            Operation::Cancel { job: 1, acked: true },
        ];
        let jobs = vec![job(1, "CANCELLED", &["submitted", "cancelled"])];
        assert_eq!(
            no_acknowledged_submit_lost(&history, &jobs),
            Err(Violation::LostSubmit { request_id: "r3".into(), job: 3 })
        );
        let jobs = vec![job(1, "CANCELLED", &["cancelled"]), job(3, "PENDING", &[])];
        assert_eq!(no_acknowledged_submit_lost(&history, &jobs), Ok(()));
    }

    #[test]
    fn a_gpu_held_by_two_jobs_at_once_is_reported_and_a_handover_is_not() {
        let handover = vec![proc("n1", 1, 0, &[0, 1], 0, Some(100)), proc("n1", 2, 0, &[1], 100, None)];
        assert_eq!(no_gpu_held_twice(&handover), Ok(()));
        let double = vec![proc("n1", 1, 0, &[0, 1], 0, Some(100)), proc("n1", 2, 0, &[1], 99, None)];
        assert_eq!(
            no_gpu_held_twice(&double),
            Err(Violation::GpuDoubleHeld { node: "n1".into(), gpu: 1, a: 1, b: 2, at_ms: 99 })
        );
        // The same GPU index on another node is another GPU.
        let elsewhere = vec![proc("n1", 1, 0, &[0], 0, None), proc("n2", 2, 0, &[0], 0, None)];
        assert_eq!(no_gpu_held_twice(&elsewhere), Ok(()));
    }

    #[test]
    fn an_attempt_running_twice_or_attempts_overlapping_are_reported() {
        let twice = vec![proc("n1", 5, 0, &[0], 0, None), proc("n1", 5, 0, &[1], 10, Some(20))];
        assert!(matches!(no_attempt_runs_twice(&twice), Err(Violation::AttemptTwice { job: 5, .. })));
        let overlap = vec![proc("n1", 5, 0, &[0], 0, Some(50)), proc("n2", 5, 1, &[0], 40, None)];
        assert!(matches!(
            no_attempt_runs_twice(&overlap),
            Err(Violation::AttemptsOverlap { job: 5, earlier: 0, later: 1, at_ms: 40 })
        ));
        // A gang's ranks of one attempt on distinct nodes, and a clean requeue, are fine.
        let fine = vec![
            proc("n1", 5, 0, &[0], 0, Some(50)),
            proc("n2", 5, 0, &[0], 0, Some(50)),
            proc("n1", 5, 1, &[0], 50, None),
        ];
        assert_eq!(no_attempt_runs_twice(&fine), Ok(()));
    }

    #[test]
    fn a_job_ending_twice_or_ending_silently_is_reported() {
        let twice = vec![job(1, "COMPLETED", &["submitted", "completed", "cancelled"])];
        assert!(matches!(
            one_terminal_state_each(&twice),
            Err(Violation::TerminalStates { job: 1, count: 2, .. })
        ));
        let silent = vec![job(2, "FAILED", &["submitted", "started"])];
        assert!(matches!(
            one_terminal_state_each(&silent),
            Err(Violation::TerminalWithoutEvent { job: 2, .. })
        ));
        let fine =
            vec![job(3, "NODE_FAIL", &["started", "node_fail"]), job(4, "RUNNING", &["requeued", "started"])];
        assert_eq!(one_terminal_state_each(&fine), Ok(()));
    }

    #[test]
    fn disagreeing_digests_and_a_slow_or_absent_recovery_are_reported() {
        let same = vec![(10, "aa".to_string()), (10, "aa".to_string()), (9, "bb".to_string())];
        assert_eq!(digests_agree(&same), Ok(()));
        let split = vec![(10, "aa".to_string()), (10, "ab".to_string())];
        assert!(matches!(digests_agree(&split), Err(Violation::DigestsDiffer { index: 10, .. })));
        assert_eq!(recovered(1000, Some(1500), 1000, 0), Ok(()));
        assert!(matches!(recovered(1000, Some(3000), 1000, 0), Err(Violation::NoLeader { .. })));
        assert!(matches!(recovered(1000, None, 1000, 0), Err(Violation::NoLeader { .. })));
        assert_eq!(recovered(1000, Some(1100), 1000, 3), Err(Violation::QueueNotDrained { pending: 3 }));
    }

    #[test]
    fn replicas_that_did_not_converge_are_reported_not_skipped() {
        let r = |id: u64, index: u64, d: &str| (id, index, d.to_string());
        assert_eq!(replicas_converged(3, &[r(1, 9, "aa"), r(2, 9, "aa"), r(3, 9, "aa")]), Ok(()));
        // Behind (what digests_agree alone let pass), absent, or down.
        assert!(matches!(
            replicas_converged(3, &[r(1, 9, "aa"), r(2, 9, "aa"), r(3, 7, "bb")]),
            Err(Violation::NotConverged { .. })
        ));
        assert!(matches!(
            replicas_converged(3, &[r(1, 9, "aa"), r(2, 9, "aa")]),
            Err(Violation::NotConverged { .. })
        ));
        assert!(matches!(replicas_converged(3, &[]), Err(Violation::NotConverged { .. })));
        // Different states at one index stay the sharper finding.
        assert!(matches!(
            replicas_converged(3, &[r(1, 9, "aa"), r(2, 9, "ab"), r(3, 9, "aa")]),
            Err(Violation::DigestsDiffer { index: 9, .. })
        ));
    }

    #[test]
    fn an_acknowledged_cancel_of_a_job_that_ended_otherwise_is_reported() {
        let history =
            vec![Operation::Cancel { job: 1, acked: true }, Operation::Cancel { job: 2, acked: false }];
        let fine = vec![job(1, "CANCELLED", &["cancelled"]), job(2, "COMPLETED", &["completed"])];
        assert_eq!(acked_cancels_hold(&history, &fine), Ok(()));
        let requeued =
            vec![job(1, "COMPLETED", &["requeued", "completed"]), job(2, "COMPLETED", &["completed"])];
        assert_eq!(
            acked_cancels_hold(&history, &requeued),
            Err(Violation::CancelNotHonoured { job: 1, state: "COMPLETED".into() })
        );
        assert!(matches!(
            acked_cancels_hold(&history, &[]),
            Err(Violation::CancelNotHonoured { job: 1, .. })
        ));
    }

    #[test]
    fn a_time_limit_stop_before_the_run_had_its_limit_is_reported() {
        let mut j = job(1, "TIMEOUT", &["started", "timeout"]);
        j.time_limit_ms = Some(10_000);
        let jobs = std::slice::from_ref(&j);
        // Allocated at 0, requeued, allocated again at 5 s.
        let allocations = [(1, 0), (1, 5_000)];
        assert_eq!(no_early_timeout(&[(1, 15_100)], &allocations, jobs), Ok(()));
        // Within the cluster clock's tolerance (1 s + 1 %).
        assert_eq!(no_early_timeout(&[(1, 13_950)], &allocations, jobs), Ok(()));
        assert_eq!(
            no_early_timeout(&[(1, 7_000)], &allocations, jobs),
            Err(Violation::EarlyTimeout { job: 1, ran_ms: 2_000, limit_ms: 10_000 })
        );
    }

    #[test]
    fn a_run_that_outlives_its_stop_order_is_reported() {
        let processes = [proc("n1", 1, 0, &[0], 0, Some(4_000)), proc("n1", 2, 0, &[1], 0, None)];
        assert_eq!(stops_honoured(&[(1, 0, 3_500)], &processes, 1_000, 9_000), Ok(()));
        // An attempt started after the order is another story (a requeue's next attempt).
        assert_eq!(stops_honoured(&[(1, 0, -10)], &processes, 1_000, 9_000), Ok(()));
        assert_eq!(
            stops_honoured(&[(1, 0, 2_000)], &processes, 1_000, 9_000),
            Err(Violation::StopIgnored {
                job: 1,
                attempt: 0,
                ordered_ms: 2_000,
                ran_ms: 4_000,
                bound_ms: 1_000
            })
        );
        assert!(matches!(
            stops_honoured(&[(2, 0, 1_000)], &processes, 1_000, 9_000),
            Err(Violation::StopIgnored { ran_ms: 9_000, .. })
        ));
    }

    #[test]
    fn a_timeline_still_behind_the_clocks_after_healing_is_reported() {
        assert_eq!(timeline_caught_up(None), Ok(()));
        assert_eq!(timeline_caught_up(Some(-300)), Ok(()), "a timeline slewed ahead a little");
        assert_eq!(timeline_caught_up(Some(TIMELINE_LAG_MAX_MS)), Ok(()));
        assert_eq!(timeline_caught_up(Some(59_000)), Err(Violation::TimelineBehind { lag_ms: 59_000 }));
    }

    #[test]
    fn jobs_that_started_without_a_process_record_are_reported() {
        let jobs = vec![job(1, "COMPLETED", &["started", "completed"]), job(2, "PENDING", &[])];
        assert_eq!(processes_recorded(&jobs, &[proc("n1", 1, 0, &[0], 0, Some(5))]), Ok(()));
        // Empty or unread process logs no longer pass the GPU and attempt checkers unseen.
        assert_eq!(processes_recorded(&jobs, &[]), Err(Violation::NoProcessRecord { job: 1 }));
    }

    #[test]
    fn a_state_that_breaks_its_invariants_is_reported_and_every_checker_runs() {
        let checked = vec![(1, Ok(())), (2, Err("GPU 0 of n1 allocated twice".to_string()))];
        assert_eq!(
            states_hold_their_invariants(&checked),
            Err(Violation::StateInvariant { replica: 2, what: "GPU 0 of n1 allocated twice".into() })
        );
        let history = vec![Operation::Submit { request_id: "r1".into(), acked: Some(1) }];
        let run = Run {
            history: &history,
            processes: &[],
            finals: &[],
            replicas: &[],
            expected_replicas: 3,
            leader_after_ms: None,
            bound_ms: 1000,
            unfinished: 0,
            invariants: &checked,
            time_limit_stops: &[],
            allocations: &[],
            stop_orders: &[(1, 0, 0)],
            stop_bound_ms: 1_000,
            end_ms: 5_000,
            timeline_lag_ms: Some(60_000),
            owed: &[(0, Some(vec!["ta".into()])), (5_000, Some(vec!["ta".into()]))],
            owed_bound_ms: 1_000,
        };
        let found = check_all(&run);
        assert!(found.iter().any(|v| matches!(v, Violation::LostSubmit { .. })));
        assert!(found.iter().any(|v| matches!(v, Violation::NotConverged { .. })));
        assert!(found.iter().any(|v| matches!(v, Violation::NoLeader { .. })));
        assert!(found.iter().any(|v| matches!(v, Violation::StateInvariant { .. })));
        assert!(found.iter().any(|v| matches!(v, Violation::TimelineBehind { lag_ms: 60_000 })));
        assert!(found.iter().any(|v| matches!(v, Violation::GuaranteeOwed { .. })));
    }

    #[test]
    fn the_summary_has_a_row_per_scenario() {
        let rows =
            vec![Summary { scenario: "leader-partition".into(), seed: 42, faults: 3, ..Default::default() }];
        let table = summary_table(&rows);
        assert_eq!(table.lines().count(), 2);
        assert!(table.contains("leader-partition") && table.contains("42"));
    }
}

#[test]
fn a_team_owed_past_the_bound_while_a_leader_led_is_caught_and_leaderless_time_does_not_count() {
    let owed = |t: &[&str]| Some(t.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    // Owed from 0 to 400 ms with a leader throughout: 400 ms of leadership.
    let looks: Vec<(i64, Option<Vec<String>>)> = (0..=4).map(|i| (i * 100, owed(&["ta"]))).collect();
    assert_eq!(guarantees_honoured(&looks, 400), Ok(()));
    assert!(matches!(
        guarantees_honoured(&looks, 300),
        Err(Violation::GuaranteeOwed { ref team, from_ms: 0, owed_ms: 400, bound_ms: 300 }) if team == "ta"
    ));
    // A leaderless second in the middle neither counts nor ends the wait.
    let mut gap = vec![(0, owed(&["ta"])), (100, owed(&["ta"]))];
    gap.extend((2..12).map(|i| (i * 100, None)));
    gap.extend([(1200, owed(&["ta"])), (1300, owed(&["ta"]))]);
    assert_eq!(guarantees_honoured(&gap, 200), Ok(()));
    assert!(guarantees_honoured(&gap, 199).is_err());
    // A look that finds the team served ends its wait.
    let served = [(0, owed(&["ta"])), (100, owed(&[])), (200, owed(&["ta"])), (300, owed(&["ta"]))];
    assert_eq!(guarantees_honoured(&served, 100), Ok(()));
}
