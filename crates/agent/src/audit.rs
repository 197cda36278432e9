//! The process log: one JSON line per job process start and exit on this node — which job and
//! attempt, on which GPUs, with which pid, when. Operators read it to answer "what ran on GPU 3
//! at 02:14"; the chaos tests check from it that no GPU was ever held by two jobs at once.
//!
//! A start is written just before the process is spawned and an exit just after its whole
//! group is gone, so each logged interval covers the real one.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// One line of the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEvent {
    /// Unix milliseconds.
    pub t_ms: i64,
    /// "start" or "exit".
    pub event: String,
    pub node: String,
    pub job: u64,
    pub attempt: u32,
    /// The GPU indices the process was given (starts only).
    #[serde(default)]
    pub gpus: Vec<u32>,
    #[serde(default)]
    pub pid: Option<i32>,
    /// How it ended (exits only): "exit 0", "signal 9", "orphan killed", "not started".
    #[serde(default)]
    pub how: String,
}

/// Appends events to a file; a no-op when no file is configured.
#[derive(Clone, Default)]
pub struct ProcessLog {
    node: String,
    file: Option<Arc<Mutex<std::fs::File>>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl ProcessLog {
    pub fn open(path: &Path, node: &str) -> std::io::Result<ProcessLog> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(ProcessLog { node: node.to_string(), file: Some(Arc::new(Mutex::new(file))) })
    }

    fn write(&self, event: ProcessEvent) {
        let Some(file) = &self.file else { return };
        let Ok(mut line) = serde_json::to_vec(&event) else { return };
        line.push(b'\n');
        let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
        // One write per line: concurrent writers never interleave within a line.
        if let Err(e) = f.write_all(&line) {
            tracing::warn!(error = %e, "cannot write the process log");
        }
    }

    pub fn start(&self, job: u64, attempt: u32, gpus: &[u32], pid: Option<i32>) {
        self.write(ProcessEvent {
            t_ms: now_ms(),
            event: "start".into(),
            node: self.node.clone(),
            job,
            attempt,
            gpus: gpus.to_vec(),
            pid,
            how: String::new(),
        });
    }

    pub fn exit(&self, job: u64, attempt: u32, how: &str) {
        self.write(ProcessEvent {
            t_ms: now_ms(),
            event: "exit".into(),
            node: self.node.clone(),
            job,
            attempt,
            gpus: Vec::new(),
            pid: None,
            how: how.to_string(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_json_lines_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proc.jsonl");
        let log = ProcessLog::open(&path, "n1").unwrap();
        log.start(7, 0, &[2, 3], Some(42));
        log.exit(7, 0, "exit 0");
        ProcessLog::default().start(1, 0, &[], None);
        let text = std::fs::read_to_string(&path).unwrap();
        let events: Vec<ProcessEvent> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(events.len(), 2);
        assert_eq!((events[0].event.as_str(), events[0].gpus.as_slice()), ("start", &[2, 3][..]));
        assert_eq!((events[1].event.as_str(), events[1].how.as_str()), ("exit", "exit 0"));
        assert!(events[0].t_ms <= events[1].t_ms && events[1].node == "n1");
    }
}
