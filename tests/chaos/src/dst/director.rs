//! The director: injects each fault of the schedule (and ends it after its hold), heals
//! everything after the window, waits (bounded) for the cluster to settle and hands what it
//! finds to the checkers.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kairos_consensus::ReplicaId;
use openraft::BasicNode;
use tokio::time::Instant;

use super::faults::{Fault, FaultKind};
use super::{cluster, locked, net, Settled, World};
use crate::{FinalJob, JobId, Violation};

/// The longest a team may stay owed GPUs that reclaim could serve, counting only time a
/// leader led: two passes, and 2 s for a new leader's state to catch up (a preemption ends
/// the wait when it commits, before its victims stop).
const OWED_BOUND_MS: i64 = 3_000;

/// Membership changes never take a cluster below three replicas; every member (as the healed
/// cluster's membership lists them) must converge.
const MIN_MEMBERS: usize = 3;

impl World {
    /// The leader, or failing that any running replica (a fault aimed at the leader then hits
    /// whoever runs).
    fn target(&self, pick: u64) -> Option<ReplicaId> {
        if let Some((id, _)) = self.leader() {
            if !pick.is_multiple_of(4) {
                return Some(id);
            }
        }
        let running: Vec<ReplicaId> = self.running().into_iter().map(|(id, _)| id).collect();
        (!running.is_empty()).then(|| running[(pick as usize / 4) % running.len()])
    }

    /// Waits (at most half a second) until `id`'s disk has a log write in flight: crashes and
    /// power cuts strike mid-write, where durability bugs live.
    async fn while_writing(&self, id: Option<ReplicaId>) {
        let Some(disk) = id.and_then(|id| self.slots().get(&id).map(|s| s.disk.clone())) else { return };
        for _ in 0..500 {
            if !disk.log_writes_in_flight().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Ends a network fault: `heal` runs on the network after `hold`.
    fn on_net_after(&self, hold: Duration, heal: impl FnOnce(&mut net::NetState) + Send + 'static) {
        let net = self.net.clone();
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            heal(&mut net::lock(&net));
        });
    }

    fn hold_down(&self, id: ReplicaId, hold: Duration) {
        if let Some(s) = self.slots().get_mut(&id) {
            s.down_until = Some(Instant::now() + hold);
        }
    }

