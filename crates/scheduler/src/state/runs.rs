//! Runs: a plan's placements (re-validated by `check_grant`), starts, exits (single tasks and
//! gangs), time limits, and how a run ends (charged, released, requeued or finished).

use super::*;

/// Why a run its idle GPU rule stopped was requeued.
const IDLE_REQUEUE: &str = "its GPUs were idle (the idle GPU rule requeues)";

impl ClusterState {
    pub(super) fn apply_plan(&mut self, plan: &Plan, now: i64) -> Outcome {
        let mut accepted = Vec::new();
        let mut rejected = Vec::new();
        let mut usage = self.running_usage();
        let mut teams = self.guarantees();
        // Running tasks of the limited arrays this plan places tasks of (counted when first met).
        let mut arrays: BTreeMap<JobId, u32> = BTreeMap::new();
        for (i, p) in plan.placements.iter().enumerate() {
            if i >= PLAN_PLACEMENTS_MAX {
                rejected.push((p.job, "plan too large".to_string()));
                continue;
            }
            let checked = self.check_placement(p).and_then(|()| {
                let job = &self.jobs[&p.job];
                usage.admits(job, &self.policy).map_err(|r| format!("job {}: {r}", p.job))?;
                if let Some((array, max)) = job.spec.array.as_ref().and_then(|a| Some((a, a.max_running?))) {
                    let running =
                        arrays.entry(array.id).or_insert_with(|| self.array_running(array.id, array.count));
                    if *running >= max {
                        return Err(format!(
                            "job {}: {}",
                            p.job,
                            crate::reasons::PendingReason::JobArrayTaskLimit
                        ));
                    }
                    *running += 1;
                }
                let (account, gpus) = (job.spec.account.as_str(), u64::from(job.total_gpus()));
                // A claim (a preemptor's, a resized run's) was granted when it was made, and
                // counted as held: it is now its run. Every other start stays within every
                // borrow limit of its chain.
                let claimed = job.claim.as_ref().map(|c| c.tasks().map(|(_, g)| g.len() as u64).sum());
                if let Some(held) = claimed {
                    teams.remove(account, held);
                } else if teams.active() {
                    teams.borrow_check(account, gpus).map_err(|r| format!("job {}: {r}", p.job))?;
                }
                let borrowing = teams.active() && !teams.within(account, gpus);
                teams.add(account, gpus);
                usage.add(job, &self.policy);
                Ok(borrowing)
            });
            match checked {
                Ok(borrowing) => {
                    let account = &self.jobs[&p.job].spec.account;
                    let note = borrowing.then(|| teams.borrow_note(account));
                    self.place(p, now, note);
                    accepted.push(p.job);
                }
                Err(why) => rejected.push((p.job, why)),
            }
        }
        Outcome::PlanApplied { accepted, rejected }
    }

    /// Running (or suspended) tasks of array `id` (`count` tasks, consecutive ids from `id`).
    pub(super) fn array_running(&self, id: JobId, count: u32) -> u32 {
        self.jobs
            .range(id..id.saturating_add(u64::from(count)))
            .filter(|(_, j)| j.spec.array.as_ref().is_some_and(|a| a.id == id))
            .filter(|(_, j)| matches!(j.state, JobState::Running | JobState::Suspended))
            .count() as u32
    }

