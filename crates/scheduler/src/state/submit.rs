//! Users' commands on jobs: submit (with QoS, partition and limits), hold/release, cancel, and
//! policy changes (validated whole).

use super::*;

/// Fills in the CPUs and memory a job asked none of from its partition's (else QoS's)
/// per-GPU defaults, then holds it to their per-node maxima.
fn with_resource_defaults(spec: &mut JobSpec, res: &crate::policy::ResourceDefaults) -> Result<(), String> {
    if spec.cpus == 0 {
        spec.cpus = res.def_cpus_per_gpu.unwrap_or(0).saturating_mul(spec.gpus);
    }
    if spec.mem_mib == 0 {
        spec.mem_mib = res.def_mem_per_gpu_mib.unwrap_or(0).saturating_mul(u64::from(spec.gpus));
    }
    if let Some(max) = res.max_cpus_per_node.filter(|m| spec.cpus > *m) {
        return Err(format!(
            "cpus: {} per node is more than the partition's or QoS's maximum of {max}",
            spec.cpus
        ));
    }
    if let Some(max) = res.max_mem_per_node_mib.filter(|m| spec.mem_mib > *m) {
        return Err(format!(
            "memory_mib: {} MiB per node is more than the partition's or QoS's maximum of {max} MiB",
            spec.mem_mib
        ));
    }
    crate::validate::validate_spec(spec).map_err(|e| e.to_string())
}

/// A fraction of a GPU is asked only under a QoS that shares GPUs, and never by training.
fn check_fraction(spec: &JobSpec, qos: &Qos) -> Result<(), Rejection> {
    if spec.gpu_milli > 0 && (!qos.gpu_sharing || spec.profile == crate::model::Profile::Training) {
        return Err(Rejection::FailedPrecondition(format!(
            "gpu_milli: qos \"{}\" does not share GPUs (training never does); ask for whole GPUs",
            qos.name
        )));
    }
    Ok(())
}

impl ClusterState {
    pub(super) fn submit(
        &mut self,
        spec: &JobSpec,
        request_id: Option<&str>,
        hold: bool,
        limits: Option<&crate::state::quota::SubmitLimits>,
        now: i64,
    ) -> Outcome {
        if request_id.is_some_and(|r| r.is_empty() || r.len() > crate::validate::REQUEST_ID_LEN_MAX) {
            let max = crate::validate::REQUEST_ID_LEN_MAX;
            return Outcome::Rejected(Rejection::Invalid(format!("request_id: must be 1 to {max} bytes")));
        }
        if let Some(job) = request_id.and_then(|r| self.submit_requests.get(&spec.user)?.get(r)) {
            return Outcome::Submitted { job: *job };
        }
        if let Err(e) = validate_spec(spec) {
            return Outcome::Rejected(Rejection::Invalid(e.to_string()));
        }
        let tasks = spec.array.as_ref().map_or(1, |a| a.indices.len().max(1)) as u64;
        if let Some(limits) = limits {
            if let Err(r) = self.check_submit_limits(&spec.user, limits, tasks) {
                return Outcome::Rejected(r);
            }
        }
        let partition_name =
            if spec.partition.is_empty() { &self.policy.default_partition } else { &spec.partition };
        let Some(partition) = self.policy.partitions.get(partition_name) else {
            let name: String = spec.partition.chars().take(64).collect();
            return Outcome::Rejected(Rejection::Invalid(format!("partition: unknown partition \"{name}\"")));
        };
        let account = match self.policy.resolve_account(&spec.user, &spec.account) {
            Ok(a) => a,
            Err(why) if spec.account.is_empty() => {
                return Outcome::Rejected(Rejection::FailedPrecondition(why))
            }
            Err(why) => return Outcome::Rejected(Rejection::Invalid(why)),
        };
        let qos = match self.resolve_qos(spec, limits, partition, &account) {
            Ok(qos) => qos,
            Err(why) => return Outcome::Rejected(why),
        };
        let partition_name = partition.name.clone();
        if let Some((kind, dep)) = spec.dependencies().find(|(_, d)| self.job_state(*d).is_none()) {
            return Outcome::Rejected(Rejection::NotFound(format!("{}: job {dep} not found", kind.field())));
        }
        let (qos_name, priority) = (qos.name.clone(), qos.priority);
        if let Err(why) = check_fraction(spec, qos).and_then(|()| self.check_size(spec, qos)) {
            return Outcome::Rejected(why);
        }
        let asked = crate::model::CpuMem { cpus: spec.cpus, mem_mib: spec.mem_mib };
        let mut spec = spec.clone();
        if let Err(why) = with_resource_defaults(&mut spec, &partition.resources.or(&qos.resources)) {
            return Outcome::Rejected(Rejection::Invalid(why));
        }
        if let Err(why) = self.check_fits_a_node(&spec, asked, qos) {
            return Outcome::Rejected(why);
        }
        if let Err(why) = self.check_reservation(&spec, &account, &qos_name) {
            return Outcome::Rejected(why);
        }
        spec.qos = qos_name;
        spec.account = account;
        spec.partition = partition_name;
        let Some(array) = spec.array.take() else {
            return Outcome::Submitted { job: self.add_job(spec, priority, request_id, hold, now) };
        };
        Outcome::Submitted { job: self.add_array(&spec, &array, priority, request_id, hold, now) }
    }

