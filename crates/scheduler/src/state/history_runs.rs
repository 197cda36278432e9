//! What a replay of the history needs of each job beyond what accounting shows
//! (`JobRecord::replay`): its GPUs per task, the models it accepts, its dependencies and array,
//! whether it asked to be requeued, its holds, and the window of every run with when it was
//! preempted and whether it checkpointed on the signal. Taken from the job's events when its
//! record is made, so it costs the live state nothing.

use serde::{Deserialize, Serialize};

use crate::model::{Job, JobId};

/// Most run windows a record keeps (its first ones: a job preempted more often than this is
/// replayed with its later runs merged into the last).
pub const RUNS_KEPT: usize = 16;

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !v
}

/// One run of a job: started, maybe preempted, ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunWindow {
    #[serde(rename = "s")]
    pub start_ms: i64,
    /// When it stopped (0: it still runs).
    #[serde(rename = "e", default, skip_serializing_if = "is_zero")]
    pub end_ms: i64,
    /// When the scheduler preempted it (0: never).
    #[serde(rename = "p", default, skip_serializing_if = "is_zero")]
    pub preempted_ms: i64,
    /// It reported a finished checkpoint on the preemption signal.
    #[serde(rename = "c", default, skip_serializing_if = "is_false")]
    pub checkpointed: bool,
}

/// A time a job was held, and released (0: never).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldWindow {
    #[serde(rename = "h")]
    pub held_ms: i64,
    #[serde(rename = "r", default, skip_serializing_if = "is_zero")]
    pub released_ms: i64,
}

/// The replay's facts of one job (short names: one per history record).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replay {
    #[serde(rename = "gt", default, skip_serializing_if = "is_zero_u32")]
    pub gpus_per_task: u32,
    #[serde(rename = "gm", default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    #[serde(rename = "ok", default, skip_serializing_if = "Vec::is_empty")]
    pub after_ok: Vec<JobId>,
    #[serde(rename = "any", default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<JobId>,
    #[serde(rename = "nok", default, skip_serializing_if = "Vec::is_empty")]
    pub after_not_ok: Vec<JobId>,
    /// An array task: the array's task count and its limit on running tasks (0: none).
    #[serde(rename = "an", default, skip_serializing_if = "is_zero_u32")]
    pub array_count: u32,
    #[serde(rename = "al", default, skip_serializing_if = "is_zero_u32")]
    pub array_limit: u32,
    #[serde(rename = "rq", default, skip_serializing_if = "is_false")]
    pub requeue: bool,
    #[serde(rename = "r", default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunWindow>,
    #[serde(rename = "hd", default, skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<HoldWindow>,
}

impl Replay {
    pub fn is_empty(&self) -> bool {
        *self == Replay::default()
    }

    /// The facts of `job`, from its spec and its events.
    pub fn of(job: &Job) -> Replay {
        let mut runs: Vec<RunWindow> = Vec::new();
        let mut holds: Vec<HoldWindow> = Vec::new();
        for e in &job.events {
            let open = runs.last().is_some_and(|r| r.end_ms == 0);
            match &*e.kind {
                "started" if open => {}
                "started" if runs.len() < RUNS_KEPT => {
                    runs.push(RunWindow { start_ms: e.time_ms, ..RunWindow::default() })
                }
                // Past the kept runs: the last one is reopened and takes the later ones in.
                "started" => runs.last_mut().iter_mut().for_each(|r| r.end_ms = 0),
                "preempted" if open => runs.last_mut().iter_mut().for_each(|r| r.preempted_ms = e.time_ms),
                "checkpointed" if open => runs.last_mut().iter_mut().for_each(|r| r.checkpointed = true),
                "requeued" if open => runs.last_mut().iter_mut().for_each(|r| r.end_ms = e.time_ms),
                "held" => holds.push(HoldWindow { held_ms: e.time_ms, released_ms: 0 }),
                // A job submitted held has no "held" event: its hold began at its submit.
                "released" => match holds.last_mut().filter(|h| h.released_ms == 0) {
                    Some(h) => h.released_ms = e.time_ms,
                    None => holds.push(HoldWindow { held_ms: job.submit_time_ms, released_ms: e.time_ms }),
                },
                _ => {}
            }
        }
        if job.held && holds.last().is_none_or(|h| h.released_ms != 0) {
            holds.push(HoldWindow { held_ms: job.submit_time_ms, released_ms: 0 });
        }
        if let (Some(r), Some(end)) = (runs.last_mut().filter(|r| r.end_ms == 0), job.end_time_ms) {
            if job.state.is_terminal() {
                r.end_ms = end.max(r.start_ms);
            }
        }
        let array = job.spec.array.as_deref().filter(|a| a.id != 0);
        Replay {
            gpus_per_task: job.spec.gpus,
            gpu_model: job.spec.gpu_model.clone(),
            after_ok: job.spec.after_ok.clone(),
            after_any: job.spec.after_any.clone(),
            after_not_ok: job.spec.after_not_ok.clone(),
            array_count: array.map_or(0, |a| a.count),
            array_limit: array.and_then(|a| a.max_running).unwrap_or(0),
            requeue: job.spec.requeue,
            runs,
            holds,
        }
    }
}
