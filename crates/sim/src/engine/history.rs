//! Replaying a cluster's own history (`crate::history`): its jobs submitted as they were (QoS,
//! account, partition, user, tasks, limits, dependencies), its recorded events repeated at
//! their times (nodes joining, draining, down, up and leaving; holds, releases and cancels),
//! and each job meeting preemption as it did (checkpoint on the signal or not, its stop time).

use std::collections::{BTreeMap, HashMap};

use kairos_scheduler::model::{JobId, JobSpec, JobState, Profile};
use kairos_scheduler::{Op, Outcome};

use super::{node_info, Event, Sim};
use crate::history::{HistoryJob, HistoryTrace, NodeChange};
use crate::trace::TraceJob;

/// The history half of a replay.
pub(super) struct Side<'a> {
    pub(super) trace: &'a HistoryTrace,
    /// Unix ms of the replay's time 0.
    pub(super) origin_ms: i64,
    /// Recorded job id → the replay's.
    ids: HashMap<u64, JobId>,
}

/// The trace's jobs as the engine's plain ones (what offered load and the plot read): submit
/// and run time from the replay's origin, all GPUs of all tasks.
pub fn trace_jobs(trace: &HistoryTrace) -> Vec<TraceJob> {
    let origin = trace.origin_ms();
    trace
        .jobs
        .iter()
        .map(|j| TraceJob {
            name: format!("{} ({})", j.id, j.name),
            submit_ms: j.submit_ms - origin,
            duration_ms: j.work_ms.max(1),
            gpus: j.gpus.saturating_mul(j.tasks.max(1)),
            inference: j.profile == "inference",
            cpus: j.cpus,
            mem_mib: j.mem_mib,
            gpu_spec: j.gpu_model.clone(),
            gpu_milli: j.gpu_milli,
            // `gpus` counts every task's (the offered load); the spec is the history's own.
            tasks: 1,
        })
        .collect()
}

impl<'a> Side<'a> {
    pub(super) fn new(trace: &'a HistoryTrace) -> Side<'a> {
        Side { trace, origin_ms: trace.origin_ms(), ids: HashMap::new() }
    }

    pub(super) fn job(&self, i: usize) -> &'a HistoryJob {
        &self.trace.jobs[i]
    }

    /// The events to schedule, at the replay's times.
    pub(super) fn events(&self) -> Vec<(i64, Event)> {
        let at = |ms: i64| (ms - self.origin_ms).max(0);
        let mut out = Vec::new();
        for (k, e) in self.trace.node_events.iter().enumerate() {
            out.push((at(e.at_ms), Event::NodeChange(k)));
        }
        for (i, j) in self.trace.jobs.iter().enumerate() {
            if let Some(c) = j.cancel_ms {
                out.push((at(c), Event::Cancel(i)));
            }
            for (n, (held, released)) in j.holds.iter().enumerate() {
                // A hold at its submit is part of the submit.
                if n > 0 || *held > j.submit_ms {
                    out.push((at(*held), Event::Hold { job: i, held: true }));
                }
                if *released > 0 {
                    out.push((at(*released), Event::Hold { job: i, held: false }));
                }
            }
        }
        out
    }

    /// Whether job `i` was submitted held.
    pub(super) fn submitted_held(&self, i: usize) -> bool {
        let j = self.job(i);
        j.holds.first().is_some_and(|(held, _)| *held <= j.submit_ms)
    }

    /// The job the trace's job `i` is submitted as; dependencies on jobs the replay never
    /// submitted (before the window, or refused) are dropped.
    pub(super) fn spec(&self, i: usize) -> JobSpec {
        let j = self.job(i);
        let mut spec = JobSpec::new(&j.name, &j.user, vec!["true".into()], j.gpus);
        spec.qos = j.qos.clone();
        spec.account = j.account.clone();
        spec.partition = j.partition.clone();
        spec.profile = match j.profile.as_str() {
            "inference" => Profile::Inference,
            "batch" => Profile::Batch,
            "interactive" => Profile::Interactive,
            _ => Profile::Training,
        };
        spec.tasks = j.tasks.max(1);
        spec.gpu_milli = j.gpu_milli;
        spec.gpu_model = j.gpu_model.clone();
        spec.cpus = j.cpus;
        spec.mem_mib = j.mem_mib;
        spec.time_limit_s = j.time_limit_s;
        spec.requeue = j.requeue;
        let map = |ids: &[u64]| ids.iter().filter_map(|id| self.ids.get(id).copied()).collect::<Vec<_>>();
        spec.after_ok = map(&j.after_ok);
        spec.after_any = map(&j.after_any);
        spec.after_not_ok = map(&j.after_not_ok);
        spec
    }

