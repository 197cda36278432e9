//! The agent's Prometheus metrics (`kairos-agent --metrics-addr`), rendered at every scrape:
//! its live runs and GPUs, and per-GPU utilisation and memory where NVML measures them.

use kairos_telemetry::Exposition;

use crate::gpu::GpuUsage;

/// What one scrape reports.
pub struct AgentFigures {
    pub node: String,
    pub runs: usize,
    pub gpus: usize,
    pub usage: Vec<GpuUsage>,
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
    e.finish()
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
        let text = render(&AgentFigures { node: "n1".into(), runs: 2, gpus: 8, usage });
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
