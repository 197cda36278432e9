//! The look-ahead half of the burst policy: how much burstable work the next while brings that
//! on-prem GPUs cannot take within a preemption grace, so instances boot before jobs wait for
//! them. Pure, like the rest of the policy.
//!
//! - *headroom*: free on-prem GPUs. GPUs burstable work could take by preemption are not
//!   counted: burst exists so that inference runs beside training instead of preempting it
//!   (measured in docs/simulation.md: counting them kept p99 low but left training waiting
//!   longer than without burst). A job that is already owed preempted GPUs is not waiting for
//!   an instance (`decision::waiting_jobs` skips it): whichever frees first serves it, and an
//!   idle cloud GPU is free now, so the planner takes it before preempting.
//! - *expected*: the GPUs burstable jobs asked for over the last `forecast_window` (every one
//!   the state still holds, whatever its state), taken as what the next window brings.
//! - *shortfall* = expected − headroom − cloud GPUs up or coming that nothing is planned on.
//!
//! The expected GPUs count only jobs the state still holds (finished ones are kept a while in
//! its history); a window of zero turns the forecast off.

use kairos_scheduler::burst::BURST_LABEL;
use kairos_scheduler::model::{model_matches, CpuMem};
use kairos_scheduler::{ClusterState, Job, JobState, NodeState};

/// What the policy expects of burstable work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outlook {
    /// Free on-prem GPUs.
    pub headroom: u64,
    /// GPUs burstable jobs asked for over the last window.
    pub expected: u64,
    /// The GPUs, CPUs and memory of the largest of those jobs an allowed type fits: an
    /// instance launched ahead is one that fits it.
    pub largest_gpus: u32,
    pub largest_share: CpuMem,
}

impl Outlook {
    /// GPUs expected beyond the headroom and `spare` idle cloud GPUs.
    pub fn shortfall(&self, spare: u64) -> u64 {
        self.expected.saturating_sub(self.headroom).saturating_sub(spare)
    }
}

/// Free on-prem GPUs (usable, not allocated, not promised to a preemptor).
pub fn headroom(state: &ClusterState) -> u64 {
    let on_prem =
        state.nodes.values().filter(|n| n.state == NodeState::Up && !n.info.labels.contains_key(BURST_LABEL));
    let free = |n: &kairos_scheduler::Node| {
        n.usable_gpus()
            .filter(|g| !n.allocated.contains_key(&g.index) && !n.claimed.contains_key(&g.index))
            .count()
    };
    on_prem.map(|n| free(n) as u64).sum()
}

/// The outlook at `now`: the headroom, the burstable GPUs asked over the configured window
/// (none when it is 0: no forecast), and the largest burstable job some allowed instance type
/// fits among those (among the ones pending or running when there are none).
pub fn outlook(state: &ClusterState, now: i64) -> Outlook {
    let window = state.burst.config.forecast_window_s;
    let since = now.saturating_sub((window.min(i64::MAX as u64 / 1000) as i64) * 1000);
    let mut o = Outlook { headroom: headroom(state), ..Outlook::default() };
    let types = &state.burst.config.instance_types;
    let fits_a_type = |j: &Job| {
        let (need, want) = (j.gpus(), j.spec.cpu_mem());
        types.iter().any(|t| {
            t.gpus >= need
                && want.fits(t.cpu_mem())
                && model_matches(j.spec.gpu_model.as_deref(), &t.gpu_model)
        })
    };
    let burstable = |j: &&Job| j.spec.tasks <= 1 && state.may_burst(j);
    // Jobs are numbered in the order they were submitted: read back from the newest until one
    // is older than the window (O(jobs in the window), not O(all jobs), every round).
    let recent: Vec<&Job> = if window == 0 {
        Vec::new()
    } else {
        let newest = state.jobs.values().rev().take_while(|j| j.submit_time_ms > since);
        newest.filter(|j| j.submit_time_ms <= now).filter(burstable).collect()
    };
    o.expected = recent.iter().map(|j| u64::from(j.gpus())).sum();
    // The reference job: the largest recent one (by GPUs, then memory, then CPUs) that some
    // allowed type fits; without any, the largest pending or running one. One job, so the
    // instance launched ahead always fits a real job.
    let size = |j: &&Job| (j.gpus(), j.spec.cpu_mem().mem_mib, j.spec.cpu_mem().cpus, j.id);
    let mut reference = recent.into_iter().filter(|j| fits_a_type(j)).max_by_key(size);
    if reference.is_none() {
        let live = |j: &&Job| matches!(j.state, JobState::Pending | JobState::Running);
        reference =
            state.jobs.values().filter(burstable).filter(live).filter(|j| fits_a_type(j)).max_by_key(size);
    }
    if let Some(j) = reference {
        (o.largest_gpus, o.largest_share) = (j.gpus(), j.spec.cpu_mem());
    }
    o
}