    /// Injects `f`; false when there was nothing to inject it on.
    pub async fn inject(self: &Arc<Self>, f: &Fault) -> bool {
        let hold = Duration::from_millis(f.hold_ms);
        let pick = f.pick;
        match f.kind {
            FaultKind::KillLeader => {
                let Some(id) = self.target(pick) else { return false };
                self.hold_down(id, hold);
                self.crash_replica(id, 0, false).await;
            }
            FaultKind::TornWrite => {
                let Some(id) = self.target(pick | 1) else { return false };
                self.while_writing(Some(id)).await;
                // One of the log writes in flight is torn; the unsynced changes before it survive.
                let writes = self.slots().get(&id).map(|s| s.disk.log_writes_in_flight()).unwrap_or_default();
                let survive = writes.get((pick >> 8) as usize % writes.len().max(1)).copied();
                self.hold_down(id, hold);
                self.crash_replica(id, survive.unwrap_or(usize::MAX), survive.is_some()).await;
            }
            FaultKind::PowerLoss => {
                self.while_writing(self.leader().map(|(id, _)| id)).await;
                let running: Vec<ReplicaId> = self.running().into_iter().map(|(id, _)| id).collect();
                for id in running {
                    self.hold_down(id, hold);
                    let unsynced = self.slots().get(&id).map(|s| s.disk.unsynced()).unwrap_or(0);
                    // Whatever the page cache had happened to write out survives, nothing else.
                    self.crash_replica(id, (pick >> id) as usize % (unsynced + 1), false).await;
                }
            }
            FaultKind::PauseLeader => {
                let Some(id) = self.target(pick) else { return false };
                net::lock(&self.net).paused.insert(id);
                self.on_net_after(hold, move |n| {
                    n.paused.remove(&id);
                });
            }
            FaultKind::Partition => {
                // One side: the target (often the leader) and, in larger clusters, up to a
                // minority more; cut from the rest both ways or one way.
                let Some(x) = self.target(pick) else { return false };
                let all: Vec<ReplicaId> = self.slots().keys().copied().collect();
                let extra = (pick >> 24) as usize % all.len().div_ceil(2);
                let side: BTreeSet<ReplicaId> =
                    std::iter::once(x).chain(all.iter().copied().filter(|o| *o != x).take(extra)).collect();
                self.trace(|| format!("partition {side:?} | rest, mode {}", (pick >> 16) % 3));
                let mut cut = BTreeSet::new();
                for a in &side {
                    for o in all.iter().filter(|o| !side.contains(o)) {
                        match (pick >> 16) % 3 {
                            0 => {
                                cut.insert((*a, *o));
                                cut.insert((*o, *a));
                            }
                            1 => {
                                cut.insert((*a, *o));
                            }
                            _ => {
                                cut.insert((*o, *a));
                            }
                        }
                    }
                }
                net::lock(&self.net).cut.extend(cut.iter().copied());
                self.on_net_after(hold, move |n| {
                    for c in cut {
                        n.cut.remove(&c);
                    }
                });
            }
            FaultKind::AgentStall | FaultKind::AgentCrash => {
                let node = format!("node-{}", pick % self.cfg.nodes as u64);
                let until = Some(Instant::now() + hold);
                let mut faults = locked(&self.agent_faults);
                let fault = faults.entry(node).or_default();
                if f.kind == FaultKind::AgentStall {
                    fault.stalled_until = until;
                } else {
                    fault.crashed_until = until;
                }
            }
            FaultKind::DiskFull => {
                let Some(id) = self.target(pick) else { return false };
                let disk = self.slots().get(&id).map(|s| s.disk.clone());
                let Some(disk) = disk else { return false };
                disk.state.lock().unwrap_or_else(|p| p.into_inner()).full = true;
                tokio::spawn(async move {
                    tokio::time::sleep(hold).await;
                    disk.state.lock().unwrap_or_else(|p| p.into_inner()).full = false;
                });
            }
            FaultKind::ClockSkew => {
                let Some(id) = self.target(pick) else { return false };
                let minutes = 1 + (pick >> 8) % 10;
                let sign = if (pick >> 20).is_multiple_of(2) { 1 } else { -1 };
                // One clock off at a time: a majority of wrong clocks that agree is what the
                // cluster takes as the time (`kairos_scheduler::clock`), not a fault it rides out.
                let mut n = net::lock(&self.net);
                n.skew_ms.clear();
                n.skew_ms.insert(id, sign * (minutes as i64) * 60_000);
            }
            FaultKind::SlowLinks => {
                net::lock(&self.net).slow_ms = 20 + pick % 300;
                self.on_net_after(hold, |n| n.slow_ms = 0);
            }
            FaultKind::LostReplies => {
                net::lock(&self.net).lose_replies_per_mille = 100 + pick % 300;
                self.on_net_after(hold, |n| n.lose_replies_per_mille = 0);
            }
            FaultKind::MembershipChange => {
                let w = self.clone();
                tokio::spawn(async move { w.change_membership(pick).await });
            }
            FaultKind::BitRot => {
                // A replica stops, and a committed entry of its log rots on the disk meanwhile:
                // its log refuses to open, and the operator re-adds it empty.
                use std::sync::atomic::Ordering;
                if self.re_adding.swap(true, Ordering::SeqCst) {
                    return false;
                }
                let Some(id) = self.target(pick) else {
                    self.re_adding.store(false, Ordering::SeqCst);
                    return false;
                };
                self.hold_down(id, hold);
                self.crash_replica(id, 0, false).await;
                let refusals = self.damaged_refusals(id);
                let rotted = self.slots().get(&id).is_some_and(|s| s.disk.rot(pick >> 8));
                self.trace(|| format!("bit rot in replica {id}'s committed log: {rotted}"));
                if rotted {
                    let w = self.clone();
                    tokio::spawn(async move {
                        w.clone().re_add_damaged(id, refusals).await;
                        w.re_adding.store(false, Ordering::SeqCst);
                    });
                } else {
                    self.re_adding.store(false, Ordering::SeqCst);
                }
            }
        }
        true
    }

