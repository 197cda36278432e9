//! Accounting history and retention: finished jobs leave the live state through a committed
//! purge and remain as compact records, bounded in number and age.
//!
//! The leader proposes `Op::PurgeJobs` for jobs finished longer ago than the retention
//! (`purge_due`, pure; `kairosd --job-retention`, like Slurm's MinJobAge); apply re-checks each
//! job (finished, and for long enough by the command's own time), moves it into `History` as a
//! `JobRecord`, forgets its submit request id, and evicts records past the history's bounds
//! (oldest first). Every replica applies the same purges in the same order, so the history is
//! the same on every replica, survives failover, and travels in snapshots; the live job table
//! holds only unfinished and recently finished jobs.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::{Job, JobId, JobState};
pub use crate::state::history_runs::{HoldWindow, Replay, RunWindow};
use crate::state::{ClusterState, Op, Outcome};

/// Most jobs one purge command moves.
pub const PURGE_BATCH_MAX: usize = 1_000;

/// How long finished jobs stay live, and how much history is kept (stamped into every purge,
/// so every replica applies the same bounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// A finished job leaves the live state this long after it ended.
    pub job_ms: i64,
    /// At most this many records (the oldest go first).
    pub history_max_jobs: u32,
    /// Records of jobs that ended longer ago than this are dropped.
    pub history_max_age_ms: i64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { job_ms: 5 * 60_000, history_max_jobs: 100_000, history_max_age_ms: 90 * 86_400_000 }
    }
}

/// What the history keeps of a finished job (what `kairos history` shows, like `sacct`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    pub name: String,
    pub user: String,
    pub account: String,
    pub partition: String,
    pub qos: String,
    pub state: JobState,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// GPUs of the last run (all tasks).
    pub gpus: u32,
    /// Node of the last run (rank 0).
    pub node: String,
    pub submit_ms: i64,
    pub start_ms: Option<i64>,
    pub end_ms: i64,
    /// Attempts it took (1 + requeues).
    pub attempts: u32,
    /// Times it was preempted.
    pub preemptions: u32,
    /// GPU-seconds of the last run: its GPUs × its wall time.
    pub gpu_seconds: u64,
    /// An array task's array (its first task's id) and index (sacct's `JobID` `A_i`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<(JobId, u32)>,
    /// CPUs and memory (MiB) it asked for, per task (sacct's ReqCPUS, ReqMem).
    #[serde(default)]
    pub req_cpus: u32,
    #[serde(default)]
    pub req_mem_mib: u64,
    /// What its runs used, all attempts and tasks, as its agents measured it (sacct's MaxRSS
    /// and TotalCPU, the GPU figures of `TRESUsageIn*`); flat, as earlier records kept
    /// `max_rss_kib` and `cpu_ms`.
    #[serde(flatten)]
    pub used: crate::model::RunUsage,
    /// The wall-clock limit it ran under (s; 0: none), its profile, GPU fraction (thousandths)
    /// and tasks.
    #[serde(default)]
    pub time_limit_s: u64,
    #[serde(default)]
    pub profile: crate::model::Profile,
    #[serde(default)]
    pub gpu_milli: u32,
    #[serde(default)]
    pub tasks: u32,
    /// What the idle GPU watch said of it (empty: never idle).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub idle_note: String,
    /// What a replay of the history needs of it (`history_runs`).
    #[serde(rename = "rp", default, skip_serializing_if = "Replay::is_empty")]
    pub replay: Replay,
}

impl JobRecord {
    /// The record of finished job `job`, which ran under a wall-clock limit of `time_limit_s`.
    pub fn of(job: &Job, time_limit_s: u64) -> JobRecord {
        let end_ms = job.end_time_ms.unwrap_or(job.submit_time_ms);
        let gpus = job.total_gpus();
        let ran_ms = job.start_time_ms.map_or(0, |s| (end_ms - s).max(0));
        let preemptions = job.events.iter().filter(|e| e.kind == "preempted").count() as u32;
        JobRecord {
            id: job.id,
            name: job.spec.name.clone(),
            user: job.spec.user.clone(),
            account: job.spec.account.clone(),
            partition: job.spec.partition.clone(),
            qos: job.spec.qos.clone(),
            state: job.state,
            reason: job.reason.clone(),
            exit_code: job.exit_code,
            signal: job.signal,
            gpus,
            node: job.last_node.clone(),
            submit_ms: job.submit_time_ms,
            start_ms: job.start_time_ms,
            end_ms,
            attempts: job.attempt + 1,
            preemptions: preemptions.max(job.preempted_at.len() as u32),
            gpu_seconds: u64::from(gpus) * (ran_ms as u64) / 1000,
            array: job.spec.array.as_ref().filter(|a| a.id != 0).map(|a| (a.id, a.index)),
            req_cpus: job.spec.cpus,
            req_mem_mib: job.spec.mem_mib,
            used: job.usage.unwrap_or_default(),
            time_limit_s,
            profile: job.spec.profile,
            gpu_milli: job.spec.gpu_milli,
            tasks: job.spec.tasks,
            idle_note: job
                .events
                .iter()
                .rev()
                .find(|e| e.kind == "gpu idle")
                .map(|e| e.message.clone())
                .unwrap_or_default(),
            replay: Replay::of(job),
        }
    }
}