    /// Re-validates one placement against the current state.
    fn check_placement(&self, p: &Placement) -> Result<(), String> {
        let job = self.jobs.get(&p.job).ok_or_else(|| format!("job {} not found", p.job))?;
        if job.state != JobState::Pending {
            return Err(format!("job {} is {}, not pending", p.job, job.state.as_str()));
        }
        if job.held {
            return Err(format!("job {} is held", p.job));
        }
        self.dependency_state(job).map_err(|r| format!("job {}: {r}", p.job))?;
        let tasks: Vec<(&str, &[GpuIndex])> = p.tasks().collect();
        if tasks.len() != job.tasks() as usize {
            return Err(format!("job {} needs {} tasks, plan gives {}", p.job, job.tasks(), tasks.len()));
        }
        let distinct: BTreeSet<&str> = tasks.iter().map(|(n, _)| *n).collect();
        if distinct.len() != tasks.len() {
            return Err(format!("job {}: two tasks on one node", p.job));
        }
        if self.over_partition_wall(job) {
            return Err(format!("job {}: {}", p.job, crate::reasons::PendingReason::PartitionTimeLimit));
        }
        self.placement_domains(job, p).map_err(|why| format!("job {}: {why}", p.job))?;
        for (name, gpus) in tasks {
            self.check_grant(job, name, gpus, Some(job.gpus()), Taking::Free).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Places one re-validated placement; `borrowing`: when it starts beyond its team's
    /// guarantee, what its team holds with it (marked, and said in its event).
    fn place(&mut self, p: &Placement, now: i64, borrowing: Option<String>) {
        let domains = self.jobs.get(&p.job).and_then(|j| self.placement_domains(j, p).ok().flatten());
        if let Some(placed) = &domains {
            self.count_gang(placed, p.more.len() + 1);
        }
        self.drop_claim(p.job);
        let share = self.jobs.get(&p.job).map(|j| j.spec.cpu_mem()).unwrap_or_default();
        let milli = self.jobs.get(&p.job).map_or(0, |j| j.spec.gpu_milli);
        for (name, gpus) in p.tasks() {
            let node = self.nodes.get_mut(name).expect("placement was validated");
            for gpu in gpus {
                match milli {
                    0 => {
                        node.allocated.insert(*gpu, p.job);
                    }
                    m => {
                        node.shared.entry(*gpu).or_default().insert(p.job, m);
                    }
                }
            }
            node.held.insert(p.job, share);
        }
        let skipped = self.skipped_ms;
        let job = self.jobs.get_mut(&p.job).expect("placement was validated");
        job.skipped_at_start_ms = skipped;
        job.state = JobState::Running;
        job.reason.clear();
        job.last_checkpoint_ms = None;
        job.suspended_ms = 0;
        job.suspended_since = None;
        job.gpu_idle_since = None;
        job.allocation = Some(Allocation {
            node: p.node.clone(),
            gpus: p.gpus.clone(),
            more: p.more.clone(),
            started: false,
            stop: None,
            exits: BTreeMap::new(),
            failure: None,
            lent: Vec::new(),
            borrowing: borrowing.is_some(),
        });
        job.last_node = p.node.clone();
        job.attempt_nodes.insert(job.attempt, p.node.clone());
        while job.attempt_nodes.len() > crate::model::ATTEMPT_NODES_KEPT {
            job.attempt_nodes.pop_first();
        }
        job.last_gpus = p.gpus.clone();
        job.last_more = p.more.clone();
        job.start_time_ms = Some(now);
        let mut msg = format!("node \"{}\" GPUs {:?}", p.node, p.gpus);
        for t in &p.more {
            msg.push_str(&format!(", node \"{}\" GPUs {:?}", t.node, t.gpus));
        }
        if let Some(placed) = domains {
            msg.push_str(&format!("; {}", placed.note));
        }
        if let Some(note) = borrowing {
            msg.push_str(&format!("; borrowing: {note}"));
        }
        job.record(now, "allocated", msg);
    }

    /// The running job's allocation, if `job`/`attempt`/`node` name its current run.
    pub(super) fn current_run(&mut self, id: JobId, attempt: u32, node: &str) -> Result<&mut Job, String> {
        let job = self.jobs.get_mut(&id).ok_or_else(|| format!("job {id} not found"))?;
        let matches = matches!(job.state, JobState::Running | JobState::Suspended)
            && job.attempt == attempt
            && job.allocation.as_ref().is_some_and(|a| a.rank_on(node).is_some());
        if matches {
            Ok(job)
        } else {
            Err(format!("job {id} attempt {attempt} on \"{node}\" is not a current run"))
        }
    }

    pub(super) fn job_started(&mut self, id: JobId, attempt: u32, node: &str, now: i64) -> Outcome {
        let skipped = self.skipped_ms;
        let job = match self.current_run(id, attempt, node) {
            Ok(job) => job,
            Err(why) => return Outcome::Ignored(why),
        };
        let alloc = job.allocation.as_mut().expect("current run has an allocation");
        if alloc.started {
            return Outcome::Ignored(format!("job {id} already started"));
        }
        alloc.started = true;
        job.start_time_ms = Some(now);
        job.skipped_at_start_ms = skipped;
        job.record(now, "started", format!("on \"{node}\""));
        Outcome::RunUpdated { job: id, state: JobState::Running }
    }

    pub(super) fn job_exited(
        &mut self,
        id: JobId,
        attempt: u32,
        node: &str,
        exit: &RunExit,
        now: i64,
    ) -> Outcome {
        let job = match self.current_run(id, attempt, node) {
            Ok(job) => job,
            Err(why) => return Outcome::Ignored(why),
        };
        if job.allocation.as_ref().is_some_and(|a| a.task_count() > 1) {
            return self.gang_task_exited(id, node, exit, now);
        }
        let stop = job.allocation.as_ref().and_then(|a| a.stop);
        if let Some(by_cluster) = stop.filter(stopped_by_cluster) {
            return self.run_stopped_by_cluster(id, by_cluster, now);
        }
        // A failed run of a job that retries failures starts again (Kubernetes' backoffLimit).
        let failure = match (stop, exit) {
            (None, RunExit::Code(c)) if *c != 0 => Some(format!("exit code {c}")),
            (None, RunExit::Signal(s)) => Some(format!("killed by signal {s}")),
            _ => None,
        };
        if let Some(why) = failure.filter(|_| job.retried < job.spec.retries) {
            job.retried += 1;
            let why = format!("{why}; retry {} of {}", job.retried, job.spec.retries);
            self.requeue_run(id, &why, now);
            return Outcome::RunUpdated { job: id, state: JobState::Pending };
        }
        let (state, reason) = run_end(job, stop, exit);
        match exit {
            RunExit::Code(c) => job.exit_code = Some(*c),
            RunExit::Signal(s) => job.signal = Some(*s),
            RunExit::Lost(_) => {}
        }
        let state = if matches!(exit, RunExit::Lost(_)) && stop.is_none() {
            // The cluster, not the job, lost this run: requeue it where the job allows.
            self.fail_run(id, state, reason, now)
        } else {
            self.end_run(id, state, reason, now);
            state
        };
        Outcome::RunUpdated { job: id, state }
    }

    /// One task of a gang ended. Its GPUs are released at once (its process is gone); the
    /// first failure stops the other tasks; the job ends when every task has ended.
    pub(super) fn gang_task_exited(&mut self, id: JobId, node: &str, exit: &RunExit, now: i64) -> Outcome {
        let Some(job) = self.jobs.get_mut(&id) else {
            return Outcome::Ignored(format!("job {id} not found"));
        };
        let Some(alloc) = job.allocation.as_mut() else {
            return Outcome::Ignored(format!("job {id} has no run"));
        };
        let Some(rank) = alloc.rank_on(node) else {
            return Outcome::Ignored(format!("no task of job {id} on \"{node}\""));
        };
        if alloc.exits.contains_key(&rank) {
            return Outcome::Ignored(format!("rank {rank} of job {id} already ended"));
        }
        let (code, failure) = rank_exit(rank, node, exit);
        alloc.exits.insert(rank, code);
        let first_failure = failure.filter(|_| alloc.failure.is_none() && alloc.stop.is_none());
        if let Some(f) = &first_failure {
            alloc.stop = Some(StopReason::TaskFailed);
            alloc.failure = Some(f.clone());
        }
        let done = alloc.exits.len() as u32 == alloc.task_count();
        let (stop, failure) = (alloc.stop, alloc.failure.clone());
        if let Some(f) = first_failure {
            match exit {
                RunExit::Code(c) => job.exit_code = Some(*c),
                RunExit::Signal(s) => job.signal = Some(*s),
                RunExit::Lost(_) => {}
            }
            job.record(now, "task-failed", format!("{f}; stopping the other tasks"));
        }
        // The cluster lost a task (node down, agent lost it): requeue where the job allows.
        let lost = stop == Some(StopReason::TaskFailed)
            && self
                .jobs
                .get(&id)
                .and_then(|j| j.allocation.as_ref())
                .is_some_and(|a| a.exits.values().any(|c| *c == LOST_EXIT));
        if let Some(n) = self.nodes.get_mut(node) {
            n.allocated.retain(|_, holder| *holder != id);
            n.held.remove(&id);
        }
        if !done {
            return Outcome::RunUpdated { job: id, state: JobState::Running };
        }
        self.gang_ended(id, stop, failure, lost, now)
    }

    /// The run of a whole gang ended (every task has): how, from why it was stopped (`lost`:
    /// the cluster lost a task, so a failure requeues where the job allows).
    fn gang_ended(
        &mut self,
        id: JobId,
        stop: Option<StopReason>,
        failure: Option<String>,
        lost: bool,
        now: i64,
    ) -> Outcome {
        let (state, reason) = match stop {
            Some(StopReason::Cancelled) => (JobState::Cancelled, "cancelled".to_string()),
            Some(StopReason::TimeLimit) => (JobState::Timeout, "time limit reached".to_string()),
            Some(StopReason::TaskFailed) => (JobState::Failed, failure.unwrap_or_default()),
            Some(StopReason::Preempted { by, .. }) => (JobState::Cancelled, format!("preempted by job {by}")),
            Some(StopReason::Resize { by }) => return self.resized_run_ended(id, by, now),
            Some(StopReason::Idle) => {
                self.requeue_run(id, IDLE_REQUEUE, now);
                return Outcome::RunUpdated { job: id, state: JobState::Pending };
            }
            Some(StopReason::ReservationOpened) => {
                self.requeue_run(id, "a reservation's window opened on a node of the gang", now);
                return Outcome::RunUpdated { job: id, state: JobState::Pending };
            }
            Some(StopReason::Drained | StopReason::Vacated) => {
                self.requeue_run(id, "a node of the gang was drained", now);
                return Outcome::RunUpdated { job: id, state: JobState::Pending };
            }
            Some(StopReason::GpuFailed) => {
                let why = self.fault_of(id);
                self.requeue_run(id, &why, now);
                return Outcome::RunUpdated { job: id, state: JobState::Pending };
            }
            None => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.exit_code = Some(0);
                }
                (JobState::Completed, String::new())
            }
        };
        let state = if lost && state == JobState::Failed {
            self.fail_run(id, JobState::NodeFail, reason, now)
        } else {
            self.end_run(id, state, reason, now);
            state
        };
        Outcome::RunUpdated { job: id, state }
    }

