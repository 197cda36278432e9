//! Whether a job could ever run: some registered node — or, for a job that may burst, an
//! allowed cloud instance type — holds one task of it, its GPUs (of its model set; one for a
//! fraction), its CPUs and its memory at once. A job that nothing registered could hold is
//! refused at submit, naming the largest node's figures; what only the current load (or a node
//! that is down or draining) prevents waits. Before any node registered nothing is refused,
//! as with the GPU count (`check_size`).

use super::*;
use crate::fit::{fits, NodeFree, TaskAsk};
use crate::model::{model_matches, CpuMem};

/// Somewhere one task could go, as submit judges it: all its GPUs count (a faulty one may be
/// repaired), and its CPUs and memory are what jobs may be granted there.
struct Room {
    /// `node "a"` or `cloud instance type "p5.48xlarge"`.
    what: String,
    /// GPUs of the job's model set (all of them without one).
    gpus: u32,
    cpu_mem: CpuMem,
}

impl Room {
    /// `node "a" (4 H100 GPUs, 64 CPUs, 524288 MiB of memory)`.
    fn describe(&self, of: &str) -> String {
        let cpus = match self.cpu_mem.cpus {
            u32::MAX => "CPUs unstated".to_string(),
            n => format!("{n} CPUs"),
        };
        let mem = match self.cpu_mem.mem_mib {
            u64::MAX => "memory unstated".to_string(),
            n => format!("{n} MiB of memory"),
        };
        format!("{} ({}, {cpus}, {mem})", self.what, gpus_of(self.gpus, of))
    }
}

impl ClusterState {
    /// Refuses a job (its spec resolved: CPUs and memory filled in from the defaults) that no
    /// registered node could ever hold; `asked` is what the submitter asked for itself (CPUs,
    /// memory), to say when a default made the job too big.
    pub(super) fn check_fits_a_node(
        &self,
        spec: &JobSpec,
        asked: CpuMem,
        qos: &Qos,
    ) -> Result<(), Rejection> {
        if self.nodes.is_empty() {
            return Ok(());
        }
        let model = spec.gpu_model.as_deref();
        let gpus = if spec.gpu_milli > 0 { 1 } else { spec.gpus };
        let need = CpuMem { cpus: spec.cpus, mem_mib: spec.mem_mib };
        let ask = TaskAsk { gpus: gpus as usize, cpu_mem: need };
        // Most submits fit the first node looked at: the rooms, each named for the error, are
        // built only when no node holds the task.
        let node_fits = |n: &crate::model::Node| {
            let gpus = n.info.gpus.iter().filter(|g| model_matches(model, &g.model)).count();
            fits(&NodeFree { gpus, cpu_mem: n.capacity() }, &ask).is_ok()
        };
        if self.nodes.values().any(node_fits) {
            return Ok(());
        }
        let rooms = self.rooms(model, qos);
        if rooms.iter().any(|r| fits(&NodeFree { gpus: r.gpus as usize, cpu_mem: r.cpu_mem }, &ask).is_ok()) {
            return Ok(());
        }
        Err(Rejection::FailedPrecondition(why_nowhere(&rooms, spec, gpus, need, asked, || self.models())))
    }

    /// The registered nodes, then the cloud instance types a job of `qos` may burst to.
    fn rooms(&self, model: Option<&str>, qos: &Qos) -> Vec<Room> {
        let of_model = |m: &str| model_matches(model, m);
        let mut rooms: Vec<Room> = self
            .nodes
            .values()
            .map(|n| Room {
                what: format!("node \"{}\"", n.info.name),
                gpus: n.info.gpus.iter().filter(|g| of_model(&g.model)).count() as u32,
                cpu_mem: n.capacity(),
            })
            .collect();
        let cloud = &self.burst.config;
        let may_burst = if cloud.qos.is_empty() { qos.burstable } else { cloud.qos.contains(&qos.name) };
        if cloud.enabled && may_burst {
            rooms.extend(cloud.instance_types.iter().map(|t| Room {
                what: format!("cloud instance type \"{}\"", t.name),
                gpus: if of_model(&t.gpu_model) { t.gpus } else { 0 },
                cpu_mem: t.cpu_mem(),
            }));
        }
        rooms
    }

