//! Preemption: who may preempt whom, the `Preempt` op (re-validated whole), what happens to each
//! victim (stop, shrink, suspend), and resuming suspended jobs.

use super::*;
use crate::guarantee::Guarantees;

/// What a preemption does to one victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VictimAction {
    /// Stop the run; then requeue or cancel it, by mode.
    Stop(crate::policy::PreemptMode),
    /// Restart an elastic job on the GPUs it keeps.
    Shrink,
    /// Restart an elastic gang on its other nodes (this node's task is released).
    ShrinkGang,
    /// SIGSTOP the job and lend its GPUs to the preemptor.
    Suspend,
}

/// One victim of a checked preemption: what happens to it, the GPUs it gives, and — when it is
/// another team's borrower taken for a preemptor within its guarantee — the account the GPUs
/// are reclaimed for and how many its team gives up.
struct VictimPlan {
    id: JobId,
    action: VictimAction,
    taken: Vec<GpuIndex>,
    reclaim: Option<(String, u64)>,
}

/// What one preemption victim costs (`ClusterState::preemption_cost`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VictimCost {
    /// Work lost, GPU-ms, weighted by recent preemptions.
    pub lost_gpu_ms: u128,
    /// The longest the victim may take to free its GPUs.
    pub free_ms: u64,
}

/// Most preemption records kept.
pub const PREEMPTION_RECORDS_MAX: usize = 1000;
/// A job preempted this often within `THRASH_WINDOW_MS` is not preempted again.
pub const THRASH_PREEMPTIONS_MAX: usize = 3;
pub const THRASH_WINDOW_MS: i64 = 3600 * 1000;

/// Whether `job` is a guaranteed job that may take back what other teams borrowed: it asks
/// GPUs (a CPU-only job reclaims nothing) within its team's guarantee.
pub fn reclaims(g: &Guarantees, job: &Job) -> bool {
    job.total_gpus() > 0 && g.within(&job.spec.account, u64::from(job.total_gpus()))
}

impl ClusterState {
    /// Whether `job` could preempt anything at all: its QoS preempts some QoS, its partition
    /// is above the lowest tier, or (`may_reclaim`) it is within its team's guarantee (it may
    /// reclaim what others borrowed): a cheap filter before looking for victims.
    pub fn may_preempt(&self, job: &Job, g: &Guarantees, may_reclaim: bool) -> bool {
        let by_qos = self.policy.qos(&job.spec.qos).is_some_and(|q| !q.preempt.is_empty());
        let lowest = self.policy.partitions.values().map(|p| p.priority_tier).min().unwrap_or(0);
        by_qos
            || self.partition_of(job).is_some_and(|p| p.priority_tier > lowest)
            || (may_reclaim && reclaims(g, job))
    }

    /// Whether running job `victim` may be preempted by `preemptor` at `now`, else why not:
    /// by QoS or partition tier, or to reclaim what the victim's team borrowed of the
    /// preemptor's guarantee; a job of another team only where its team holds more than its
    /// guarantee (`Guarantees::take` bounds how much of it, for all victims together).
    /// `may_reclaim`: the caller's own view lets the preemptor reclaim (the planner's, with
    /// what its pass started, may be stricter than the state's).
    pub fn preemptible(
        &self,
        preemptor: &Job,
        victim: &Job,
        now: i64,
        g: &Guarantees,
        may_reclaim: bool,
    ) -> Result<(), String> {
        let (p_qos, v_qos) = (self.policy.qos(&preemptor.spec.qos), self.policy.qos(&victim.spec.qos));
        let (Some(p_qos), Some(v_qos)) = (p_qos, v_qos) else { return Err("unknown qos".into()) };
        let alloc = victim.allocation.as_ref().ok_or("not running")?;
        if victim.state != JobState::Running || alloc.stop.is_some() {
            return Err(format!("job {} is not running undisturbed", victim.id));
        }
        // Slurm's preempt/qos and preempt/partition_prio: by QoS preempt list, or from a
        // partition of a higher priority tier.
        let tier = |j: &Job| self.partition_of(j).map(|p| p.priority_tier).unwrap_or(0);
        let (from, to) = (victim.spec.account.as_str(), preemptor.spec.account.as_str());
        let across = g.active() && from != to && g.across(from, to);
        let reclaim = may_reclaim && across && reclaims(g, preemptor);
        if !p_qos.preempt.contains(&v_qos.name) && tier(preemptor) <= tier(victim) && !reclaim {
            return Err(format!(
                "qos \"{}\" may not preempt qos \"{}\" and its partition tier is not higher",
                p_qos.name, v_qos.name
            ));
        }
        if across && g.lendable(from, to) == 0 {
            return Err(format!("job {}: account \"{from}\" holds no more than its guarantee", victim.id));
        }
        self.undisturbed_victim(victim, v_qos, now)
    }

