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

use crate::guarantee::Guarantees;
use crate::limits::{Usage, UsageKey};
use crate::model::{Job, JobId, JobState};
use crate::policy::{Partition, Qos};
use crate::priority::{Of, Prioritizer};
use crate::reasons::PendingReason;
use crate::state::brief::{Index, NO_MODEL};
use crate::state::{limit_ms, ClusterState};

/// One pending job in the queue: what the pass asks of every pending job, so the pass looks
/// the job itself up only to place it.
pub(crate) struct Queued<'a> {
    pub id: JobId,
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
    /// CPUs and memory per task.
    pub cpu_mem: crate::model::CpuMem,
    /// The array it is a task of, and how many of its tasks may run at once.
    pub array: Option<(JobId, u32)>,
    /// Its fairshare account (team guarantees are counted by it).
    pub account: &'a str,
    /// It runs in a reservation: only on its resources (`planner::windows`).
    pub in_reservation: bool,
}

/// What one scan of the jobs gives a planning pass.
pub(crate) struct Scan<'a> {
    entries: Vec<Queued<'a>>,
    /// (`order_key`: guaranteed before borrowing, higher priority first, then job id; entry):
    /// unique, so one order.
    order: Vec<(u128, u32)>,
    /// GPUs and jobs the running and suspended work holds under QoS limits; the keys of the
    /// pending jobs' pairs are in it too (at zero until one runs).
    pub usage: Usage,
    /// Running elastic jobs (single-node or gang), in id order: the ones that may grow back.
    pub elastic: Vec<&'a Job>,
    /// Running (or suspended) tasks of each array that limits them.
    pub array_running: std::collections::HashMap<JobId, u32, crate::limits::Fixed>,
    /// The team guarantees and what each team holds (inactive when no account has one).
    pub guarantees: Guarantees,
}