/// Records of purged jobs, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct History {
    records: BTreeMap<JobId, JobRecord>,
}

impl History {
    pub fn get(&self, id: JobId) -> Option<&JobRecord> {
        self.records.get(&id)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Every record, by ascending id.
    pub fn iter(&self) -> impl Iterator<Item = &JobRecord> {
        self.records.values()
    }

    /// Records with ids above `after`, ascending (pages).
    pub fn after(&self, after: JobId) -> impl Iterator<Item = &JobRecord> {
        self.records.range(after.saturating_add(1)..).map(|(_, r)| r)
    }

    /// Drops records that ended before `now - max_age`, then the oldest (by end time, then id)
    /// past `max_jobs`.
    fn evict(&mut self, now: i64, retention: &Retention) {
        let cutoff = now.saturating_sub(retention.history_max_age_ms);
        self.records.retain(|_, r| r.end_ms >= cutoff);
        let excess = self.records.len().saturating_sub(retention.history_max_jobs as usize);
        if excess == 0 {
            return;
        }
        let mut by_age: Vec<(i64, JobId)> = self.records.values().map(|r| (r.end_ms, r.id)).collect();
        by_age.select_nth_unstable(excess - 1);
        for (_, id) in &by_age[..excess] {
            self.records.remove(id);
        }
    }
}

/// The jobs of `state` due for purging at `now` (finished at least `retention.job_ms` ago), as
/// one command of at most `PURGE_BATCH_MAX` of them (`None`: nothing is due).
pub fn purge_due(state: &ClusterState, now: i64, retention: &Retention) -> Option<Op> {
    let due: Vec<JobId> = state
        .jobs
        .values()
        .filter(|j| {
            j.state.is_terminal() && j.end_time_ms.is_some_and(|e| e.saturating_add(retention.job_ms) <= now)
        })
        .map(|j| j.id)
        .take(PURGE_BATCH_MAX)
        .collect();
    (!due.is_empty()).then_some(Op::PurgeJobs { jobs: due, retention: *retention })
}

impl ClusterState {
    /// Moves the finished jobs among `ids` that ended at least the retention before `now` into
    /// the history (others are left alone: the command may be stale), forgets their submit
    /// request ids, and bounds the history.
    pub(crate) fn purge_jobs(&mut self, ids: &[JobId], retention: &Retention, now: i64) -> Outcome {
        let mut purged = 0u32;
        let mut users = BTreeSet::new();
        for id in ids.iter().take(PURGE_BATCH_MAX) {
            let due = self.jobs.get(id).is_some_and(|j| {
                j.state.is_terminal()
                    && j.end_time_ms.is_some_and(|e| e.saturating_add(retention.job_ms) <= now)
            });
            if !due {
                continue;
            }
            if let Some(job) = self.jobs.remove(id) {
                users.insert(job.spec.user.clone());
                let limit = self.time_limit_s(&job).unwrap_or(0);
                self.history.records.insert(job.id, JobRecord::of(&job, limit));
                purged += 1;
            }
        }
        for user in users {
            if let Some(requests) = self.submit_requests.get_mut(&user) {
                requests.retain(|_, job| self.jobs.contains_key(job));
                if requests.is_empty() {
                    self.submit_requests.remove(&user);
                }
            }
        }
        self.history.evict(now, retention);
        Outcome::Purged { jobs: purged }
    }