    /// A run the cluster, not the job, stopped ended (`stopped_by_cluster`): it continues as
    /// the preemption or resize planned, or requeues regardless of --requeue.
    fn run_stopped_by_cluster(&mut self, id: JobId, stop: StopReason, now: i64) -> Outcome {
        match stop {
            StopReason::Preempted { by, mode } => return self.preempted_run_ended(id, by, mode, now),
            StopReason::Resize { by } => return self.resized_run_ended(id, by, now),
            StopReason::Drained => self.requeue_run(id, "its node was drained", now),
            StopReason::ReservationOpened => {
                self.requeue_run(id, "a reservation's window opened on its resources", now)
            }
            StopReason::Vacated => {
                self.requeue_run(id, "stopped to keep GPUs idle for the inference headroom", now)
            }
            StopReason::Idle => self.requeue_run(id, IDLE_REQUEUE, now),
            _ => {
                // A GPU failed: not the job's doing either.
                let why = self.fault_of(id);
                self.requeue_run(id, &why, now);
            }
        }
        Outcome::RunUpdated { job: id, state: JobState::Pending }
    }

    pub(super) fn enforce_time_limit(&mut self, id: JobId, attempt: u32, now: i64) -> Outcome {
        let past = self.jobs.get(&id).is_some_and(|j| self.past_limit(j, now));
        let Some(job) = self.jobs.get_mut(&id) else {
            return Outcome::Ignored(format!("job {id} not found"));
        };
        if job.state != JobState::Running || job.attempt != attempt || !past {
            return Outcome::Ignored(format!("job {id} attempt {attempt} is not past its limit"));
        }
        let Some(alloc) = job.allocation.as_mut() else {
            return Outcome::Ignored(format!("job {id} has no allocation"));
        };
        if alloc.stop.is_some() {
            return Outcome::Ignored(format!("job {id} is already stopping"));
        }
        alloc.stop = Some(StopReason::TimeLimit);
        job.record(now, "time-limit", "wall-clock limit reached, stopping".into());
        Outcome::RunUpdated { job: id, state: JobState::Running }
    }

