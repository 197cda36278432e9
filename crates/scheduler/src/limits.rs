//! QoS limits on running work: GPUs of a whole QoS (GrpTRES gres/gpu), GPUs and jobs per user.
//!
//! `Usage` is counted from the running jobs; the planner uses it to hold jobs that would exceed
//! a limit (with the limit as pending reason), and apply uses it again to re-validate every
//! placement, so no limit is exceeded even by a plan computed on a stale state.

use std::collections::BTreeMap;

use crate::model::{Job, JobState};
use crate::planner::PendingReason;
use crate::policy::Policy;

/// GPUs and jobs held by running jobs, per QoS and per (QoS, user).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Usage {
    qos_gpus: BTreeMap<String, u64>,
    user_gpus: BTreeMap<(String, String), u64>,
    user_jobs: BTreeMap<(String, String), u64>,
}

impl Usage {
    /// Counts the running jobs among `jobs`.
    pub fn of<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> Usage {
        let mut usage = Usage::default();
        for job in jobs.into_iter().filter(|j| j.state == JobState::Running) {
            usage.add(job);
        }
        usage
    }

    pub fn add(&mut self, job: &Job) {
        let key = (job.spec.qos.clone(), job.spec.user.clone());
        *self.qos_gpus.entry(job.spec.qos.clone()).or_default() += u64::from(job.spec.gpus);
        *self.user_gpus.entry(key.clone()).or_default() += u64::from(job.spec.gpus);
        *self.user_jobs.entry(key).or_default() += 1;
    }

    /// Whether `job` may start now without exceeding a limit of its QoS.
    pub fn admits(&self, job: &Job, policy: &Policy) -> Result<(), PendingReason> {
        let Some(qos) = policy.qos(&job.spec.qos) else { return Ok(()) };
        let gpus = u64::from(job.spec.gpus);
        let key = (job.spec.qos.clone(), job.spec.user.clone());
        if let Some(max) = qos.grp_gpus {
            if self.qos_gpus.get(&job.spec.qos).copied().unwrap_or(0) + gpus > u64::from(max) {
                return Err(PendingReason::QosGrpGpuLimit);
            }
        }
        if let Some(max) = qos.user_gpus {
            if self.user_gpus.get(&key).copied().unwrap_or(0) + gpus > u64::from(max) {
                return Err(PendingReason::QosUserGpuLimit);
            }
        }
        if let Some(max) = qos.user_jobs {
            if self.user_jobs.get(&key).copied().unwrap_or(0) + 1 > u64::from(max) {
                return Err(PendingReason::QosUserJobLimit);
            }
        }
        Ok(())
    }
}