    pub(super) fn submitted(&mut self, i: usize, job: JobId) {
        self.ids.insert(self.job(i).id, job);
    }

    fn replay_id(&self, i: usize) -> Option<JobId> {
        self.ids.get(&self.job(i).id).copied()
    }
}

impl Sim<'_> {
    /// The trace's nodes that exist when the replay begins, registered (their CPUs and memory
    /// counted when all say them), and its recorded events scheduled.
    pub(super) fn start_history(&mut self) {
        let Some(side) = &self.history else { return };
        let (shapes, events) = (side.trace.nodes.clone(), side.events());
        for n in &shapes {
            self.join(0, n);
        }
        let shares = !shapes.is_empty() && shapes.iter().all(|n| n.cpus > 0 && n.memory_mib > 0);
        self.share_totals = shares.then(|| {
            (shapes.iter().map(|n| u64::from(n.cpus)).sum(), shapes.iter().map(|n| n.memory_mib).sum())
        });
        for (at, event) in events {
            self.events.push(std::cmp::Reverse((at, u64::MAX / 2, event)));
        }
    }

    fn join(&mut self, now: i64, n: &crate::history::NodeShape) {
        let info = node_info(&n.name, n.gpus, &n.gpu_model, n.cpus, n.memory_mib, n.labels.clone());
        self.apply(now, Op::RegisterNode { info });
        let before = self.capacity.insert(n.name.clone(), n.gpus).unwrap_or(0);
        self.total_gpus = self.total_gpus + n.gpus - before.min(self.total_gpus);
    }

    /// A recorded node change, repeated: runs it stops end after their stop time, runs it
    /// loses (down) end at once.
    pub(super) fn node_change(&mut self, now: i64, k: usize) -> bool {
        let Some(side) = &self.history else { return false };
        let event = side.trace.node_events[k].clone();
        let running = self.running_on(&event.node);
        match &event.change {
            NodeChange::Joined { shape } => {
                self.join(now, &crate::history::NodeShape { name: event.node.clone(), ..shape.clone() })
            }
            NodeChange::Draining { reason } => {
                let op = Op::DrainNode { node: event.node.clone(), reason: reason.clone(), keep_runs: false };
                self.apply(now, op);
            }
            NodeChange::Down { reason } => {
                self.apply(now, Op::NodeDown { node: event.node.clone(), reason: reason.clone() });
            }
            NodeChange::Up => {
                let node = self.state.nodes.get(&event.node).map(|n| (n.state, n.info.clone()));
                match node {
                    Some((kairos_scheduler::NodeState::Down, info)) => {
                        self.apply(now, Op::RegisterNode { info });
                    }
                    Some(_) => {
                        self.apply(now, Op::ResumeNode { node: event.node.clone(), only_reason: None });
                    }
                    None => {}
                }
            }
            NodeChange::Removed => {
                self.apply(now, Op::RemoveNode { node: event.node.clone() });
            }
        }
        self.settle_runs(now, &running);
        true
    }

    /// The runs on `node` now: (job, attempt).
    fn running_on(&self, node: &str) -> Vec<(JobId, u32)> {
        self.state
            .jobs_on(node)
            .iter()
            .filter(|j| j.state == JobState::Running)
            .map(|j| (j.id, j.attempt))
            .collect()
    }

    /// After a recorded event: runs asked to stop end after their stop time; runs the state
    /// already ended (their node went down) are released now.
    fn settle_runs(&mut self, now: i64, runs: &[(JobId, u32)]) {
        for &(job, attempt) in runs {
            let Some(j) = self.state.jobs.get(&job) else { continue };
            let alive = j.state == JobState::Running && j.attempt == attempt;
            let stopping = alive && j.allocation.as_ref().is_some_and(|a| a.stop.is_some());
            if stopping && self.stopping.insert((job, attempt)) {
                let stop_at = now + self.stop_ms(job);
                self.save_progress(job, stop_at, false);
                self.push(stop_at, Event::Stop { job, attempt });
            } else if !alive {
                self.released_lost(now, job);
            }
        }
    }

    /// A run the state ended without its exit (its node went down): its GPUs counted free.
    fn released_lost(&mut self, now: i64, job: JobId) {
        let Some((tasks, share, fraction)) = self.held.remove(&job) else { return };
        for (node, gpus) in tasks {
            if fraction {
                self.sync_shared(&node);
            } else {
                self.release(&node, gpus);
            }
        }
        self.share_used =
            (self.share_used.0.saturating_sub(share.0), self.share_used.1.saturating_sub(share.1));
        self.allocation.push((now, self.allocated));
        self.settle_end(now, job);
    }

    /// A recorded cancel, repeated: a pending job ends, a running one stops.
    pub(super) fn cancel(&mut self, now: i64, i: usize) -> bool {
        let Some(job) = self.history.as_ref().and_then(|h| h.replay_id(i)) else { return false };
        let attempt = self.state.jobs.get(&job).map(|j| j.attempt).unwrap_or(0);
        match self.apply(now, Op::Cancel { job, by: "history".into() }) {
            Outcome::Cancelled { was_running: true, .. } => {
                self.settle_runs(now, &[(job, attempt)]);
                true
            }
            Outcome::Cancelled { .. } => {
                self.settle_end(now, job);
                true
            }
            _ => false,
        }
    }

    /// A recorded hold or release, repeated (a job no longer pending is left alone).
    pub(super) fn hold(&mut self, now: i64, i: usize, held: bool) -> bool {
        let Some(job) = self.history.as_ref().and_then(|h| h.replay_id(i)) else { return false };
        let by = "history".to_string();
        let op = if held { Op::Hold { job, by } } else { Op::Release { job, by } };
        !matches!(self.apply(now, op), Outcome::Rejected(_))
    }

    /// How long job `job`'s runs take to stop after the signal (ms).
    pub(super) fn stop_ms(&self, job: JobId) -> i64 {
        match (&self.history, self.tracks.get(&job)) {
            (Some(h), Some(t)) => h.job(t.trace).stop_ms,
            _ => self.config.stop_delay_s as i64 * 1000,
        }
    }

    /// Whether job `job` saves its work on the checkpoint signal.
    pub(super) fn checkpoints_on_signal(&self, job: JobId) -> bool {
        match (&self.history, self.tracks.get(&job)) {
            (Some(h), Some(t)) => h.job(t.trace).checkpoint_on_signal,
            _ => self.config.checkpoint_on_signal,
        }
    }

    /// Replayed first start of each trace job (Unix ms), by trace index.
    pub(super) fn first_starts(&self) -> Vec<Option<i64>> {
        let origin = self.history.as_ref().map_or(0, |h| h.origin_ms);
        let mut out = vec![None; self.jobs.len()];
        for t in self.tracks.values() {
            out[t.trace] = t.first_start_ms.map(|s| s + origin);
        }
        out
    }

    /// Fairshare: each account's share of the decayed GPU usage at the end.
    pub(super) fn shares(&self) -> BTreeMap<String, f64> {
        let half_life = self.state.policy.weights.fairshare_half_life_s;
        let now = self.state.now_ms;
        let used: BTreeMap<String, u128> =
            self.state.usage.iter().map(|(a, u)| (a.clone(), u.at(now, half_life))).collect();
        let total: u128 = used.values().sum();
        used.into_iter()
            .map(|(a, u)| {
                (a, if total == 0 { 0.0 } else { (u as f64 / total as f64 * 1000.0).round() / 1000.0 })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use kairos_scheduler::policy::Policy;

    use crate::engine::{simulate_history, SimConfig};
    use crate::fidelity::fidelity;
    use crate::history::{HistoryJob, HistoryTrace, NodeChange, NodeEvent, NodeShape, Recorded, Window};

    const T0: i64 = 1_700_000_000_000;

    fn job(id: u64, profile: &str, submit_s: i64, work_s: i64, gpus: u32, starts: &[i64]) -> HistoryJob {
        HistoryJob {
            id,
            name: format!("j{id}"),
            user: "alice".into(),
            qos: profile.into(),
            profile: profile.into(),
            submit_ms: T0 + submit_s * 1000,
            work_ms: work_s * 1000,
            gpus,
            tasks: 1,
            requeue: true,
            stop_ms: 2000,
            recorded: Recorded {
                state: "COMPLETED".into(),
                starts: starts.iter().map(|s| T0 + s * 1000).collect(),
                end_ms: None,
                preemptions: 0,
            },
            ..Default::default()
        }
    }

    /// Two 4-GPU nodes and a 1-GPU one: a training job on each big one, inference preempting
    /// one at 10 s, a drain of the other at 30 s, a held job released at 50 s and a job
    /// cancelled while pending.
    fn day() -> HistoryTrace {
        let node = |name: &str| NodeShape {
            name: name.into(),
            gpus: 4,
            gpu_model: "sim".into(),
            ..Default::default()
        };
        let mut train_a = job(1, "training", 0, 100, 4, &[0, 12]);
        train_a.recorded.preemptions = 1;
        let train_b = job(2, "training", 0, 60, 4, &[0, 100]);
        let inference = job(3, "inference", 10, 20, 2, &[12]);
        let mut held = job(4, "batch", 5, 10, 1, &[50]);
        held.holds = vec![(T0 + 5_000, T0 + 50_000)];
        let mut cancelled = job(5, "training", 20, 10, 4, &[]);
        cancelled.cancel_ms = Some(T0 + 25_000);
        cancelled.recorded.state = "CANCELLED".into();
        HistoryTrace {
            window: Window { from_ms: T0, to_ms: T0 + 400_000, ..Default::default() },
            nodes: vec![node("n1"), node("n2"), NodeShape { gpus: 1, ..node("n3") }],
            node_events: vec![
                NodeEvent {
                    at_ms: T0 + 30_000,
                    node: "n2".into(),
                    change: NodeChange::Draining { reason: "maintenance".into() },
                },
                NodeEvent { at_ms: T0 + 90_000, node: "n2".into(), change: NodeChange::Up },
            ],
            jobs: vec![train_a, train_b, inference, held, cancelled],
        }
    }

    #[test]
    fn a_history_replays_its_preemption_drain_hold_and_cancel_where_they_happened() {
        let trace = day();
        let replay = simulate_history(&trace, &Policy::default(), &SimConfig::default());
        let starts: Vec<Option<i64>> = replay.starts.iter().map(|s| s.map(|s| (s - T0) / 1000)).collect();
        // Job 1 is preempted at 10 s and stops 2 s later, when inference starts.
        assert_eq!(
            starts,
            vec![Some(0), Some(0), Some(12), Some(50), None],
            "{:?}",
            replay.report.unfinished_jobs
        );
        assert_eq!(replay.preemptions, 1);
        let f = fidelity(&trace, &replay);
        assert_eq!((f.reproduced, f.compared, f.replayed_preemptions), (5, 5, 1), "{f:?}");
        assert!(!f.poor && f.not_reproduced.is_empty());
        assert_eq!(replay.report.by_qos["training"].preempted, 1);
        assert!(replay.report.by_qos.contains_key("inference"));
        assert_eq!(replay.report.unfinished, 0, "{:?}", replay.report.unfinished_jobs);
    }

    #[test]
    fn fidelity_names_what_the_replay_did_not_reproduce() {
        let mut trace = day();
        // Recorded: inference waited a minute more, and job 4 never started.
        trace.jobs[2].recorded.starts = vec![T0 + 72_000];
        trace.jobs[3].recorded.starts.clear();
        trace.jobs[0].recorded.preemptions = 3;
        let replay = simulate_history(&trace, &Policy::default(), &SimConfig::default());
        let f = fidelity(&trace, &replay);
        assert_eq!(f.reproduced, 3);
        assert!(f.poor, "two of five missed");
        assert_eq!(f.not_reproduced.len(), 2);
        assert_eq!(f.not_reproduced[0].id, 4, "never started there: worst first");
        assert!(f.not_reproduced[0].why.starts_with("started in the replay but never on the cluster"));
        assert!(f.not_reproduced[1].why.starts_with("started 60.0 s earlier than recorded"), "{f:?}");
        assert_eq!((f.recorded_preemptions, f.replayed_preemptions), (3, 1));
        assert!(f.summary().starts_with("POOR fidelity: 3/5"), "{}", f.summary());
    }

    #[test]
    fn a_window_with_node_changes_and_no_jobs_replays_to_an_empty_report() {
        // A quiet week (a fresh cluster): nodes came and went, nothing was submitted.
        let mut trace = day();
        trace.jobs.clear();
        let replay = simulate_history(&trace, &Policy::default(), &SimConfig::default());
        assert!(replay.starts.is_empty());
        assert_eq!((replay.report.unfinished, replay.preemptions), (0, 0));
        assert_eq!(replay.report.utilization, 0.0);
        assert_eq!(fidelity(&trace, &replay).compared, 0);
    }
}