    /// Ends a run the cluster lost (node down, run lost): the job goes back to Pending with the
    /// next attempt when it allows requeue and has attempts left, else ends in `state`.
    /// Returns the job's new state.
    pub(super) fn fail_run(&mut self, id: JobId, state: JobState, reason: String, now: i64) -> JobState {
        // A run already stopping for good (cancelled, out of time) ends as it was told to: the
        // cluster losing it must not bring the job back.
        let stop = self.jobs.get(&id).and_then(|j| j.allocation.as_ref()).and_then(|a| a.stop);
        let for_good = match stop {
            Some(StopReason::Cancelled) => Some(JobState::Cancelled),
            Some(StopReason::TimeLimit) => Some(JobState::Timeout),
            // (A gang that lost a task stops the rest with `TaskFailed` and requeues from here.)
            _ => None,
        };
        if let Some(ended) = for_good {
            self.end_run(id, ended, format!("{} ({reason})", ended.as_str().to_ascii_lowercase()), now);
            return ended;
        }
        let requeue = self.jobs.get(&id).is_some_and(|j| j.spec.requeue && j.attempt + 1 < ATTEMPTS_MAX);
        if !requeue {
            self.end_run(id, state, reason, now);
            return state;
        }
        self.requeue_run(id, &reason, now);
        JobState::Pending
    }

