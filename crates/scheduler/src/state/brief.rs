//! The planner's compact view of the unfinished jobs, kept up to date by apply.
//!
//! A planning pass asks the same few things of every pending job (its QoS, partition, account,
//! size, limits, whether it is held). Reading them from the full job records means touching
//! scattered 800-byte records and the heap strings behind them for 100k jobs per pass; the
//! index keeps one small `Brief` per unfinished job, names interned to numbers, so a pass reads
//! a compact, ordered table instead.
//!
//! Kept by apply: every command refreshes the briefs of exactly the jobs it handed out mutably
//! (`state::Jobs` records them). It is a cache — never serialized, equal to any other, built
//! in full when missing (a state read from a snapshot) — and `check_invariants` compares it
//! with a fresh build, so the property tests catch any drift.
//!
//! ```text
//!   apply(cmd) ──▶ jobs changed ──▶ touched ids ──▶ JobIndex::update (refresh those briefs)
//!   plan(state) ──▶ JobIndex::current (or a fresh build) ──▶ queue::scan
//! ```

use std::collections::{BTreeMap, HashMap};

use crate::limits::{has_user_limit, is_limited, Fixed, Usage, UsageKey};
use crate::model::{Job, JobId, JobState};
use crate::policy::{Policy, Qos};
use crate::state::Jobs;

/// Names to numbers, in first-seen order; numbers are never reused.
#[derive(Clone, Debug, Default)]
pub(crate) struct Interner {
    ids: HashMap<String, u32, Fixed>,
    names: Vec<String>,
}

impl Interner {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), self.names.len() as u32 - 1);
        self.names.len() as u32 - 1
    }

    /// Every interned name, by number.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// No GPU model constraint.
pub(crate) const NO_MODEL: u32 = u32::MAX;

/// What a planning pass reads of one unfinished job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Brief {
    pub state: JobState,
    pub held: bool,
    /// A preemptor (or resized job) that starts only on its claimed GPUs.
    pub claimed: bool,
    /// It names jobs it depends on (`after_ok`).
    pub has_deps: bool,
    /// An elastic job (single-node or gang) that may grow back.
    pub elastic: bool,
    /// It runs in a reservation (`--reservation`).
    pub in_reservation: bool,
    /// Interned in `Index::names`: QoS, partition as named ("" for the default), account, model.
    pub qos: u32,
    pub partition: u32,
    pub account: u32,
    pub model: u32,
    /// Interned in `Index::users`.
    pub user: u32,
    /// GPUs per task and tasks of the current (or next) run.
    pub gpus: u32,
    pub tasks: u32,
    /// GPUs of all tasks as submitted (the priority's size factor).
    pub spec_gpus: u32,
    /// CPUs and memory per task.
    pub cpu_mem: crate::model::CpuMem,
    /// The job's own time limit in seconds (0: it set none; submit refuses 0).
    own_limit_s: u32,
    pub submit_time_ms: i64,
    /// The array this job is a task of, when the array limits its running tasks (`%N`).
    pub array: Option<(JobId, u32)>,
}

impl Brief {
    /// GPUs of all tasks of the current (or next) run.
    pub fn total_gpus(&self) -> u32 {
        self.gpus.saturating_mul(self.tasks)
    }

    /// The job's own time limit, if it set one.
    pub fn time_limit_s(&self) -> Option<u64> {
        (self.own_limit_s != 0).then_some(u64::from(self.own_limit_s))
    }
}

/// The briefs of every unfinished job, with the name tables they point into.
#[derive(Clone, Debug, Default)]
pub(crate) struct Index {
    pub names: Interner,
    pub users: Interner,
    pub briefs: BTreeMap<JobId, Brief>,
    /// Pending briefs by (QoS, partition) name numbers, and how many of them hold a claim:
    /// kept with the briefs, so the leader's "can a pass act?" reads a few counters.
    pending: BTreeMap<(u32, u32), u32>,
    pending_claimed: u32,
    /// Pending briefs that ask for no GPU (they may start on a node whose GPUs are all taken).
    pending_gpuless: u32,
    /// Running and suspended briefs by (QoS, user) name numbers: (GPUs, jobs). A pass's QoS
    /// usage is summed from these few pairs, not from every brief.
    holding: BTreeMap<(u32, u32), (u64, u64)>,
}

