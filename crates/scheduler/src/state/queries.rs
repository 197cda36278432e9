//! Read-only questions about the state that the planner, apply and the server share.

use super::*;
use crate::policy::Partition;

impl ClusterState {
    /// The largest GPU count of any registered node (0 when there is none).
    pub fn largest_node_gpus(&self) -> u32 {
        self.largest_node_gpus
    }

    pub(crate) fn refresh_largest_node(&mut self) {
        self.largest_node_gpus = self.nodes.values().map(Node::gpu_count).max().unwrap_or(0);
    }

    /// A job's effective wall-clock limit in seconds.
    /// Without its own limit a job gets the tighter of its QoS's and its partition's max wall.
    pub fn time_limit_s(&self, job: &Job) -> Option<u64> {
        limit_s(job.spec.time_limit_s, self.policy.qos(&job.spec.qos), self.partition_of(job))
    }

    /// GPUs and jobs the running and suspended work holds under QoS limits: read from the job
    /// index when it is current (O(unfinished briefs)), else counted from the jobs.
    pub(crate) fn running_usage(&self) -> Usage {
        let count = || Usage::of(self.jobs_running(), &self.policy);
        self.job_index.running_usage(&self.jobs, count, &self.policy)
    }

    /// The jobs with a run on `node` (holding GPUs there, or suspended there), in id order:
    /// O(GPUs of the node + suspended jobs), not O(jobs).
    pub fn jobs_on(&self, node: &str) -> Vec<&Job> {
        let Some(n) = self.nodes.get(node) else { return Vec::new() };
        let mut ids: BTreeSet<JobId> = n.allocated.values().copied().collect();
        ids.extend(n.held.keys());
        ids.extend(self.suspended.iter().filter(|id| {
            self.jobs.get(id).and_then(|j| j.allocation.as_ref()).is_some_and(|a| a.node == node)
        }));
        ids.iter().filter_map(|id| self.jobs.get(id)).collect()
    }

    /// The jobs with a run (running or suspended: a suspended job keeps its QoS usage), found
    /// through the nodes' GPU maps: O(running), not O(jobs).
    pub fn jobs_running(&self) -> impl Iterator<Item = &Job> {
        let mut ids: Vec<JobId> = self.nodes.values().flat_map(|n| n.allocated.values().copied()).collect();
        ids.extend(self.nodes.values().flat_map(|n| n.held.keys().copied()));
        ids.extend(self.suspended.iter().copied());
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().filter_map(|id| self.jobs.get(&id))
    }

