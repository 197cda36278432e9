//! What each run on a node must do, decided from the state alone: run, suspend, or stop with
//! signal S and SIGKILL after grace G. The server only converts these orders to the agents'
//! wire format (`server/src/agents.rs`); the agent carries them out. One place decides how a
//! stop is asked for, per reason:
//!
//! | why the run stops | signal | grace |
//! |---|---|---|
//! | preempted, REQUEUE; resized (elastic) | the job's checkpoint signal | its checkpoint grace |
//! | preempted, CANCEL (or another mode) | SIGTERM | its checkpoint grace |
//! | node drained (spot notice) | the job's checkpoint signal | its grace, at most `DRAIN_GRACE_S` |
//! | cancelled, time limit, a gang task failed | SIGTERM | `KILL_GRACE_S` |
//!
//! A job's checkpoint grace is its own (`--checkpoint-grace`), never above its QoS's grace. A
//! job that named no checkpoint signal gets Slurm's sequence: SIGTERM (with SIGCONT) at once,
//! SIGKILL when the grace ends — a job written for Slurm saves and exits on SIGTERM and frees its
//! GPUs at once. One that names one (`--checkpoint-signal`, `#SBATCH --signal`) gets it first; the
//! agent then ends the grace at its checkpoint report and follows with SIGTERM.

use crate::model::{GpuIndex, Job, JobId, JobState, StopReason};
use crate::policy::PreemptMode;
use crate::state::ClusterState;

/// Grace between the stop signal and SIGKILL for cancels, time limits and failed gangs.
pub const KILL_GRACE_S: u32 = 10;
/// Most grace a drained node's jobs get (a spot interruption notice comes 2 minutes ahead).
pub const DRAIN_GRACE_S: u32 = 100;
/// What a job is sent to stop for a requeue when it named no checkpoint signal of its own:
/// SIGTERM, as Slurm sends a preempted job.
pub const DEFAULT_CHECKPOINT_SIGNAL: &str = "SIGTERM";
/// Gang rank 0 listens on `MASTER_PORT_BASE + (job id mod 10000)`.
pub const MASTER_PORT_BASE: u32 = 29_500;

/// What one run must do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunAction {
    /// Run (start it if it has not started).
    Run,
    /// Keep it frozen (SUSPEND preemption).
    Suspend,
    /// Send `signal`, then SIGKILL after `grace_s`.
    Stop { signal: String, grace_s: u32 },
}

/// One run a node should have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOrder<'a> {
    pub job: &'a Job,
    pub attempt: u32,
    pub rank: u32,
    pub world_size: u32,
    pub gpus: Vec<GpuIndex>,
    /// Whether the run was reported started (never launched twice).
    pub started: bool,
    pub action: RunAction,
    /// What the job checkpoints on (also for stops that do not ask for a checkpoint).
    pub checkpoint_signal: &'a str,
    /// Where rank 0 listens: its agent's host, a port derived from the job.
    pub master_host: String,
    pub master_port: u32,
    /// Its GPUs are watched for idleness (its partition's or QoS's idle GPU rule) while it runs.
    pub idle_watch: Option<crate::policy::IdleGpu>,
}

/// The job's checkpoint signal and grace: its own grace, never above its QoS's (checked at
/// submit, capped again here).
pub fn checkpoint_of<'a>(state: &ClusterState, job: &'a Job) -> (&'a str, u32) {
    let signal = job.spec.checkpoint_signal.as_deref().unwrap_or(DEFAULT_CHECKPOINT_SIGNAL);
    let qos_grace = state.policy.qos(&job.spec.qos).map(|q| q.grace_s).unwrap_or(0);
    let grace =
        job.spec.checkpoint_grace_s.unwrap_or(qos_grace).min(qos_grace).min(u64::from(u32::MAX)) as u32;
    (signal, grace)
}

/// How a run stopped for `reason` is asked to stop.
pub fn stop_action(reason: &StopReason, checkpoint_signal: &str, grace_s: u32) -> RunAction {
    let (signal, grace_s) = match reason {
        StopReason::Preempted { mode: PreemptMode::Requeue, .. }
        | StopReason::Resize { .. }
        | StopReason::Vacated
        | StopReason::Idle => (checkpoint_signal, grace_s),
        StopReason::Preempted { .. } => ("SIGTERM", grace_s),
        StopReason::Drained | StopReason::ReservationOpened => {
            (checkpoint_signal, grace_s.min(DRAIN_GRACE_S))
        }
        // Its GPU is gone: no checkpoint can be taken from it, stop at once.
        StopReason::GpuFailed => ("SIGTERM", KILL_GRACE_S),
        StopReason::Cancelled | StopReason::TimeLimit | StopReason::TaskFailed => ("SIGTERM", KILL_GRACE_S),
    };
    RunAction::Stop { signal: signal.to_string(), grace_s }
}

