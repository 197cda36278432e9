//! Conversions between domain types (`kairos_scheduler`) and the `kairos.v1` protobuf types.
//!
//! Request conversions validate at the API edge: a field the server cannot honour yet is
//! rejected with `UNIMPLEMENTED` naming the field, never silently dropped.

use kairos_proto::v1 as pb;
use kairos_scheduler::{
    validate_spec, Gpu, Job, JobSpec, JobState, Node, NodeInfo, NodeState, PendingReason, Profile,
};
use tonic::Status;

fn unimplemented(field: &str, what: &str) -> Status {
    Status::unimplemented(format!("{field}: {what} is not supported yet"))
}

/// Turns a submitted spec into a domain spec for `user`, or says precisely what is wrong.
pub fn job_spec_from_pb(spec: Option<pb::JobSpec>, user: &str) -> Result<JobSpec, Status> {
    let spec = spec.ok_or_else(|| Status::invalid_argument("spec: required"))?;
    let res = spec.resources.unwrap_or_default();
    let checkpoint = spec.checkpoint.unwrap_or_default();
    let checkpoint_signal = checkpoint_signal_from_pb(&checkpoint)?;
    if spec.burstable {
        // Bursting is the QoS's: a job bursts by being of a burstable QoS.
        return Err(Status::invalid_argument(
            "burstable: a job bursts to the cloud by its QoS (`kairos qos update NAME --burstable`, \
             e.g. inference); submit it with that QoS and leave this field unset",
        ));
    }
    let profile = profile_from_pb(spec.profile)?;
    // An empty QoS is resolved from the profile by the cluster's submit rules, on apply.
    let qos = spec.qos;
    let out = JobSpec {
        array: array_from_pb(&spec.array_indices, spec.array_max_running),
        name: spec.name,
        user: user.to_string(),
        argv: spec.argv,
        env: spec.env.into_iter().collect(),
        workdir: spec.workdir,
        workdir_is_submit_dir: spec.workdir_is_submit_dir,
        gpus: res.gpus,
        // A job without GPUs gets one CPU unless it asks for more (Slurm's default).
        cpus: if res.gpus == 0 { res.cpus.max(1) } else { res.cpus },
        mem_mib: res.memory_mib,
        qos,
        profile,
        time_limit_s: (spec.time_limit_s != 0).then_some(spec.time_limit_s),
        requeue: spec.requeue.unwrap_or(false),
        after_ok: spec.after_ok,
        after_any: spec.after_any,
        after_not_ok: spec.after_not_ok,
        retries: spec.retries,
        gpu_milli: res.gpu_milli,
        gpu_model: (!res.gpu_model.is_empty()).then_some(res.gpu_model),
        account: spec.account,
        partition: spec.partition,
        tasks: res.tasks.max(1),
        min_gpus: (res.min_gpus != 0).then_some(res.min_gpus),
        min_tasks: (res.min_tasks != 0).then_some(res.min_tasks),
        suspendable: spec.suspendable,
        checkpoint_signal: checkpoint_signal.map(Into::into),
        checkpoint_grace_s: (checkpoint.grace_s != 0).then_some(u64::from(checkpoint.grace_s)),
        // Set by the API edge from the caller's trace context, never by the spec.
        traceparent: None,
        container: container_from_pb(spec.container)?,
        topology: res.topology.map(crate::topology::ask_from_pb),
        reservation: (!spec.reservation.is_empty()).then(|| spec.reservation.into()),
        keep_alive_s: spec.keep_alive_s,
    };
    validate_spec(&out).map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(out)
}

/// The signal a job asks to be checkpointed by (`None`: the default), checked by name.
fn checkpoint_signal_from_pb(checkpoint: &pb::CheckpointSpec) -> Result<Option<String>, Status> {
    if !checkpoint.dir.is_empty() {
        return Err(unimplemented("checkpoint.dir", "a job-chosen checkpoint directory"));
    }
    match checkpoint.signal.as_str() {
        "" => Ok(None),
        name => kairos_scheduler::validate::checkpoint_signal(name)
            .map(|s| Some(s.to_string()))
            .map_err(|e| Status::invalid_argument(e.to_string())),
    }
}

