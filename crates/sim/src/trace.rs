//! Job traces: the Alibaba GPU cluster trace (v2023 CSVs) and a generic JSONL form.

use serde::Deserialize;

/// One job of a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceJob {
    pub name: String,
    /// When it arrives (ms from the trace's start).
    pub submit_ms: i64,
    /// How long it runs once started (ms, at least 1 s).
    pub duration_ms: i64,
    pub gpus: u32,
    /// Inference (latency-sensitive) or training.
    pub inference: bool,
    /// CPUs (whole, rounded up) and memory (MiB) it asks for; 0: none.
    pub cpus: u32,
    pub mem_mib: u64,
    /// The GPU models it accepts, `|`-separated (the trace's `gpu_spec`); None: any.
    pub gpu_spec: Option<String>,
    /// Thousandths of its one GPU it asks (the trace's `gpu_milli` of a one-GPU pod below a
    /// whole GPU); 0: whole GPUs.
    pub gpu_milli: u32,
    /// A gang of this many tasks (one node each, `gpus` per task); 0 or 1: one node.
    pub tasks: u32,
}

impl TraceJob {
    /// GPUs of all its tasks.
    pub fn total_gpus(&self) -> u32 {
        self.gpus.saturating_mul(self.tasks.max(1))
    }
}

/// One GPU node of a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceNode {
    pub name: String,
    pub gpus: u32,
    pub model: String,
    /// CPUs and memory (MiB) it offers; 0: not known (then they bind nothing).
    pub cpus: u32,
    pub mem_mib: u64,
    /// Its labels (a topology's domains: `block=b1`).
    pub labels: std::collections::BTreeMap<String, String>,
}

/// A trace that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TraceError {
    #[error("{file}: line {line}: {why}")]
    Line { file: String, line: usize, why: String },
    #[error("{file}: no header with the columns {columns}")]
    Header { file: String, columns: String },
}

/// Column positions by name, from a CSV header.
fn columns<'a>(file: &str, header: &'a str, wanted: &[&str]) -> Result<Vec<usize>, TraceError> {
    let names: Vec<&'a str> = header.trim().split(',').collect();
    wanted
        .iter()
        .map(|w| names.iter().position(|n| n == w))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| TraceError::Header { file: file.to_string(), columns: wanted.join(",") })
}

fn number(file: &str, line: usize, field: &str, what: &str) -> Result<i64, TraceError> {
    field.trim().parse::<i64>().map_err(|_| TraceError::Line {
        file: file.to_string(),
        line,
        why: format!("{what} \"{field}\" is not a number"),
    })
}

/// The Alibaba v2023 pod list (`openb_pod_list_*.csv`): class `LS` is inference, every other
/// class training; submit = creation time, duration = deletion − scheduled time; a one-GPU
/// pod's `gpu_milli` below 1000 is kept as its fraction (used where the replay shares GPUs). Pods without GPUs, and pods the trace never scheduled (no scheduled time:
/// no run time is known), are left out; returns the jobs and how many were.
pub fn alibaba_pods(file: &str, text: &str) -> Result<(Vec<TraceJob>, usize), TraceError> {
    let mut lines = text.lines().enumerate();
    let header = lines.next().map(|(_, l)| l).unwrap_or_default();
    let cols = columns(
        file,
        header,
        &[
            "name",
            "num_gpu",
            "qos",
            "creation_time",
            "deletion_time",
            "scheduled_time",
            "cpu_milli",
            "memory_mib",
            "gpu_spec",
            "gpu_milli",
        ],
    )?;
    let (mut jobs, mut skipped) = (Vec::new(), 0);
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let field = |c: usize| f.get(cols[c]).copied().unwrap_or_default();
        let n = i + 1;
        let gpus = number(file, n, field(1), "num_gpu")?;
        if gpus <= 0 || field(5).trim().is_empty() {
            skipped += 1;
            continue;
        }
        let created = number(file, n, field(3), "creation_time")?;
        let deleted = number(file, n, field(4), "deletion_time")?;
        let scheduled = number(file, n, field(5), "scheduled_time")?;
        jobs.push(TraceJob {
            name: field(0).to_string(),
            submit_ms: created * 1000,
            duration_ms: (deleted - scheduled).max(1) * 1000,
            gpus: gpus.min(u32::MAX as i64) as u32,
            inference: field(2) == "LS",
            cpus: (number(file, n, field(6), "cpu_milli")?.max(0) as u64)
                .div_ceil(1000)
                .min(u64::from(u32::MAX)) as u32,
            mem_mib: number(file, n, field(7), "memory_mib")?.max(0) as u64,
            gpu_spec: Some(field(8).trim()).filter(|s| !s.is_empty()).map(str::to_string),
            gpu_milli: match number(file, n, field(9), "gpu_milli")? {
                m if gpus == 1 && (1..1000).contains(&m) => m as u32,
                _ => 0,
            },
            tasks: 1,
        });
    }
    Ok((jobs, skipped))
}

