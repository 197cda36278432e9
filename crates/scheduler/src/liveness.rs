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

use crate::model::{NodeInfo, NodeState};
use crate::state::{ClusterState, Op, Outcome, Rejection};

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
    /// When the leader last swept for silent nodes and runs past their limits (`sweep_due`).
    swept_at: Option<Instant>,
}

/// The leader sweeps for silent nodes and runs past their time limits at most this many times
/// per node timeout (every 500 ms at the default 20 s): with ten thousand nodes and fifty
/// thousand runs a sweep costs milliseconds, and the loop may step at every submit.
pub const SWEEPS_PER_TIMEOUT: u32 = 40;

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
        // No allocation for a node already seen (every heartbeat but its first).
        match self.seen.get_mut(node) {
            Some(seen) => *seen = (now, wall_ms),
            None => {
                self.seen.insert(node.to_string(), (now, wall_ms));
            }
        }
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

    /// A registration that would change nothing in the state stands at once, without a
    /// `JoinNode` (Some: the node's epoch): the node is up (or draining) with exactly `info`,
    /// no reason to clear, `credential_epoch` is its current epoch, and a burst node's
    /// instance still takes it. Asked only on a leader a quorum confirmed whose state holds
    /// everything committed, after `may_register`: what admits a heartbeat admits it, so ten
    /// thousand agents reconnecting after a leader change cost no log entries.
    pub fn rejoins_unchanged(
        &mut self,
        state: &ClusterState,
        info: &NodeInfo,
        credential_epoch: Option<u64>,
        now: Instant,
        wall_ms: i64,
    ) -> Option<u64> {
        let node = state.nodes.get(&info.name)?;
        let unchanged = credential_epoch == Some(node.epoch)
            && node.info == *info
            && (node.state == NodeState::Draining || (node.state == NodeState::Up && node.reason.is_empty()))
            && state.check_burst_node(info).is_ok();
        (unchanged && self.registration_stands(state, &info.name, now, wall_ms)).then_some(node.epoch)
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

    /// Whether a sweep is due at `now` (the first, or `timeout / SWEEPS_PER_TIMEOUT` after the
    /// last); marks it done.
    pub fn sweep_due(&mut self, now: Instant, timeout: Duration) -> bool {
        let due =
            self.swept_at.is_none_or(|at| now.saturating_duration_since(at) >= timeout / SWEEPS_PER_TIMEOUT);
        if due {
            self.swept_at = Some(now);
        }
        due
    }

    /// When `node` was last heard of (wall-clock ms; 0: never, here).
    pub fn last_seen_ms(&self, node: &str) -> i64 {
        self.seen.get(node).map(|(_, ms)| *ms).unwrap_or(0)
    }
}

/// The replica a leader's work runs on, as the agent service's checks (`register`,
/// `heartbeat`) and the leader loop (`propose::Leadership::tick`) read it: `kairosd`'s replica
/// and the simulation's both answer these (the Raft facts, the state, the commit of a
/// `JoinNode`), so both take the same checks in the same order.
pub trait Seat {
    type Error;
    /// Whether this replica believes it leads.
    fn is_leader(&self) -> bool;
    /// The term it leads in (None: it does not lead).
    fn term(&self) -> Option<u64>;
    /// Whether a quorum still follows this replica as leader (which also waits for its state
    /// machine to catch up with what it committed).
    fn leads_confirmed(&self) -> impl std::future::Future<Output = bool> + Send;
    /// Whether the applied state holds every entry this replica knows committed.
    fn applied_all_committed(&self) -> bool;
    /// `f` on the applied state and this leader's liveness.
    fn read<R>(&self, f: impl FnOnce(&ClusterState, &mut Liveness) -> R) -> R;
    /// Commits `op` (a `JoinNode`) and gives its outcome.
    fn commit(&self, op: Op) -> impl std::future::Future<Output = Result<Outcome, Self::Error>> + Send;
    /// The leader's clocks now: monotonic, and wall-clock ms.
    fn now(&self) -> (Instant, i64);
}