    /// Pending jobs promised GPUs (preemptors, through the nodes' claims): O(claims).
    pub fn claimants(&self) -> impl Iterator<Item = &Job> {
        let mut ids: Vec<JobId> = self.nodes.values().flat_map(|n| n.claimed.values().copied()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().filter_map(|id| self.jobs.get(&id)).filter(|j| j.state == JobState::Pending)
    }

    /// GPU fragmentation of the Up nodes: (free GPUs, free GPUs on nodes that are entirely
    /// free). Packing small jobs keeps the second close to the first, so whole nodes stay
    /// available for large jobs.
    pub fn fragmentation(&self) -> (u32, u32) {
        let up = self.nodes.values().filter(|n| n.state == NodeState::Up);
        up.fold((0, 0), |(free, whole), n| {
            let f = n.free_gpu_count();
            (free + f, whole + if n.allocated.is_empty() { f } else { 0 })
        })
    }

    /// Whether any Up node has a free GPU (if not, only a job asking for no GPU can start).
    pub fn has_free_gpus(&self) -> bool {
        self.nodes.values().any(|n| n.state == NodeState::Up && n.free_gpu_count() > 0)
    }

    /// Whether any Up node has a healthy GPU that fractions share with room for another.
    pub fn has_shared_room(&self) -> bool {
        self.nodes.values().any(|n| {
            n.state == NodeState::Up
                && n.shared.keys().any(|g| n.healthy(*g) && n.shared_milli(*g) < crate::model::GPU_MILLI)
        })
    }

    /// Whether any Up node has a CPU no job holds.
    pub fn has_free_cpus(&self) -> bool {
        self.nodes.values().any(|n| n.state == NodeState::Up && n.free_cpu_mem().cpus > 0)
    }

    /// The partition a job runs in (None only for jobs from before partitions existed).
    pub fn partition_of(&self, job: &Job) -> Option<&crate::policy::Partition> {
        let name =
            if job.spec.partition.is_empty() { &self.policy.default_partition } else { &job.spec.partition };
        self.policy.partitions.get(name)
    }

    /// A job's time limit in milliseconds (its QoS maximum when it set none; a year at most).
    /// Whether `job` asks for more time than its partition allows (it waits:
    /// `PendingReason::PartitionTimeLimit`; a placement of it is refused).
    pub fn over_partition_wall(&self, job: &Job) -> bool {
        let part = self.partition_of(job);
        over_wall(part, limit_ms(job.spec.time_limit_s, self.policy.qos(&job.spec.qos), part))
    }

    pub fn time_limit_ms(&self, job: &Job) -> i64 {
        limit_ms(job.spec.time_limit_s, self.policy.qos(&job.spec.qos), self.partition_of(job))
    }

    /// When a running job will have ended at the latest: its start plus its time limit (plus
    /// the time it spent suspended).
    pub fn expected_end_ms(&self, job: &Job) -> i64 {
        job.start_time_ms
            .unwrap_or(self.now_ms)
            .saturating_add(self.time_limit_ms(job))
            .saturating_add(self.uncounted_ms(job, self.now_ms))
    }

    /// Time since the current run of `job` started that does not count against its limit:
    /// what it spent suspended, and what the timeline skipped meanwhile (`crate::clock`).
    fn uncounted_ms(&self, job: &Job, now_ms: i64) -> i64 {
        let skipped = self.skipped_ms.saturating_sub(job.skipped_at_start_ms).max(0);
        self.suspended_ms(job, now_ms).saturating_add(skipped)
    }

    /// How long the current run of `job` has been suspended in all, at `now_ms`.
    pub(super) fn suspended_ms(&self, job: &Job, now_ms: i64) -> i64 {
        job.suspended_ms.saturating_add(job.suspended_since.map_or(0, |t| now_ms.saturating_sub(t)))
    }

    /// Running jobs past their time limit at `now_ms` that have not been asked to stop yet.
    pub fn expired_runs(&self, now_ms: i64) -> Vec<(JobId, u32)> {
        let running: BTreeSet<JobId> =
            self.nodes.values().flat_map(|n| n.allocated.values().copied()).collect();
        running
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|j| j.state == JobState::Running)
            .filter(|j| j.allocation.as_ref().is_some_and(|a| a.stop.is_none()))
            .filter(|j| self.past_limit(j, now_ms))
            .map(|j| (j.id, j.attempt))
            .collect()
    }

    pub(super) fn past_limit(&self, job: &Job, now_ms: i64) -> bool {
        match (self.time_limit_s(job), job.start_time_ms) {
            (Some(limit_s), Some(start)) => {
                // Time spent suspended, or skipped by the timeline, does not count.
                now_ms.saturating_sub(start).saturating_sub(self.uncounted_ms(job, now_ms))
                    >= (limit_s as i64).saturating_mul(1000)
            }
            _ => false,
        }
    }
}

/// A job's effective wall-clock limit in seconds from its own (`own`), its QoS and partition already looked up
/// (`ClusterState::time_limit_s`; the planner resolves names once per pass).
pub(crate) fn limit_s(own: Option<u64>, qos: Option<&Qos>, part: Option<&Partition>) -> Option<u64> {
    own.or_else(|| match (qos.map(|q| q.max_wall_s), part.and_then(|p| p.max_wall_s)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// `limit_s` in milliseconds (a year at most).
pub(crate) fn limit_ms(own: Option<u64>, qos: Option<&Qos>, part: Option<&Partition>) -> i64 {
    let secs = limit_s(own, qos, part).unwrap_or(crate::validate::TIME_LIMIT_S_MAX);
    (secs.min(crate::validate::TIME_LIMIT_S_MAX) as i64).saturating_mul(1000)
}

/// Whether a limit of `limit_ms` is longer than `part` allows.
pub(crate) fn over_wall(part: Option<&Partition>, limit_ms: i64) -> bool {
    part.and_then(|p| p.max_wall_s).is_some_and(|max| limit_ms > (max as i64).saturating_mul(1000))
}
