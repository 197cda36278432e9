//! The pending queue of one planning pass, from one sequential scan of the jobs.
//!
//! A pass has to look at every job. Reading them once, in the map's (id) order, and keeping
//! what the pass needs in compact entries is what keeps a pass over 100k pending jobs cheap:
//! each job's QoS and partition are looked up once, the sort compares integers held in the
//! entries (never a job behind a pointer), and the running work's QoS usage and the running
//! elastic jobs come from the same scan instead of a walk of their own.
//!
//! ```text
//!   jobs (id order) ──scan──▶ Scan { queue (priority, then id), usage, elastic }
//! ```

use std::cmp::Reverse;

use crate::limits::{is_limited, Usage, UsageKey};
use crate::model::{Job, JobId, JobState};
use crate::planner::PendingReason;
use crate::policy::{Partition, Qos};
use crate::priority::Prioritizer;
use crate::state::{limit_ms, ClusterState};

/// One pending job in the queue: what the pass asks of every pending job, read in the scan so
/// the pass touches the job itself only to place it.
pub(crate) struct Queued<'a> {
    pub id: JobId,
    pub job: &'a Job,
    pub qos: Option<&'a Qos>,
    /// The partition it runs in (the default one when it names none).
    pub part: Option<&'a Partition>,
    /// Its wall-clock limit, QoS and partition defaults applied.
    pub limit_ms: i64,
    /// Its counters under its QoS's limits (None: its QoS has none).
    pub usage: Option<UsageKey>,
    /// Held, or waiting on a dependency: why it waits before anything else is asked.
    pub waits: Option<Box<PendingReason>>,
    pub model: Option<&'a str>,
    /// A preemptor (or resized job) that starts only on its claimed GPUs.
    pub claimed: bool,
    /// GPUs per task, tasks, and GPUs of all tasks.
    pub gpus: u32,
    pub tasks: u32,
    pub total_gpus: u32,
}

/// What one scan of the jobs gives a planning pass.
pub(crate) struct Scan<'a> {
    entries: Vec<Queued<'a>>,
    /// (higher priority first, then submit order, entry): unique keys, so one order.
    order: Vec<(Reverse<i64>, JobId, u32)>,
    /// GPUs and jobs the running and suspended work holds under QoS limits; the keys of the
    /// pending jobs' pairs are in it too (at zero until one runs).
    pub usage: Usage,
    /// Running elastic jobs (single-node or gang), in id order: the ones that may grow back.
    pub elastic: Vec<&'a Job>,
}

impl<'a> Scan<'a> {
    /// Pending jobs in the order the planner considers them, with their entry numbers.
    pub fn queue(&self) -> impl Iterator<Item = (usize, &Queued<'a>)> + '_ {
        self.order.iter().map(|(_, _, i)| (*i as usize, &self.entries[*i as usize]))
    }

    /// How many pending jobs (entries) there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The pending jobs' ids by entry number (ascending).
    pub fn ids(&self) -> impl Iterator<Item = JobId> + '_ {
        self.entries.iter().map(|q| q.id)
    }
}

/// Scans the jobs once: the queue by multifactor priority, then submit order.
pub(crate) fn scan(state: &ClusterState) -> Scan<'_> {
    let prioritizer = Prioritizer::new(state);
    let policy = &state.policy;
    let limited = policy.qos.values().any(is_limited);
    // Room for every job up front (pages never written cost nothing): no regrowth mid-scan.
    let (entries, order) = (Vec::with_capacity(state.jobs.len()), Vec::with_capacity(state.jobs.len()));
    let mut out = Scan { entries, order, usage: Usage::default(), elastic: Vec::new() };
    for job in state.jobs.values() {
        match job.state {
            JobState::Pending => {
                let qos = policy.qos(&job.spec.qos);
                let part = state.partition_of(job);
                // The priority's partition factor counts only a partition the job names.
                let tier = (!job.spec.partition.is_empty()).then(|| part.map(|p| p.priority_tier)).flatten();
                let priority = prioritizer.factors_under(job, qos, tier).priority;
                let waits = if job.held {
                    Some(Box::new(PendingReason::JobHeldUser))
                } else if job.spec.after_ok.is_empty() {
                    None
                } else {
                    state.dependency_state(job).err().map(Box::new)
                };
                let usage = qos.filter(|q| is_limited(q)).map(|q| out.usage.key(job, q));
                out.order.push((Reverse(priority), job.id, out.entries.len() as u32));
                out.entries.push(Queued {
                    id: job.id,
                    job,
                    qos,
                    part,
                    limit_ms: limit_ms(job, qos, part),
                    usage,
                    waits,
                    model: job.spec.gpu_model.as_deref(),
                    gpus: job.gpus(),
                    tasks: job.tasks(),
                    total_gpus: job.total_gpus(),
                    claimed: job.claim.is_some(),
                });
            }
            // A suspended job still holds its place under the limits: it resumes without asking.
            JobState::Running | JobState::Suspended => {
                if limited {
                    out.usage.add(job, policy);
                }
                if job.state == JobState::Running && (job.spec.is_elastic() || job.spec.is_elastic_gang()) {
                    out.elastic.push(job);
                }
            }
            _ => {}
        }
    }
    out.order.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Usage;
    use crate::state::{Command, Op, Outcome};
    use crate::testing::{node_info, spec};

    #[test]
    fn the_scan_orders_by_priority_then_id_and_counts_usage_like_a_walk_of_the_running_jobs() {
        let mut s = ClusterState::new();
        s.apply(&Command { now_ms: 1, op: Op::RegisterNode { info: node_info("a", 4) } });
        let mut policy = s.policy.clone();
        policy.qos.get_mut("batch").expect("default qos").user_gpus = Some(8);
        s.apply(&Command { now_ms: 1, op: Op::SetPolicy { policy } });
        let mut ids = Vec::new();
        for (i, qos) in ["batch", "inference", "batch", "inference", "batch"].iter().enumerate() {
            let op = Op::Submit {
                spec: spec(1 + (i as u32 % 2), qos),
                request_id: None,
                hold: false,
                limits: None,
            };
            match s.apply(&Command { now_ms: 2 + i as i64, op }) {
                Outcome::Submitted { job } => ids.push(job),
                other => panic!("{other:?}"),
            }
        }
        let plan = crate::plan(&s).plan;
        assert!(!plan.placements.is_empty());
        s.apply(&Command { now_ms: 10, op: Op::ApplyPlan { plan } });
        let scan = scan(&s);
        // Usage from the scan equals usage counted over the running jobs.
        assert_eq!(scan.usage, Usage::of(s.jobs_running(), &s.policy));
        // The queue holds exactly the pending jobs, by priority (descending), then id.
        let p = Prioritizer::new(&s);
        let queue: Vec<(i64, JobId)> = scan.queue().map(|(_, q)| (p.priority(q.job), q.job.id)).collect();
        let mut want: Vec<(i64, JobId)> =
            s.jobs.values().filter(|j| j.state == JobState::Pending).map(|j| (p.priority(j), j.id)).collect();
        want.sort_by_key(|(pr, id)| (Reverse(*pr), *id));
        assert_eq!(queue, want);
        assert!(!queue.is_empty(), "some jobs must still wait for the test to mean anything");
    }
}