    /// The GPU models of the registered nodes, each once, in order.
    fn models(&self) -> Vec<String> {
        let mut models: Vec<String> = Vec::new();
        for g in self.nodes.values().flat_map(|n| &n.info.gpus) {
            if !models.contains(&g.model) {
                models.push(g.model.clone());
            }
        }
        models
    }
}

/// Why no room holds the task: the first figure none has (GPUs of the model set, CPUs,
/// memory), naming the room with the most of it; else that none has them all at once, naming
/// the largest room by each figure.
fn why_nowhere(
    rooms: &[Room],
    spec: &JobSpec,
    gpus: u32,
    need: CpuMem,
    asked: CpuMem,
    models: impl FnOnce() -> Vec<String>,
) -> String {
    let model = spec.gpu_model.as_deref();
    let of = model.map(|m| format!("\"{m}\" ")).unwrap_or_default();
    let by = |key: &dyn Fn(&Room) -> u64| rooms.iter().max_by_key(|r| key(r));
    let most_gpus = by(&|r| u64::from(r.gpus));
    let most_cpus = by(&|r| u64::from(r.cpu_mem.cpus));
    let most_mem = by(&|r| r.cpu_mem.mem_mib);
    let (Some(most_gpus), Some(most_cpus), Some(most_mem)) = (most_gpus, most_cpus, most_mem) else {
        return "no node is registered".to_string();
    };
    if gpus > most_gpus.gpus {
        return too_few_gpus(most_gpus, spec, gpus, &of, models);
    }
    let defaulted = |asked_none: bool| match asked_none {
        true => " (the partition's or QoS's default per GPU)",
        false => "",
    };
    if need.cpus > most_cpus.cpu_mem.cpus {
        return format!(
            "job requests {} CPUs per node{} but the largest node has {}: {}",
            need.cpus,
            defaulted(asked.cpus == 0),
            most_cpus.cpu_mem.cpus,
            most_cpus.describe(&of)
        );
    }
    if need.mem_mib > most_mem.cpu_mem.mem_mib {
        return format!(
            "job requests {} MiB of memory per node{} but the largest node has {} MiB: {}",
            need.mem_mib,
            defaulted(asked.mem_mib == 0),
            most_mem.cpu_mem.mem_mib,
            most_mem.describe(&of)
        );
    }
    let mut named: Vec<&Room> = Vec::new();
    for r in [most_gpus, most_cpus, most_mem] {
        if !named.iter().any(|n| std::ptr::eq(*n, r)) {
            named.push(r);
        }
    }
    let named: Vec<String> = named.iter().map(|r| r.describe(&of)).collect();
    format!(
        "{} has {}, {} CPUs and {} MiB of memory at once; the largest: {}",
        if rooms.iter().any(|r| r.what.starts_with("cloud")) {
            "no node or cloud instance type"
        } else {
            "no node"
        },
        gpus_of(gpus, &of),
        need.cpus,
        need.mem_mib,
        named.join("; ")
    )
}

/// Why no room holds the task's GPUs: none has a GPU of its model set (naming the models the
/// nodes have), or the one with the most has too few.
fn too_few_gpus(
    most_gpus: &Room,
    spec: &JobSpec,
    gpus: u32,
    of: &str,
    models: impl FnOnce() -> Vec<String>,
) -> String {
    if most_gpus.gpus == 0 {
        let have = match models() {
            m if m.is_empty() => " (no node has a GPU)".to_string(),
            m => format!(" (the nodes have {})", m.into_iter().take(8).collect::<Vec<_>>().join(", ")),
        };
        return match (spec.gpu_milli > 0, spec.gpu_model.as_deref()) {
            (true, _) => format!("job requests a fraction of a {of}GPU but no node has one{have}"),
            (false, Some(m)) => format!("gpu_model: no node has a GPU of model \"{m}\"{have}"),
            (false, None) => format!("job requests {} but no node has a GPU", gpus_of(gpus, "")),
        };
    }
    format!(
        "job requests {} but the largest node has {}: {}",
        gpus_of(gpus, of),
        most_gpus.gpus,
        most_gpus.describe(of)
    )
}

/// `1 GPU`, `4 "H100" GPUs`.
fn gpus_of(n: u32, of: &str) -> String {
    match n {
        1 => format!("1 {of}GPU"),
        n => format!("{n} {of}GPUs"),
    }
}
