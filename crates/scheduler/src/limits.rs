//! QoS limits on running work: GPUs of a whole QoS (GrpTRES gres/gpu), GPUs and jobs per user.
//!
//! `Usage` is counted from the running jobs; the planner uses it to hold jobs that would exceed
//! a limit (with the limit as pending reason), and apply uses it again to re-validate every
//! placement, so no limit is exceeded even by a plan computed on a stale state.
//!
//! Counters are interned by (QoS, user): the planner resolves each pending job's `UsageKey` in its
//! sequential scan and then checks and counts without a string comparison.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;

use crate::model::{Job, JobState};
use crate::policy::{Policy, Qos};
use crate::reasons::PendingReason;

/// `UsageKey::cell` of a QoS without per-user limits: no per-user counters.
const NO_CELL: u32 = u32::MAX;

/// Whether a QoS limits what one user may run.
pub(crate) fn has_user_limit(q: &Qos) -> bool {
    q.user_gpus.is_some() || q.user_jobs.is_some()
}

/// Whether a QoS has a limit on running work to count against.
pub fn is_limited(q: &Qos) -> bool {
    q.grp_gpus.is_some() || q.user_gpus.is_some() || q.user_jobs.is_some()
}

/// Where one (QoS, user) pair is counted in a `Usage`: resolved once from the names, then used
/// without touching a string (the planner resolves each pending job's key in its scan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageKey {
    qos: u32,
    cell: u32,
}

/// A fixed hasher (SipHash with zero keys) for maps that are only looked up, never iterated
/// for a decision: the same on every replica.
pub(crate) type Fixed = BuildHasherDefault<DefaultHasher>;

type Names<V> = HashMap<String, V, Fixed>;

/// GPUs and jobs held by running jobs, per QoS and per (QoS, user), for the QoS classes that
/// have limits. Names are interned: `key` finds (or makes) a pair's counters once.
#[derive(Debug, Default, Clone)]
pub struct Usage {
    /// QoS name → its index into `qos_gpus` and `users`.
    qos_names: Names<usize>,
    qos_gpus: Vec<u64>,
    /// Per QoS: user → index into `cells`.
    users: Vec<Names<usize>>,
    /// (GPUs, jobs) of one user under one QoS.
    cells: Vec<(u64, u64)>,
}

/// Equal when every named counter is (interning order and untouched pairs do not count).
impl PartialEq for Usage {
    fn eq(&self, other: &Self) -> bool {
        self.counts() == other.counts()
    }
}

impl Eq for Usage {}