    /// The QoS a job runs under — the one it names, else its user's (or account's) default, the
    /// partition's, the profile's — once its user may use it (unless `limits` say any QoS may
    /// be used), it fits the QoS's limits and its partition allows it.
    fn resolve_qos(
        &self,
        spec: &JobSpec,
        limits: Option<&crate::state::quota::SubmitLimits>,
        partition: &crate::policy::Partition,
        account: &str,
    ) -> Result<&Qos, Rejection> {
        let access = self.policy.qos_access(&spec.user, account);
        let qos = match (spec.qos.is_empty(), &access.default, &partition.default_qos) {
            (false, _, _) => self.policy.qos(&spec.qos),
            (true, Some(d), _) | (true, None, Some(d)) => self.policy.qos(d),
            (true, None, None) => self.policy.default_qos(spec.profile),
        };
        let Some(qos) = qos else {
            let known: Vec<&str> = self.policy.qos.keys().map(String::as_str).collect();
            let name: String = spec.qos.chars().take(64).collect();
            return Err(Rejection::Invalid(format!(
                "qos: unknown qos \"{name}\" (known: {})",
                known.join(", ")
            )));
        };
        let checked = limits.is_some_and(|l| !l.any_qos);
        if checked && !access.allows(&qos.name) {
            let allowed: Vec<&str> = access.allowed.iter().flatten().map(String::as_str).collect();
            return Err(Rejection::PermissionDenied(format!(
                "qos \"{}\" is not allowed for user \"{}\" in account \"{account}\" (allowed: {})",
                qos.name,
                spec.user,
                allowed.join(", ")
            )));
        }
        Self::check_qos_fit(spec, qos)?;
        if !partition.allowed_qos.is_empty() && !partition.allowed_qos.contains(&qos.name) {
            return Err(Rejection::Invalid(format!(
                "qos \"{}\" is not allowed in partition \"{}\"",
                qos.name, partition.name
            )));
        }
        Ok(qos)
    }

    /// Whether a node could ever hold the job: the largest node, or for a job that may burst,
    /// the largest allowed cloud instance type.
    fn check_size(&self, spec: &JobSpec, qos: &Qos) -> Result<(), Rejection> {
        let cloud = &self.burst.config;
        let may_burst = if cloud.qos.is_empty() { qos.burstable } else { cloud.qos.contains(&qos.name) };
        let largest_cloud = if cloud.enabled && may_burst {
            cloud.instance_types.iter().map(|t| t.gpus).max().unwrap_or(0)
        } else {
            0
        };
        let largest = self.largest_node_gpus().max(largest_cloud);
        if largest > 0 && spec.gpus > largest {
            return Err(Rejection::FailedPrecondition(format!(
                "job requests {} GPUs but the largest node has {largest}",
                spec.gpus
            )));
        }
        Ok(())
    }

    /// Adds an array's tasks: one job per index, with consecutive ids; the first one's id is
    /// the array's.
    fn add_array(
        &mut self,
        spec: &JobSpec,
        array: &crate::model::ArraySpec,
        priority: i64,
        request_id: Option<&str>,
        hold: bool,
        now: i64,
    ) -> JobId {
        let first = self.next_job_id;
        let count = array.indices.len() as u32;
        for (n, index) in array.indices.iter().enumerate() {
            let mut task = spec.clone();
            task.array = Some(Box::new(crate::model::ArraySpec {
                indices: Vec::new(),
                max_running: array.max_running,
                id: first,
                index: *index,
                count,
            }));
            self.add_job(task, priority, request_id.filter(|_| n == 0), hold, now);
        }
        first
    }