    /// Charges the time of `job`'s current run, at the billing weights (its GPUs, all tasks',
    /// by default), to its account and the account's ancestors.
    fn charge_run(&mut self, id: JobId, now: i64) {
        let Some(job) = self.jobs.get(&id) else { return };
        let Some(start) = job.start_time_ms else { return };
        // Suspended time is not charged: the GPUs were lent to the preemptor.
        let suspended = self.suspended_ms(job, now);
        let ran_ms = now.saturating_sub(start).saturating_sub(suspended).max(0);
        // Charged per the billing weights: GPUs alone by default.
        let per_ms = self.policy.weights.billing.milli_per_ms(
            job.total_gpus(),
            job.spec.cpus.saturating_mul(job.tasks()),
            job.spec.mem_mib.saturating_mul(u64::from(job.tasks())),
        );
        let gpu_ms = per_ms * ran_ms as u128 / 1000;
        if gpu_ms == 0 {
            return;
        }
        let half_life = self.policy.weights.fairshare_half_life_s;
        for account in self.policy.account_chain(&job.spec.account) {
            self.usage.entry(account).or_default().charge(gpu_ms, now, half_life);
        }
    }

    /// Takes a job's allocation and frees every GPU it holds or claims.
    fn release_run(&mut self, id: JobId) {
        self.drop_claim(id);
        self.suspended.remove(&id);
        let Some(job) = self.jobs.get_mut(&id) else { return };
        job.suspended_since = None;
        let Some(alloc) = job.allocation.take() else { return };
        for (_, name, _) in alloc.tasks() {
            if let Some(node) = self.nodes.get_mut(name) {
                node.allocated.retain(|_, holder| *holder != id);
                node.held.remove(&id);
                for gpu in alloc.gpus.iter().filter(|_| alloc.node == name) {
                    if let Some(holders) = node.shared.get_mut(gpu) {
                        holders.remove(&id);
                        if holders.is_empty() {
                            node.shared.remove(gpu);
                        }
                    }
                }
            }
        }
    }

    /// Sends a job's current run back to the queue as its next attempt (usage charged, GPUs freed).
    pub(super) fn requeue_run(&mut self, id: JobId, reason: &str, now: i64) {
        self.charge_run(id, now);
        self.release_run(id);
        let Some(job) = self.jobs.get_mut(&id) else { return };
        job.attempt += 1;
        job.state = JobState::Pending;
        job.exit_code = None;
        job.signal = None;
        job.start_time_ms = None;
        job.reason.clear();
        job.record(now, "requeued", format!("{reason}; attempt {} follows", job.attempt));
    }

    /// Ends a job's current run in a terminal state and releases its GPUs.
    pub(super) fn end_run(&mut self, id: JobId, state: JobState, reason: String, now: i64) {
        debug_assert!(state.is_terminal());
        if self.jobs.get(&id).is_some_and(|j| j.allocation.is_some()) {
            self.charge_run(id, now);
        }
        self.release_run(id);
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if !job.state.is_terminal() {
            self.unfinished.ended(&job.spec.user);
        }
        job.state = state;
        job.end_time_ms = Some(now);
        job.record(now, state.as_str().to_ascii_lowercase(), reason.clone());
        job.reason = reason;
    }
}

impl ClusterState {
    /// A note an agent records on a current run (kind and message bounded).
    /// Adds what the current run used to the job's sum over its attempts and tasks (the peak is
    /// the largest; OOM kills count for the current attempt).
    pub(super) fn run_usage(
        &mut self,
        job: JobId,
        attempt: u32,
        node: &str,
        usage: &crate::model::RunUsage,
    ) -> Outcome {
        match self.current_run(job, attempt, node) {
            Ok(j) => {
                j.usage.get_or_insert_with(Default::default).add(attempt, usage);
                Outcome::RunUpdated { job, state: j.state }
            }
            Err(why) => Outcome::Ignored(why),
        }
    }

