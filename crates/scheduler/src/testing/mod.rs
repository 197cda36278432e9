//! Builders for tests, and the property-test driver (`driver`). Compiled for this crate's
//! tests and, with the `testing` feature, for other crates' (e.g. simulation) tests.

pub mod driver;
pub mod teams;

use std::collections::BTreeMap;

use crate::model::{Gpu, JobSpec, NodeInfo};

/// A node with `gpus` fake H100s in link groups of four.
pub fn node_info(name: &str, gpus: u32) -> NodeInfo {
    NodeInfo {
        name: name.to_string(),
        addr: format!("{name}:1"),
        gpus: (0..gpus)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                model: "H100".into(),
                memory_mib: 81920,
                link_group: i / 4,
                mig_parent: None,
            })
            .collect(),
        cpus: 64,
        memory_mib: 512 * 1024,
        labels: BTreeMap::new(),
        gpu_backend: "fake".into(),
        isolation: String::new(),
    }
}

/// A node with `gpus` GPUs of `model`.
pub fn node_info_model(name: &str, gpus: u32, model: &str) -> NodeInfo {
    let mut info = node_info(name, gpus);
    for g in &mut info.gpus {
        g.model = model.to_string();
    }
    info
}

/// A job asking for `gpus` GPUs under `qos`.
pub fn spec(gpus: u32, qos: &str) -> JobSpec {
    let mut spec = JobSpec::new("job", "alice", vec!["true".into()], gpus);
    spec.qos = qos.into();
    spec
}
