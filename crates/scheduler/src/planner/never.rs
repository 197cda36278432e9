//! Whether a job could ever be placed on the registered nodes (their GPUs, models, CPUs and
//! memory as registered, not what runs on them), and if not, which constraint no node meets —
//! what `kairos sim` reports for the jobs a replay could not run. (Submit refuses such jobs by
//! `state::fits`, in its own words; this names the constraint for a report.)

use crate::model::{model_matches, JobSpec};
use crate::state::ClusterState;

/// Why a job could never be placed on the registered nodes as they are (not their load):
/// the first constraint, in this order, that no node (of its partition) meets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unplaceable {
    /// A fraction of a GPU that its QoS does not share (training never shares).
    Fraction { milli: u32, qos: String },
    /// No node has a GPU of any model of the set (`|`-separated); `models` are those the
    /// nodes have.
    GpuModel { asked: String, models: Vec<String> },
    /// More GPUs (of its models) than any one node has.
    Size { gpus: u32, largest: u32 },
    /// Nodes with its GPUs have too few CPUs: the most one of them has.
    Cpus { cpus: u32, largest: u32 },
    /// Nodes with its GPUs and CPUs have too little memory (MiB): the most one of them has.
    Memory { mem_mib: u64, largest_mib: u64 },
}

impl Unplaceable {
    /// The constraint, as a short stable key (`kairos sim --json`).
    pub fn constraint(&self) -> &'static str {
        match self {
            Unplaceable::Fraction { .. } => "gpu_fraction",
            Unplaceable::GpuModel { .. } => "gpu_model",
            Unplaceable::Size { .. } => "gpus",
            Unplaceable::Cpus { .. } => "cpus",
            Unplaceable::Memory { .. } => "memory",
        }
    }
}

impl std::fmt::Display for Unplaceable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unplaceable::Fraction { milli, qos } => {
                write!(f, "{milli}/1000 of a GPU, which qos \"{qos}\" does not share")
            }
            Unplaceable::GpuModel { asked, models } => {
                write!(f, "GPU models {asked}; the nodes have {}", models.join("|"))
            }
            Unplaceable::Size { gpus, largest } => {
                write!(f, "{gpus} GPUs; the largest node has {largest} of them")
            }
            Unplaceable::Cpus { cpus, largest } => {
                write!(f, "{cpus} CPUs; the largest node with its GPUs has {largest}")
            }
            Unplaceable::Memory { mem_mib, largest_mib } => {
                write!(
                    f,
                    "{mem_mib} MiB of memory; the largest node with its GPUs and CPUs has {largest_mib} MiB"
                )
            }
        }
    }
}

