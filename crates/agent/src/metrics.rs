//! The agent's Prometheus metrics (`kairos-agent --metrics-addr`), rendered at every scrape:
//! its live runs and GPUs, per-GPU utilisation and memory where NVML measures them, and each
//! running job's latest usage sample (dcgm-exporter's per-pod labels, as `job`/`attempt`): a
//! job's series exist only while it runs, so their number is bounded by the node's runs.

use kairos_telemetry::Exposition;

use crate::gpu::GpuUsage;

/// What one scrape reports.
pub struct AgentFigures {
    pub node: String,
    pub runs: usize,
    pub gpus: usize,
    pub usage: Vec<GpuUsage>,
    /// Each running job's latest usage sample.
    pub jobs: Vec<(crate::decide::RunKey, kairos_proto::v1::UsageSample)>,
}

pub fn render(f: &AgentFigures) -> String {
    let node = [("node", f.node.as_str())];
    let mut e = Exposition::new();
    e.gauge("kairos_agent_runs", "Runs (job attempts) this agent is running.", &[(&node, f.runs as f64)]);
    e.gauge("kairos_agent_gpus", "GPUs this agent offers.", &[(&node, f.gpus as f64)]);
    let labels: Vec<[(&str, String); 3]> = f
        .usage
        .iter()
        .map(|u| [("node", f.node.clone()), ("gpu", u.index.to_string()), ("uuid", u.uuid.clone())])
        .collect();
    let refs: Vec<[(&str, &str); 3]> = labels
        .iter()
        .map(|l| [(l[0].0, l[0].1.as_str()), (l[1].0, l[1].1.as_str()), (l[2].0, l[2].1.as_str())])
        .collect();
    let per = |v: fn(&GpuUsage) -> f64| -> Vec<(&[(&str, &str)], f64)> {
        refs.iter().zip(&f.usage).map(|(l, u)| (&l[..], v(u))).collect()
    };
    e.gauge("kairos_agent_gpu_utilization_ratio", "GPU busy share (NVML), 0..1.", &per(|u| u.utilization));
    e.gauge(
        "kairos_agent_gpu_memory_used_bytes",
        "GPU memory in use (NVML).",
        &per(|u| u.memory_used_bytes as f64),
    );
    e.gauge(
        "kairos_agent_gpu_memory_total_bytes",
        "GPU memory (NVML).",
        &per(|u| u.memory_total_bytes as f64),
    );
    per_job(&mut e, &f.node, &f.jobs);
    e.finish()
}

/// The running jobs' gauges: per GPU utilisation and memory, and CPU cores and memory.
fn per_job(e: &mut Exposition, node: &str, jobs: &[(crate::decide::RunKey, kairos_proto::v1::UsageSample)]) {
    let run: Vec<[String; 2]> = jobs.iter().map(|((j, a), _)| [j.to_string(), a.to_string()]).collect();
    let run_labels: Vec<[(&str, &str); 3]> =
        run.iter().map(|[j, a]| [("node", node), ("job", j.as_str()), ("attempt", a.as_str())]).collect();
    let gpu: Vec<(usize, String, f64, f64)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, (_, s))| {
            s.gpus.iter().map(move |g| (i, g.gpu.to_string(), f64::from(g.util_pct), g.mem_mib as f64))
        })
        .collect();
    let gpu_labels: Vec<[(&str, &str); 4]> = gpu
        .iter()
        .map(|(i, g, _, _)| {
            let [n, j, a] = run_labels[*i];
            [n, j, a, ("gpu", g.as_str())]
        })
        .collect();
    let of_gpu = |v: fn(&(usize, String, f64, f64)) -> f64| -> Vec<(&[(&str, &str)], f64)> {
        gpu_labels.iter().zip(&gpu).map(|(l, g)| (&l[..], v(g))).collect()
    };
    e.gauge(
        "kairos_job_gpu_utilization_percent",
        "A running job's GPU utilisation, latest sample.",
        &of_gpu(|g| g.2),
    );
    e.gauge(
        "kairos_job_gpu_memory_used_mib",
        "A running job's GPU memory in use, latest sample.",
        &of_gpu(|g| g.3),
    );
    let of_run = |v: fn(&kairos_proto::v1::UsageSample) -> f64| -> Vec<(&[(&str, &str)], f64)> {
        run_labels.iter().zip(jobs).map(|(l, (_, s))| (&l[..], v(s))).collect()
    };
    e.gauge(
        "kairos_job_cpu_cores",
        "CPU cores a running job used over the last interval.",
        &of_run(|s| f64::from(s.cpu_milli) / 1000.0),
    );
    e.gauge(
        "kairos_job_memory_bytes",
        "Memory a running job's cgroup holds, latest sample.",
        &of_run(|s| (s.mem_kib * 1024) as f64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_gpus_and_measured_usage_are_reported() {
        let usage = vec![GpuUsage {
            index: 1,
            uuid: "GPU-1".into(),
            utilization: 0.5,
            memory_used_bytes: 10,
            memory_total_bytes: 80,
        }];
        let sample = kairos_proto::v1::UsageSample {
            time_ms: 1,
            gpus: vec![kairos_proto::v1::GpuSample { gpu: 3, util_pct: 80, mem_mib: 30_000 }],
            cpu_milli: 1500,
            mem_kib: 2,
        };
        let jobs = vec![((42, 1), sample)];
        let text = render(&AgentFigures { node: "n1".into(), runs: 2, gpus: 8, usage, jobs });
        let job = "node=\"n1\",job=\"42\",attempt=\"1\"";
        assert!(
            text.contains(&format!("kairos_job_gpu_utilization_percent{{{job},gpu=\"3\"}} 80\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("kairos_job_gpu_memory_used_mib{{{job},gpu=\"3\"}} 30000\n")),
            "{text}"
        );
        assert!(text.contains(&format!("kairos_job_cpu_cores{{{job}}} 1.5\n")), "{text}");
        assert!(text.contains(&format!("kairos_job_memory_bytes{{{job}}} 2048\n")), "{text}");
        assert!(text.contains("kairos_agent_runs{node=\"n1\"} 2\n"), "{text}");
        assert!(text.contains("kairos_agent_gpus{node=\"n1\"} 8\n"), "{text}");
        assert!(
            text.contains("kairos_agent_gpu_utilization_ratio{node=\"n1\",gpu=\"1\",uuid=\"GPU-1\"} 0.5\n"),
            "{text}"
        );
        assert!(
            text.contains("kairos_agent_gpu_memory_used_bytes{node=\"n1\",gpu=\"1\",uuid=\"GPU-1\"} 10\n"),
            "{text}"
        );
    }
}
