//! Node liveness as the leader sees it, in its memory: each node's last heartbeat, and the nodes
//! it has judged silent. The caller passes every time in (its monotonic clock); nothing here
//! reads a clock.
//!
//! The fencing promise — a run that the cluster requeues has stopped before its next attempt
//! starts — needs the agent's lease (`sent + lease`, runs killed by `lease + grace`, less than
//! the node timeout) never to be renewed after the leader decided the node is silent. A
//! heartbeat or registration answered while the `NodeDown` is in flight would renew it past the
//! requeue (the deterministic simulation found this: a heartbeat answered between the proposal
//! and its commit let an agent launch a run the `NodeDown` then requeued elsewhere). So a node
//! judged silent is *condemned*: its heartbeats are refused, and it may register again only once
//! the state shows it down; a registration stands only if no `NodeDown` applied after it and
//! none is in flight (`registration_stands`: one checked just before the node was judged can
//! commit ahead of its `NodeDown`). A node marked down is not judged again until a registration
//! stands. A new leader starts with empty liveness and gives every node a full timeout of grace.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::model::NodeState;
use crate::state::ClusterState;

/// How long after sending its last answered heartbeat an agent may run jobs: half the node
/// timeout. The leader sees that heartbeat no earlier than it was sent and declares the node
/// down a node timeout after it saw it, so every run is stopped (lease + fence grace = 0.7 node
/// timeout) before its jobs can be placed again.
pub fn lease(node_timeout: Duration) -> Duration {
    node_timeout / 2
}

/// How long a fenced agent's runs get between the checkpoint signal and the kill.
pub fn fence_grace(node_timeout: Duration) -> Duration {
    node_timeout / 5
}

#[derive(Clone, Debug, Default)]
pub struct Liveness {
    /// Last heartbeat (or registration) per node: when (monotonic) and the wall-clock ms.
    seen: BTreeMap<String, (Instant, i64)>,
    /// Nodes judged silent whose NodeDown has not applied yet.
    condemned: BTreeSet<String>,
    /// Nodes judged silent and since marked down, until a registration after it stands.
    downed: BTreeSet<String>,
}

/// Why a heartbeat renews no lease: the node must register again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatRefused {
    /// The state shows it down (or does not know it).
    Down,
    /// This leader judged it silent; its NodeDown may still be in flight.
    Condemned,
}

impl Liveness {
    /// Whether a heartbeat from `node` renews its lease, as `kairosd`'s leader and the
    /// simulation's both answer it: not for a node the state shows down or does not know, nor
    /// for one this leader judged silent (`heartbeat`); else it counts.
    pub fn admit_heartbeat(
        &mut self,
        state: &ClusterState,
        node: &str,
        now: Instant,
        wall_ms: i64,
    ) -> Result<(), HeartbeatRefused> {
        if state.nodes.get(node).is_none_or(|n| n.state == NodeState::Down) {
            return Err(HeartbeatRefused::Down);
        }
        if !self.heartbeat(node, now, wall_ms) {
            return Err(HeartbeatRefused::Condemned);
        }
        Ok(())
    }

    /// A heartbeat from `node`: false (refused: the node must register again) when it was
    /// judged silent.
    pub fn heartbeat(&mut self, node: &str, now: Instant, wall_ms: i64) -> bool {
        if self.condemned.contains(node) || self.downed.contains(node) {
            return false;
        }
        self.seen.insert(node.to_string(), (now, wall_ms));
        true
    }

    /// Condemned nodes the state now shows down: their NodeDown applied.
    fn settle(&mut self, state: &ClusterState) {
        let applied: Vec<String> = self.condemned.iter().filter(|n| is_down(state, n)).cloned().collect();
        for n in applied {
            self.condemned.remove(&n);
            self.downed.insert(n);
        }
    }

    /// Whether `node` may register now: not while this leader's `NodeDown` for it is in flight
    /// (judged silent, not yet down in the state).
    pub fn may_register(&mut self, state: &ClusterState, node: &str) -> bool {
        self.settle(state);
        !self.condemned.contains(node)
    }

    /// After its `JoinNode` committed: whether the registration stands — no `NodeDown` applied
    /// after it, and none in flight (one proposed while the registration was may commit after
    /// it) — and if so the node is live again.
    pub fn registration_stands(
        &mut self,
        state: &ClusterState,
        node: &str,
        now: Instant,
        wall_ms: i64,
    ) -> bool {
        self.settle(state);
        if is_down(state, node) || self.condemned.contains(node) {
            return false;
        }
        self.downed.remove(node);
        self.seen.insert(node.to_string(), (now, wall_ms));
        true
    }

