//! The one check every op that hands out GPUs makes (a plan's placements, a preemption's claim,
//! an elastic job's growth): the node is up, in the job's partition and open to it (burst
//! nodes), and each GPU exists, is of the job's model and is free to take — free, or held by
//! one of the victims when preempting, and claimed by nobody else. Typed reasons, so callers
//! and tests match on what went wrong; the messages are what users see.

use std::collections::BTreeSet;

use crate::fit::{fits, fraction_fits, Misfit, NodeFree, TaskAsk};
use crate::model::{GpuIndex, Job, JobId, Node, NodeState};
use crate::state::ClusterState;

/// Whose GPUs a grant may take.
#[derive(Clone, Copy, Debug)]
pub enum Taking<'a> {
    /// Only free GPUs (or the job's own claim).
    Free,
    /// Free GPUs or those of these running victims (a preemption).
    FromVictims(&'a [JobId]),
}

/// Why GPUs cannot be granted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("node \"{0}\" not found")]
    NoNode(String),
    #[error("node \"{0}\" is not up")]
    NodeNotUp(String),
    #[error("node \"{node}\" is not in partition \"{partition}\"")]
    NotInPartition { node: String, partition: String },
    #[error("node \"{node}\" is a burst node and job {job} may not burst")]
    MayNotBurst { node: String, job: JobId },
    #[error("job {job} needs {wanted} distinct GPUs per task, plan gives {given:?}")]
    GpuCount { job: JobId, wanted: u32, given: Vec<GpuIndex> },
    #[error("node \"{node}\" has no GPU {gpu}")]
    NoGpu { node: String, gpu: GpuIndex },
    #[error("GPU {gpu} of \"{node}\" is a {model}, not a {wanted}")]
    WrongModel { node: String, gpu: GpuIndex, model: String, wanted: String },
    #[error("GPU {gpu} of \"{node}\" is unhealthy")]
    Unhealthy { node: String, gpu: GpuIndex },
    #[error("GPU {gpu} of \"{node}\" is shared by GPU fractions")]
    Shared { node: String, gpu: GpuIndex },
    #[error("GPU {gpu} of \"{node}\" has {free} thousandths free, job {job} needs {wanted}")]
    FractionShort { node: String, gpu: GpuIndex, job: JobId, free: u32, wanted: u32 },
    #[error("GPU {gpu} of \"{node}\" is held by job {holder}")]
    Held { node: String, gpu: GpuIndex, holder: JobId },
    #[error("GPU {gpu} of \"{node}\" is claimed by job {claimer}")]
    Claimed { node: String, gpu: GpuIndex, claimer: JobId },
    #[error("node \"{node}\" has {free} {what} free, job {job} needs {wanted}")]
    Short { node: String, job: JobId, what: &'static str, free: u64, wanted: u64 },
    /// A reservation's window forbids it (`ClusterState::window_refuses` says why).
    #[error("{0}")]
    Reserved(String),
}

