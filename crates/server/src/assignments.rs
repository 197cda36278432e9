//! The agents' assignment streams, and the hub that wakes them.
//!
//! A stream sends its node's full set of runs each time that set changes (level-triggered; an
//! agent that reconnects receives the current set and reconciles). With ten thousand agents
//! connected, a stream that read the state on every applied entry would cost the replica nodes ×
//! entries reads; instead one hub per replica waits for applied entries, asks the state which
//! nodes' runs they may have changed (`ClusterState::take_changed_nodes`) and wakes only those
//! nodes' streams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kairos_consensus::Replica;
use kairos_proto::v1 as pb;
use kairos_scheduler::model::Profile;
use kairos_scheduler::orders::{runs_on, RunAction, KILL_GRACE_S};
use kairos_scheduler::state::changed::ChangedNodes;
use kairos_scheduler::ClusterState;
use tokio::sync::{mpsc, watch};

/// One waker per node with a stream open (several streams of one node share it).
#[derive(Default)]
pub struct Wakers {
    nodes: Mutex<HashMap<String, watch::Sender<()>>>,
}

impl Wakers {
    /// Woken each time `node`'s runs may have changed from now on.
    pub fn subscribe(&self, node: &str) -> watch::Receiver<()> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        match nodes.get(node) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(());
                nodes.insert(node.to_string(), tx);
                rx
            }
        }
    }

    /// Wakes the streams of the `changed` nodes; forgets nodes with no stream left.
    pub fn wake(&self, changed: &ChangedNodes) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        match changed {
            ChangedNodes::All => nodes.retain(|_, tx| tx.send(()).is_ok()),
            ChangedNodes::Some(changed) => {
                for node in changed {
                    if nodes.get(node).is_some_and(|tx| tx.send(()).is_err()) {
                        nodes.remove(node);
                    }
                }
            }
        }
    }

    /// Nodes with a waker (streams open, or closed since the last wake of their node).
    pub fn len(&self) -> usize {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The runs `node` should have in `state`, in job id order: the core decides what each must do
/// (`kairos_scheduler::orders`); this converts to the wire format.
pub fn assignments_for(state: &ClusterState, node: &str) -> Vec<pb::Assignment> {
    runs_on(state, node)
        .into_iter()
        .map(|o| {
            let (kill, kill_signal, kill_grace_s) = match &o.action {
                RunAction::Stop { signal, grace_s } => (true, signal.clone(), *grace_s),
                RunAction::Run | RunAction::Suspend => (false, "SIGTERM".to_string(), KILL_GRACE_S),
            };
            pb::Assignment {
                job_id: o.job.id,
                attempt: o.attempt,
                argv: o.job.spec.argv.clone(),
                env: o.job.spec.env.clone().into_iter().chain(o.job.batch_env()).collect(),
                workdir: o.job.spec.workdir.clone(),
                workdir_is_submit_dir: o.job.spec.workdir_is_submit_dir,
                gpu_ids: o.gpus,
                started: o.started,
                kill,
                kill_grace_s,
                kill_signal,
                rank: o.rank,
                world_size: o.world_size,
                master_addr: o.master_host,
                master_port: o.master_port,
                suspend: o.action == RunAction::Suspend,
                checkpoint_signal: o.checkpoint_signal.to_string(),
                user: o.job.spec.user.clone(),
                traceparent: o.job.spec.traceparent.as_deref().unwrap_or_default().to_string(),
                submit_time_ms: o.job.submit_time_ms,
                cpus: o.job.spec.cpus,
                memory_mib: o.job.spec.mem_mib,
                gpu_milli: o.job.spec.gpu_milli,
                container: o.job.spec.container.as_deref().map(crate::convert::container_to_pb),
                idle_watch: o
                    .idle_watch
                    .map(|r| pb::IdleWatch { after_s: r.after_s, below_milli: r.below_milli }),
                interactive: o.job.spec.profile == Profile::Interactive,
                keep_alive_s: match o.job.spec.keep_alive_s {
                    0 => kairos_scheduler::model::KEEP_ALIVE_DEFAULT_S,
                    s => s,
                },
            }
        })
        .collect()
}

/// The hub: for the life of the replica, after each batch of applied entries, wakes the
/// streams of the nodes whose runs they may have changed.
pub fn spawn_hub(replica: Replica, wakers: Arc<Wakers>) {
    tokio::spawn(async move {
        let mut applied = replica.applied.clone();
        loop {
            let changed = replica.take_changed_nodes();
            wakers.wake(&changed);
            if applied.changed().await.is_err() {
                return;
            }
        }
    });
}

/// `node`'s stream: its current set at once, then each set that differs from the last sent,
/// until the agent goes away.
pub fn stream(
    replica: Replica,
    wakers: &Wakers,
    node: String,
) -> tokio_stream::wrappers::ReceiverStream<Result<pb::AssignmentSet, tonic::Status>> {
    // Subscribed before the first read: a change after it wakes the stream.
    let mut woken = wakers.subscribe(&node);
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut last: Option<Vec<pb::Assignment>> = None;
        loop {
            let (runs, index) = replica
                .read(|a| (assignments_for(&a.state, &node), a.last_applied.map(|l| l.index).unwrap_or(0)));
            if last.as_ref() != Some(&runs) {
                let set = pb::AssignmentSet { runs: runs.clone(), applied_index: index };
                if tx.send(Ok(set)).await.is_err() {
                    return;
                }
                last = Some(runs);
            }
            // Wake when this node's runs may have changed, or end as soon as the agent goes.
            tokio::select! {
                changed = woken.changed() => if changed.is_err() { return },
                _ = tx.closed() => return,
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_changed_nodes_streams_are_woken_and_gone_ones_forgotten() {
        let w = Wakers::default();
        let (mut a, mut b) = (w.subscribe("a"), w.subscribe("b"));
        let a2 = w.subscribe("a");
        w.wake(&ChangedNodes::Some(["a".to_string()].into()));
        assert!(a.has_changed().unwrap() && a2.has_changed().unwrap());
        assert!(!b.has_changed().unwrap(), "b's runs did not change");
        a.mark_unchanged();
        w.wake(&ChangedNodes::All);
        assert!(a.has_changed().unwrap() && b.has_changed().unwrap());
        drop((a, a2));
        w.wake(&ChangedNodes::Some(["a".to_string()].into()));
        assert_eq!(w.len(), 1, "a has no stream left");
        b.mark_unchanged();
        drop(b);
        w.wake(&ChangedNodes::All);
        assert!(w.is_empty());
    }
}