impl Index {
    /// What the running and suspended jobs hold under the policy's QoS limits (a suspended job
    /// keeps its place: it resumes without asking), with the pair resolver the counting filled.
    pub(crate) fn usage<'a>(&'a self, policy: &'a Policy) -> (Usage, UsageKeys<'a>) {
        let mut usage = Usage::default();
        let mut keys = UsageKeys::new(self, policy);
        if policy.qos.values().any(is_limited) {
            for (&(qos, user), &(gpus, jobs)) in self.holding.iter().filter(|(_, (_, jobs))| *jobs > 0) {
                if let Some(key) = keys.key_of(&mut usage, qos, user) {
                    usage.add_many_at(key, gpus, jobs);
                }
            }
        }
        (usage, keys)
    }

    /// Whether some pending job holds a claim or may preempt (`ClusterState::may_preempt`: its
    /// QoS preempts some QoS, or its partition is above the lowest tier) — per interned name
    /// once, then integer lookups per job: the leader asks this every pass.
    pub(crate) fn pending_may_act(&self, policy: &Policy) -> bool {
        let names = self.names.names();
        let preempts: Vec<bool> =
            names.iter().map(|n| policy.qos(n).is_some_and(|q| !q.preempt.is_empty())).collect();
        let lowest = policy.partitions.values().map(|p| p.priority_tier).min().unwrap_or(0);
        let high_tier: Vec<bool> = names
            .iter()
            .map(|n| {
                let name = if n.is_empty() { &policy.default_partition } else { n };
                policy.partitions.get(name).is_some_and(|p| p.priority_tier > lowest)
            })
            .collect();
        let teams = policy.has_guarantees();
        self.pending_claimed > 0
            || self.pending.iter().any(|((qos, part), n)| {
                *n > 0 && (teams || preempts[*qos as usize] || high_tier[*part as usize])
            })
    }

    /// Counts `b` in (`add`) or out of the pending counters, or of the holding ones.
    fn count(&mut self, b: &Brief, add: bool) {
        if matches!(b.state, JobState::Running | JobState::Suspended) {
            let (gpus, jobs) = self.holding.entry((b.qos, b.user)).or_insert((0, 0));
            let g = u64::from(b.total_gpus());
            if add {
                (*gpus, *jobs) = (*gpus + g, *jobs + 1);
            } else {
                (*gpus, *jobs) = (gpus.saturating_sub(g), jobs.saturating_sub(1));
            }
            return;
        }
        if b.state != JobState::Pending {
            return;
        }
        let n = self.pending.entry((b.qos, b.partition)).or_insert(0);
        let c = &mut self.pending_claimed;
        let g = &mut self.pending_gpuless;
        let gpuless = u32::from(b.gpus == 0);
        if add {
            *n += 1;
            *c += u32::from(b.claimed);
            *g += gpuless;
        } else {
            *n = n.saturating_sub(1);
            *c = c.saturating_sub(u32::from(b.claimed));
            *g = g.saturating_sub(gpuless);
        }
    }

    fn build(jobs: &Jobs) -> Index {
        let mut index = Index::default();
        for (id, job) in jobs.iter() {
            index.refresh(*id, Some(job));
        }
        index
    }

    fn brief(names: &mut Interner, users: &mut Interner, job: &Job) -> Brief {
        let spec = &job.spec;
        Brief {
            state: job.state,
            held: job.held,
            claimed: job.claim.is_some(),
            has_deps: spec.dependencies().next().is_some(),
            elastic: spec.is_elastic() || spec.is_elastic_gang(),
            in_reservation: spec.reservation.is_some(),
            qos: names.intern(&spec.qos),
            partition: names.intern(&spec.partition),
            account: names.intern(&spec.account),
            model: spec.gpu_model.as_deref().map_or(NO_MODEL, |m| names.intern(m)),
            user: users.intern(&spec.user),
            gpus: job.gpus(),
            tasks: job.tasks(),
            spec_gpus: spec.total_gpus(),
            cpu_mem: spec.cpu_mem(),
            // Above u32::MAX seconds (136 years) a limit is as good as none: apply caps it at a year.
            own_limit_s: spec.time_limit_s.map_or(0, |s| s.clamp(1, u64::from(u32::MAX)) as u32),
            submit_time_ms: job.submit_time_ms,
            array: spec.array.as_ref().and_then(|a| Some((a.id, a.max_running?))),
        }
    }

    /// Brings the brief of job `id` up to date (`job` is its record, None if it is gone).
    fn refresh(&mut self, id: JobId, job: Option<&Job>) {
        let old = match job.filter(|j| !j.state.is_terminal()) {
            Some(job) => {
                let brief = Index::brief(&mut self.names, &mut self.users, job);
                self.count(&brief, true);
                self.briefs.insert(id, brief)
            }
            None => self.briefs.remove(&id),
        };
        if let Some(old) = old {
            self.count(&old, false);
        }
    }
}