/// The Alibaba v2023 node list (`openb_node_list_gpu_node.csv`); nodes without GPUs are left out.
pub fn alibaba_nodes(file: &str, text: &str) -> Result<Vec<TraceNode>, TraceError> {
    let mut lines = text.lines().enumerate();
    let header = lines.next().map(|(_, l)| l).unwrap_or_default();
    let cols = columns(file, header, &["sn", "gpu", "model", "cpu_milli", "memory_mib"])?;
    let mut nodes = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let field = |c: usize| f.get(cols[c]).copied().unwrap_or_default();
        let gpus = number(file, i + 1, field(1), "gpu")?;
        if gpus > 0 {
            nodes.push(TraceNode {
                name: field(0).to_string(),
                gpus: gpus as u32,
                model: field(2).to_string(),
                cpus: (number(file, i + 1, field(3), "cpu_milli")?.max(0) / 1000).min(i64::from(u32::MAX))
                    as u32,
                mem_mib: number(file, i + 1, field(4), "memory_mib")?.max(0) as u64,
                labels: Default::default(),
            });
        }
    }
    Ok(nodes)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonJob {
    #[serde(default)]
    name: String,
    submit_s: f64,
    duration_s: f64,
    gpus: u32,
    class: String,
    /// A gang: this many tasks of `gpus` each, one per node.
    #[serde(default)]
    tasks: Option<u32>,
}

/// A generic trace, one JSON object per line:
/// `{"name": "j1", "submit_s": 0, "duration_s": 600, "gpus": 2, "class": "training"}` (class
/// `inference` or `training`; `"tasks": N` makes it a gang of N nodes, `gpus` on each).
pub fn jsonl(file: &str, text: &str) -> Result<Vec<TraceJob>, TraceError> {
    let mut jobs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| TraceError::Line { file: file.to_string(), line: i + 1, why };
        let j: JsonJob = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        let inference = match j.class.as_str() {
            "inference" => true,
            "training" => false,
            other => return Err(bad(format!("class \"{other}\" is neither inference nor training"))),
        };
        if j.gpus == 0 || !j.submit_s.is_finite() || !j.duration_s.is_finite() || j.submit_s < 0.0 {
            return Err(bad("gpus must be at least 1, submit_s and duration_s finite, submit_s ≥ 0".into()));
        }
        jobs.push(TraceJob {
            name: if j.name.is_empty() { format!("job-{}", i + 1) } else { j.name },
            submit_ms: (j.submit_s * 1000.0) as i64,
            duration_ms: ((j.duration_s * 1000.0) as i64).max(1000),
            gpus: j.gpus,
            inference,
            tasks: j.tasks.unwrap_or(1).clamp(1, kairos_scheduler::validate::TASKS_MAX),
            ..TraceJob::default()
        });
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibaba_rows_become_jobs_and_bad_rows_are_named() {
        let csv = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
                   p0,1,1,1,460,,LS,Running,10,100,20\n\
                   p1,1,1,0,0,,BE,Running,10,100,20\n\
                   p2,1,1,8,1000,V100M32,BE,Succeeded,30,50,40\n\
                   p3,1,1,1,1000,,BE,Pending,30,50,\n";
        let (jobs, skipped) = alibaba_pods("pods.csv", csv).unwrap();
        assert_eq!(skipped, 2, "no GPU, never scheduled");
        assert_eq!(
            jobs,
            vec![
                TraceJob {
                    name: "p0".into(),
                    submit_ms: 10_000,
                    duration_ms: 80_000,
                    gpus: 1,
                    inference: true,
                    cpus: 1,
                    mem_mib: 1,
                    gpu_spec: None,
                    gpu_milli: 460,
                    tasks: 1,
                },
                TraceJob {
                    name: "p2".into(),
                    submit_ms: 30_000,
                    duration_ms: 10_000,
                    gpus: 8,
                    inference: false,
                    cpus: 1,
                    mem_mib: 1,
                    gpu_spec: Some("V100M32".into()),
                    gpu_milli: 0,
                    tasks: 1,
                },
            ]
        );
        let e = alibaba_pods("pods.csv", &csv.replace("p2,1,1,8", "p2,1,1,x")).unwrap_err();
        assert_eq!(e.to_string(), "pods.csv: line 4: num_gpu \"x\" is not a number");
        assert!(matches!(alibaba_pods("p.csv", "a,b\n"), Err(TraceError::Header { .. })));
        let nodes =
            alibaba_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,1024,8,T4\nn1,1,1,0,\n")
                .unwrap();
        assert_eq!(
            nodes,
            vec![TraceNode {
                name: "n0".into(),
                gpus: 8,
                model: "T4".into(),
                cpus: 96,
                mem_mib: 1024,
                ..Default::default()
            }]
        );
        let j = jsonl("j", "{\"submit_s\": 1, \"duration_s\": 2, \"gpus\": 1, \"class\": \"inference\"}\n")
            .unwrap();
        assert_eq!((j[0].submit_ms, j[0].duration_ms, j[0].inference), (1000, 2000, true));
        assert!(jsonl("j", "{\"submit_s\": 1, \"duration_s\": 2, \"gpus\": 1, \"class\": \"x\"}").is_err());
    }
}
