//! The inference headroom: GPUs kept idle for the QoS classes that have one
//! (`Qos::headroom_gpus`), so their jobs start at once instead of waiting for a preemption.
//! The planner keeps other work out of it (`PendingReason::Headroom`); when jobs of those QoS
//! use it up, the leader refills it by stopping preemptible work (`Op::Vacate`): the victims
//! checkpoint, stop and requeue, and their GPUs stay idle for the next arrival.

use super::*;

impl ClusterState {
    /// GPUs all QoS headrooms together keep idle.
    pub fn headroom_gpus(&self) -> usize {
        self.policy.qos.values().map(|q| q.headroom_gpus as usize).sum()
    }

    /// GPUs of Up nodes.
    pub fn up_gpus(&self) -> usize {
        self.nodes.values().filter(|n| n.state == NodeState::Up).map(|n| n.usable_gpus().count()).sum()
    }

    /// GPUs of Up nodes that runs stopping for the headroom will free.
    pub fn headroom_freeing(&self) -> usize {
        let up = self.nodes.values().filter(|n| n.state == NodeState::Up);
        up.flat_map(|n| n.allocated.values())
            .filter(|holder| {
                let stop = self.jobs.get(holder).and_then(|j| j.allocation.as_ref()).and_then(|a| a.stop);
                stop == Some(StopReason::Vacated)
            })
            .count()
    }

    /// How many GPUs the headrooms lack: kept idle minus (free GPUs of Up nodes + those being
    /// freed for them).
    pub fn headroom_shortfall(&self) -> usize {
        let headroom = self.headroom_gpus();
        if headroom == 0 {
            return 0;
        }
        let free: usize = self
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Up)
            .map(|n| {
                n.usable_gpus()
                    .filter(|g| !n.allocated.contains_key(&g.index) && !n.claimed.contains_key(&g.index))
                    .count()
            })
            .sum();
        headroom.saturating_sub(free + self.headroom_freeing())
    }

    /// Whether running job `victim` may be stopped to refill the headroom at `now` on a cluster
    /// of `up_gpus` GPUs: a QoS with headroom may preempt its QoS, which requeues (never
    /// cancels) its jobs; it could run outside the headroom (else, held by nothing, it would
    /// start in it again); and it passes every check any preemption makes.
    pub fn vacatable(&self, victim: &Job, now: i64, up_gpus: usize) -> Result<(), String> {
        let v_qos = self.policy.qos(&victim.spec.qos).ok_or("unknown qos")?;
        let alloc = victim.allocation.as_ref().ok_or("not running")?;
        if victim.state != JobState::Running || alloc.stop.is_some() || alloc.task_count() > 1 {
            return Err(format!("job {} is not a single-node run running undisturbed", victim.id));
        }
        let by_headroom =
            self.policy.qos.values().any(|q| q.headroom_gpus > 0 && q.preempt.contains(&v_qos.name));
        if !by_headroom {
            return Err(format!("no qos with headroom may preempt qos \"{}\"", v_qos.name));
        }
        if v_qos.preempt_mode == crate::policy::PreemptMode::Cancel {
            return Err(format!("qos \"{}\" cancels its preempted jobs", v_qos.name));
        }
        if victim.total_gpus() as usize + self.headroom_gpus() > up_gpus {
            return Err(format!(
                "job {} needs more GPUs than the cluster has outside the headroom",
                victim.id
            ));
        }
        self.undisturbed_victim(victim, v_qos, now)
    }

    /// `Op::Vacate`: stops `victims` to refill the headroom, if it lacks GPUs and every
    /// victim is needed and may be stopped; all or nothing.
    pub(super) fn vacate(&mut self, victims: &[JobId], now: i64) -> Outcome {
        let reject = |m: String| Outcome::Rejected(Rejection::FailedPrecondition(m));
        let shortfall = self.headroom_shortfall();
        if shortfall == 0 || victims.is_empty() {
            return reject("the headroom lacks no GPUs".into());
        }
        let (mut gpus, up_gpus) = (0usize, self.up_gpus());
        // The headroom serves no one team: no team is taken below its guarantee for it.
        let (teams, mut taken) = (self.guarantees(), BTreeMap::new());
        for (i, v) in victims.iter().enumerate() {
            let Some(victim) = self.jobs.get(v) else { return reject(format!("job {v} not found")) };
            if victims[..i].contains(v) {
                return reject(format!("job {v} is named twice"));
            }
            if let Err(why) = self.vacatable(victim, now, up_gpus) {
                return reject(why);
            }
            if gpus >= shortfall {
                return reject(format!("more victims than the headroom's {shortfall} missing GPUs need"));
            }
            if !teams.take(&mut taken, &victim.spec.account, "", u64::from(victim.total_gpus())) {
                let a = &victim.spec.account;
                return reject(format!("job {v}: account \"{a}\" would be left below its guarantee"));
            }
            gpus += victim.total_gpus() as usize;
        }
        for v in victims {
            let job = self.jobs.get_mut(v).expect("validated");
            let alloc = job.allocation.as_mut().expect("validated");
            alloc.stop = Some(StopReason::Vacated);
            job.preempted_at.push(now);
            if job.preempted_at.len() > 16 {
                job.preempted_at.remove(0);
            }
            job.record(
                now,
                "preempted",
                format!("to give the inference headroom {shortfall} idle GPUs back"),
            );
            *self.preemption_totals.entry("vacate".to_string()).or_default() += 1;
        }
        Outcome::Vacated { victims: victims.to_vec() }
    }
}