/// Resolves briefs' (QoS, user) pairs to `Usage` counters, each pair's names looked up once.
pub(crate) struct UsageKeys<'a> {
    index: &'a Index,
    /// Per interned QoS name: the policy's QoS, if it has limits.
    limited: Vec<Option<&'a Qos>>,
    /// Per QoS name, for QoS without per-user limits (the user does not matter).
    by_qos: Vec<Option<UsageKey>>,
    by_pair: HashMap<(u32, u32), UsageKey, Fixed>,
}

impl<'a> UsageKeys<'a> {
    fn new(index: &'a Index, policy: &'a Policy) -> Self {
        let names = index.names.names();
        let limited = names.iter().map(|n| policy.qos(n).filter(|q| is_limited(q))).collect();
        UsageKeys { index, limited, by_qos: vec![None; names.len()], by_pair: HashMap::default() }
    }

    /// The counters of `b`'s (QoS, user) pair; None when its QoS has no limits.
    pub fn key(&mut self, usage: &mut Usage, b: &Brief) -> Option<UsageKey> {
        self.key_of(usage, b.qos, b.user)
    }

    /// The counters of the (QoS, user) pair of these name numbers; None when the QoS has no limits.
    fn key_of(&mut self, usage: &mut Usage, qos: u32, user: u32) -> Option<UsageKey> {
        let q = self.limited[qos as usize]?;
        let name = &self.index.names.names()[qos as usize];
        let users = self.index.users.names();
        Some(if has_user_limit(q) {
            *self.by_pair.entry((qos, user)).or_insert_with(|| usage.key(name, &users[user as usize], q))
        } else {
            *self.by_qos[qos as usize].get_or_insert_with(|| usage.key(name, "", q))
        })
    }
}

/// The index as kept in the state: a cache, absent until built.
#[derive(Clone, Debug, Default)]
pub struct JobIndex(Option<Index>);

impl PartialEq for JobIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for JobIndex {}

impl JobIndex {
    /// The index, when it is built and no job changed since it was last brought up to date.
    pub(crate) fn current(&self, jobs: &Jobs) -> Option<&Index> {
        self.0.as_ref().filter(|_| !jobs.any_touched())
    }

    /// QoS usage of the running work: from the index when current, else from the jobs.
    pub(crate) fn running_usage(
        &self,
        jobs: &Jobs,
        fallback: impl FnOnce() -> Usage,
        policy: &Policy,
    ) -> Usage {
        match self.current(jobs) {
            Some(index) => index.usage(policy).0,
            None => fallback(),
        }
    }

    /// `Index::pending_may_act` from the index when current, else None.
    /// Whether some pending job asks for no GPU (None when the index is not current).
    pub(crate) fn pending_gpuless(&self, jobs: &Jobs) -> Option<bool> {
        self.current(jobs).map(|index| index.pending_gpuless > 0)
    }

    pub(crate) fn pending_may_act(&self, jobs: &Jobs, policy: &Policy) -> Option<bool> {
        self.current(jobs).map(|index| index.pending_may_act(policy))
    }

    /// A fresh index of `jobs` (for a pass over a state whose index is not current).
    pub(crate) fn build(jobs: &Jobs) -> Index {
        Index::build(jobs)
    }

    /// After a command: refreshes the briefs of the jobs it touched (builds the index in full
    /// the first time).
    pub(crate) fn update(&mut self, jobs: &mut Jobs) {
        let touched = jobs.take_touched();
        match &mut self.0 {
            None => self.0 = Some(Index::build(jobs)),
            Some(index) => {
                for id in touched {
                    index.refresh(id, jobs.get(&id));
                }
            }
        }
    }