impl<'a> Scan<'a> {
    /// Pending jobs in the order the planner considers them, with their entry numbers.
    pub fn queue(&self) -> impl Iterator<Item = (usize, &Queued<'a>)> + '_ {
        self.order.iter().map(|(_, i)| (*i as usize, &self.entries[*i as usize]))
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

/// A pending job's place in the queue as one integer, so the pass's sort of 100k jobs compares
/// one number: not borrowing first, then higher priority, then lower job id (submit order).
/// Ids count up from 1: one past 2^63 (never issued) would lose its top bit and sort among the
/// smallest ids of its priority (still one order: the entry number breaks a tie).
fn order_key(borrows: bool, priority: i64, id: JobId) -> u128 {
    // Ascending keys: the priority biased to unsigned (order kept), then inverted (highest first).
    let descending = !((priority as u64) ^ (1 << 63));
    (u128::from(borrows) << 127) | (u128::from(descending) << 63) | u128::from(id & ((1 << 63) - 1))
}

/// Scans the unfinished jobs' briefs once: the queue by multifactor priority, then submit order
/// — with team guarantees, the jobs within their team's guarantee first (Kueue and KAI admit
/// what does not borrow first), borrowers after them by priority (fairshare among them).
pub(crate) fn scan<'a>(state: &'a ClusterState, index: &'a Index) -> Scan<'a> {
    let prioritizer = Prioritizer::new(state);
    let policy = &state.policy;
    // Each interned name looked up once per pass, then by number.
    let names = index.names.names();
    let qos_of: Vec<Option<&Qos>> = names.iter().map(|n| policy.qos(n)).collect();
    let default_part = policy.partitions.get(&policy.default_partition);
    let part_of: Vec<Option<&Partition>> =
        names.iter().map(|n| if n.is_empty() { default_part } else { policy.partitions.get(n) }).collect();
    // The priority's partition factor counts only a partition the job names.
    let tier_of: Vec<Option<u32>> =
        names.iter().map(|n| policy.partitions.get(n).map(|p| p.priority_tier)).collect();
    let fairshare_of: Vec<u64> = names.iter().map(|n| prioritizer.fairshare_of(n)).collect();
    let (mut usage, mut keys) = index.usage(policy);
    let guarantees = state.guarantees();
    let mut entries = Vec::with_capacity(index.briefs.len());
    let mut order = Vec::with_capacity(index.briefs.len());
    let mut elastic = Vec::new();
    let mut array_running = std::collections::HashMap::default();
    for (&id, b) in &index.briefs {
        if let (Some((array, _)), JobState::Running | JobState::Suspended) = (b.array, b.state) {
            *array_running.entry(array).or_insert(0) += 1;
        }
        let qos = qos_of[b.qos as usize];
        match b.state {
            JobState::Pending => {
                let part = part_of[b.partition as usize];
                let of = Of {
                    qos,
                    tier: tier_of[b.partition as usize],
                    fairshare: fairshare_of[b.account as usize],
                    submit_time_ms: b.submit_time_ms,
                    gpus: b.spec_gpus,
                };
                let priority = prioritizer.compute(&of).priority;
                let waits = if b.held {
                    Some(Box::new(PendingReason::JobHeldUser))
                } else if b.has_deps {
                    state.jobs.get(&id).and_then(|j| state.dependency_state(j).err()).map(Box::new)
                } else {
                    None
                };
                let account = names[b.account as usize].as_str();
                let borrows = guarantees.active() && !guarantees.within(account, u64::from(b.total_gpus()));
                order.push((order_key(borrows, priority, id), entries.len() as u32));
                entries.push(Queued {
                    id,
                    qos,
                    part,
                    limit_ms: limit_ms(b.time_limit_s(), qos, part),
                    usage: keys.key(&mut usage, b),
                    waits,
                    model: (b.model != NO_MODEL).then(|| names[b.model as usize].as_str()),
                    claimed: b.claimed,
                    gpus: b.gpus,
                    tasks: b.tasks,
                    total_gpus: b.total_gpus(),
                    cpu_mem: b.cpu_mem,
                    array: b.array,
                    account,
                    in_reservation: b.in_reservation,
                });
            }
            JobState::Running if b.elastic => elastic.extend(state.jobs.get(&id)),
            _ => {}
        }
    }
    order.sort_unstable();
    Scan { entries, order, usage, elastic, array_running, guarantees }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;

    use super::*;
    use crate::limits::Usage;
    use crate::state::{Command, Op, Outcome};
    use crate::testing::{node_info, spec};

    #[test]
    fn the_scan_orders_by_priority_then_id_and_counts_usage_like_a_walk_of_the_running_jobs() {
        let mut s = ClusterState::new();
        s.apply(&Command { skipped_ms: 0, now_ms: 1, op: Op::RegisterNode { info: node_info("a", 4) } });
        let mut policy = s.policy.clone();
        policy.qos.get_mut("batch").expect("default qos").user_gpus = Some(8);
        s.apply(&Command { skipped_ms: 0, now_ms: 1, op: Op::SetPolicy { policy, audit: None } });
        let mut ids = Vec::new();
        for (i, qos) in ["batch", "inference", "batch", "inference", "batch"].iter().enumerate() {
            let op = Op::Submit {
                spec: spec(1 + (i as u32 % 2), qos),
                request_id: None,
                hold: false,
                limits: None,
            };
            match s.apply(&Command { skipped_ms: 0, now_ms: 2 + i as i64, op }) {
                Outcome::Submitted { job } => ids.push(job),
                other => panic!("{other:?}"),
            }
        }
        let plan = crate::plan(&s).plan;
        assert!(!plan.placements.is_empty());
        s.apply(&Command { skipped_ms: 0, now_ms: 10, op: Op::ApplyPlan { plan } });
        let index = crate::state::brief::JobIndex::build(&s.jobs);
        let scan = scan(&s, &index);
        // Usage from the scan equals usage counted over the running jobs.
        assert_eq!(scan.usage, Usage::of(s.jobs_running(), &s.policy));
        // The queue holds exactly the pending jobs, by priority (descending), then id.
        let p = Prioritizer::new(&s);
        let queue: Vec<(i64, JobId)> =
            scan.queue().map(|(_, q)| (p.priority(&s.jobs[&q.id]), q.id)).collect();
        let mut want: Vec<(i64, JobId)> =
            s.jobs.values().filter(|j| j.state == JobState::Pending).map(|j| (p.priority(j), j.id)).collect();
        want.sort_by_key(|(pr, id)| (Reverse(*pr), *id));
        assert_eq!(queue, want);
        assert!(!queue.is_empty(), "some jobs must still wait for the test to mean anything");
    }

    #[test]
    fn the_order_key_sorts_as_borrowing_then_priority_descending_then_id() {
        let priorities = [i64::MIN, -7, -1, 0, 1, 42, i64::MAX - 1, i64::MAX];
        let mut jobs = Vec::new();
        for (i, p) in priorities.iter().enumerate() {
            for id in [1, 2, 1 << 40, (1 << 63) - 1] {
                jobs.push((i % 3 == 0, *p, id));
            }
        }
        let mut by_key = jobs.clone();
        by_key.sort_by_key(|(b, p, id)| order_key(*b, *p, *id));
        let mut want = jobs;
        want.sort_by_key(|(b, p, id)| (*b, Reverse(*p), *id));
        assert_eq!(by_key, want);
    }
}