    /// The checks on a victim whoever preempts it: its QoS is preempted at all, a gang can
    /// release a node, it is past its exempt time and under the anti-thrash bound.
    pub fn undisturbed_victim(&self, victim: &Job, v_qos: &Qos, now: i64) -> Result<(), String> {
        let alloc = victim.allocation.as_ref().ok_or("not running")?;
        if v_qos.preempt_mode == crate::policy::PreemptMode::Off {
            return Err(format!("qos \"{}\" is never preempted", v_qos.name));
        }
        if alloc.task_count() > 1 && victim.tasks() <= victim.spec.min_tasks.unwrap_or(u32::MAX) {
            return Err(format!("job {} is a gang that cannot release a node", victim.id));
        }
        let ran_ms = now.saturating_sub(victim.start_time_ms.unwrap_or(now));
        if ran_ms < (v_qos.preempt_exempt_s as i64).saturating_mul(1000) {
            return Err(format!("job {} is inside its preempt-exempt time", victim.id));
        }
        let recent = victim.preempted_at.iter().filter(|t| now - **t < THRASH_WINDOW_MS).count();
        if recent >= THRASH_PREEMPTIONS_MAX {
            return Err(format!("job {} was preempted {recent} times in the last hour", victim.id));
        }
        Ok(())
    }

    pub(super) fn preempt(
        &mut self,
        preemptor: JobId,
        node: &str,
        victims: &[JobId],
        gpus: &[GpuIndex],
        now: i64,
    ) -> Outcome {
        let actions = match self.preemption_checked(preemptor, node, victims, gpus, now) {
            Ok(actions) => actions,
            Err(refused) => return Outcome::Rejected(refused),
        };
        // Commit: victims stop, shrink or pause; the GPUs are claimed for the preemptor.
        for victim in actions {
            self.preempt_victim(preemptor, node, victim, now);
        }
        let n = self.nodes.get_mut(node).expect("validated");
        for g in gpus {
            n.claimed.insert(*g, preemptor);
        }
        let p = self.jobs.get_mut(&preemptor).expect("validated");
        p.claim = Some(crate::model::Claim { node: node.to_string(), gpus: gpus.to_vec(), more: Vec::new() });
        p.record(now, "preempting", format!("jobs {victims:?} on \"{node}\" for GPUs {gpus:?}"));
        Outcome::Preempted { preemptor, victims: victims.to_vec() }
    }

    /// A preemption re-validated whole: the preemptor may start on these GPUs of `node`, each
    /// free or a victim's, and every victim may be preempted now; with what happens to each
    /// victim (shrink, suspend, or stop) and which of its GPUs it gives.
    fn preemption_checked(
        &self,
        preemptor: JobId,
        node: &str,
        victims: &[JobId],
        gpus: &[GpuIndex],
        now: i64,
    ) -> Result<Vec<VictimPlan>, Rejection> {
        let reject = |m: String| Rejection::FailedPrecondition(m);
        let Some(p) = self.jobs.get(&preemptor) else {
            return Err(Rejection::NotFound(format!("job {preemptor} not found")));
        };
        if p.state != JobState::Pending || p.claim.is_some() || p.held || p.spec.tasks > 1 {
            return Err(reject(format!("job {preemptor} cannot preempt now")));
        }
        if victims.is_empty() || gpus.len() != p.gpus() as usize {
            return Err(reject("a preemption needs victims and exactly the preemptor's GPU count".into()));
        }
        // The GPUs: of a node open to the preemptor, each free or a victim's, claimed by nobody.
        self.check_grant(p, node, gpus, Some(p.gpus()), Taking::FromVictims(victims))
            .map_err(|e| reject(e.to_string()))?;
        let mut actions = Vec::with_capacity(victims.len());
        let g = self.guarantees();
        // The claim it gets is a start: within every borrow limit of its team's chain.
        g.borrow_check(&p.spec.account, u64::from(p.total_gpus())).map_err(|r| reject(r.to_string()))?;
        let mut taken_from = BTreeMap::new();
        for v in victims {
            let Some(victim) = self.jobs.get(v) else { return Err(reject(format!("job {v} not found"))) };
            self.preemptible(p, victim, now, &g, true).map_err(reject)?;
            // The victim's task on this node (rank 0's for a single-node job).
            let Some(held) = victim.allocation.as_ref().and_then(|a| a.tasks().find(|(_, n, _)| *n == node))
            else {
                return Err(reject(format!("job {v} does not run on \"{node}\"")));
            };
            let taken: Vec<GpuIndex> = held.2.iter().copied().filter(|g| gpus.contains(g)).collect();
            let cpu_mem = self.nodes.get(node).and_then(|n| n.held.get(v)).copied().unwrap_or_default();
            let freed = self.freed_by(victim, taken.len() as u32, cpu_mem);
            if taken.is_empty() && freed == crate::model::CpuMem::default() {
                return Err(reject(format!("job {v} gives none of the GPUs, CPUs or memory")));
            }
            let gives = self.gives_up(victim, taken.len() as u32);
            if !g.take(&mut taken_from, &victim.spec.account, &p.spec.account, gives) {
                let a = &victim.spec.account;
                return Err(reject(format!("job {v}: account \"{a}\" would be left below its guarantee")));
            }
            let (from, to) = (victim.spec.account.as_str(), p.spec.account.as_str());
            let reclaim =
                (from != to && g.across(from, to) && reclaims(&g, p)).then(|| (to.to_string(), gives));
            let action = self.victim_action(victim, taken.len() as u32);
            actions.push(VictimPlan { id: *v, action, taken, reclaim });
        }
        Ok(actions)
    }