    /// Whether the index (if built) says what a fresh build says; for `check_invariants`.
    pub(crate) fn check(&self, jobs: &Jobs) -> Result<(), String> {
        let Some(index) = &self.0 else { return Ok(()) };
        if jobs.any_touched() {
            return Ok(()); // not brought up to date yet: the planner does not use it
        }
        let (mut names, mut users) = (index.names.clone(), index.users.clone());
        let unfinished = jobs.iter().filter(|(_, j)| !j.state.is_terminal());
        let want: BTreeMap<JobId, Brief> =
            unfinished.map(|(id, j)| (*id, Index::brief(&mut names, &mut users, j))).collect();
        if want != index.briefs {
            let differs = want.iter().find(|(id, b)| index.briefs.get(id) != Some(b)).map(|(id, _)| *id);
            let extra = index.briefs.keys().find(|id| !want.contains_key(id));
            return Err(format!(
                "job index drifted: job {:?} differs, job {:?} should not be there",
                differs, extra
            ));
        }
        let mut fresh = Index::default();
        for b in want.values() {
            fresh.count(b, true);
        }
        let kept: BTreeMap<(u32, u32), u32> =
            index.pending.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (*k, *n)).collect();
        if kept != fresh.pending || index.pending_claimed != fresh.pending_claimed {
            return Err(format!(
                "job index's pending counts drifted: {kept:?} and {} claimed, want {:?} and {}",
                index.pending_claimed, fresh.pending, fresh.pending_claimed
            ));
        }
        let holding: BTreeMap<(u32, u32), (u64, u64)> =
            index.holding.iter().filter(|(_, v)| **v != (0, 0)).map(|(k, v)| (*k, *v)).collect();
        if holding != fresh.holding {
            return Err(format!("job index's holding counts drifted: {holding:?}, want {:?}", fresh.holding));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ClusterState, Command, Op, Outcome};
    use crate::testing::{node_info, spec};

    #[test]
    fn the_index_follows_every_command_and_its_check_catches_a_change_it_missed() {
        let mut s = ClusterState::new();
        s.apply(&Command { skipped_ms: 0, now_ms: 1, op: Op::RegisterNode { info: node_info("a", 2) } });
        let mut ids = Vec::new();
        for i in 0..4 {
            let op = Op::Submit { spec: spec(1, "batch"), request_id: None, hold: i >= 2, limits: None };
            match s.apply(&Command { skipped_ms: 0, now_ms: 2, op }) {
                Outcome::Submitted { job } => ids.push(job),
                other => panic!("{other:?}"),
            }
        }
        let plan = crate::plan(&s).plan;
        s.apply(&Command { skipped_ms: 0, now_ms: 3, op: Op::ApplyPlan { plan } });
        s.apply(&Command { skipped_ms: 0, now_ms: 4, op: Op::Cancel { job: ids[3], by: "alice".into() } });
        s.apply(&Command { skipped_ms: 0, now_ms: 5, op: Op::Release { job: ids[2], by: "alice".into() } });
        s.check_invariants().unwrap();
        let index = s.job_index.current(&s.jobs).expect("built and current after apply");
        // The cancelled job left; the released one is no longer held; the placed one runs.
        assert!(!index.briefs.contains_key(&ids[3]));
        assert!(!index.briefs[&ids[2]].held);
        assert_eq!(index.briefs[&ids[1]].state, JobState::Running);
        // A change made behind the table's back (not through `Jobs`) is caught by the check.
        let mut stale = s.clone();
        let mut jobs: BTreeMap<JobId, Job> = stale.jobs.iter().map(|(id, j)| (*id, j.clone())).collect();
        jobs.get_mut(&ids[2]).unwrap().held = true;
        stale.jobs = jobs.into_iter().collect();
        let err = stale.check_invariants().unwrap_err();
        assert!(err.contains("job index drifted"), "{err}");
        // So is a running job's QoS usage counted wrong (what a pass's usage is summed from).
        let mut miscounted = s.clone();
        let index = miscounted.job_index.0.as_mut().expect("built");
        assert!(index.holding.values().any(|(_, jobs)| *jobs > 0), "a job runs");
        index.holding.values_mut().for_each(|(gpus, _)| *gpus += 1);
        let err = miscounted.check_invariants().unwrap_err();
        assert!(err.contains("holding counts drifted"), "{err}");
    }
}