impl Usage {
    /// Counts the running and suspended jobs among `jobs`, for the QoS classes of `policy` that have limits.
    pub fn of<'a>(jobs: impl IntoIterator<Item = &'a Job>, policy: &Policy) -> Usage {
        let mut usage = Usage::default();
        if !policy.qos.values().any(is_limited) {
            return usage;
        }
        // A suspended job still holds its place under the limits: it resumes without asking.
        for job in jobs.into_iter().filter(|j| matches!(j.state, JobState::Running | JobState::Suspended)) {
            usage.add(job, policy);
        }
        usage
    }

    /// The counters of a (QoS, user) pair, made at zero if new; per-user counters only
    /// where `qos` has a per-user limit (a QoS with a group limit alone needs no user lookup).
    pub fn key(&mut self, qos_name: &str, user: &str, q: &Qos) -> UsageKey {
        let qos = match self.qos_names.get(qos_name) {
            Some(i) => *i,
            None => {
                self.qos_gpus.push(0);
                self.users.push(Names::default());
                self.qos_names.insert(qos_name.to_string(), self.qos_gpus.len() - 1);
                self.qos_gpus.len() - 1
            }
        };
        if !has_user_limit(q) {
            return UsageKey { qos: qos as u32, cell: NO_CELL };
        }
        let users = &mut self.users[qos];
        let cell = match users.get(user) {
            Some(i) => *i,
            None => {
                self.cells.push((0, 0));
                users.insert(user.to_string(), self.cells.len() - 1);
                self.cells.len() - 1
            }
        };
        UsageKey { qos: qos as u32, cell: cell as u32 }
    }

    /// Counts `job` as running (only where its QoS has a limit to check).
    pub fn add(&mut self, job: &Job, policy: &Policy) {
        if let Some(q) = policy.qos(&job.spec.qos).filter(|q| is_limited(q)) {
            let key = self.key(&job.spec.qos, &job.spec.user, q);
            self.add_at(key, job.total_gpus());
        }
    }

    /// Counts one more running job of `gpus` GPUs at `key`.
    pub fn add_at(&mut self, key: UsageKey, gpus: u32) {
        self.add_many_at(key, u64::from(gpus), 1);
    }

    /// Counts `jobs` more running jobs holding `gpus` GPUs together at `key`.
    pub fn add_many_at(&mut self, key: UsageKey, gpus: u64, jobs: u64) {
        self.qos_gpus[key.qos as usize] += gpus;
        if let Some((g, n)) = self.cells.get_mut(key.cell as usize) {
            *g += gpus;
            *n += jobs;
        }
    }

    /// Whether `job` may start now without exceeding a limit of its QoS.
    pub fn admits(&self, job: &Job, policy: &Policy) -> Result<(), PendingReason> {
        let Some(qos) = policy.qos(&job.spec.qos).filter(|q| is_limited(q)) else { return Ok(()) };
        let qos_index = self.qos_names.get(&job.spec.qos).copied();
        let grp = qos_index.map_or(0, |i| self.qos_gpus[i]);
        let user = qos_index.and_then(|i| self.users[i].get(&job.spec.user));
        let cell = user.map_or((0, 0), |i| self.cells[*i]);
        check(qos, grp, cell, job.total_gpus())
    }

    /// `admits` for a job of `gpus` GPUs whose counters are at `key`.
    pub fn admits_at(&self, key: UsageKey, qos: &Qos, gpus: u32) -> Result<(), PendingReason> {
        let cell = self.cells.get(key.cell as usize).copied().unwrap_or((0, 0));
        check(qos, self.qos_gpus[key.qos as usize], cell, gpus)
    }

    /// The non-zero counters by name (for equality and tests).
    fn counts(&self) -> Counts<'_> {
        let qos = self.qos_names.iter().map(|(n, i)| (n.as_str(), self.qos_gpus[*i])).filter(|(_, g)| *g > 0);
        let cells = self
            .qos_names
            .iter()
            .flat_map(|(q, qi)| self.users[*qi].iter().map(move |(u, i)| ((q.as_str(), u.as_str()), *i)))
            .map(|(names, i)| (names, self.cells[i]))
            .filter(|(_, c)| *c != (0, 0));
        (qos.collect(), cells.collect())
    }
}

/// Non-zero counters by name: GPUs per QoS, (GPUs, jobs) per (QoS, user).
type Counts<'a> = (BTreeMap<&'a str, u64>, BTreeMap<(&'a str, &'a str), (u64, u64)>);

/// The one limit check: `gpus` more GPUs (one more job) on top of what the QoS (`grp`) and
/// the user under it (`(GPUs, jobs)`) hold.
fn check(qos: &Qos, grp: u64, (user_gpus, user_jobs): (u64, u64), gpus: u32) -> Result<(), PendingReason> {
    let gpus = u64::from(gpus);
    if qos.grp_gpus.is_some_and(|max| grp + gpus > u64::from(max)) {
        return Err(PendingReason::QosGrpGpuLimit);
    }
    if qos.user_gpus.is_some_and(|max| user_gpus + gpus > u64::from(max)) {
        return Err(PendingReason::QosUserGpuLimit);
    }
    if qos.user_jobs.is_some_and(|max| user_jobs + 1 > u64::from(max)) {
        return Err(PendingReason::QosUserJobLimit);
    }
    Ok(())
}