    /// Victim `v` gives `taken` of its GPUs on `node` to `preemptor`: it stops, shrinks or is
    /// suspended, and the preemption is recorded (its history bounded).
    fn preempt_victim(&mut self, preemptor: JobId, node: &str, plan: VictimPlan, now: i64) {
        let VictimPlan { id: v, action, taken, reclaim } = plan;
        let victim = self.jobs.get_mut(&v).expect("validated");
        let safe_at = victim.start_time_ms.unwrap_or(now).max(victim.last_checkpoint_ms.unwrap_or(i64::MIN));
        let lost_s = now.saturating_sub(safe_at).max(0) as u64 / 1000;
        let mut record = PreemptionRecord {
            time_ms: now,
            preemptor,
            victim: v,
            mode: crate::policy::PreemptMode::Requeue,
            node: node.to_string(),
            gpu_s_lost: u64::from(victim.total_gpus()) * lost_s,
            shrunk_to: None,
            suspended: false,
            reclaimed_gpus: reclaim.as_ref().map_or(0, |(_, n)| *n as u32),
            reclaimed_for: reclaim.map(|(a, _)| a),
        };
        let mut message = self.victim_gives(&mut record, action, &taken, now);
        if let Some(account) = &record.reclaimed_for {
            message.push_str(&format!("; reclaimed for account {account} ({} GPUs)", record.reclaimed_gpus));
        }
        let victim = self.jobs.get_mut(&v).expect("validated");
        victim.preempted_at.push(now);
        if victim.preempted_at.len() > 16 {
            victim.preempted_at.remove(0);
        }
        victim.record(now, "preempted", message);
        let how = if record.shrunk_to.is_some() { "shrink" } else { record.mode.as_str() };
        *self.preemption_totals.entry(how.to_string()).or_default() += 1;
        self.preemptions.push_back(record);
        if self.preemptions.len() > PREEMPTION_RECORDS_MAX {
            self.preemptions.pop_front();
        }
    }