/// The runs `node` should have, in job id order: every task of a running or suspended job placed
/// there that has not ended yet.
pub fn runs_on<'a>(state: &'a ClusterState, node: &str) -> Vec<RunOrder<'a>> {
    let mut out = Vec::new();
    for j in
        state.jobs_on(node).into_iter().filter(|j| matches!(j.state, JobState::Running | JobState::Suspended))
    {
        let Some(a) = j.allocation.as_ref() else { continue };
        let Some((rank, _, gpus)) = a.tasks().find(|(_, n, _)| *n == node) else { continue };
        if a.exits.contains_key(&rank) {
            continue; // this task already ended; its GPUs are free
        }
        let (checkpoint_signal, grace) = checkpoint_of(state, j);
        let action = match &a.stop {
            Some(reason) => stop_action(reason, checkpoint_signal, grace),
            None if j.state == JobState::Suspended => RunAction::Suspend,
            None => RunAction::Run,
        };
        let master_host = state
            .nodes
            .get(&a.node)
            .and_then(|n| n.info.addr.rsplit_once(':').map(|(h, _)| h.to_string()))
            .unwrap_or_default();
        out.push(RunOrder {
            job: j,
            attempt: j.attempt,
            rank,
            world_size: a.task_count(),
            gpus: gpus.to_vec(),
            started: a.started,
            action,
            checkpoint_signal,
            master_host,
            master_port: master_port(j.id),
            idle_watch: if gpus.is_empty() {
                None
            } else {
                state.policy.idle_gpu(&j.spec.qos, &j.spec.partition)
            },
        });
    }
    out
}

/// Where rank 0 of job `job` listens.
pub fn master_port(job: JobId) -> u32 {
    MASTER_PORT_BASE + (job % 10_000) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Op, Outcome};
    use crate::testing::{node_info, spec};

    #[test]
    fn each_stop_reason_has_its_signal_and_grace() {
        let req = StopReason::Preempted { by: 9, mode: PreemptMode::Requeue };
        let cancel = StopReason::Preempted { by: 9, mode: PreemptMode::Cancel };
        let stop = |signal: &str, grace_s| RunAction::Stop { signal: signal.into(), grace_s };
        assert_eq!(stop_action(&req, "SIGUSR2", 300), stop("SIGUSR2", 300));
        assert_eq!(stop_action(&StopReason::Resize { by: None }, "SIGUSR2", 300), stop("SIGUSR2", 300));
        assert_eq!(stop_action(&cancel, "SIGUSR2", 300), stop("SIGTERM", 300));
        assert_eq!(stop_action(&StopReason::Drained, "SIGUSR2", 300), stop("SIGUSR2", DRAIN_GRACE_S));
        assert_eq!(stop_action(&StopReason::Drained, "SIGUSR2", 30), stop("SIGUSR2", 30));
        for r in [StopReason::Cancelled, StopReason::TimeLimit, StopReason::TaskFailed] {
            assert_eq!(stop_action(&r, "SIGUSR2", 300), stop("SIGTERM", KILL_GRACE_S), "{r:?}");
        }
    }

    fn apply(s: &mut ClusterState, op: Op) -> Outcome {
        s.apply(&Command { skipped_ms: 0, now_ms: 5, op })
    }

    #[test]
    fn a_node_is_told_to_run_suspend_or_stop_each_of_its_runs() {
        let mut s = ClusterState::new();
        apply(&mut s, Op::RegisterNode { info: node_info("n1", 2) });
        let mut sp = spec(1, "training");
        sp.checkpoint_signal = Some("SIGUSR2".into());
        sp.checkpoint_grace_s = Some(60);
        let job = match apply(&mut s, Op::Submit { spec: sp, request_id: None, hold: false, limits: None }) {
            Outcome::Submitted { job } => job,
            other => panic!("{other:?}"),
        };
        assert!(runs_on(&s, "n1").is_empty(), "pending: nothing to run");
        let plan = crate::planner::plan(&s).plan;
        apply(&mut s, Op::ApplyPlan { plan });
        let orders = runs_on(&s, "n1");
        assert_eq!(orders.len(), 1);
        let o = &orders[0];
        assert_eq!((o.job.id, o.attempt, o.rank, o.world_size, o.started), (job, 0, 0, 1, false));
        assert_eq!((o.action.clone(), o.checkpoint_signal), (RunAction::Run, "SIGUSR2"));
        assert_eq!((o.master_host.as_str(), o.master_port), ("n1", MASTER_PORT_BASE + job as u32));
        assert!(runs_on(&s, "n2").is_empty(), "another node");
        // A job that named no checkpoint signal is asked to stop with SIGTERM (Slurm's way).
        let mut plain_job = (*s.jobs[&job]).clone();
        plain_job.spec.checkpoint_signal = None;
        assert_eq!(checkpoint_of(&s, &plain_job).0, "SIGTERM");
        apply(&mut s, Op::JobStarted { job, attempt: 0, node: "n1".into() });
        assert!(runs_on(&s, "n1")[0].started);
        // Cancelled: SIGTERM with the kill grace, whatever the checkpoint settings.
        apply(&mut s, Op::Cancel { job, by: "alice".into() });
        let stop = RunAction::Stop { signal: "SIGTERM".into(), grace_s: KILL_GRACE_S };
        assert_eq!(runs_on(&s, "n1")[0].action, stop);
    }
}