/// Why a registration renews no lease.
#[derive(Debug)]
pub enum RegisterRefused<E> {
    /// This leader's `NodeDown` for the node is in flight (`may_register`): again shortly.
    BeingMarkedDown,
    /// A `NodeDown` applied after the registration or is in flight (`registration_stands`).
    MarkedDownMeanwhile,
    Rejected(Rejection),
    Unexpected(Outcome),
    /// The caller's own refusal (the credential), or the commit failed.
    Failed(E),
}

/// A registration as the agent service takes it: leadership confirmed first (a just-elected
/// leader may not have applied every committed registration: the epoch read next must be
/// current), the credential checked against the node's epoch (`credential`: the epoch it
/// presents), `may_register`, the `JoinNode` committed, and `registration_stands`. The epoch
/// registered.
pub async fn register<D: Seat>(
    desk: &D,
    info: NodeInfo,
    credential: impl FnOnce(Option<u64>) -> Result<Option<u64>, D::Error> + Send,
) -> Result<u64, RegisterRefused<D::Error>> {
    // A replica that does not lead is refused by the commit below.
    let confirmed = desk.leads_confirmed().await;
    let name = info.name.clone();
    let epoch = desk.read(|state, _| state.nodes.get(&name).map(|n| n.epoch));
    let credential_epoch = credential(epoch).map_err(RegisterRefused::Failed)?;
    // Fencing: no lease while this leader's NodeDown for the node is in flight, nor from a
    // registration that a NodeDown overtook in the log.
    if !desk.read(|state, live| live.may_register(state, &name)) {
        return Err(RegisterRefused::BeingMarkedDown);
    }
    // An agent coming back to a new leader (or over a new connection) with nothing to change:
    // admitted as a heartbeat is, without an entry (`rejoins_unchanged`) — only on a state
    // that holds everything committed (a removal committed but not applied would be skipped).
    if confirmed && desk.applied_all_committed() {
        let (now, wall_ms) = desk.now();
        let rejoined =
            desk.read(|state, live| live.rejoins_unchanged(state, &info, credential_epoch, now, wall_ms));
        if let Some(epoch) = rejoined {
            return Ok(epoch);
        }
    }
    match desk.commit(Op::JoinNode { info, credential_epoch }).await.map_err(RegisterRefused::Failed)? {
        Outcome::NodeRegistered { epoch, .. } => {
            let (now, wall_ms) = desk.now();
            match desk.read(|state, live| live.registration_stands(state, &name, now, wall_ms)) {
                true => Ok(epoch),
                false => Err(RegisterRefused::MarkedDownMeanwhile),
            }
        }
        Outcome::Rejected(r) => Err(RegisterRefused::Rejected(r)),
        other => Err(RegisterRefused::Unexpected(other)),
    }
}

/// Why a heartbeat renews no lease.
#[derive(Debug, PartialEq, Eq)]
pub enum HeartbeatError<E> {
    /// This replica does not believe it leads.
    NotLeader,
    /// It believes so, but no quorum confirms it (deposed, paused or cut off).
    NotConfirmed,
    /// The caller's own check refused it.
    Failed(E),
    Refused(HeartbeatRefused),
}

