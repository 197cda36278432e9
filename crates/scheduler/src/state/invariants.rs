//! The ownership invariants, checked after every apply in debug builds and by the property tests.

use super::*;

impl ClusterState {
    /// Checks the ownership invariants; used by tests and debug assertions.
    ///
    /// - every allocated GPU exists on its node and is held by a running job that lists it;
    /// - every running job's GPUs are held by it, on an existing node;
    /// - no GPU is held by two jobs (by construction of the per-node map, checked both ways).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_unfinished_index()?;
        if let Some(r) = self.history.iter().find(|r| self.jobs.contains_key(&r.id)) {
            return Err(format!("job {} is both live and in the history", r.id));
        }
        for job in self.jobs.values() {
            if let Some((a, max)) =
                job.spec.array.as_ref().filter(|a| a.id == job.id).and_then(|a| Some((a, a.max_running?)))
            {
                let running = self.array_running(a.id, a.count);
                if running > max {
                    return Err(format!("array {} runs {running} tasks, more than its %{max}", a.id));
                }
            }
        }
        self.job_index.check(&self.jobs)?;
        self.check_allocated()?;
        self.check_faults()?;
        self.check_shared()?;
        self.check_held()?;
        self.check_claimed()?;
        self.check_reservations()?;
        self.check_running()
    }

    /// An open reservation's resources run only its own jobs and runs that are stopping (with
    /// `ignore_jobs`, any run: the planner and apply keep new ones out); its jobs run only
    /// there.
    fn check_reservations(&self) -> Result<(), String> {
        let now = self.now_ms;
        for r in self.reservations.values() {
            let Some(_) = r.open_at(now).filter(|(s, _)| r.opened_ms == Some(*s)) else { continue };
            let running = self.jobs.values().filter(|j| j.state == JobState::Running);
            for job in running.filter(|j| j.allocation.as_ref().is_some_and(|a| a.stop.is_none())) {
                let member = self.member(r, job);
                if (member || !r.ignore_jobs) && self.breaks_window(r, job) {
                    return Err(if member {
                        format!("job {} of reservation {} runs outside it", job.id, r.name)
                    } else {
                        format!("job {} runs on reservation {}'s resources in its window", job.id, r.name)
                    });
                }
            }
        }
        Ok(())
    }

    /// Every allocated GPU exists on its node and is held by a running job that lists it.
    fn check_allocated(&self) -> Result<(), String> {
        for (name, node) in &self.nodes {
            for (gpu, holder) in &node.allocated {
                if !node.info.gpus.iter().any(|g| g.index == *gpu) {
                    return Err(format!("node {name} allocates missing GPU {gpu}"));
                }
                let job = self.jobs.get(holder).ok_or(format!("GPU held by unknown job {holder}"))?;
                let alloc = job
                    .allocation
                    .as_ref()
                    .ok_or(format!("job {holder} holds GPU {gpu} without allocation"))?;
                let listed = alloc.tasks().any(|(rank, n, gpus)| {
                    n == name.as_str() && gpus.contains(gpu) && !alloc.exits.contains_key(&rank)
                }) && !alloc.lent.contains(gpu);
                if !matches!(job.state, JobState::Running | JobState::Suspended) || !listed {
                    return Err(format!("GPU {gpu} of {name} held by job {holder} which does not own it"));
                }
                // An unhealthy GPU is only ever held by a run on its way out.
                if !node.healthy(*gpu) && alloc.stop.is_none() {
                    return Err(format!(
                        "unhealthy GPU {gpu} of {name} held by job {holder}, which is not stopping"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every shared GPU exists, is held whole by no one, claimed by no one, and its fractions
    /// (at most a whole GPU together) belong to live single-task runs there that asked for them.
    fn check_shared(&self) -> Result<(), String> {
        for (name, node) in &self.nodes {
            for (gpu, holders) in &node.shared {
                if !node.info.gpus.iter().any(|g| g.index == *gpu) || holders.is_empty() {
                    return Err(format!("node {name} shares missing GPU {gpu} (or none holds it)"));
                }
                if node.allocated.contains_key(gpu) || node.claimed.contains_key(gpu) {
                    return Err(format!("shared GPU {gpu} of {name} is also held or claimed whole"));
                }
                if holders.values().sum::<u32>() > crate::model::GPU_MILLI {
                    return Err(format!("GPU {gpu} of {name} is shared past a whole GPU: {holders:?}"));
                }
                for (job, milli) in holders {
                    let j = self
                        .jobs
                        .get(job)
                        .ok_or(format!("GPU {gpu} of {name} shared by unknown job {job}"))?;
                    let live = matches!(j.state, JobState::Running | JobState::Suspended);
                    let placed = j.allocation.as_ref().is_some_and(|a| a.node == *name && a.gpus == [*gpu]);
                    if !live || !placed || j.spec.gpu_milli != *milli {
                        return Err(format!(
                            "GPU {gpu} of {name} shared by job {job}, which does not hold it"
                        ));
                    }
                    if !node.healthy(*gpu) && j.allocation.as_ref().is_some_and(|a| a.stop.is_none()) {
                        return Err(format!(
                            "unhealthy GPU {gpu} of {name} shared by job {job}, which is not stopping"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Every unhealthy GPU exists and no claim promises one.
    fn check_faults(&self) -> Result<(), String> {
        for (name, node) in &self.nodes {
            for gpu in node.faults.keys() {
                if !node.info.gpus.iter().any(|g| g.index == *gpu) {
                    return Err(format!("node {name} records a fault of missing GPU {gpu}"));
                }
                if let Some(claimer) = node.claimed.get(gpu) {
                    return Err(format!("unhealthy GPU {gpu} of {name} is claimed by job {claimer}"));
                }
            }
        }
        Ok(())
    }

    /// Every job a node lists as holding CPUs and memory runs a live task there.
    fn check_held(&self) -> Result<(), String> {
        for (name, node) in &self.nodes {
            for holder in node.held.keys() {
                let live = self.jobs.get(holder).is_some_and(|j| {
                    matches!(j.state, JobState::Running | JobState::Suspended)
                        && j.allocation.as_ref().is_some_and(|a| {
                            a.tasks().any(|(r, n, _)| n == name.as_str() && !a.exits.contains_key(&r))
                        })
                });
                if !live {
                    return Err(format!(
                        "node {name} lists job {holder} as holding CPUs/memory; it runs nothing there"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every claimed GPU is claimed by a preemptor (or a resizing run) that has that claim.
    fn check_claimed(&self) -> Result<(), String> {
        for (name, node) in &self.nodes {
            for (gpu, claimer) in &node.claimed {
                let ok = self.jobs.get(claimer).is_some_and(|j| match j.state {
                    JobState::Pending => j
                        .claim
                        .as_ref()
                        .is_some_and(|c| c.tasks().any(|(n, gs)| n == name.as_str() && gs.contains(gpu))),
                    // A resizing run claims the GPUs of its next run (on its own nodes, or for a
                    // grown gang, on new ones).
                    JobState::Running => j
                        .allocation
                        .as_ref()
                        .is_some_and(|a| matches!(a.stop, Some(StopReason::Resize { .. }))),
                    _ => false,
                });
                if !ok {
                    return Err(format!(
                        "GPU {gpu} of {name} is claimed by job {claimer} which has no such claim"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every running (or suspended) job holds the GPUs it lists, one task per node, on existing
    /// nodes; no other job has an allocation; the suspended set matches.
    fn check_running(&self) -> Result<(), String> {
        for job in self.jobs.values() {
            if (job.state == JobState::Suspended) != self.suspended.contains(&job.id) {
                return Err(format!(
                    "job {} is {} but the suspended set disagrees",
                    job.id,
                    job.state.as_str()
                ));
            }
            match (&job.allocation, job.state) {
                (Some(alloc), JobState::Running | JobState::Suspended) => {
                    if !alloc.lent.is_empty() && job.state != JobState::Suspended {
                        return Err(format!("job {} lends GPUs but is not suspended", job.id));
                    }
                    if alloc.task_count() != job.tasks() {
                        return Err(format!(
                            "job {} runs {} of {} tasks",
                            job.id,
                            alloc.task_count(),
                            job.tasks()
                        ));
                    }
                    let nodes: BTreeSet<&str> = alloc.tasks().map(|(_, n, _)| n).collect();
                    if nodes.len() != alloc.task_count() as usize {
                        return Err(format!("job {} has two tasks on one node", job.id));
                    }
                    for (rank, name, gpus) in alloc.tasks().filter(|(r, _, _)| !alloc.exits.contains_key(r)) {
                        let node = self.nodes.get(name).ok_or(format!("job {} on unknown node", job.id))?;
                        if gpus.len() != job.gpus() as usize {
                            return Err(format!("job {} rank {rank} has {} GPUs", job.id, gpus.len()));
                        }
                        for gpu in gpus.iter().filter(|g| !alloc.lent.contains(g)) {
                            let holds = match job.spec.gpu_milli {
                                0 => node.allocated.get(gpu) == Some(&job.id),
                                m => node.shared.get(gpu).and_then(|h| h.get(&job.id)) == Some(&m),
                            };
                            if !holds {
                                return Err(format!("job {} lists GPU {gpu} it does not hold", job.id));
                            }
                        }
                        let mut cpu_mem = job.spec.cpu_mem();
                        if job.state == JobState::Suspended {
                            cpu_mem.cpus = 0;
                        }
                        if node.held.get(&job.id) != Some(&cpu_mem) {
                            return Err(format!(
                                "job {} rank {rank} should hold {cpu_mem:?} on {name}, the node says {:?}",
                                job.id,
                                node.held.get(&job.id)
                            ));
                        }
                    }
                }
                (None, JobState::Running | JobState::Suspended) => {
                    return Err(format!("running job {} has no allocation", job.id))
                }
                (Some(_), _) => return Err(format!("job {} is not running but has an allocation", job.id)),
                (None, _) => {}
            }
        }
        Ok(())
    }
}