    /// Adds the spare replica when the cluster has its initial size, else removes a voter
    /// (perhaps the leader), through the leader, as `kairos cluster add|remove` does.
    async fn change_membership(self: Arc<Self>, pick: u64) {
        let Some((_, leader)) = self.leader() else { return };
        let voters: BTreeSet<ReplicaId> =
            leader.raft.metrics().borrow().membership_config.voter_ids().collect();
        let spare = self.slots().iter().find(|(_, s)| !s.member).map(|(id, _)| *id);
        let within = Duration::from_secs(10);
        match spare {
            Some(spare) if voters.len() == self.cfg.replicas => {
                if let Some(s) = self.slots().get_mut(&spare) {
                    s.member = true;
                    s.join = true;
                }
                let mut next = voters;
                next.insert(spare);
                let mut added = self.start_replica(spare, true).await.is_ok();
                if added {
                    let node = BasicNode::new(cluster::addr(spare));
                    let learner =
                        tokio::time::timeout(within, leader.raft.add_learner(spare, node, true)).await;
                    added = matches!(learner, Ok(Ok(_)));
                }
                if added {
                    let _ = tokio::time::timeout(within, leader.raft.change_membership(next, false)).await;
                }
                // Whether it became a voter (or a learner) is what the membership says, wherever
                // it got to; one that is in neither is stopped and wiped again.
                let metrics = leader.raft.metrics().borrow().clone();
                let joined = metrics.membership_config.nodes().any(|(id, _)| *id == spare);
                self.trace(|| {
                    format!("membership: adding {spare}: {}", if joined { "in" } else { "not in" })
                });
                if !joined {
                    self.retire(spare).await;
                }
            }
            _ => {
                let list: Vec<ReplicaId> = voters.iter().copied().collect();
                if list.len() <= MIN_MEMBERS {
                    return;
                }
                let gone = list[pick as usize % list.len()];
                let next: BTreeSet<ReplicaId> = voters.iter().copied().filter(|v| *v != gone).collect();
                let changed = tokio::time::timeout(within, leader.raft.change_membership(next, false)).await;
                self.trace(|| format!("membership: removing {gone}: {changed:?}"));
                if matches!(changed, Ok(Ok(_))) {
                    self.retire(gone).await;
                }
            }
        }
    }