    pub(super) fn run_note(
        &mut self,
        job: JobId,
        attempt: u32,
        node: &str,
        kind: &str,
        message: &str,
        now: i64,
    ) -> Outcome {
        match self.current_run(job, attempt, node) {
            Ok(j) => {
                let kind: String = kind.chars().take(32).collect();
                j.record(now, kind, message.chars().take(256).collect());
                Outcome::RunUpdated { job, state: j.state }
            }
            Err(why) => Outcome::Ignored(why),
        }
    }

    /// A current run saved a checkpoint: on a preemption's signal, the work its preemption
    /// record counted as lost was not.
    pub(super) fn checkpointed(&mut self, job: JobId, attempt: u32, node: &str, now: i64) -> Outcome {
        let j = match self.current_run(job, attempt, node) {
            Ok(j) => j,
            Err(why) => return Outcome::Ignored(why),
        };
        j.last_checkpoint_ms = Some(now);
        let preempted =
            j.allocation.as_ref().is_some_and(|a| matches!(a.stop, Some(StopReason::Preempted { .. })));
        if preempted {
            j.record(now, "checkpointed", "on the preemption signal: no work lost".into());
            if let Some(r) = self.preemptions.iter_mut().rev().find(|r| r.victim == job) {
                r.gpu_s_lost = 0;
            }
        }
        Outcome::RunUpdated { job, state: JobState::Running }
    }
}

/// Whether the cluster, not the job, stopped a run for this reason (preempted, resized,
/// drained, vacated, a failed GPU, idle GPUs).
fn stopped_by_cluster(stop: &StopReason) -> bool {
    matches!(
        stop,
        StopReason::Preempted { .. }
            | StopReason::Resize { .. }
            | StopReason::Drained
            | StopReason::ReservationOpened
            | StopReason::Vacated
            | StopReason::GpuFailed
            | StopReason::Idle
    )
}

/// How a single-task run that the job itself ended (or that was cancelled, timed out or lost)
/// ends: its final state and reason.
fn run_end(job: &Job, stop: Option<StopReason>, exit: &RunExit) -> (JobState, String) {
    match (stop, exit) {
        (Some(StopReason::Cancelled), _) => (JobState::Cancelled, "cancelled".to_string()),
        (Some(StopReason::TimeLimit), _) => (JobState::Timeout, "time limit reached".to_string()),
        (Some(StopReason::TaskFailed), _) => (JobState::Failed, "a task failed".to_string()),
        (
            Some(
                StopReason::Preempted { .. }
                | StopReason::Resize { .. }
                | StopReason::Drained
                | StopReason::ReservationOpened
                | StopReason::Vacated
                | StopReason::GpuFailed
                | StopReason::Idle,
            ),
            _,
        ) => {
            unreachable!("handled above")
        }
        (None, RunExit::Code(0)) => (JobState::Completed, String::new()),
        // A session ends however its user ends it: `exit 3` is the user's answer, not a failure.
        (None, RunExit::Code(c)) if job.spec.profile == crate::model::Profile::Interactive => {
            (JobState::Completed, format!("the session ended with exit code {c}"))
        }
        (None, RunExit::Code(_) | RunExit::Signal(_)) if job.usage.is_some_and(|u| u.oom_in(job.attempt)) => {
            let limit = job.spec.mem_mib;
            (JobState::OutOfMemory, format!("out of memory: the kernel killed it at its {limit} MiB limit"))
        }
        (None, RunExit::Code(c)) => (JobState::Failed, format!("exit code {c}")),
        (None, RunExit::Signal(s)) => (JobState::Failed, format!("killed by signal {s}")),
        (None, RunExit::Lost(m)) => (JobState::Failed, format!("lost: {m}")),
    }
}

/// A gang rank's exit code as recorded (a signal negated, a lost task `LOST_EXIT`), and the
/// failure it is, if any.
fn rank_exit(rank: u32, node: &str, exit: &RunExit) -> (i32, Option<String>) {
    match exit {
        RunExit::Code(0) => (0, None),
        RunExit::Code(c) => (*c, Some(format!("rank {rank} on \"{node}\" exited with code {c}"))),
        RunExit::Signal(s) => (-*s, Some(format!("rank {rank} on \"{node}\" was killed by signal {s}"))),
        RunExit::Lost(m) => (LOST_EXIT, Some(format!("rank {rank} on \"{node}\" lost: {m}"))),
    }
}
