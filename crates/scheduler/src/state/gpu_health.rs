//! GPU health and resuming drained nodes, as the state machine applies them: an unhealthy GPU
//! is never granted, the runs on it are stopped and requeued, and an operator's reset returns it.

use super::*;
use crate::model::GpuFault;

/// Longest fault reason kept (an agent's report is cut to it).
const FAULT_REASON_MAX: usize = 256;

impl ClusterState {
    /// Records GPU `gpu` of `name` as unhealthy; stops (to requeue) the run holding it and any
    /// suspended run that lent it, and drops claims on it.
    pub(super) fn gpu_fault(
        &mut self,
        name: &str,
        gpu: GpuIndex,
        uuid: &str,
        reason: &str,
        now: i64,
    ) -> Outcome {
        let reason: String = reason.chars().take(FAULT_REASON_MAX).collect();
        let Some(node) = self.nodes.get_mut(name) else {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" not found")));
        };
        let Some(g) = node.info.gpus.iter().find(|g| g.index == gpu) else {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" has no GPU {gpu}")));
        };
        if !uuid.is_empty() && uuid != g.uuid {
            return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "GPU {gpu} of node \"{name}\" is {}, not {uuid}",
                g.uuid
            )));
        }
        if node.faults.contains_key(&gpu) {
            return Outcome::Ignored(format!("GPU {gpu} of node \"{name}\" is already unhealthy"));
        }
        let message = format!("GPU {gpu} ({}) failed: {reason}", g.uuid);
        node.faults.insert(gpu, GpuFault { reason, since_ms: now });
        let claimer = node.claimed.get(&gpu).copied();
        let mut hit: Vec<JobId> = node.allocated.get(&gpu).copied().into_iter().collect();
        hit.extend(node.shared.get(&gpu).into_iter().flat_map(|h| h.keys().copied()));
        hit.extend(self.suspended.iter().copied().filter(|id| {
            let a = self.jobs.get(id).and_then(|j| j.allocation.as_ref());
            a.is_some_and(|a| a.node == name && a.lent.contains(&gpu))
        }));
        if let Some(c) = claimer {
            self.drop_claim(c);
        }
        let mut stopped = Vec::new();
        for id in hit {
            let Some(job) = self.jobs.get_mut(&id) else { continue };
            let Some(alloc) = job.allocation.as_mut() else { continue };
            // A run stopping for good (cancel, time limit, a failed task) or for its preemptor
            // ends as it was told to; any other stop would bring it back here.
            let restartable = matches!(
                alloc.stop,
                None | Some(
                    StopReason::Drained
                        | StopReason::ReservationOpened
                        | StopReason::Vacated
                        | StopReason::Idle
                        | StopReason::Resize { .. }
                )
            );
            if !restartable {
                continue;
            }
            alloc.stop = Some(StopReason::GpuFailed);
            alloc.failure = Some(message.clone());
            job.record(now, "gpu-fault", format!("{message}; stopping the run to requeue it"));
            stopped.push(id);
            self.drop_claim(id);
        }
        Outcome::NodeChanged { node: name.to_string(), stopped }
    }

    /// Returns GPU `gpu` of `name` to service.
    pub(super) fn gpu_reset(&mut self, name: &str, gpu: GpuIndex) -> Outcome {
        let Some(node) = self.nodes.get_mut(name) else {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" not found")));
        };
        if !node.info.gpus.iter().any(|g| g.index == gpu) {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" has no GPU {gpu}")));
        }
        if node.faults.remove(&gpu).is_none() {
            return Outcome::Ignored(format!("GPU {gpu} of node \"{name}\" is healthy"));
        }
        Outcome::NodeChanged { node: name.to_string(), stopped: Vec::new() }
    }

    /// A draining node takes work again (only a drain whose reason starts with `only_reason`,
    /// when given). A burst node drained for termination stays draining.
    pub(super) fn resume_node(&mut self, name: &str, only_reason: Option<&str>) -> Outcome {
        let burst = self.burst.intent_of_node(name).is_some();
        let Some(node) = self.nodes.get_mut(name) else {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" not found")));
        };
        if node.state != NodeState::Draining {
            return Outcome::Ignored(format!("node \"{name}\" is not draining"));
        }
        if only_reason.is_some_and(|p| !node.reason.starts_with(&format!("draining: {p}"))) {
            return Outcome::Ignored(format!("node \"{name}\" drains for another reason: {}", node.reason));
        }
        if burst {
            return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "node \"{name}\" is a burst node: a drained burst node is terminated, not resumed"
            )));
        }
        node.state = NodeState::Up;
        node.reason.clear();
        Outcome::NodeChanged { node: name.to_string(), stopped: Vec::new() }
    }

    /// The first fault message of the run of `id` (what its requeue says).
    pub(super) fn fault_of(&self, id: JobId) -> String {
        let failure = self.jobs.get(&id).and_then(|j| j.allocation.as_ref()).and_then(|a| a.failure.clone());
        failure.unwrap_or_else(|| "a GPU of the run failed".to_string())
    }
}