/// A heartbeat as the agent service takes it: only on a leader a quorum still follows (an
/// agent talking to a deposed, paused or partitioned replica must move to the real leader, or
/// that leader would judge its node silent), then the caller's `check` (the node is known),
/// then `admit_heartbeat`.
pub async fn heartbeat<D: Seat>(
    desk: &D,
    node: &str,
    check: impl FnOnce() -> Result<(), D::Error> + Send,
) -> Result<(), HeartbeatError<D::Error>> {
    if !desk.is_leader() {
        return Err(HeartbeatError::NotLeader);
    }
    if !desk.leads_confirmed().await {
        return Err(HeartbeatError::NotConfirmed);
    }
    check().map_err(HeartbeatError::Failed)?;
    let (now, wall_ms) = desk.now();
    desk.read(|state, live| live.admit_heartbeat(state, node, now, wall_ms)).map_err(HeartbeatError::Refused)
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
    fn the_leader_sweeps_on_a_cadence_not_at_every_step() {
        let mut l = Liveness::default();
        let (t0, timeout) = (Instant::now(), Duration::from_secs(20));
        assert!(l.sweep_due(t0, timeout), "the first step sweeps");
        assert!(!l.sweep_due(t0 + Duration::from_millis(499), timeout));
        assert!(l.sweep_due(t0 + Duration::from_millis(500), timeout), "a 40th of the timeout later");
        assert!(!l.sweep_due(t0 + Duration::from_millis(600), timeout));
    }

    #[test]
    fn an_unchanged_registration_stands_without_an_entry_and_any_change_needs_one() {
        let mut s = state();
        let epoch = s.nodes["n1"].epoch;
        let mut l = Liveness::default();
        let t0 = Instant::now();
        let same = node_info("n1", 1);
        assert_eq!(l.rejoins_unchanged(&s, &same, Some(epoch), t0, 7), Some(epoch));
        assert_eq!(l.last_seen_ms("n1"), 7, "seen, as a heartbeat");
        assert_eq!(l.rejoins_unchanged(&s, &node_info("n1", 2), Some(epoch), t0, 8), None, "a GPU more");
        assert_eq!(l.rejoins_unchanged(&s, &same, Some(epoch + 1), t0, 8), None, "another epoch");
        assert_eq!(l.rejoins_unchanged(&s, &same, None, t0, 8), None, "the join token");
        assert_eq!(l.rejoins_unchanged(&s, &node_info("ghost", 1), Some(epoch), t0, 8), None);
        // Judged silent: no lease without the entry that orders it after the NodeDown.
        let timeout = Duration::from_secs(10);
        assert!(!l.judge_silent(&s, timeout, timeout, t0 + timeout).is_empty());
        assert_eq!(l.rejoins_unchanged(&s, &same, Some(epoch), t0 + timeout, 9), None, "condemned");
        s.apply(&Command {
            skipped_ms: 0,
            now_ms: 3,
            op: Op::NodeDown { node: "n1".into(), reason: "silent".into() },
        });
        assert_eq!(l.rejoins_unchanged(&s, &same, Some(epoch), t0 + timeout, 9), None, "down");
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

#[cfg(test)]
pub(crate) mod desk_tests {
    use std::sync::Mutex;

    use super::*;
    use crate::state::Command;
    use crate::testing::node_info;

    /// A leader whose facts the test sets; a commit applies at once (`down_on_commit`: a
    /// `NodeDown` for the node applies just after it).
    pub(crate) struct Desk {
        pub(crate) state: Mutex<ClusterState>,
        pub(crate) live: Mutex<Liveness>,
        pub(crate) leader: bool,
        pub(crate) confirmed: bool,
        pub(crate) down_on_commit: bool,
        pub(crate) commits: Mutex<Vec<Op>>,
        pub(crate) t0: Instant,
    }

    impl Seat for Desk {
        type Error = &'static str;
        fn is_leader(&self) -> bool {
            self.leader
        }
        fn term(&self) -> Option<u64> {
            self.leader.then_some(1)
        }
        fn leads_confirmed(&self) -> impl std::future::Future<Output = bool> + Send {
            std::future::ready(self.leader && self.confirmed)
        }
        fn applied_all_committed(&self) -> bool {
            true
        }
        fn read<R>(&self, f: impl FnOnce(&ClusterState, &mut Liveness) -> R) -> R {
            f(&self.state.lock().unwrap(), &mut self.live.lock().unwrap())
        }
        fn commit(&self, op: Op) -> impl std::future::Future<Output = Result<Outcome, &'static str>> + Send {
            self.commits.lock().unwrap().push(op.clone());
            let mut state = self.state.lock().unwrap();
            let outcome = state.apply(&Command { skipped_ms: 0, now_ms: 5, op });
            if self.down_on_commit {
                let down = Op::NodeDown { node: "n1".into(), reason: "silent".into() };
                state.apply(&Command { skipped_ms: 0, now_ms: 6, op: down });
            }
            std::future::ready(if self.leader { Ok(outcome) } else { Err("not the leader") })
        }
        fn now(&self) -> (Instant, i64) {
            (self.t0, 7)
        }
    }

    pub(crate) fn desk() -> Desk {
        Desk {
            state: Mutex::new(ClusterState::new()),
            live: Mutex::default(),
            leader: true,
            confirmed: true,
            down_on_commit: false,
            commits: Mutex::default(),
            t0: Instant::now(),
        }
    }

    fn ready<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => out,
            std::task::Poll::Pending => panic!("the fake desk's futures are ready at once"),
        }
    }

    pub(crate) fn join(d: &Desk, presented: Option<u64>) -> Result<u64, RegisterRefused<&'static str>> {
        ready(register(d, node_info("n1", 1), |_| Ok(presented)))
    }

    #[test]
    fn a_registration_commits_and_stands_with_the_epoch_the_credential_was_checked_against() {
        let d = desk();
        let first = join(&d, None).unwrap();
        let mut seen = None;
        let again = ready(register(&d, node_info("n1", 1), |epoch| {
            seen = Some(epoch);
            Ok(epoch)
        }));
        assert_eq!(again.unwrap(), first);
        assert_eq!(seen, Some(Some(first)), "the credential is checked against the node's epoch");
        assert_eq!(d.live.lock().unwrap().last_seen_ms("n1"), 7, "the node is live from its registration");
        let refused = ready(register(&d, node_info("n1", 1), |_| Err("invalid join token")));
        assert!(matches!(refused, Err(RegisterRefused::Failed("invalid join token"))));
        assert!(matches!(join(&d, None), Err(RegisterRefused::Rejected(_))), "the name is taken");
    }

    #[test]
    fn a_condemned_node_is_not_registered_and_one_overtaken_by_a_node_down_does_not_stand() {
        let d = desk();
        join(&d, None).unwrap();
        let timeout = std::time::Duration::from_secs(10);
        let silent = d.read(|s, l| l.judge_silent(s, timeout, timeout, d.t0 + timeout));
        assert!(silent.contains("n1"));
        let commits = d.commits.lock().unwrap().len();
        assert!(matches!(join(&d, Some(1)), Err(RegisterRefused::BeingMarkedDown)));
        assert_eq!(d.commits.lock().unwrap().len(), commits, "no JoinNode while its NodeDown is in flight");
        // The NodeDown applies: it may register again, unless another overtakes the JoinNode.
        let down = Op::NodeDown { node: "n1".into(), reason: "silent".into() };
        d.state.lock().unwrap().apply(&Command { skipped_ms: 0, now_ms: 4, op: down });
        let racing =
            Desk { down_on_commit: true, state: Mutex::new(d.state.lock().unwrap().clone()), ..desk() };
        assert!(matches!(join(&racing, Some(1)), Err(RegisterRefused::MarkedDownMeanwhile)));
        assert!(join(&d, Some(1)).is_ok());
    }

    #[test]
    fn a_heartbeat_counts_only_on_a_confirmed_leader_after_the_callers_check() {
        let d = desk();
        join(&d, None).unwrap();
        let beat = |d: &Desk, check: Result<(), &'static str>| ready(heartbeat(d, "n1", || check));
        assert_eq!(beat(&d, Ok(())), Ok(()));
        assert_eq!(beat(&d, Err("unknown node")), Err(HeartbeatError::Failed("unknown node")));
        let deposed = Desk { confirmed: false, ..desk() };
        assert_eq!(beat(&deposed, Ok(())), Err(HeartbeatError::NotConfirmed));
        let follower = Desk { leader: false, ..desk() };
        assert_eq!(beat(&follower, Err("not reached")), Err(HeartbeatError::NotLeader));
        assert_eq!(
            ready(heartbeat(&d, "ghost", || Ok(()))),
            Err(HeartbeatError::Refused(HeartbeatRefused::Down))
        );
    }
}
