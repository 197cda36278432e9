//! Elastic jobs: growing back (single-node and gangs) and the restart of a resized run.

use super::*;

impl ClusterState {
    /// A running elastic job grows (or shrinks) to `gpus` (and, for a gang, `more`).
    pub(super) fn resize(
        &mut self,
        job: JobId,
        attempt: u32,
        gpus: &[GpuIndex],
        more: &[TaskPlacement],
        now: i64,
    ) -> Outcome {
        if more.is_empty() {
            self.grow(job, attempt, gpus, now)
        } else {
            self.grow_gang(job, attempt, gpus, more, now)
        }
    }

    /// Whether running `job` may grow to `gpus` GPUs within its QoS limits.
    pub fn may_grow(&self, job: &Job, gpus: u32, tasks: u32) -> bool {
        let usage = Usage::of(self.jobs_running().filter(|j| j.id != job.id), &self.policy);
        let mut grown = job.clone();
        grown.width = Some(gpus);
        grown.tasks_now = Some(tasks);
        usage.admits(&grown, &self.policy).is_ok()
    }

    /// Grows a running elastic gang onto more nodes (see `Op::Resize`), re-validated whole.
    pub(super) fn grow_gang(
        &mut self,
        id: JobId,
        attempt: u32,
        gpus: &[GpuIndex],
        more: &[crate::model::TaskPlacement],
        now: i64,
    ) -> Outcome {
        let reject = |m: String| Outcome::Rejected(Rejection::FailedPrecondition(m));
        let Some(job) = self.jobs.get(&id) else {
            return Outcome::Rejected(Rejection::NotFound(format!("job {id} not found")));
        };
        let Some(a) = job.allocation.as_ref().filter(|a| a.stop.is_none()) else {
            return reject(format!("job {id} is not running undisturbed"));
        };
        if job.state != JobState::Running || job.attempt != attempt || !job.spec.is_elastic_gang() {
            return reject(format!("job {id} attempt {attempt} is not a running elastic gang"));
        }
        let total = 1 + more.len() as u32;
        if gpus != a.gpus.as_slice()
            || !more.starts_with(&a.more)
            || total <= a.task_count()
            || total > job.spec.tasks
        {
            return reject(format!(
                "job {id}: not a growth of its {} nodes within {}",
                a.task_count(),
                job.spec.tasks
            ));
        }
        let mut used: BTreeSet<&str> = a.tasks().map(|(_, n, _)| n).collect();
        for t in &more[a.more.len()..] {
            if !used.insert(t.node.as_str()) {
                return reject(format!("job {id}: two tasks on \"{}\"", t.node));
            }
            if let Err(e) = self.check_grant(job, &t.node, &t.gpus, Some(job.gpus()), Taking::Free) {
                return reject(e.to_string());
            }
        }
        if !self.may_grow(job, job.gpus(), total) {
            return reject(format!("job {id}: growing to {total} nodes would exceed a qos limit"));
        }
        let claims: Vec<(String, Vec<GpuIndex>)> = std::iter::once((a.node.clone(), a.gpus.clone()))
            .chain(more.iter().map(|t| (t.node.clone(), t.gpus.clone())))
            .collect();
        for (node, gs) in &claims {
            if let Some(n) = self.nodes.get_mut(node) {
                for g in gs {
                    n.claimed.insert(*g, id);
                }
            }
        }
        let job = self.jobs.get_mut(&id).expect("checked");
        job.allocation.as_mut().expect("checked").stop = Some(StopReason::Resize { by: None });
        job.record(now, "resizing", format!("growing to {total} nodes"));
        Outcome::RunUpdated { job: id, state: JobState::Running }
    }

