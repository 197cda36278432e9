//! QoS limits on running work: GPUs of a whole QoS (GrpTRES gres/gpu), GPUs and jobs per user.
//!
//! `Usage` is counted from the running jobs; the planner uses it to hold jobs that would exceed
//! a limit (with the limit as pending reason), and apply uses it again to re-validate every
//! placement, so no limit is exceeded even by a plan computed on a stale state.
//!
//! Lookups borrow the job's names (no allocation per job): the planner asks once per pending job.

use std::collections::BTreeMap;

use crate::model::{Job, JobState};
use crate::planner::PendingReason;
use crate::policy::Policy;

/// What one QoS's running jobs hold.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct QosUsage {
    gpus: u64,
    /// user → (GPUs, jobs)
    users: BTreeMap<String, (u64, u64)>,
}

/// GPUs and jobs held by running jobs, per QoS and per (QoS, user).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Usage {
    qos: BTreeMap<String, QosUsage>,
}

impl Usage {
    /// Counts the running and suspended jobs among `jobs`, for the QoS classes of `policy` that have limits.
    pub fn of<'a>(jobs: impl IntoIterator<Item = &'a Job>, policy: &Policy) -> Usage {
        let mut usage = Usage::default();
        let limited = policy
            .qos
            .values()
            .any(|q| q.grp_gpus.is_some() || q.user_gpus.is_some() || q.user_jobs.is_some());
        if !limited {
            return usage;
        }
        // A suspended job still holds its place under the limits: it resumes without asking.
        for job in jobs.into_iter().filter(|j| matches!(j.state, JobState::Running | JobState::Suspended)) {
            usage.add(job, policy);
        }
        usage
    }

    /// Counts `job` as running (only where its QoS has a limit to check).
    pub fn add(&mut self, job: &Job, policy: &Policy) {
        let limited = policy
            .qos(&job.spec.qos)
            .is_some_and(|q| q.grp_gpus.is_some() || q.user_gpus.is_some() || q.user_jobs.is_some());
        if !limited {
            return;
        }
        let gpus = u64::from(job.total_gpus());
        if !self.qos.contains_key(&job.spec.qos) {
            self.qos.insert(job.spec.qos.clone(), QosUsage::default());
        }
        let q = self.qos.get_mut(&job.spec.qos).expect("inserted above");
        q.gpus += gpus;
        match q.users.get_mut(&job.spec.user) {
            Some((g, n)) => {
                *g += gpus;
                *n += 1;
            }
            None => {
                q.users.insert(job.spec.user.clone(), (gpus, 1));
            }
        }
    }

    /// Whether `job` may start now without exceeding a limit of its QoS.
    pub fn admits(&self, job: &Job, policy: &Policy) -> Result<(), PendingReason> {
        let Some(qos) = policy.qos(&job.spec.qos) else { return Ok(()) };
        if qos.grp_gpus.is_none() && qos.user_gpus.is_none() && qos.user_jobs.is_none() {
            return Ok(());
        }
        let gpus = u64::from(job.total_gpus());
        let used = self.qos.get(&job.spec.qos);
        let (user_gpus, user_jobs) =
            used.and_then(|q| q.users.get(&job.spec.user)).copied().unwrap_or((0, 0));
        if let Some(max) = qos.grp_gpus {
            if used.map_or(0, |q| q.gpus) + gpus > u64::from(max) {
                return Err(PendingReason::QosGrpGpuLimit);
            }
        }
        if let Some(max) = qos.user_gpus {
            if user_gpus + gpus > u64::from(max) {
                return Err(PendingReason::QosUserGpuLimit);
            }
        }
        if let Some(max) = qos.user_jobs {
            if user_jobs + 1 > u64::from(max) {
                return Err(PendingReason::QosUserJobLimit);
            }
        }
        Ok(())
    }
}