impl ClusterState {
    /// Whether `gpus` of node `name` may be handed to `job` (taking them as `taking` allows).
    /// `per_task`, when given, is how many distinct GPUs the grant must be.
    pub fn check_grant(
        &self,
        job: &Job,
        name: &str,
        gpus: &[GpuIndex],
        per_task: Option<u32>,
        taking: Taking<'_>,
    ) -> Result<(), GrantError> {
        let node = self.nodes.get(name).ok_or_else(|| GrantError::NoNode(name.to_string()))?;
        if node.state != NodeState::Up {
            return Err(GrantError::NodeNotUp(name.to_string()));
        }
        if let Some(part) = self.partition_of(job) {
            if !part.contains(&node.info.name, &node.info.labels) {
                return Err(GrantError::NotInPartition {
                    node: name.to_string(),
                    partition: part.name.clone(),
                });
            }
        }
        if !self.node_admits(job, &node.info.labels) {
            return Err(GrantError::MayNotBurst { node: name.to_string(), job: job.id });
        }
        if let Some(why) = self.window_refuses(job, name, gpus) {
            return Err(GrantError::Reserved(why));
        }
        let distinct: BTreeSet<GpuIndex> = gpus.iter().copied().collect();
        if distinct.len() != gpus.len() || per_task.is_some_and(|n| distinct.len() != n as usize) {
            let wanted = per_task.unwrap_or(gpus.len() as u32);
            return Err(GrantError::GpuCount { job: job.id, wanted, given: gpus.to_vec() });
        }
        for gpu in &distinct {
            let Some(g) = node.info.gpus.iter().find(|g| g.index == *gpu) else {
                return Err(GrantError::NoGpu { node: name.to_string(), gpu: *gpu });
            };
            if !crate::model::model_matches(job.spec.gpu_model.as_deref(), &g.model) {
                return Err(GrantError::WrongModel {
                    node: name.to_string(),
                    gpu: *gpu,
                    model: g.model.clone(),
                    wanted: job.spec.gpu_model.clone().unwrap_or_default(),
                });
            }
            if !node.healthy(*gpu) {
                return Err(GrantError::Unhealthy { node: name.to_string(), gpu: *gpu });
            }
            // A fraction goes onto a GPU no job holds whole, beside the fractions there; a
            // whole grant never onto a shared GPU.
            let milli = job.spec.gpu_milli;
            if let (true, Err(Misfit::Fraction { free, wanted })) =
                (milli > 0, fraction_fits(node.shared_milli(*gpu), milli))
            {
                let (node, gpu, job) = (name.to_string(), *gpu, job.id);
                return Err(GrantError::FractionShort { node, gpu, job, free, wanted });
            }
            if milli == 0 && node.shared.contains_key(gpu) {
                return Err(GrantError::Shared { node: name.to_string(), gpu: *gpu });
            }
            if let Some(holder) = node.allocated.get(gpu) {
                let victim = matches!(taking, Taking::FromVictims(v) if v.contains(holder));
                if !victim {
                    return Err(GrantError::Held { node: name.to_string(), gpu: *gpu, holder: *holder });
                }
            }
            if let Some(claimer) = node.claimed.get(gpu).filter(|c| **c != job.id) {
                return Err(GrantError::Claimed { node: name.to_string(), gpu: *gpu, claimer: *claimer });
            }
        }
        let wanted = per_task.map_or(gpus.len(), |n| n as usize);
        self.check_fit(job, node, gpus, wanted, taking)
    }