    /// Adds one pending job (a validated, resolved spec) under the next id.
    fn add_job(
        &mut self,
        spec: JobSpec,
        priority: i64,
        request_id: Option<&str>,
        hold: bool,
        now: i64,
    ) -> JobId {
        let id = self.next_job_id;
        self.next_job_id += 1;
        let mut job = Job {
            id,
            spec,
            priority,
            state: JobState::Pending,
            reason: String::new(),
            attempt: 0,
            allocation: None,
            last_node: String::new(),
            last_gpus: Vec::new(),
            last_more: Vec::new(),
            exit_code: None,
            signal: None,
            submit_time_ms: now,
            start_time_ms: None,
            end_time_ms: None,
            events: Vec::new(),
            held: hold,
            claim: None,
            preempted_at: Vec::new(),
            last_checkpoint_ms: None,
            width: None,
            tasks_now: None,
            suspended_ms: 0,
            suspended_since: None,
            skipped_at_start_ms: 0,
            retried: 0,
            attempt_nodes: Default::default(),
            usage: None,
            gpu_idle_since: None,
        };
        job.record(now, "submitted", format!("by \"{}\", qos \"{}\"", job.spec.user, job.spec.qos));
        if let Some(r) = request_id {
            self.submit_requests.entry(job.spec.user.clone()).or_default().insert(r.to_string(), id);
        }
        self.unfinished.added(&job.spec.user);
        self.jobs.insert(id, job);
        id
    }

    /// Whether a job could ever run under `qos`: its time limit and size within the QoS maxima.
    fn check_qos_fit(spec: &JobSpec, qos: &Qos) -> Result<(), Rejection> {
        if let Some(limit) = spec.time_limit_s {
            if limit > qos.max_wall_s {
                return Err(Rejection::Invalid(format!(
                    "time_limit_s: {limit}s is more than qos \"{}\" allows ({}s)",
                    qos.name, qos.max_wall_s
                )));
            }
        }
        if let Some(grace) = spec.checkpoint_grace_s.filter(|g| *g > qos.grace_s) {
            return Err(Rejection::Invalid(format!(
                "checkpoint.grace_s: {grace}s is more than qos \"{}\" allows ({}s)",
                qos.name, qos.grace_s
            )));
        }
        for (what, limit) in [("in total", qos.grp_gpus), ("per user", qos.user_gpus)] {
            if let Some(max) = limit.filter(|max| spec.total_gpus() > *max) {
                return Err(Rejection::FailedPrecondition(format!(
                    "job requests {} GPUs but qos \"{}\" allows {max} GPUs {what}",
                    spec.total_gpus(),
                    qos.name
                )));
            }
        }
        Ok(())
    }