    /// The nodes to mark down now, condemned from here on: none until this leader has led for
    /// `timeout`, then every node not down whose last heartbeat here is `timeout` old or older,
    /// or unknown (a condemned node again until its NodeDown applies: a proposal may not have
    /// committed). A node marked down is not judged again until a registration stands.
    pub fn judge_silent(
        &mut self,
        state: &ClusterState,
        led_for: Duration,
        timeout: Duration,
        now: Instant,
    ) -> BTreeSet<String> {
        if led_for < timeout {
            return BTreeSet::new();
        }
        self.settle(state);
        let silent: BTreeSet<String> = state
            .nodes
            .iter()
            .filter(|(name, n)| n.state != NodeState::Down && !self.downed.contains(name.as_str()))
            .filter(|(name, _)| {
                self.seen
                    .get(name.as_str())
                    .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= timeout)
            })
            .map(|(name, _)| name.clone())
            .collect();
        self.condemned.extend(silent.iter().cloned());
        silent
    }

    /// When `node` was last heard of (wall-clock ms; 0: never, here).
    pub fn last_seen_ms(&self, node: &str) -> i64 {
        self.seen.get(node).map(|(_, ms)| *ms).unwrap_or(0)
    }
}

fn is_down(state: &ClusterState, node: &str) -> bool {
    state.nodes.get(node).is_some_and(|n| n.state == NodeState::Down)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Op};
    use crate::testing::node_info;

    fn state() -> ClusterState {
        let mut s = ClusterState::new();
        s.apply(&Command { skipped_ms: 0, now_ms: 1, op: Op::RegisterNode { info: node_info("n1", 1) } });
        s
    }

    #[test]
    fn a_heartbeat_is_admitted_only_from_a_known_node_that_is_up_and_not_condemned() {
        let mut s = state();
        let mut l = Liveness::default();
        let t0 = Instant::now();
        assert_eq!(l.admit_heartbeat(&s, "n1", t0, 1), Ok(()));
        assert_eq!(l.admit_heartbeat(&s, "ghost", t0, 1), Err(HeartbeatRefused::Down));
        let timeout = Duration::from_secs(10);
        let silent = l.judge_silent(&s, timeout, timeout, t0 + timeout);
        assert!(silent.contains("n1"));
        assert_eq!(l.admit_heartbeat(&s, "n1", t0 + timeout, 2), Err(HeartbeatRefused::Condemned));
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: 3,
            op: Op::NodeDown { node: "n1".into(), reason: "silent".into() },
        });
        assert_eq!(l.admit_heartbeat(&s, "n1", t0 + timeout, 3), Err(HeartbeatRefused::Down));
    }

    #[test]
    fn a_node_judged_silent_gets_no_lease_until_it_registers_after_the_node_down() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(3);
        let mut s = state();
        let mut l = Liveness::default();
        assert!(l.judge_silent(&s, Duration::from_secs(1), timeout, t0).is_empty(), "a new leader's grace");
        assert!(l.heartbeat("n1", t0, 1));
        let later = t0 + Duration::from_secs(2);
        assert!(l.judge_silent(&s, Duration::from_secs(5), timeout, later).is_empty());
        let silent_at = t0 + timeout;
        assert_eq!(
            l.judge_silent(&s, Duration::from_secs(5), timeout, silent_at),
            BTreeSet::from(["n1".into()])
        );
        // The NodeDown is in flight: the node's heartbeat and registration are refused.
        assert!(!l.heartbeat("n1", silent_at, 2), "a heartbeat must not renew the lease now");
        assert!(!l.may_register(&s, "n1"));
        // A registration that committed before the NodeDown does not stand once it applied.
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: 3,
            op: Op::NodeDown { node: "n1".into(), reason: "silent".into() },
        });
        assert!(!l.registration_stands(&s, "n1", silent_at, 3));
        assert!(l.may_register(&s, "n1"), "once down, it may register again");
        s.apply(&Command { skipped_ms: 0, now_ms: 4, op: Op::RegisterNode { info: node_info("n1", 1) } });
        // Registered (up in the state) but not yet confirmed: the pass does not judge it again.
        let later_still = silent_at + Duration::from_secs(10);
        assert!(l.judge_silent(&s, Duration::from_secs(60), timeout, later_still).is_empty());
        assert!(l.registration_stands(&s, "n1", silent_at, 4));
        assert!(l.heartbeat("n1", silent_at, 5));
        assert_eq!(l.last_seen_ms("n1"), 5);
        // A registration racing a NodeDown (found by a 10,000-schedule soak): allowed before the
        // pass judged the node, then the pass condemns it and the JoinNode commits first — it
        // must not stand.
        let t = silent_at + Duration::from_secs(20);
        assert!(l.heartbeat("n1", t, 6));
        assert!(l.may_register(&s, "n1"));
        let judged = t + timeout;
        assert_eq!(
            l.judge_silent(&s, Duration::from_secs(60), timeout, judged),
            BTreeSet::from(["n1".into()])
        );
        assert!(!l.registration_stands(&s, "n1", judged, 7), "a NodeDown is in flight");
        assert!(!l.may_register(&s, "n1"));
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: 8,
            op: Op::NodeDown { node: "n1".into(), reason: "silent".into() },
        });
        assert!(l.may_register(&s, "n1"));
        s.apply(&Command { skipped_ms: 0, now_ms: 9, op: Op::RegisterNode { info: node_info("n1", 1) } });
        assert!(l.registration_stands(&s, "n1", judged, 9));
        // A node already down is not judged again.
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: 6,
            op: Op::NodeDown { node: "n1".into(), reason: "silent".into() },
        });
        let much_later = silent_at + Duration::from_secs(60);
        assert!(l.judge_silent(&s, Duration::from_secs(60), timeout, much_later).is_empty());
    }
}