    /// Whether one of `job`'s tasks fits on the node (`fit::fits`): the `wanted` GPUs among
    /// `gpus` (each found free to take above), and its CPUs and memory free (counting what
    /// preemption victims give up when `gpus` are taken from them).
    fn check_fit(
        &self,
        job: &Job,
        node: &Node,
        gpus: &[GpuIndex],
        wanted: usize,
        taking: Taking<'_>,
    ) -> Result<(), GrantError> {
        let mut free = node.free_cpu_mem();
        if let Some(own) = node.held.get(&job.id) {
            free = free.plus(*own);
        }
        if let Taking::FromVictims(victims) = taking {
            for v in victims.iter().filter_map(|v| self.jobs.get(v)) {
                let taken = gpus.iter().filter(|g| node.allocated.get(g) == Some(&v.id)).count() as u32;
                let held = node.held.get(&v.id).copied().unwrap_or_default();
                free = free.plus(self.freed_by(v, taken, held));
            }
        }
        let ask = TaskAsk { gpus: wanted, cpu_mem: job.spec.cpu_mem() };
        let short = |what, free: u64, wanted: u64| GrantError::Short {
            node: node.info.name.clone(),
            job: job.id,
            what,
            free,
            wanted,
        };
        match fits(&NodeFree { gpus: gpus.len(), cpu_mem: free }, &ask) {
            Ok(()) => Ok(()),
            Err(Misfit::Cpus { free, wanted }) => Err(short("CPUs", free.into(), wanted.into())),
            Err(Misfit::Memory { free, wanted }) => Err(short("MiB of memory", free, wanted)),
            Err(_) => Err(GrantError::GpuCount { job: job.id, wanted: wanted as u32, given: gpus.to_vec() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Op, Outcome};
    use crate::testing::{node_info_model, spec};

    fn state() -> (ClusterState, JobId, JobId) {
        let mut s = ClusterState::new();
        let apply = |s: &mut ClusterState, op| s.apply(&Command { skipped_ms: 0, now_ms: 1, op });
        apply(&mut s, Op::RegisterNode { info: node_info_model("n1", 4, "H100") });
        let submit = |s: &mut ClusterState, gpus| match apply(
            s,
            Op::Submit { spec: spec(gpus, "batch"), request_id: None, hold: false, limits: None },
        ) {
            Outcome::Submitted { job } => job,
            other => panic!("{other:?}"),
        };
        let running = submit(&mut s, 2);
        let plan = crate::planner::plan(&s).plan;
        apply(&mut s, Op::ApplyPlan { plan });
        let pending = submit(&mut s, 2);
        (s, running, pending)
    }

    #[test]
    fn every_reason_is_found() {
        let (mut s, running, pending) = state();
        let job = Job::clone(&s.jobs[&pending]);
        let held = s.jobs[&running].allocation.as_ref().unwrap().gpus.clone();
        let free: Vec<GpuIndex> = (0..4).filter(|g| !held.contains(g)).collect();
        assert_eq!(s.check_grant(&job, "n1", &free, Some(2), Taking::Free), Ok(()));
        let err =
            |s: &ClusterState, gpus: &[GpuIndex], taking| s.check_grant(&job, "n1", gpus, Some(2), taking);
        assert!(
            matches!(err(&s, &held, Taking::Free), Err(GrantError::Held { holder, .. }) if holder == running)
        );
        let (victims, others) = ([running], [99]);
        assert_eq!(err(&s, &held, Taking::FromVictims(&victims)), Ok(()), "a victim's GPUs");
        assert!(matches!(err(&s, &held, Taking::FromVictims(&others)), Err(GrantError::Held { .. })));
        assert!(matches!(err(&s, &[free[0], free[0]], Taking::Free), Err(GrantError::GpuCount { .. })));
        assert!(matches!(err(&s, &free[..1], Taking::Free), Err(GrantError::GpuCount { .. })));
        assert!(matches!(err(&s, &[free[0], 7], Taking::Free), Err(GrantError::NoGpu { gpu: 7, .. })));
        assert!(matches!(
            s.check_grant(&job, "n9", &free, Some(2), Taking::Free),
            Err(GrantError::NoNode(_))
        ));
        let mut a100 = job.clone();
        a100.spec.gpu_model = Some("A100".into());
        assert!(matches!(
            s.check_grant(&a100, "n1", &free, Some(2), Taking::Free),
            Err(GrantError::WrongModel { .. })
        ));
        s.nodes.get_mut("n1").unwrap().claimed.insert(free[0], 42);
        assert!(matches!(err(&s, &free, Taking::Free), Err(GrantError::Claimed { claimer: 42, .. })));
        s.nodes.get_mut("n1").unwrap().claimed.insert(free[0], pending);
        assert_eq!(err(&s, &free, Taking::Free), Ok(()), "the job's own claim");
        s.nodes.get_mut("n1").unwrap().state = NodeState::Down;
        assert!(matches!(err(&s, &free, Taking::Free), Err(GrantError::NodeNotUp(_))));
    }

    #[test]
    fn a_grant_takes_exactly_the_cpus_and_memory_free_and_not_one_more() {
        let (s, _, pending) = state();
        let free = s.nodes["n1"].free_cpu_mem();
        let held = &s.jobs.values().find(|j| j.id != pending).unwrap().allocation.as_ref().unwrap().gpus;
        let gpus: Vec<GpuIndex> = (0..4).filter(|g| !held.contains(g)).collect();
        let grant = |cpus, mem_mib| {
            let mut job = Job::clone(&s.jobs[&pending]);
            (job.spec.cpus, job.spec.mem_mib) = (cpus, mem_mib);
            s.check_grant(&job, "n1", &gpus, Some(2), Taking::Free)
        };
        assert_eq!(grant(free.cpus, free.mem_mib), Ok(()), "all that is free");
        assert!(matches!(
            grant(free.cpus + 1, free.mem_mib),
            Err(GrantError::Short { what: "CPUs", free: f, wanted: w, .. }) if f + 1 == w
        ));
        assert!(matches!(
            grant(free.cpus, free.mem_mib + 1),
            Err(GrantError::Short { what: "MiB of memory", free: f, wanted: w, .. }) if f + 1 == w
        ));
    }
}