    /// What `action` does to the victim of `record` (its run told to stop or resize, or
    /// suspended with its GPUs lent; what it keeps claimed for its next run), and the event's
    /// message.
    fn victim_gives(
        &mut self,
        record: &mut PreemptionRecord,
        action: VictimAction,
        taken: &[GpuIndex],
        now: i64,
    ) -> String {
        let (preemptor, v, node) = (record.preemptor, record.victim, record.node.as_str());
        let victim = self.jobs.get_mut(&v).expect("validated");
        let alloc = victim.allocation.as_mut().expect("a victim runs");
        match action {
            VictimAction::Stop(mode) => {
                alloc.stop = Some(StopReason::Preempted { by: preemptor, mode });
                record.mode = mode;
                format!("by job {preemptor}, mode {}, {} GPU-s lost", mode.as_str(), record.gpu_s_lost)
            }
            VictimAction::ShrinkGang => {
                alloc.stop = Some(StopReason::Resize { by: Some(preemptor) });
                // Every other node of the gang is kept (claimed for the next run).
                let kept: Vec<(String, Vec<GpuIndex>)> = alloc
                    .tasks()
                    .filter(|(_, n, _)| *n != node)
                    .map(|(_, n, g)| (n.to_string(), g.to_vec()))
                    .collect();
                record.shrunk_to = Some(kept.iter().map(|(_, g)| g.len() as u32).sum());
                for (n, gs) in &kept {
                    if let Some(n) = self.nodes.get_mut(n) {
                        // A GPU that failed under it is never promised to its next run.
                        let healthy: Vec<GpuIndex> = gs.iter().copied().filter(|g| n.healthy(*g)).collect();
                        n.claimed.extend(healthy.into_iter().map(|g| (g, v)));
                    }
                }
                let lost = record.gpu_s_lost;
                format!(
                    "by job {preemptor}: releasing node \"{node}\", {} nodes remain, {lost} GPU-s lost",
                    kept.len()
                )
            }
            VictimAction::Shrink => {
                alloc.stop = Some(StopReason::Resize { by: Some(preemptor) });
                let kept: Vec<GpuIndex> = alloc.gpus.iter().copied().filter(|g| !taken.contains(g)).collect();
                let n = self.nodes.get_mut(node).expect("validated");
                // A GPU that failed under it is never promised to its next run.
                let kept: Vec<GpuIndex> = kept.into_iter().filter(|g| n.healthy(*g)).collect();
                record.shrunk_to = Some(kept.len() as u32);
                n.claimed.extend(kept.iter().map(|g| (*g, v)));
                format!(
                    "by job {preemptor}: shrinking to {} GPUs, {} GPU-s lost",
                    kept.len(),
                    record.gpu_s_lost
                )
            }
            VictimAction::Suspend => {
                alloc.lent = taken.to_vec();
                victim.state = JobState::Suspended;
                victim.suspended_since = Some(now);
                record.mode = crate::policy::PreemptMode::Suspend;
                record.suspended = true;
                record.gpu_s_lost = 0;
                self.suspended.insert(v);
                let n = self.nodes.get_mut(node).expect("validated");
                n.allocated.retain(|g, holder| *holder != v || !taken.contains(g));
                // A stopped process uses no CPU: its cores are lent with the GPUs.
                if let Some(held) = n.held.get_mut(&v) {
                    held.cpus = 0;
                }
                format!("by job {preemptor}: suspended, GPUs {taken:?} lent until it ends")
            }
        }
    }

    /// How preemption treats `victim` when `taken` of its GPUs go to the preemptor: an elastic
    /// job that keeps at least its minimum is shrunk; a suspendable one under a SUSPEND QoS is
    /// paused; otherwise its QoS mode decides (SUSPEND without `suspendable` requeues).
    fn victim_action(&self, victim: &Job, taken: u32) -> VictimAction {
        use crate::policy::PreemptMode;
        if victim.allocation.as_ref().is_some_and(|a| a.task_count() > 1) {
            // Only an elastic gang above its minimum is preemptible at all (`preemptible`).
            return VictimAction::ShrinkGang;
        }
        let kept = victim.gpus().saturating_sub(taken);
        if victim.spec.is_elastic() && kept > 0 && victim.spec.min_gpus.is_some_and(|m| kept >= m) {
            return VictimAction::Shrink;
        }
        match self.policy.qos(&victim.spec.qos).map(|q| q.preempt_mode) {
            Some(PreemptMode::Suspend) if victim.spec.suspendable => VictimAction::Suspend,
            Some(PreemptMode::Suspend | PreemptMode::Requeue) => VictimAction::Stop(PreemptMode::Requeue),
            _ => VictimAction::Stop(PreemptMode::Cancel),
        }
    }

    /// The CPUs and memory a node gets back when `taken` of `victim`'s GPUs there go to a
    /// preemptor (`held`: what its task holds there): a stopped run (or a gang giving this
    /// node up) frees all; a suspended one its CPUs (its memory stays resident); a shrunk
    /// one nothing (it runs on, on fewer GPUs).
    pub fn freed_by(&self, victim: &Job, taken: u32, held: crate::model::CpuMem) -> crate::model::CpuMem {
        match self.victim_action(victim, taken) {
            VictimAction::Stop(_) | VictimAction::ShrinkGang => held,
            VictimAction::Suspend => crate::model::CpuMem { cpus: held.cpus, mem_mib: 0 },
            VictimAction::Shrink => crate::model::CpuMem::default(),
        }
    }

    /// The GPUs `victim`'s team stops holding when `taken` of them go to a preemptor: all of
    /// a stopped run's, only those taken from one that shrinks or is suspended.
    pub fn gives_up(&self, victim: &Job, taken: u32) -> u64 {
        match self.victim_action(victim, taken) {
            VictimAction::Stop(_) => u64::from(victim.total_gpus()),
            VictimAction::Shrink | VictimAction::ShrinkGang | VictimAction::Suspend => u64::from(taken),
        }
    }