/// The first constraint of `spec` that no registered node of its partition meets (checked in
/// the order of `Unplaceable`'s variants, each among the nodes that meet the ones before), or
/// None when some node could hold one of its tasks. Its QoS is the one it names, else its
/// profile's.
pub fn never_placeable(state: &ClusterState, spec: &JobSpec) -> Option<Unplaceable> {
    let policy = &state.policy;
    if spec.gpu_milli > 0 {
        let qos = if spec.qos.is_empty() { policy.default_qos(spec.profile) } else { policy.qos(&spec.qos) };
        let shares = qos.is_some_and(|q| q.gpu_sharing) && spec.profile != crate::model::Profile::Training;
        if !shares {
            let qos = qos.map_or_else(|| spec.qos.clone(), |q| q.name.clone());
            return Some(Unplaceable::Fraction { milli: spec.gpu_milli, qos });
        }
    }
    let partition_name = if spec.partition.is_empty() { &policy.default_partition } else { &spec.partition };
    let partition = policy.partitions.get(partition_name);
    let nodes: Vec<&crate::model::Node> = state
        .nodes
        .values()
        .filter(|n| partition.is_none_or(|p| p.contains(&n.info.name, &n.info.labels)))
        .collect();
    let model = spec.gpu_model.as_deref();
    let matching =
        |n: &crate::model::Node| n.info.gpus.iter().filter(|g| model_matches(model, &g.model)).count();
    if model.is_some() && spec.gpus > 0 && nodes.iter().all(|n| matching(n) == 0) {
        let mut models: Vec<String> =
            nodes.iter().flat_map(|n| n.info.gpus.iter().map(|g| g.model.clone())).collect();
        models.sort();
        models.dedup();
        return Some(Unplaceable::GpuModel { asked: model.unwrap_or_default().to_string(), models });
    }
    let gpus = spec.gpus.max(u32::from(spec.gpu_milli > 0));
    let sized: Vec<_> = nodes.into_iter().filter(|n| matching(n) >= gpus as usize).collect();
    if sized.is_empty() {
        let largest = state.nodes.values().map(|n| matching(n) as u32).max().unwrap_or(0);
        return Some(Unplaceable::Size { gpus, largest });
    }
    let cpus: Vec<_> = sized.iter().filter(|n| n.capacity().cpus >= spec.cpus).collect();
    if cpus.is_empty() {
        let largest = sized.iter().map(|n| n.capacity().cpus).max().unwrap_or(0);
        return Some(Unplaceable::Cpus { cpus: spec.cpus, largest });
    }
    if cpus.iter().all(|n| n.capacity().mem_mib < spec.mem_mib) {
        let largest_mib = cpus.iter().map(|n| n.capacity().mem_mib).max().unwrap_or(0);
        return Some(Unplaceable::Memory { mem_mib: spec.mem_mib, largest_mib });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NodeInfo, Profile};
    use crate::testing::node_info_model;
    use crate::{Command, Op};

    fn node(name: &str, gpus: u32, model: &str, cpus: u32, memory_mib: u64) -> NodeInfo {
        NodeInfo { cpus, memory_mib, ..node_info_model(name, gpus, model) }
    }

    #[test]
    fn each_constraint_no_node_meets_is_named_and_a_job_some_node_fits_is_not() {
        let mut state = ClusterState::new();
        for info in [node("a", 8, "T4", 16, 1024), node("b", 2, "A100", 96, 8192)] {
            state.apply(&Command { skipped_ms: 0, now_ms: 0, op: Op::RegisterNode { info } });
        }
        let spec = |gpus: u32| JobSpec::new("j", "u", vec!["true".into()], gpus);
        let never = |s: &JobSpec| never_placeable(&state, s);
        assert_eq!(never(&spec(8)), None);
        let mut s = spec(1);
        s.gpu_model = Some("V100|H100".into());
        assert_eq!(
            never(&s),
            Some(Unplaceable::GpuModel {
                asked: "V100|H100".into(),
                models: vec!["A100".into(), "T4".into()]
            })
        );
        s.gpu_model = Some("A100".into());
        assert_eq!(never(&s), None);
        s.gpus = 4;
        assert_eq!(never(&s), Some(Unplaceable::Size { gpus: 4, largest: 2 }));
        assert_eq!(never(&spec(9)), Some(Unplaceable::Size { gpus: 9, largest: 8 }));
        // 8 GPUs are only on a with 16 CPUs; b's 96 do not help.
        let mut s = spec(8);
        s.cpus = 32;
        assert_eq!(never(&s), Some(Unplaceable::Cpus { cpus: 32, largest: 16 }));
        let mut s = spec(1);
        s.cpus = 32;
        assert_eq!(never(&s), None);
        s.mem_mib = 10_000;
        assert_eq!(never(&s), Some(Unplaceable::Memory { mem_mib: 10_000, largest_mib: 8192 }));
        // Fractions: the shipped inference QoS shares GPUs, training never does.
        let mut s = spec(1);
        s.gpu_milli = 250;
        s.profile = Profile::Inference;
        assert_eq!(never(&s), None);
        s.profile = Profile::Training;
        assert_eq!(never(&s), Some(Unplaceable::Fraction { milli: 250, qos: "training".into() }));
        assert_eq!(
            never(&s).map(|u| (u.constraint(), u.to_string())),
            Some(("gpu_fraction", "250/1000 of a GPU, which qos \"training\" does not share".into()))
        );
    }
}