    /// The runbook for a replica whose log refuses to open (damaged): removed from the
    /// membership through the leader, emptied, and added back as a new member (`kairos cluster
    /// remove N`, a fresh data directory, `--join`, `kairos cluster add N ADDR`), each step
    /// retried through elections and other faults.
    async fn re_add_damaged(self: Arc<Self>, id: ReplicaId, refusals: u64) {
        let within = Duration::from_secs(10);
        let deadline = Instant::now() + Duration::from_secs(120);
        // The operator acts on the replica's refusal to start (its one-line error); a log that
        // opens anyway (the broken build) gets no runbook.
        while self.damaged_refusals(id) == refusals {
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let voters = |leader: &kairos_consensus::Replica| -> BTreeSet<ReplicaId> {
            leader.raft.metrics().borrow().membership_config.voter_ids().collect()
        };
        let listed = |leader: &kairos_consensus::Replica| -> bool {
            leader.raft.metrics().borrow().membership_config.nodes().any(|(n, _)| *n == id)
        };
        while Instant::now() < deadline {
            if let Some((_, leader)) = self.leader() {
                if !listed(&leader) {
                    break;
                }
                // `kairos cluster remove N`: as a voter, or as a learner it was still being added as.
                let removed = tokio::time::timeout(within, leader.remove_replica(id)).await;
                self.trace(|| format!("membership: removing damaged {id}: {removed:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.retire(id).await;
        while Instant::now() < deadline {
            if let Some((_, leader)) = self.leader() {
                let joint =
                    leader.raft.metrics().borrow().membership_config.membership().get_joint_config().len()
                        > 1;
                if voters(&leader).contains(&id) {
                    if !joint {
                        self.trace(|| format!("membership: damaged {id} is back, empty"));
                        return;
                    }
                    // Added, but the change is still joint: until it leaves the joint
                    // configuration the old majority is still needed, so it is not back yet.
                    let _ =
                        tokio::time::timeout(within, leader.raft.change_membership(voters(&leader), false))
                            .await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                if let Some(s) = self.slots().get_mut(&id) {
                    s.member = true;
                    s.join = true;
                }
                if self.start_replica(id, true).await.is_ok() {
                    let node = BasicNode::new(cluster::addr(id));
                    if let Ok(Ok(_)) =
                        tokio::time::timeout(within, leader.raft.add_learner(id, node, true)).await
                    {
                        let mut next = voters(&leader);
                        next.insert(id);
                        let _ =
                            tokio::time::timeout(within, leader.raft.change_membership(next, false)).await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// How often `id`'s log has refused to open as damaged.
    fn damaged_refusals(&self, id: ReplicaId) -> u64 {
        self.slots()
            .get(&id)
            .map(|s| s.disk.state.lock().unwrap_or_else(|p| p.into_inner()).damaged_refused)
            .unwrap_or(0)
    }

    /// A replica out of the membership: stopped and wiped; it may be added back later, empty.
    async fn retire(&self, id: ReplicaId) {
        if let Some(s) = self.slots().get_mut(&id) {
            s.member = false;
        }
        self.crash_replica(id, 0, false).await;
        if let Some(s) = self.slots().get_mut(&id) {
            s.disk.wipe();
        }
        net::lock(&self.net).skew_ms.remove(&id);
    }

    /// Ends every fault: links whole, nothing paused, disks with space, clocks right, agents
    /// up, every member replica running.
    pub async fn heal_all(self: &Arc<Self>) {
        {
            let mut n = net::lock(&self.net);
            n.cut.clear();
            n.paused.clear();
            n.slow_ms = 0;
            n.lose_replies_per_mille = 0;
            n.skew_ms.clear();
        }
        locked(&self.agent_faults).clear();
        let members: Vec<(ReplicaId, bool)> = {
            let mut slots = self.slots();
            for s in slots.values_mut() {
                s.disk.state.lock().unwrap_or_else(|p| p.into_inner()).full = false;
                s.down_until = None;
            }
            slots.iter().filter(|(_, s)| s.member).map(|(id, s)| (*id, s.join)).collect()
        };
        for (id, join) in members {
            let _ = self.start_replica(id, join).await;
        }
    }

    /// Waits, at most the settle bound, until a leader leads, no job is unfinished and every
    /// member replica applied the same entries.
    pub async fn settle(&self, healed: Instant) -> Settled {
        let deadline = healed + self.cfg.settle;
        let mut leader_after_ms = None;
        loop {
            let leader = self.leader();
            if leader_after_ms.is_none() && leader.is_some() {
                leader_after_ms = Some(Instant::now().duration_since(healed).as_millis() as i64);
            }
            if let Some((_, l)) = &leader {
                // Membership is what the cluster says: a replica whose addition never committed
                // (its leader lost) is stopped and wiped, like an operator's retry would start over.
                let listed: BTreeSet<ReplicaId> =
                    l.raft.metrics().borrow().membership_config.nodes().map(|(id, _)| *id).collect();
                let strays: Vec<ReplicaId> = self
                    .slots()
                    .iter()
                    .filter(|(id, s)| s.member && !listed.contains(id))
                    .map(|(id, _)| *id)
                    .collect();
                for id in strays {
                    self.trace(|| format!("replica {id} is not in the membership: retired"));
                    self.retire(id).await;
                }
            }
            // Digests and invariant checks only once the rest says settled.
            let leading = leader.as_ref().map(|(_, r)| r);
            let mut settled = self.observe(leading, false);
            let done = |s: &Settled| {
                leader.is_some()
                    && s.unfinished == 0
                    && s.replicas.len() >= MIN_MEMBERS
                    && s.replicas.windows(2).all(|p| p[0].1 == p[1].1 && p[0].2 == p[1].2)
            };
            let timed_out = Instant::now() >= deadline;
            if done(&settled) || timed_out {
                settled = self.observe(leading, true);
            }
            if done(&settled) || timed_out {
                for (id, r) in self.running() {
                    self.trace(|| {
                        let m = r.raft.metrics().borrow().clone();
                        format!(
                            "replica {id}: {:?} term {} leader {:?} log {:?} applied {:?} snapshot {:?} membership {:?}",
                            m.state, m.current_term, m.current_leader, m.last_log_index, m.last_applied, m.snapshot, m.membership_config
                        )
                    });
                }
                let timeline_lag_ms = leader.map(|(id, r)| self.wall_ms(id) - self.stamp(id, &r).now_ms);
                return Settled { leader_after_ms, timeline_lag_ms, ..settled };
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The cluster now; the replicas' state digests and invariant checks only when `full` (an
    /// encoding of each state: most of a schedule's time when taken at every look).
    fn observe(&self, leader: Option<&kairos_consensus::Replica>, full: bool) -> Settled {
        let members: Vec<(ReplicaId, Option<kairos_consensus::Replica>)> =
            self.slots().iter().filter(|(_, s)| s.member).map(|(id, s)| (*id, s.replica.clone())).collect();
        let invariants = members
            .iter()
            .filter(|_| full)
            .filter_map(|(id, r)| r.as_ref().map(|r| (*id, r.read(|a| a.state.check_invariants()))))
            .collect();
        let replicas = members
            .iter()
            .map(|(id, r)| match r {
                Some(r) => {
                    let (index, digest) = r.read(|a| {
                        let digest =
                            if full { kairos_consensus::state_digest(&a.state) } else { String::new() };
                        (a.last_applied.map(|l| l.index).unwrap_or(0), digest)
                    });
                    (*id, index, digest)
                }
                None => (*id, 0, "down".to_string()),
            })
            .collect();
        let source = leader.cloned().or_else(|| members.iter().find_map(|(_, r)| r.clone()));
        // Live jobs, and purged ones where the history has them (a job in neither is lost).
        let purged = locked(&self.records).purged.clone();
        let finals: Vec<FinalJob> = source
            .map(|r| {
                r.read(|a| {
                    let live = a.state.jobs.values().map(FinalJob::of);
                    let kept: BTreeSet<JobId> = a.state.history.iter().map(|h| h.id).collect();
                    let gone =
                        purged.values().filter(|j| !a.state.jobs.contains_key(&j.id) && kept.contains(&j.id));
                    live.chain(gone.cloned()).collect()
                })
            })
            .unwrap_or_default();
        let unfinished = finals.iter().filter(|j| !crate::TERMINAL.contains(&j.state.as_str())).count();
        Settled { finals, replicas, invariants, leader_after_ms: None, unfinished, timeline_lag_ms: None }
    }

    /// Every checker over what this schedule recorded. Also returns what the fingerprint covers
    /// of the final state.
    pub fn check(&self, settled: Settled) -> (Vec<Violation>, Vec<(ReplicaId, u64, String)>) {
        let records = locked(&self.records);
        let bound_ms = self.cfg.settle.as_millis() as i64;
        let stop_orders: Vec<(JobId, u32, i64)> =
            records.stop_orders.iter().map(|(&(job, attempt), &at)| (job, attempt, at)).collect();
        // The longest an honest agent takes: its lease lapses (it is cut off or stalled), the
        // fence's grace, the longest stop grace the modelled processes take (1 s), and 2 s for
        // a new leader's state to catch up to what was committed.
        let stop_bound_ms = (self.cfg.lease() + self.cfg.fence_grace()).as_millis() as i64 + 3_000;
        let violations = crate::check_all(&crate::Run {
            history: &records.history,
            processes: &records.processes,
            finals: &settled.finals,
            replicas: &settled.replicas,
            expected_replicas: MIN_MEMBERS,
            leader_after_ms: settled.leader_after_ms,
            bound_ms,
            unfinished: settled.unfinished,
            invariants: &settled.invariants,
            time_limit_stops: &records.time_limit_stops,
            allocations: &records.allocations,
            stop_orders: &stop_orders,
            stop_bound_ms,
            end_ms: self.elapsed_ms(),
            timeline_lag_ms: settled.timeline_lag_ms,
            owed: &records.owed,
            owed_bound_ms: OWED_BOUND_MS,
        });
        (violations, settled.replicas)
    }
}
