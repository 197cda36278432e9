//! A cluster's own history as a trace (`kairos history --export-trace`, read by `kairos sim
//! --history` and `kairos policy what-if`): one JSON object per line, tagged by `type`:
//!
//! - `window`: the window exported (Unix ms) and when;
//! - `node`: a node that existed when the replay begins (its GPUs, model, CPUs, memory, labels);
//! - `node_event`: a node joining (with its shape), draining, down, up or removed, when;
//! - `job`: everything the planner reads of one job, the work it needed, how it met
//!   preemption, its holds and cancel, and what was recorded of its runs (for fidelity).
//!
//! Times are Unix milliseconds as recorded; the replay counts from the earliest of the window's
//! start and its jobs' submits.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::trace::TraceError;

/// Most lines a history trace may have (a 30-day window of a large cluster fits easily).
pub const LINES_MAX: usize = 2_000_000;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    pub from_ms: i64,
    pub to_ms: i64,
    #[serde(default)]
    pub exported_ms: i64,
    /// The policy the cluster ran when the trace was exported (`kairos policy export`'s TOML):
    /// what `kairos sim --history` replays unless given another.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub policy_toml: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeShape {
    pub name: String,
    pub gpus: u32,
    #[serde(default)]
    pub gpu_model: String,
    #[serde(default)]
    pub cpus: u32,
    #[serde(default)]
    pub memory_mib: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// What happened to a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "change")]
pub enum NodeChange {
    Joined { shape: NodeShape },
    Draining { reason: String },
    Down { reason: String },
    Up,
    Removed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEvent {
    pub at_ms: i64,
    pub node: String,
    #[serde(flatten)]
    pub change: NodeChange,
}

/// What was recorded of a job's runs (the replay under the same policy should reproduce it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recorded {
    /// Its final state (`COMPLETED`, `RUNNING`, …).
    pub state: String,
    /// Every run's start (Unix ms), first first.
    #[serde(default)]
    pub starts: Vec<i64>,
    #[serde(default)]
    pub end_ms: Option<i64>,
    #[serde(default)]
    pub preemptions: u32,
}

/// An array task: its array's id, its index, the array's size and running limit (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrayTask {
    pub id: u64,
    pub index: u32,
    pub count: u32,
    #[serde(default)]
    pub limit: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryJob {
    pub id: u64,
    pub name: String,
    pub user: String,
    #[serde(default)]
    pub account: String,
    #[serde(default)]
    pub partition: String,
    pub qos: String,
    /// `training`, `inference` or `batch`.
    pub profile: String,
    pub submit_ms: i64,
    /// The run time it needed: its runs' useful time, without work redone after a preemption
    /// that found no checkpoint (ms).
    pub work_ms: i64,
    /// GPUs per task, tasks, thousandths of one GPU (0: whole GPUs), the models it accepts.
    pub gpus: u32,
    #[serde(default = "one")]
    pub tasks: u32,
    #[serde(default)]
    pub gpu_milli: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Per task.
    #[serde(default)]
    pub cpus: u32,
    #[serde(default)]
    pub mem_mib: u64,
    /// Its own time limit (s), when it set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_ok: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_not_ok: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayTask>,
    #[serde(default)]
    pub requeue: bool,
    /// It saved its work on the checkpoint signal (else a preemption loses its run), and how
    /// long it took to stop after the signal (ms).
    #[serde(default)]
    pub checkpoint_on_signal: bool,
    #[serde(default = "stop_ms_default")]
    pub stop_ms: i64,
    /// Held at and released at (0: never released), Unix ms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<(i64, i64)>,
    /// When it was cancelled (a recorded event the replay repeats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_ms: Option<i64>,
    /// How its last run exited (0: success).
    #[serde(default)]
    pub exit_code: i32,
    pub recorded: Recorded,
}

fn one() -> u32 {
    1
}

fn stop_ms_default() -> i64 {
    5_000
}

/// One line of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Line {
    Window(Window),
    Node(NodeShape),
    NodeEvent(NodeEvent),
    Job(Box<HistoryJob>),
}

/// A whole history trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryTrace {
    pub window: Window,
    /// Nodes that existed when the replay begins.
    pub nodes: Vec<NodeShape>,
    /// Later changes, in time order.
    pub node_events: Vec<NodeEvent>,
    /// By submit time (then id).
    pub jobs: Vec<HistoryJob>,
}