    /// Grows a running elastic job to `gpus` (see `Op::Resize`), re-validated whole.
    pub(super) fn grow(&mut self, id: JobId, attempt: u32, gpus: &[GpuIndex], now: i64) -> Outcome {
        let reject = |m: String| Outcome::Rejected(Rejection::FailedPrecondition(m));
        let Some(job) = self.jobs.get(&id) else {
            return Outcome::Rejected(Rejection::NotFound(format!("job {id} not found")));
        };
        let Some(a) = job.allocation.as_ref().filter(|a| a.stop.is_none() && a.more.is_empty()) else {
            return reject(format!("job {id} is not running undisturbed"));
        };
        if job.state != JobState::Running || job.attempt != attempt || !job.spec.is_elastic() {
            return reject(format!("job {id} attempt {attempt} is not a running elastic job"));
        }
        let wanted: BTreeSet<GpuIndex> = gpus.iter().copied().collect();
        if wanted.len() != gpus.len()
            || wanted.len() as u32 > job.spec.gpus
            || wanted.len() <= a.gpus.len()
            || !a.gpus.iter().all(|g| wanted.contains(g))
        {
            return reject(format!(
                "job {id}: {gpus:?} does not grow {:?} within {} GPUs",
                a.gpus, job.spec.gpus
            ));
        }
        let added: Vec<GpuIndex> = wanted.iter().copied().filter(|g| !a.gpus.contains(g)).collect();
        if let Err(e) = self.check_grant(job, &a.node, &added, None, Taking::Free) {
            return reject(e.to_string());
        }
        if !self.may_grow(job, wanted.len() as u32, 1) {
            return reject(format!("job {id}: growing to {} GPUs would exceed a qos limit", wanted.len()));
        }
        let node = a.node.clone();
        let n = self.nodes.get_mut(&node).expect("checked");
        for g in &wanted {
            n.claimed.insert(*g, id);
        }
        let job = self.jobs.get_mut(&id).expect("checked");
        job.allocation.as_mut().expect("checked").stop = Some(StopReason::Resize { by: None });
        job.record(now, "resizing", format!("growing to {} GPUs {gpus:?}", gpus.len()));
        Outcome::RunUpdated { job: id, state: JobState::Running }
    }

    /// A resized run's process is gone: the job goes back to the queue as its next attempt,
    /// holding a claim on exactly the GPUs of its new size (claimed when the resize began).
    pub(super) fn resized_run_ended(&mut self, id: JobId, by: Option<JobId>, now: i64) -> Outcome {
        let Some(alloc) = self.jobs.get(&id).and_then(|j| j.allocation.as_ref()) else {
            return Outcome::Ignored(format!("job {id} has no run"));
        };
        let gang = self.jobs.get(&id).is_some_and(|j| j.spec.tasks > 1);
        // The next run's tasks: its nodes in rank order, then nodes claimed to grow a gang.
        let mut order: Vec<String> = alloc.tasks().map(|(_, n, _)| n.to_string()).collect();
        if gang {
            let more = self
                .nodes
                .iter()
                .filter(|(name, n)| !order.contains(name) && n.claimed.values().any(|h| *h == id));
            let more: Vec<String> = more.map(|(name, _)| name.clone()).collect();
            order.extend(more);
        }
        let target: Vec<(String, Vec<GpuIndex>)> = order
            .into_iter()
            .filter_map(|name| {
                let gpus: Vec<GpuIndex> = self
                    .nodes
                    .get(&name)?
                    .claimed
                    .iter()
                    .filter(|(_, h)| **h == id)
                    .map(|(g, _)| *g)
                    .collect();
                (!gpus.is_empty()).then_some((name, gpus))
            })
            .collect();
        let gpus: usize = target.iter().map(|(_, g)| g.len()).sum();
        let reason = match (by, gang) {
            (Some(p), true) => format!("shrunk for job {p} to {} nodes", target.len()),
            (None, true) => format!("grown to {} nodes", target.len()),
            (Some(p), false) => format!("shrunk for job {p} to {gpus} GPUs"),
            (None, false) => format!("grown to {gpus} GPUs"),
        };
        self.requeue_run(id, &reason, now);
        let mut tasks = target.into_iter();
        if let Some((node, first)) = tasks.next() {
            let more: Vec<crate::model::TaskPlacement> =
                tasks.map(|(node, gpus)| crate::model::TaskPlacement { node, gpus }).collect();
            let claim = crate::model::Claim { node, gpus: first, more };
            for (n, gs) in claim.tasks() {
                if let Some(n) = self.nodes.get_mut(n) {
                    for g in gs {
                        n.claimed.insert(*g, id);
                    }
                }
            }
            if let Some(job) = self.jobs.get_mut(&id) {
                if gang {
                    job.tasks_now = Some(1 + claim.more.len() as u32);
                } else {
                    job.width = Some(claim.gpus.len() as u32);
                }
                job.claim = Some(claim);
            }
        }
        Outcome::RunUpdated { job: id, state: JobState::Pending }
    }
}
