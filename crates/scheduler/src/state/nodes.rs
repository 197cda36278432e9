//! Node trust in the replicated state: who may register a node name, and how an operator
//! frees one.
//!
//! The join token proves only that an agent belongs to the cluster, not which node it is; so it
//! registers only a name nobody holds (`Op::JoinNode` without a credential epoch). An agent that
//! re-registers presents the credential it was given, which names the registration's epoch; an
//! operator frees a name with `Op::RemoveNode`, which voids every credential issued for it
//! (a later registration of the name gets a new epoch, and credentials are derived from
//! name + epoch at the API edge).

use crate::model::NodeInfo;
use crate::state::{ClusterState, Outcome, Rejection};

impl ClusterState {
    pub(crate) fn join_node(&mut self, info: &NodeInfo, credential_epoch: Option<u64>, now: i64) -> Outcome {
        let name = &info.name;
        match (self.nodes.get(name).map(|n| n.epoch), credential_epoch) {
            (Some(_), None) => Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "node \"{name}\" is already registered: its agent re-registers with its node credential; \
                 to give the name to another agent, an operator runs `kairos node remove {name}` first"
            ))),
            (Some(held), Some(presented)) if held != presented => {
                Outcome::Rejected(Rejection::FailedPrecondition(format!(
                    "node \"{name}\" was registered again since this credential was issued"
                )))
            }
            (None, Some(_)) => Outcome::Rejected(Rejection::NotFound(format!(
                "node \"{name}\" was removed; its agent registers again with the join token"
            ))),
            _ => self.register_node(info, now),
        }
    }

    pub(crate) fn remove_node(&mut self, name: &str) -> Outcome {
        let Some(node) = self.nodes.get(name) else {
            return Outcome::Rejected(Rejection::NotFound(format!("node \"{name}\" not found")));
        };
        if !node.allocated.is_empty() || !node.held.is_empty() {
            let mut jobs: std::collections::BTreeSet<_> = node.allocated.values().collect();
            jobs.extend(node.held.keys());
            return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "node \"{name}\" still holds jobs {jobs:?}: drain it (`kairos drain {name}`) and wait \
                 for them to stop, or for the node to be declared down"
            )));
        }
        let claimers: Vec<_> = node.claimed.values().copied().collect();
        for job in claimers {
            self.drop_claim(job);
        }
        self.nodes.remove(name);
        self.refresh_largest_node();
        Outcome::NodeRemoved { node: name.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use crate::model::JobSpec;
    use crate::state::{ClusterState, Command, Op, Outcome, Rejection};
    use crate::testing::node_info;

    fn apply(s: &mut ClusterState, op: Op) -> Outcome {
        let out = s.apply(&Command { skipped_ms: 0, now_ms: 1, op });
        s.check_invariants().unwrap();
        out
    }

    #[test]
    fn the_join_token_registers_only_a_free_name_and_removal_voids_the_old_epoch() {
        let mut s = ClusterState::new();
        let join = |s: &mut ClusterState, e| {
            apply(s, Op::JoinNode { info: node_info("n1", 2), credential_epoch: e })
        };
        let Outcome::NodeRegistered { epoch: first, .. } = join(&mut s, None) else {
            panic!("not registered")
        };
        // Another agent with the join token cannot take the name …
        assert!(
            matches!(join(&mut s, None), Outcome::Rejected(Rejection::FailedPrecondition(m)) if m.contains("node remove n1"))
        );
        // … the holder of this epoch's credential can, and keeps the epoch.
        assert_eq!(join(&mut s, Some(first)), Outcome::NodeRegistered { node: "n1".into(), epoch: first });
        assert!(matches!(join(&mut s, Some(first + 7)), Outcome::Rejected(_)));
        // A node holding a job cannot be removed.
        let spec = JobSpec::new("j", "alice", vec!["true".into()], 1);
        apply(&mut s, Op::Submit { spec, request_id: None, hold: false, limits: None });
        let plan = crate::plan(&s).plan;
        apply(&mut s, Op::ApplyPlan { plan });
        assert!(matches!(
            apply(&mut s, Op::RemoveNode { node: "n1".into() }),
            Outcome::Rejected(Rejection::FailedPrecondition(_))
        ));
        apply(&mut s, Op::NodeDown { node: "n1".into(), reason: "gone".into() });
        assert_eq!(
            apply(&mut s, Op::RemoveNode { node: "n1".into() }),
            Outcome::NodeRemoved { node: "n1".into() }
        );
        assert!(s.nodes.is_empty());
        // The old credential is void; the join token takes the name, with a new epoch.
        assert!(matches!(join(&mut s, Some(first)), Outcome::Rejected(Rejection::NotFound(_))));
        let Outcome::NodeRegistered { epoch: second, .. } = join(&mut s, None) else {
            panic!("not registered")
        };
        assert!(second > first);
        assert!(matches!(
            apply(&mut s, Op::RemoveNode { node: "nope".into() }),
            Outcome::Rejected(Rejection::NotFound(_))
        ));
    }
}