impl HistoryTrace {
    /// When the replay begins: the window's start, or an earlier job's submit.
    pub fn origin_ms(&self) -> i64 {
        self.jobs.iter().map(|j| j.submit_ms).chain([self.window.from_ms]).min().unwrap_or(0)
    }

    /// The trace as JSONL.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        let mut line = |l: Line| {
            out.push_str(&serde_json::to_string(&l).unwrap_or_default());
            out.push('\n');
        };
        line(Line::Window(self.window.clone()));
        for n in &self.nodes {
            line(Line::Node(n.clone()));
        }
        for e in &self.node_events {
            line(Line::NodeEvent(e.clone()));
        }
        for j in &self.jobs {
            line(Line::Job(Box::new(j.clone())));
        }
        out
    }

    /// Reads a history trace (`file` names it in errors); lines in any order.
    pub fn parse(file: &str, text: &str) -> Result<HistoryTrace, TraceError> {
        let mut trace = HistoryTrace::default();
        let mut window = None;
        for (i, raw) in text.lines().enumerate() {
            let bad = |why: String| TraceError::Line { file: file.to_string(), line: i + 1, why };
            if i >= LINES_MAX {
                return Err(bad(format!("more than {LINES_MAX} lines")));
            }
            if raw.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Line>(raw).map_err(|e| bad(e.to_string()))? {
                Line::Window(w) => window = Some(w),
                Line::Node(n) => trace.nodes.push(n),
                Line::NodeEvent(e) => trace.node_events.push(e),
                Line::Job(j) => {
                    if j.gpus == 0 && j.gpu_milli == 0 && j.cpus == 0 {
                        return Err(bad(format!("job {}: asks for no GPU and no CPU", j.id)));
                    }
                    if j.work_ms < 0 || j.stop_ms < 0 {
                        return Err(bad(format!("job {}: work_ms and stop_ms must be ≥ 0", j.id)));
                    }
                    trace.jobs.push(*j);
                }
            }
        }
        trace.window = window.ok_or_else(|| TraceError::Header {
            file: file.to_string(),
            columns: "a {\"type\": \"window\"} line (is it a history trace?)".into(),
        })?;
        trace.node_events.sort_by_key(|e| e.at_ms);
        trace.jobs.sort_by_key(|j| (j.submit_ms, j.id));
        Ok(trace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_round_trips_and_bad_lines_are_named() {
        let trace = HistoryTrace {
            window: Window { from_ms: 1000, to_ms: 9000, exported_ms: 9500, policy_toml: String::new() },
            nodes: vec![NodeShape {
                name: "n1".into(),
                gpus: 4,
                gpu_model: "A100".into(),
                ..Default::default()
            }],
            node_events: vec![NodeEvent {
                at_ms: 5000,
                node: "n1".into(),
                change: NodeChange::Draining { reason: "maintenance".into() },
            }],
            jobs: vec![HistoryJob {
                id: 7,
                name: "train".into(),
                user: "alice".into(),
                qos: "training".into(),
                profile: "training".into(),
                submit_ms: 900,
                work_ms: 3000,
                gpus: 2,
                tasks: 1,
                stop_ms: 100,
                holds: vec![(900, 1200)],
                recorded: Recorded {
                    state: "COMPLETED".into(),
                    starts: vec![1300],
                    end_ms: Some(4300),
                    preemptions: 0,
                },
                ..Default::default()
            }],
        };
        let text = trace.to_jsonl();
        assert!(text.lines().next().unwrap().contains("\"type\":\"window\""));
        assert!(text.contains("\"change\":\"draining\""), "{text}");
        assert_eq!(HistoryTrace::parse("h", &text).unwrap(), trace);
        assert_eq!(trace.origin_ms(), 900);
        let e = HistoryTrace::parse("h", &text.replace("\"gpus\":2", "\"gpus\":0")).unwrap_err();
        assert_eq!(e.to_string(), "h: line 4: job 7: asks for no GPU and no CPU");
        let e = HistoryTrace::parse("h", "{\"type\":\"node\",\"name\":\"n\",\"gpus\":1}\n").unwrap_err();
        assert!(e.to_string().contains("is it a history trace"), "{e}");
        assert!(HistoryTrace::parse("h", "{\"type\":\"job\"}").is_err());
    }
}
