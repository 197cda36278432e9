//! Nodes joining, draining and going down, as the state machine applies them.

use super::*;
use crate::model::HEALTH_CHECK_REASON;

impl ClusterState {
    /// Drains `name`: Draining (nothing new placed), every run there stopped with the checkpoint
    /// signal and requeued on exit (unless `keep_runs`); a burst node's instance is terminated.
    pub(super) fn drain_node(&mut self, name: &str, reason: &str, keep_runs: bool, now: i64) -> Outcome {
        let reason: String = reason.chars().take(256).collect();
        let Some(node) = self.nodes.get_mut(name) else {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" not found")));
        };
        let was_draining = match node.state {
            NodeState::Up => {
                node.state = NodeState::Draining;
                node.reason = format!("draining: {reason}");
                false
            }
            // Another drain over the health check's takes its place: the check passing
            // again must not end an operator's drain.
            NodeState::Draining
                if node.reason.starts_with(&format!("draining: {HEALTH_CHECK_REASON}"))
                    && !reason.starts_with(HEALTH_CHECK_REASON) =>
            {
                node.reason = format!("draining: {reason}");
                false
            }
            NodeState::Draining if node.reason.starts_with("draining:") => true,
            NodeState::Draining => {
                node.reason = format!("draining: {reason}");
                false
            }
            NodeState::Down => return Outcome::Ignored(format!("node \"{name}\" is down")),
        };
        // Preemptors waiting for GPUs here plan again elsewhere.
        let claimers: BTreeSet<JobId> = node.claimed.values().copied().collect();
        for c in claimers {
            self.drop_claim(c);
        }
        if keep_runs {
            return match was_draining {
                true => Outcome::Ignored(format!("node \"{name}\" is already draining")),
                false => Outcome::NodeChanged { node: name.to_string(), stopped: Vec::new() },
            };
        }
        // A drain that kept its runs (a failed health check) stops them when drained again
        // without keeping them.
        let mut stopped = Vec::new();
        let jobs: Vec<JobId> = self.jobs_on(name).iter().map(|j| j.id).collect();
        for id in jobs {
            let Some(job) = self.jobs.get_mut(&id) else { continue };
            let Some(alloc) = job.allocation.as_mut() else { continue };
            // Runs already stopping for good keep their reason; a preempted or resizing run
            // would come back here, so it is drained too.
            if matches!(alloc.stop, None | Some(StopReason::Preempted { .. } | StopReason::Resize { .. })) {
                alloc.stop = Some(StopReason::Drained);
                job.record(now, "drain", format!("node \"{name}\" is draining: {reason}"));
                stopped.push(id);
            }
            self.drop_claim(id);
        }
        if was_draining && stopped.is_empty() {
            return Outcome::Ignored(format!("node \"{name}\" is already draining"));
        }
        if let Some(intent) = self.burst.intent_of_node(name) {
            self.burst_terminate(intent, &reason, now);
        }
        Outcome::NodeDown { node: name.to_string(), failed_jobs: Vec::new() }
    }

    pub(crate) fn register_node(&mut self, info: &NodeInfo, now: i64) -> Outcome {
        if let Err(e) = validate_node(info) {
            return Outcome::Rejected(Rejection::Invalid(e.to_string()));
        }
        if let Err(why) = self.check_burst_node(info) {
            return Outcome::Rejected(Rejection::FailedPrecondition(why));
        }
        let present: BTreeSet<GpuIndex> = info.gpus.iter().map(|g| g.index).collect();
        // Runs on a GPU that vanished (held, or lent while suspended) are lost; claims on one
        // are dropped (the claimer plans again).
        let lost: Vec<JobId> = self
            .jobs_on(&info.name)
            .iter()
            .filter(|j| {
                j.allocation.as_ref().is_some_and(|a| {
                    a.tasks().any(|(_, n, gpus)| n == info.name && gpus.iter().any(|g| !present.contains(g)))
                })
            })
            .map(|j| j.id)
            .collect();
        for job in lost {
            self.fail_run(job, JobState::NodeFail, "GPU vanished from its node".into(), now);
        }
        let claimers: BTreeSet<JobId> = self
            .nodes
            .get(&info.name)
            .map(|n| n.claimed.iter().filter(|(g, _)| !present.contains(g)).map(|(_, j)| *j).collect())
            .unwrap_or_default();
        for job in claimers {
            self.drop_claim(job);
        }
        match self.nodes.get_mut(&info.name) {
            Some(node) => {
                // A fault belongs to a GPU: one that is gone, or replaced (another UUID at its
                // index), takes its fault with it.
                let old = std::mem::replace(&mut node.info, info.clone());
                node.faults.retain(|i, _| {
                    let uuid = |n: &NodeInfo| n.gpus.iter().find(|g| g.index == *i).map(|g| g.uuid.clone());
                    uuid(&old).is_some() && uuid(&old) == uuid(&node.info)
                });
                // A draining node stays draining when its agent reconnects.
                if node.state != NodeState::Draining {
                    node.state = NodeState::Up;
                    node.reason.clear();
                }
            }
            None => {
                let node = Node {
                    info: info.clone(),
                    state: NodeState::Up,
                    reason: String::new(),
                    allocated: BTreeMap::new(),
                    claimed: BTreeMap::new(),
                    held: BTreeMap::new(),
                    faults: BTreeMap::new(),
                    shared: BTreeMap::new(),
                    epoch: self.node_epoch_seq + 1,
                };
                self.node_epoch_seq += 1;
                self.nodes.insert(info.name.clone(), node);
            }
        }
        self.refresh_largest_node();
        let epoch = self.nodes.get(&info.name).map(|n| n.epoch).unwrap_or_default();
        Outcome::NodeRegistered { node: info.name.clone(), epoch }
    }

    pub(crate) fn node_down(&mut self, name: &str, reason: &str, now: i64) -> Outcome {
        let Some(node) = self.nodes.get_mut(name) else {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" not found")));
        };
        if node.state == NodeState::Down {
            return Outcome::Ignored(format!("node \"{name}\" is already down"));
        }
        node.state = NodeState::Down;
        node.reason = reason.to_string();
        let claimers: BTreeSet<JobId> = node.claimed.values().copied().collect();
        for c in claimers {
            self.drop_claim(c);
        }
        let jobs: BTreeSet<JobId> = self.jobs_on(name).iter().map(|j| j.id).collect();
        for &job in &jobs {
            let gang =
                self.jobs.get(&job).and_then(|j| j.allocation.as_ref()).is_some_and(|a| a.task_count() > 1);
            if gang {
                // Its task here is lost; the tasks on healthy nodes are stopped and release
                // their GPUs as they exit.
                self.gang_task_exited(
                    job,
                    name,
                    &RunExit::Lost(format!("node \"{name}\" down: {reason}")),
                    now,
                );
            } else {
                self.fail_run(job, JobState::NodeFail, format!("node \"{name}\" down: {reason}"), now);
            }
        }
        Outcome::NodeDown { node: name.to_string(), failed_jobs: jobs.into_iter().collect() }
    }
}