fn profile_from_pb(profile: i32) -> Result<Profile, Status> {
    match pb::Profile::try_from(profile) {
        Ok(pb::Profile::Unspecified) | Ok(pb::Profile::Batch) => Ok(Profile::Batch),
        Ok(pb::Profile::Training) => Ok(Profile::Training),
        Ok(pb::Profile::Inference) => Ok(Profile::Inference),
        Ok(pb::Profile::Interactive) => Ok(Profile::Interactive),
        Err(_) => Err(Status::invalid_argument(format!("profile: unknown value {profile}"))),
    }
}

/// An array submit's indices (`None`: a single job); the id, index and count are set on apply.
fn array_from_pb(indices: &[u32], max_running: u32) -> Option<Box<kairos_scheduler::model::ArraySpec>> {
    (!indices.is_empty()).then(|| {
        Box::new(kairos_scheduler::model::ArraySpec {
            indices: indices.to_vec(),
            max_running: (max_running > 0).then_some(max_running),
            id: 0,
            index: 0,
            count: 0,
        })
    })
}

/// A submit's container, its mounts parsed (`SRC:DST[:ro]`); checked with the rest of the spec.
fn container_from_pb(
    c: Option<pb::ContainerSpec>,
) -> Result<Option<Box<kairos_scheduler::model::Container>>, Status> {
    let Some(c) = c.filter(|c| !c.image.is_empty() || !c.mounts.is_empty() || !c.workdir.is_empty()) else {
        return Ok(None);
    };
    if c.mounts.len() > kairos_scheduler::validate::CONTAINER_MOUNTS_MAX {
        return Err(Status::invalid_argument(format!(
            "container: at most {} mounts",
            kairos_scheduler::validate::CONTAINER_MOUNTS_MAX
        )));
    }
    let mounts = c
        .mounts
        .iter()
        .map(|m| {
            kairos_scheduler::model::ContainerMount::parse(m).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "container: mount \"{}\" is not SRC:DST or SRC:DST:ro",
                    m.chars().take(80).collect::<String>()
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(Box::new(kairos_scheduler::model::Container { image: c.image, mounts, workdir: c.workdir })))
}

/// The wire form of a job's container.
pub fn container_to_pb(c: &kairos_scheduler::model::Container) -> pb::ContainerSpec {
    pb::ContainerSpec {
        image: c.image.clone(),
        mounts: c.mounts.iter().map(|m| m.text()).collect(),
        workdir: c.workdir.clone(),
    }
}

fn profile_to_pb(p: Profile) -> pb::Profile {
    match p {
        Profile::Training => pb::Profile::Training,
        Profile::Inference => pb::Profile::Inference,
        Profile::Batch => pb::Profile::Batch,
        Profile::Interactive => pb::Profile::Interactive,
    }
}

/// The API state: a running job being preempted (stopped or shrunk) shows as PREEMPTING.
pub fn job_view_state(job: &Job) -> pb::JobState {
    if job.preempting() {
        return pb::JobState::Preempting;
    }
    job_state_to_pb(job.state)
}

pub fn job_state_to_pb(s: JobState) -> pb::JobState {
    match s {
        JobState::Pending => pb::JobState::Pending,
        JobState::Running => pb::JobState::Running,
        JobState::Completed => pb::JobState::Completed,
        JobState::Failed => pb::JobState::Failed,
        JobState::Cancelled => pb::JobState::Cancelled,
        JobState::Timeout => pb::JobState::Timeout,
        JobState::NodeFail => pb::JobState::NodeFail,
        JobState::Suspended => pb::JobState::Suspended,
        JobState::OutOfMemory => pb::JobState::OutOfMemory,
    }
}

/// Why a job is where it is, in the API's words: its pending reason, how its run is stopping
/// (or growing), or the reason it ended with.
fn view_reason(job: &Job, pending: Option<&PendingReason>) -> String {
    match (job.state, pending) {
        (JobState::Pending, Some(r)) => r.to_string(),
        (JobState::Pending, None) => "Scheduling".to_string(),
        (JobState::Running | JobState::Suspended, _) => match job.allocation.as_ref().and_then(|a| a.stop) {
            Some(kairos_scheduler::StopReason::Preempted { by, .. }) => format!("preempted by job {by}"),
            Some(kairos_scheduler::StopReason::Resize { by: Some(by) }) => format!("shrinking for job {by}"),
            Some(kairos_scheduler::StopReason::Resize { by: None }) => "growing".to_string(),
            Some(kairos_scheduler::StopReason::Drained) => "node draining; will requeue".to_string(),
            Some(kairos_scheduler::StopReason::ReservationOpened) => {
                "a reservation's window opened on its node; will requeue".to_string()
            }
            Some(kairos_scheduler::StopReason::GpuFailed) => {
                match job.allocation.as_ref().and_then(|a| a.failure.as_deref()) {
                    Some(f) => format!("{f}; will requeue"),
                    None => "a GPU failed; will requeue".to_string(),
                }
            }
            Some(kairos_scheduler::StopReason::Vacated) => {
                "stopping for the inference headroom; will requeue".to_string()
            }
            Some(kairos_scheduler::StopReason::Idle) => "GPUs idle; will requeue".to_string(),
            Some(_) => "Stopping".to_string(),
            None if job.state == JobState::Suspended => "suspended for a preemptor".to_string(),
            None => String::new(),
        },
        _ => job.reason.clone(),
    }
}

/// Its tasks: the current run's, else the last run's.
fn tasks_of(job: &Job) -> Vec<pb::TaskAllocation> {
    match &job.allocation {
        Some(a) => a
            .tasks()
            .map(|(rank, node, gpus)| pb::TaskAllocation {
                rank,
                node: node.to_string(),
                gpu_ids: gpus.to_vec(),
            })
            .collect(),
        None if !job.last_node.is_empty() => {
            let first =
                pb::TaskAllocation { rank: 0, node: job.last_node.clone(), gpu_ids: job.last_gpus.clone() };
            let more = job.last_more.iter().enumerate().map(|(i, t)| pb::TaskAllocation {
                rank: i as u32 + 1,
                node: t.node.clone(),
                gpu_ids: t.gpus.clone(),
            });
            std::iter::once(first).chain(more).collect()
        }
        None => Vec::new(),
    }
}

/// Its spec as submitted (with what submit resolved: QoS, account, partition).
fn spec_to_pb(job: &Job) -> pb::JobSpec {
    let s = &job.spec;
    pb::JobSpec {
        name: s.name.clone(),
        argv: s.argv.clone(),
        env: s.env.clone().into_iter().collect(),
        workdir: s.workdir.clone(),
        workdir_is_submit_dir: s.workdir_is_submit_dir,
        qos: s.qos.clone(),
        profile: profile_to_pb(s.profile) as i32,
        resources: Some(pb::Resources {
            gpus: s.gpus,
            tasks: s.tasks,
            gpu_model: s.gpu_model.clone().unwrap_or_default(),
            min_gpus: s.min_gpus.unwrap_or(0),
            min_tasks: s.min_tasks.unwrap_or(0),
            cpus: s.cpus,
            memory_mib: s.mem_mib,
            gpu_milli: s.gpu_milli,
            topology: s.topology.as_deref().map(crate::topology::ask_to_pb),
        }),
        suspendable: s.suspendable,
        checkpoint: (s.checkpoint_signal.is_some() || s.checkpoint_grace_s.is_some()).then(|| {
            pb::CheckpointSpec {
                signal: s.checkpoint_signal.as_deref().unwrap_or_default().to_string(),
                grace_s: s.checkpoint_grace_s.unwrap_or(0).min(u64::from(u32::MAX)) as u32,
                dir: String::new(),
            }
        }),
        after_ok: s.after_ok.clone(),
        after_any: s.after_any.clone(),
        after_not_ok: s.after_not_ok.clone(),
        retries: s.retries,
        hold: job.held,
        account: s.account.clone(),
        partition: s.partition.clone(),
        time_limit_s: s.time_limit_s.unwrap_or(0),
        requeue: Some(s.requeue),
        container: s.container.as_deref().map(container_to_pb),
        reservation: s.reservation.as_deref().unwrap_or_default().to_string(),
        keep_alive_s: s.keep_alive_s,
        ..Default::default()
    }
}

/// The API view of a job; `pending` is its derived pending reason, if it waits, and `priority`
/// its current multifactor priority (pending jobs) or the one it started with.
pub fn job_to_pb(job: &Job, pending: Option<&PendingReason>, priority: i64) -> pb::Job {
    let reason = view_reason(job, pending);
    let (node, gpus) = match &job.allocation {
        Some(a) => (a.node.clone(), a.gpus.clone()),
        // A requeued job waiting again holds no node: its last run's is in its events.
        None if job.state == JobState::Pending => (String::new(), Vec::new()),
        None => (job.last_node.clone(), job.last_gpus.clone()),
    };
    let tasks = tasks_of(job);
    let s = &job.spec;
    pb::Job {
        id: job.id,
        spec: Some(spec_to_pb(job)),
        user: s.user.clone(),
        state: job_view_state(job) as i32,
        reason,
        node,
        gpu_ids: gpus,
        exit_code: job.exit_code,
        attempt: job.attempt,
        submit_time_ms: job.submit_time_ms,
        start_time_ms: job.start_time_ms.unwrap_or(0),
        end_time_ms: job.end_time_ms.unwrap_or(0),
        priority,
        qos: s.qos.clone(),
        profile: profile_to_pb(s.profile) as i32,
        events: job
            .events
            .iter()
            .map(|e| pb::JobEvent {
                time_ms: e.time_ms,
                kind: e.kind.to_string(),
                message: e.message.clone(),
            })
            .collect(),
        signal: job.signal.unwrap_or(0),
        tasks,
        last_checkpoint_ms: job.last_checkpoint_ms.unwrap_or(0),
        purged: false,
        array_job_id: s.array.as_ref().map_or(0, |a| a.id),
        array_task_id: s.array.as_ref().map_or(0, |a| a.index),
        array_task_count: s.array.as_ref().map_or(0, |a| a.count),
        array_max_running: s.array.as_ref().and_then(|a| a.max_running).unwrap_or(0),
        // Set where the policy is at hand (the job views).
        effective_time_limit_s: 0,
        gpu_idle_since_ms: job.gpu_idle_since.unwrap_or(0),
        borrowing: job.allocation.as_ref().is_some_and(|a| a.borrowing),
        // Set from the planner's pass where it is at hand (the job views).
        expected_start_ms: 0,
        start_reason: String::new(),
    }
}

pub fn node_info_from_pb(info: Option<pb::NodeInfo>) -> Result<NodeInfo, Status> {
    let info = info.ok_or_else(|| Status::invalid_argument("node: required"))?;
    let out = NodeInfo {
        name: info.name,
        addr: info.addr,
        gpus: info
            .gpus
            .into_iter()
            .map(|g| Gpu {
                index: g.index,
                uuid: g.uuid,
                model: g.model,
                memory_mib: g.memory_mib,
                link_group: g.link_group,
                mig_parent: g.mig_parent,
            })
            .collect(),
        cpus: info.cpus,
        memory_mib: info.memory_mib,
        labels: info.labels.into_iter().collect(),
        gpu_backend: info.gpu_backend,
        isolation: info.isolation,
    };
    kairos_scheduler::validate_node(&out).map_err(|e| Status::invalid_argument(format!("node.{e}")))?;
    Ok(out)
}

pub fn node_info_to_pb(info: &NodeInfo) -> pb::NodeInfo {
    pb::NodeInfo {
        name: info.name.clone(),
        addr: info.addr.clone(),
        gpus: info
            .gpus
            .iter()
            .map(|g| pb::Gpu {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                memory_mib: g.memory_mib,
                link_group: g.link_group,
                mig_parent: g.mig_parent,
            })
            .collect(),
        cpus: info.cpus,
        memory_mib: info.memory_mib,
        labels: info.labels.clone().into_iter().collect(),
        gpu_backend: info.gpu_backend.clone(),
        isolation: info.isolation.clone(),
    }
}

pub fn node_to_pb(node: &Node, last_heartbeat_ms: i64) -> pb::Node {
    let state = match node.state {
        NodeState::Up => pb::NodeState::Up,
        NodeState::Draining => pb::NodeState::Draining,
        NodeState::Down => pb::NodeState::Down,
    };
    pb::Node {
        name: node.info.name.clone(),
        info: Some(node_info_to_pb(&node.info)),
        state: state as i32,
        allocated: node.allocated.iter().map(|(g, j)| (*g, *j)).collect(),
        last_heartbeat_ms,
        reason: node.reason.clone(),
        cpus_used: node.used().cpus,
        memory_used_mib: node.used().mem_mib,
        faults: node
            .faults
            .iter()
            .map(|(g, f)| pb::GpuFault { gpu: *g, reason: f.reason.clone(), since_ms: f.since_ms })
            .collect(),
        shared: node
            .shared
            .iter()
            .flat_map(|(g, holders)| {
                holders.iter().map(|(j, m)| pb::GpuShare { gpu: *g, job_id: *j, milli: *m })
            })
            .collect(),
        // Set by the caller from the state's reservations (`ClusterState::maint_of`).
        maint: String::new(),
    }
}

/// A history record in the API's form (`purged`: only the record is left).
pub fn record_to_pb(r: &kairos_scheduler::history::JobRecord, purged: bool) -> pb::JobRecord {
    pb::JobRecord {
        id: r.id,
        name: r.name.clone(),
        user: r.user.clone(),
        account: r.account.clone(),
        partition: r.partition.clone(),
        qos: r.qos.clone(),
        state: job_state_to_pb(r.state) as i32,
        reason: r.reason.clone(),
        exit_code: r.exit_code,
        signal: r.signal.unwrap_or(0),
        gpus: r.gpus,
        node: r.node.clone(),
        submit_time_ms: r.submit_ms,
        start_time_ms: r.start_ms.unwrap_or(0),
        end_time_ms: r.end_ms,
        attempts: r.attempts,
        preemptions: r.preemptions,
        gpu_seconds: r.gpu_seconds,
        purged,
        array_job_id: r.array.map_or(0, |a| a.0),
        array_task_id: r.array.map_or(0, |a| a.1),
        req_cpus: r.req_cpus,
        req_memory_mib: r.req_mem_mib,
        max_rss_kib: r.used.max_rss_kib,
        cpu_time_ms: r.used.cpu_ms,
        run_ms: r.used.wall_ms,
        gpu_ms: r.used.gpu_ms,
        gpu_busy_ms: r.used.gpu_busy_ms,
        gpu_util_max_pct: r.used.gpu_util_max_pct,
        gpu_util_p95_pct: r.used.gpu_util_p95_pct,
        gpu_mem_max_mib: r.used.gpu_mem_max_mib,
        gpu_mem_device_mib: r.used.gpu_mem_device_mib,
        time_limit_s: r.time_limit_s,
        profile: profile_to_pb(r.profile) as i32,
        gpu_milli: r.gpu_milli,
        tasks: r.tasks,
        idle_note: r.idle_note.clone(),
        gpus_per_task: r.replay.gpus_per_task,
        gpu_model: r.replay.gpu_model.clone().unwrap_or_default(),
        after_ok: r.replay.after_ok.clone(),
        after_any: r.replay.after_any.clone(),
        after_not_ok: r.replay.after_not_ok.clone(),
        array_task_count: r.replay.array_count,
        array_max_running: r.replay.array_limit,
        requeue: r.replay.requeue,
        holds: r
            .replay
            .holds
            .iter()
            .map(|h| pb::HoldWindow { held_ms: h.held_ms, released_ms: h.released_ms })
            .collect(),
        runs: r
            .replay
            .runs
            .iter()
            .map(|w| pb::RunWindow {
                start_ms: w.start_ms,
                end_ms: w.end_ms,
                preempted_ms: w.preempted_ms,
                checkpointed: w.checkpointed,
            })
            .collect(),
    }
}

/// The accounting record of a live job at `now` under a wall-clock limit of `time_limit_s`
/// (unfinished: no end yet, GPU-seconds so far).
pub fn live_record(job: &Job, now: i64, time_limit_s: u64) -> pb::JobRecord {
    let mut r = kairos_scheduler::history::JobRecord::of(job, time_limit_s);
    if !job.state.is_terminal() {
        r.end_ms = 0;
        r.gpu_seconds = match (&job.allocation, job.start_time_ms) {
            (Some(_), Some(start)) => u64::from(job.total_gpus()) * ((now - start).max(0) as u64) / 1000,
            _ => 0,
        };
    }
    record_to_pb(&r, false)
}

/// `kairos show` of a purged job: what its history record knows.
pub fn purged_job_to_pb(r: &kairos_scheduler::history::JobRecord) -> pb::Job {
    pb::Job {
        id: r.id,
        spec: Some(pb::JobSpec {
            name: r.name.clone(),
            qos: r.qos.clone(),
            partition: r.partition.clone(),
            account: r.account.clone(),
            resources: Some(pb::Resources { gpus: r.gpus, ..Default::default() }),
            ..Default::default()
        }),
        user: r.user.clone(),
        state: job_state_to_pb(r.state) as i32,
        reason: r.reason.clone(),
        node: r.node.clone(),
        exit_code: r.exit_code,
        attempt: r.attempts.saturating_sub(1),
        submit_time_ms: r.submit_ms,
        start_time_ms: r.start_ms.unwrap_or(0),
        end_time_ms: r.end_ms,
        qos: r.qos.clone(),
        signal: r.signal.unwrap_or(0),
        purged: true,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            "[a-zA-Z0-9_]{1,12}",
            any::<String>(),
            Just("KAIROS_JOB_ID".to_string()),
            Just("CUDA_VISIBLE_DEVICES".to_string()),
            Just("SIGUSR2".to_string()),
            Just("a\0b".to_string()),
        ]
    }

    prop_compose! {
        fn job_spec()(
            name in text(),
            argv in proptest::collection::vec(text(), 0..4),
            env in proptest::collection::btree_map(text(), text(), 0..4),
            profile in -2i32..6,
            gpus in prop_oneof![Just(0u32), 1u32..9, Just(u32::MAX)],
            tasks in prop_oneof![Just(0u32), 1u32..4, Just(u32::MAX)],
            min_gpus in prop_oneof![Just(0u32), 1u32..10, Just(u32::MAX)],
            min_tasks in prop_oneof![Just(0u32), 1u32..5],
            gpu_model in text(),
            time_limit_s in prop_oneof![Just(0u64), 1u64..100_000, Just(u64::MAX)],
            signal in text(),
            grace_s in any::<u32>(),
            dir in prop_oneof![Just(String::new()), text()],
            suspendable in any::<bool>(),
            after_ok in proptest::collection::vec(any::<u64>(), 0..3),
        ) -> pb::JobSpec {
            pb::JobSpec {
                name,
                argv,
                env: env.into_iter().collect(),
                profile,
                resources: Some(pb::Resources {
                    gpus, tasks, min_gpus, min_tasks, gpu_model, ..Default::default()
                }),
                time_limit_s,
                checkpoint: Some(pb::CheckpointSpec { signal, grace_s, dir }),
                suspendable,
                after_ok,
                ..Default::default()
            }
        }
    }

    #[test]
    fn a_sound_spec_is_accepted_and_each_bad_field_is_named() {
        let good = pb::JobSpec {
            argv: vec!["true".into()],
            resources: Some(pb::Resources { gpus: 2, min_gpus: 1, ..Default::default() }),
            checkpoint: Some(pb::CheckpointSpec { signal: "usr2".into(), grace_s: 30, dir: String::new() }),
            ..Default::default()
        };
        let out = job_spec_from_pb(Some(good.clone()), "alice").unwrap();
        assert_eq!((out.checkpoint_signal.as_deref(), out.min_gpus), (Some("SIGUSR2"), Some(1)));
        let mut bad = good.clone();
        bad.checkpoint =
            Some(pb::CheckpointSpec { signal: "SIGKILL".into(), grace_s: 0, dir: String::new() });
        assert!(job_spec_from_pb(Some(bad), "alice").unwrap_err().message().starts_with("checkpoint.signal"));
        let mut bad = good.clone();
        bad.checkpoint = Some(pb::CheckpointSpec { signal: String::new(), grace_s: 0, dir: "/tmp".into() });
        assert_eq!(job_spec_from_pb(Some(bad), "alice").unwrap_err().code(), tonic::Code::Unimplemented);
        let mut bad = good;
        bad.resources = Some(pb::Resources { gpus: 2, min_gpus: 3, ..Default::default() });
        assert!(job_spec_from_pb(Some(bad), "alice").unwrap_err().message().starts_with("min_gpus"));
    }

    proptest! {
        /// Hostile or nonsensical specs get a clean status, never a panic, and whatever the
        /// edge accepts also passes the state machine's own validation.
        #[test]
        fn the_api_edge_accepts_only_valid_specs(spec in job_spec(), user in text()) {
            match job_spec_from_pb(Some(spec), &user) {
                Ok(out) => prop_assert!(validate_spec(&out).is_ok()),
                Err(status) => prop_assert!(matches!(
                    status.code(),
                    tonic::Code::InvalidArgument | tonic::Code::Unimplemented
                ), "{status:?}"),
            }
        }
    }
}