    /// Whether preempting `victim` to take `taken` of its GPUs loses no work (it is suspended).
    pub fn preemption_is_free(&self, victim: &Job, taken: u32) -> bool {
        self.victim_action(victim, taken) == VictimAction::Suspend
    }

    /// What preempting `victim` for `taken` of its GPUs costs at `now`, in GPU-ms: the work it
    /// loses (its GPUs × the time since its last checkpoint or start), weighted up by how often
    /// it was preempted in the anti-thrash window (each recent preemption counts it once more),
    /// and how long the GPUs take to be free (its QoS grace — the most it may take to save and
    /// stop; a suspended job frees them at once and loses nothing).
    pub fn preemption_cost(&self, victim: &Job, taken: u32, now: i64) -> VictimCost {
        if self.preemption_is_free(victim, taken) {
            return VictimCost { lost_gpu_ms: 0, free_ms: 0 };
        }
        let safe_at = victim.start_time_ms.unwrap_or(now).max(victim.last_checkpoint_ms.unwrap_or(i64::MIN));
        let ran_ms = now.saturating_sub(safe_at).max(0) as u128;
        let recent = victim.preempted_at.iter().filter(|t| now - **t < THRASH_WINDOW_MS).count() as u128;
        let grace_s = self.policy.qos(&victim.spec.qos).map_or(0, |q| q.grace_s);
        VictimCost {
            lost_gpu_ms: u128::from(victim.total_gpus()) * ran_ms * (1 + recent),
            free_ms: grace_s.saturating_mul(1000),
        }
    }

    /// Resumes every suspended job whose lent GPUs are free again (no holder, no claim).
    pub(super) fn resume_ready(&mut self, now: i64) {
        let ready: Vec<JobId> = self
            .suspended
            .iter()
            .copied()
            .filter(|id| {
                let Some(job) = self.jobs.get(id) else { return false };
                let Some(a) = job.allocation.as_ref().filter(|a| a.stop.is_none()) else { return false };
                let Some(n) = self.nodes.get(&a.node).filter(|n| n.state == NodeState::Up) else {
                    return false;
                };
                job.state == JobState::Suspended
                    && a.lent
                        .iter()
                        .all(|g| !n.allocated.contains_key(g) && !n.claimed.contains_key(g) && n.usable(*g))
                    && job.spec.cpus <= n.free_cpu_mem().cpus
            })
            .collect();
        for id in ready {
            self.suspended.remove(&id);
            let job = self.jobs.get_mut(&id).expect("checked");
            let a = job.allocation.as_mut().expect("checked");
            let lent = std::mem::take(&mut a.lent);
            let node = self.nodes.get_mut(&a.node).expect("checked");
            for g in &lent {
                node.allocated.insert(*g, id);
            }
            if let Some(held) = node.held.get_mut(&id) {
                held.cpus = job.spec.cpus;
            }
            job.state = JobState::Running;
            job.suspended_ms += job.suspended_since.take().map_or(0, |t| now.saturating_sub(t));
            job.record(now, "resumed", format!("GPUs {lent:?} are back"));
        }
    }

    /// A preempted run's process is gone: requeue it (next attempt) or cancel it, by mode.
    pub(super) fn preempted_run_ended(
        &mut self,
        id: JobId,
        by: JobId,
        mode: crate::policy::PreemptMode,
        now: i64,
    ) -> Outcome {
        let reason = format!("preempted by job {by}");
        if mode == crate::policy::PreemptMode::Requeue {
            // Requeue regardless of --requeue: the cluster, not the job, stopped it.
            self.requeue_run(id, &reason, now);
            return Outcome::RunUpdated { job: id, state: JobState::Pending };
        }
        self.end_run(id, JobState::Cancelled, reason, now);
        Outcome::RunUpdated { job: id, state: JobState::Cancelled }
    }

    /// Drops every claim of a job: a pending job's (it was cancelled or placed, or its node went
    /// down) and a resizing run's on its node.
    pub(crate) fn drop_claim(&mut self, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let mut names: Vec<String> = Vec::new();
        if let Some(c) = job.claim.take() {
            names.extend(c.tasks().map(|(n, _)| n.to_string()));
        }
        if let Some(a) = job.allocation.as_ref() {
            names.extend(a.tasks().map(|(_, n, _)| n.to_string()));
        }
        for name in names {
            if let Some(node) = self.nodes.get_mut(&name) {
                node.claimed.retain(|_, holder| *holder != id);
            }
        }
    }
}