    /// The state of job `id`, live or in the history.
    pub fn job_state(&self, id: JobId) -> Option<JobState> {
        self.jobs.get(&id).map(|j| j.state).or_else(|| self.history.get(id).map(|r| r.state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JobSpec;
    use crate::state::Command;

    fn apply(s: &mut ClusterState, now: i64, op: Op) -> Outcome {
        s.apply(&Command { skipped_ms: 0, now_ms: now, op })
    }

    fn submit(s: &mut ClusterState, now: i64, request: &str) -> JobId {
        let spec = JobSpec::new("j", "alice", vec!["true".into()], 1);
        match apply(s, now, Op::Submit { spec, request_id: Some(request.into()), hold: true, limits: None }) {
            Outcome::Submitted { job } => job,
            other => panic!("{other:?}"),
        }
    }

    fn retention(job_ms: i64, max_jobs: u32) -> Retention {
        Retention { job_ms, history_max_jobs: max_jobs, history_max_age_ms: 1_000_000 }
    }

    #[test]
    fn finished_jobs_move_to_the_history_after_the_retention_and_nothing_else_does() {
        let mut s = ClusterState::new();
        let done = submit(&mut s, 1_000, "a");
        let waiting = submit(&mut s, 1_000, "b");
        apply(&mut s, 2_000, Op::Cancel { job: done, by: "alice".into() });
        let r = retention(10_000, 100);
        assert_eq!(purge_due(&s, 11_999, &r), None, "not finished long enough");
        let op = purge_due(&s, 12_000, &r).expect("due");
        assert_eq!(op, Op::PurgeJobs { jobs: vec![done], retention: r });
        // A stale or forged purge naming an unfinished job, or one too early, moves nothing.
        let forged = Op::PurgeJobs { jobs: vec![waiting, done], retention: r };
        assert_eq!(apply(&mut s.clone(), 5_000, forged.clone()), Outcome::Purged { jobs: 0 });
        assert_eq!(apply(&mut s, 12_000, forged), Outcome::Purged { jobs: 1 });
        assert!(!s.jobs.contains_key(&done) && s.jobs.contains_key(&waiting));
        let record = s.history.get(done).expect("in the history");
        assert_eq!(
            (record.state, record.end_ms, record.user.as_str()),
            (JobState::Cancelled, 2_000, "alice")
        );
        assert_eq!(s.job_state(done), Some(JobState::Cancelled));
        // Its request id is forgotten with it; the waiting job's is kept.
        assert_eq!(s.submit_requests["alice"].values().copied().collect::<Vec<_>>(), vec![waiting]);
        assert_eq!(s.check_invariants(), Ok(()));
    }

    #[test]
    fn the_history_keeps_the_newest_within_its_bounds() {
        let mut s = ClusterState::new();
        let ids: Vec<JobId> = (0..5).map(|i| submit(&mut s, 0, &format!("r{i}"))).collect();
        for (i, id) in ids.iter().enumerate() {
            apply(&mut s, 1_000 + i as i64, Op::Cancel { job: *id, by: "alice".into() });
        }
        let r = retention(0, 3);
        apply(&mut s, 10_000, Op::PurgeJobs { jobs: ids.clone(), retention: r });
        let kept: Vec<JobId> = s.history.iter().map(|r| r.id).collect();
        assert_eq!(kept, ids[2..].to_vec(), "the three that ended last");
        // Age: everything that ended more than 8.996 s before now (10 s) goes: the jobs that
        // ended at 1.002 and 1.003 s.
        let aged = Retention { history_max_age_ms: 8_996, ..r };
        apply(&mut s, 10_000, Op::PurgeJobs { jobs: vec![], retention: aged });
        assert_eq!(s.history.iter().map(|r| r.id).collect::<Vec<_>>(), ids[4..].to_vec());
    }

    #[test]
    fn a_dependency_on_a_purged_job_is_judged_by_its_record() {
        let mut s = ClusterState::new();
        let first = submit(&mut s, 0, "a");
        apply(&mut s, 1, Op::Cancel { job: first, by: "alice".into() });
        apply(&mut s, 10, Op::PurgeJobs { jobs: vec![first], retention: retention(0, 10) });
        let mut spec = JobSpec::new("after", "alice", vec!["true".into()], 1);
        spec.after_ok = vec![first];
        let Outcome::Submitted { job } =
            apply(&mut s, 20, Op::Submit { spec, request_id: None, hold: false, limits: None })
        else {
            panic!("a dependency on a purged job is accepted")
        };
        assert_eq!(
            s.dependency_state(&s.jobs[&job]),
            Err(crate::reasons::PendingReason::DependencyNeverSatisfied(first))
        );
    }
}