    pub(super) fn set_held(&mut self, id: JobId, held: bool, by: &str, now: i64) -> Outcome {
        match self.hold_check(id, held) {
            Err(r) => return Outcome::Rejected(r),
            Ok(false) => {}
            Ok(true) => {
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.held = held;
                    job.record(now, if held { "held" } else { "released" }, format!("by \"{by}\""));
                }
            }
        }
        Outcome::HoldChanged { job: id, held }
    }

    /// Whether holding (or releasing) job `id` would change it; refused unless it is pending.
    fn hold_check(&self, id: JobId, held: bool) -> Result<bool, Rejection> {
        let job = self.jobs.get(&id).ok_or_else(|| Rejection::NotFound(format!("job {id} not found")))?;
        if job.state != JobState::Pending {
            let verb = if held { "held" } else { "released" };
            return Err(Rejection::FailedPrecondition(format!(
                "job {id} is {}; only pending jobs can be {verb}",
                job.state.as_str()
            )));
        }
        Ok(job.held != held)
    }

    /// What a hold, release or cancel would answer without changing anything, judged on this
    /// (applied) state before it is proposed: `Err`, refused; `Ok(Some)`, already so (answered
    /// without a log entry); `Ok(None)`, it changes the state and goes through the log (where
    /// apply judges it again). Other operations: `Ok(None)`.
    pub fn precheck(&self, op: &Op) -> Result<Option<Outcome>, Rejection> {
        match op {
            Op::Hold { job, .. } | Op::Release { job, .. } => {
                let held = matches!(op, Op::Hold { .. });
                Ok((!self.hold_check(*job, held)?).then_some(Outcome::HoldChanged { job: *job, held }))
            }
            Op::Cancel { job, .. } => {
                let tasks = self.cancel_targets(*job)?;
                let already = tasks.iter().all(|t| {
                    self.jobs.get(t).is_some_and(|j| {
                        j.allocation.as_ref().is_some_and(|a| a.stop == Some(StopReason::Cancelled))
                    })
                });
                Ok(already.then_some(Outcome::Cancelled { job: *job, was_running: true }))
            }
            _ => Ok(None),
        }
    }

    /// The jobs a cancel of `id` ends: every unfinished task of an array (by its id), or the
    /// job; refused when there is nothing left to cancel.
    fn cancel_targets(&self, id: JobId) -> Result<Vec<JobId>, Rejection> {
        let count =
            self.jobs.get(&id).and_then(|j| j.spec.array.as_ref()).filter(|a| a.id == id).map(|a| a.count);
        if let Some(count) = count {
            let tasks: Vec<JobId> = self
                .jobs
                .range(id..id.saturating_add(u64::from(count)))
                .filter(|(_, j)| !j.state.is_terminal() && j.spec.array.as_ref().is_some_and(|a| a.id == id))
                .map(|(t, _)| *t)
                .collect();
            if tasks.is_empty() {
                return Err(Rejection::FailedPrecondition(format!("every task of array {id} already ended")));
            }
            return Ok(tasks);
        }
        let job = self.jobs.get(&id).ok_or_else(|| Rejection::NotFound(format!("job {id} not found")))?;
        if job.state.is_terminal() {
            return Err(Rejection::FailedPrecondition(format!(
                "job {id} already ended ({})",
                job.state.as_str()
            )));
        }
        Ok(vec![id])
    }

    /// Whether the job's dependencies let it start: `Ok` when each is met, else the reason
    /// (`DependencyNeverSatisfied` once one can never be). An array's id stands for every task
    /// of it, as in Slurm: `afterok` waits for the last task and fails with any task.
    pub fn dependency_state(&self, job: &Job) -> Result<(), crate::reasons::PendingReason> {
        use crate::model::DependencyKind as Kind;
        use crate::reasons::PendingReason;
        let mut waiting = false;
        for (kind, dep) in job.spec.dependencies() {
            let (ended, failed) = self.dependency_outcome(dep);
            match kind {
                Kind::AfterOk if failed => return Err(PendingReason::DependencyNeverSatisfied(dep)),
                Kind::AfterNotOk if ended && !failed => return Err(PendingReason::DependencyCompleted(dep)),
                _ => waiting |= !ended,
            }
        }
        if waiting {
            return Err(PendingReason::Dependency);
        }
        Ok(())
    }

    /// Whether job `dep` (every task, for an array's id) has ended, and whether it (any task)
    /// ended without completing. Tasks of an array have consecutive ids from the array's.
    fn dependency_outcome(&self, dep: JobId) -> (bool, bool) {
        let array_of = |id: JobId| {
            let live = self.jobs.get(&id).map(|j| j.spec.array.as_ref().map(|a| a.id));
            live.unwrap_or_else(|| self.history.get(id).and_then(|r| r.array).map(|(a, _)| a))
        };
        let is_array = array_of(dep) == Some(dep);
        let (mut ended, mut failed, mut task) = (true, false, dep);
        loop {
            match self.job_state(task) {
                Some(JobState::Completed) => {}
                Some(s) if s.is_terminal() => failed = true,
                _ => ended = false,
            }
            task = task.saturating_add(1);
            if !is_array || array_of(task) != Some(dep) {
                return (ended, failed);
            }
        }
    }

    pub(super) fn cancel(&mut self, id: JobId, by: &str, now: i64) -> Outcome {
        let tasks = match self.cancel_targets(id) {
            Ok(tasks) => tasks,
            Err(r) => return Outcome::Rejected(r),
        };
        let mut was_running = false;
        for task in tasks {
            if let Outcome::Cancelled { was_running: r, .. } = self.cancel_one(task, by, now) {
                was_running |= r;
            }
        }
        Outcome::Cancelled { job: id, was_running }
    }

    pub(super) fn cancel_one(&mut self, id: JobId, by: &str, now: i64) -> Outcome {
        let Some(job) = self.jobs.get_mut(&id) else {
            return Outcome::Rejected(Rejection::NotFound(format!("job {id} not found")));
        };
        match job.state {
            JobState::Pending => {
                self.unfinished.ended(&job.spec.user);
                job.state = JobState::Cancelled;
                job.reason = format!("cancelled by \"{by}\"");
                job.end_time_ms = Some(now);
                job.record(now, "cancelled", format!("by \"{by}\" while pending"));
                self.drop_claim(id);
                Outcome::Cancelled { job: id, was_running: false }
            }
            JobState::Running | JobState::Suspended => {
                if let Some(alloc) = job.allocation.as_mut() {
                    // A preempted or resizing run would come back; a cancel ends it for good. An
                    // acknowledged cancel ends the job CANCELLED, also when the run was already
                    // stopping for another reason (its time limit, a failed task of its gang).
                    if alloc.stop != Some(StopReason::Cancelled) {
                        alloc.stop = Some(StopReason::Cancelled);
                        job.record(now, "cancel-requested", format!("by \"{by}\""));
                    }
                }
                // A resizing run no longer needs the GPUs of its next run.
                self.drop_claim(id);
                Outcome::Cancelled { job: id, was_running: true }
            }
            state => Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "job {id} already ended ({})",
                state.as_str()
            ))),
        }
    }
}
