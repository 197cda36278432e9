//! The simulated controller cluster: replicas that are the real `kairos_consensus::Replica`
//! (openraft, the state machine, `ClusterState::apply`) on a simulated disk and network, each
//! with the leader's pass (`kairos_scheduler::propose`, as `kairosd`'s leader loop runs it), and
//! the calls clients and agents make to it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_consensus::peerclock::PeerClocks;
use kairos_consensus::{Replica, ReplicaConfig, ReplicaId, Storage, WriteError};
use kairos_scheduler::clock::Stamp;
use kairos_scheduler::history::Retention;
use kairos_scheduler::liveness::{Liveness, Seat};
use kairos_scheduler::propose::{Leadership, Tick};
use kairos_scheduler::{ClusterState, Command, Op, Outcome};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::disk::Disk;
use super::net::{self, SimNetwork};
use super::{locked, World};

/// The leader's pass period (`kairosd --tick`).
const TICK: Duration = Duration::from_millis(100);
/// Finished jobs leave the live state 3 s (cluster time) after they ended.
const SIM_RETENTION: Retention =
    Retention { job_ms: 3_000, history_max_jobs: 100_000, history_max_age_ms: i64::MAX };

/// One replica's machine: its disk survives crashes, the rest is its running incarnation.
pub struct Slot {
    pub disk: Disk,
    pub replica: Option<Replica>,
    pub leader_loop: Option<JoinHandle<()>>,
    /// Node liveness as this replica saw it leading (memory only, as in kairosd).
    pub liveness: Arc<Mutex<Liveness>>,
    /// Whether the replica is (meant to be) in the membership.
    pub member: bool,
    /// Started with `--join` (it was added to a running cluster, never initialises one).
    pub join: bool,
    /// A fault keeps it down until then; afterwards the supervisor restarts it.
    pub down_until: Option<Instant>,
}

impl Slot {
    pub fn new(disk: Disk, member: bool) -> Slot {
        Slot {
            disk,
            replica: None,
            leader_loop: None,
            liveness: Arc::default(),
            member,
            join: !member,
            down_until: None,
        }
    }
}

pub fn addr(id: ReplicaId) -> String {
    format!("replica-{id}")
}

impl World {
    pub fn config(&self, id: ReplicaId, join: bool) -> ReplicaConfig {
        ReplicaConfig {
            id,
            addr: addr(id),
            snapshot_logs: self.cfg.snapshot_logs,
            join,
            heartbeat_ms: ReplicaConfig::HEARTBEAT_MS_DEFAULT,
            election_timeout_ms: ReplicaConfig::ELECTION_TIMEOUT_MS_DEFAULT,
            key: kairos_consensus::auth::ClusterKey::new("simulated"),
            peer_tls: None,
        }
    }

    /// Starts replica `id` on its disk (a crashed one restarts from what its disk kept).
    pub async fn start_replica(self: &Arc<Self>, id: ReplicaId, join: bool) -> Result<(), String> {
        let opened = {
            let slots = self.slots();
            let slot = slots.get(&id).ok_or("no such replica")?;
            if slot.replica.is_some() {
                return Ok(());
            }
            if slot.disk.state.lock().unwrap_or_else(|p| p.into_inner()).full {
                return Err("disk full".into());
            }
            slot.disk.open(id)?
        };
        let commit_index = opened.log.commit_index();
        let members: BTreeMap<ReplicaId, String> = self.initial_members();
        let storage = Storage { log: opened.log, sm: opened.sm, applied: opened.applied, commit_index };
        let clocks: Arc<PeerClocks> = Arc::default();
        let network = SimNetwork { from: id, net: self.net.clone(), clocks: clocks.clone() };
        let replica = Replica::start(&self.config(id, join), &members, storage, network, clocks)
            .await
            .map_err(|e| e.to_string())?;
        net::lock(&self.net).rafts.insert(id, replica.raft.clone());
        self.trace(|| format!("replica {id} starts"));
        if self.elapsed_ms() > 0 {
            self.restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let liveness: Arc<Mutex<Liveness>> = Arc::default();
        let task = tokio::spawn(leader_loop(self.clone(), id, replica.clone(), liveness.clone()));
        let mut slots = self.slots();
        let slot = slots.get_mut(&id).ok_or("no such replica")?;
        slot.liveness = liveness;
        slot.replica = Some(replica);
        slot.leader_loop = Some(task);
        Ok(())
    }

    pub fn initial_members(&self) -> BTreeMap<ReplicaId, String> {
        (1..=self.cfg.replicas as ReplicaId).map(|id| (id, addr(id))).collect()
    }

    /// Crashes replica `id`: its process ends at once; of its disk's unsynced writes `survive`
    /// reach the platter and, with `tear`, the next in part.
    pub async fn crash_replica(&self, id: ReplicaId, survive: usize, tear: bool) {
        self.trace(|| format!("replica {id} crashes (unsynced writes surviving: {survive}, torn: {tear})"));
        let (replica, task) = {
            let mut slots = self.slots();
            let Some(slot) = slots.get_mut(&id) else { return };
            slot.disk.crash(survive, tear);
            (slot.replica.take(), slot.leader_loop.take())
        };
        net::lock(&self.net).rafts.remove(&id);
        if let Some(t) = task {
            t.abort();
        }
        if let Some(r) = replica {
            // The old incarnation's disk handle is dead; its tasks end here.
            let _ = tokio::time::timeout(Duration::from_secs(2), r.raft.shutdown()).await;
        }
    }

    /// Whether a replica that is down may start again (no fault holds it down).
    pub fn restart_due(&self, id: ReplicaId) -> bool {
        self.slots().get(&id).is_some_and(|s| s.down_until.is_none_or(|t| Instant::now() >= t))
    }

    pub fn joins(&self, id: ReplicaId) -> bool {
        self.slots().get(&id).is_some_and(|s| s.join)
    }

    /// Replicas that run now.
    pub fn running(&self) -> Vec<(ReplicaId, Replica)> {
        self.slots().iter().filter_map(|(id, s)| s.replica.clone().map(|r| (*id, r))).collect()
    }

    /// The replica that leads now (by its own belief, unpaused), if any.
    pub fn leader(&self) -> Option<(ReplicaId, Replica)> {
        let paused = net::lock(&self.net).paused.clone();
        self.running().into_iter().find(|(id, r)| !paused.contains(id) && r.is_leader())
    }

    /// The leader no replica has moved past: the unpaused replica that believes it leads at the
    /// highest term any running replica reached (a deposed or cut-off leader still believes it
    /// leads, at an older term, and its state falls behind).
    pub fn current_leader(&self) -> Option<(ReplicaId, Replica)> {
        let running = self.running();
        let term = |r: &Replica| r.raft.metrics().borrow().current_term;
        let newest = running.iter().map(|(_, r)| term(r)).max()?;
        let paused = net::lock(&self.net).paused.clone();
        running.into_iter().find(|(id, r)| !paused.contains(id) && r.is_leader() && term(r) == newest)
    }

    /// The time replica `id` stamps into commands now: its wall clock through the cluster
    /// clock (`Replica::clock_ms`), as `kairosd` does.
    pub fn stamp(&self, id: ReplicaId, replica: &Replica) -> Stamp {
        let wall = self.wall_ms(id);
        if self.cfg.broken.stamp_wall_clock {
            return Stamp { now_ms: wall, skipped_ms: 0 };
        }
        replica.stamp(wall)
    }

    /// This replica's wall clock, in ms.
    pub fn wall_ms(&self, id: ReplicaId) -> i64 {
        net::lock(&self.net).wall_ms(id)
    }

    /// A call to the cluster as a client or agent makes it: to `via` (or the leader it names),
    /// the ops time-stamped by the replica that proposes them. A lost reply is an error even
    /// when the ops committed.
    pub async fn write(&self, via: &mut ReplicaId, ops: Vec<Op>) -> Result<Vec<Outcome>, String> {
        let target = {
            let slots = self.slots();
            slots.get(via).and_then(|s| s.replica.clone())
        };
        let Some(replica) = target else {
            *via = self.any_replica();
            return Err("replica down".into());
        };
        if !self.wait_unpaused(*via, Duration::from_secs(2)).await {
            return Err("replica paused".into());
        }
        // As `kairosd` stamps a client's command: waiting to hear the voters' clocks first.
        let now = if self.cfg.broken.stamp_wall_clock {
            self.stamp(*via, &replica)
        } else {
            let id = *via;
            replica.stamp_heard(|| self.wall_ms(id)).await
        };
        let shown = if self.traced {
            format!("{:?}", ops.iter().map(op_name).collect::<Vec<_>>())
        } else {
            String::new()
        };
        let commands = ops
            .into_iter()
            .map(|op| Command { now_ms: now.now_ms, skipped_ms: now.skipped_ms, op })
            .collect();
        let result = replica.write(commands).await;
        self.trace(|| format!("via {via}: {shown} -> {result:?}"));
        match result {
            Ok(outcomes) => {
                let lost = {
                    let mut n = net::lock(&self.net);
                    n.lose_replies_per_mille > 0 && n.rng.below(1000) < n.lose_replies_per_mille
                };
                if lost {
                    return Err("reply lost".into());
                }
                Ok(outcomes)
            }
            Err(WriteError::NotLeader { leader, .. }) => {
                *via = leader.unwrap_or_else(|| self.any_replica());
                Err("not the leader".into())
            }
            Err(e) => {
                *via = self.any_replica();
                Err(e.to_string())
            }
        }
    }

    /// Waits while `id` is paused; false when `within` passed first.
    pub async fn wait_unpaused(&self, id: ReplicaId, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while net::lock(&self.net).paused.contains(&id) {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// A random running replica (the first one when none runs).
    pub fn any_replica(&self) -> ReplicaId {
        let running: Vec<ReplicaId> = self.running().into_iter().map(|(id, _)| id).collect();
        if running.is_empty() {
            return 1;
        }
        running[self.draw(running.len() as u64) as usize]
    }
}

/// A replica as the core's leader checks read it (`kairos_scheduler::liveness::Seat`), as
/// `kairosd`'s `agents::Desk` does: the modelled agents register and heartbeat through it
/// (`liveness::register`, `liveness::heartbeat`) and the leader loop ticks on it
/// (`Leadership::tick`).
pub struct SimSeat<'w> {
    pub w: &'w World,
    pub replica: Replica,
    pub liveness: Arc<Mutex<Liveness>>,
    /// Where a commit is sent; a refusal naming the leader moves it there.
    pub via: Mutex<ReplicaId>,
}

impl<'w> SimSeat<'w> {
    pub fn new(w: &'w World, id: ReplicaId, replica: Replica) -> SimSeat<'w> {
        SimSeat { w, replica, liveness: w.liveness(id), via: Mutex::new(id) }
    }

    pub fn via(&self) -> ReplicaId {
        *locked(&self.via)
    }
}

impl Seat for SimSeat<'_> {
    type Error = String;

    fn is_leader(&self) -> bool {
        self.replica.is_leader()
    }

    fn term(&self) -> Option<u64> {
        self.is_leader().then(|| self.replica.raft.metrics().borrow().current_term)
    }

    fn leads_confirmed(&self) -> impl std::future::Future<Output = bool> + Send {
        self.replica.leads_confirmed()
    }

    fn applied_all_committed(&self) -> bool {
        self.replica.applied_all_committed()
    }

    fn read<R>(&self, f: impl FnOnce(&ClusterState, &mut Liveness) -> R) -> R {
        self.replica.read(|a| f(&a.state, &mut locked(&self.liveness)))
    }

    async fn commit(&self, op: Op) -> Result<Outcome, String> {
        let mut via = self.via();
        let written = self.w.write(&mut via, vec![op]).await;
        *locked(&self.via) = via;
        written?.into_iter().next().ok_or_else(|| "no outcome".to_string())
    }

    fn now(&self) -> (std::time::Instant, i64) {
        (Instant::now().into_std(), 0)
    }
}

/// What `kairosd`'s leader loop does each tick, while this replica leads and is not paused:
/// the core's tick (`Leadership::tick`: the silent nodes judged, what to change), proposed.
async fn leader_loop(w: Arc<World>, id: ReplicaId, replica: Replica, liveness: Arc<Mutex<Liveness>>) {
    let mut leadership = Leadership::default();
    let seat = SimSeat { w: &w, replica: replica.clone(), liveness, via: Mutex::new(id) };
    loop {
        tokio::time::sleep(TICK).await;
        if net::lock(&w.net).paused.contains(&id) {
            continue;
        }
        let now = w.stamp(id, &replica);
        // As kairosd's, with a retention short enough to purge within a schedule.
        let tick = Tick {
            now: Instant::now().into_std(),
            now_ms: now.now_ms,
            node_timeout: w.cfg.node_timeout,
            retention: &SIM_RETENTION,
        };
        let Some((led_for, ops)) = leadership.tick(&seat, tick) else { continue };
        if led_for.is_zero() {
            w.trace(|| format!("leader {id}: leads (term {})", seat.term().unwrap_or_default()));
        }
        w.purging(replica.read(|a| purged_finals(&a.state, &ops)));
        if ops.is_empty() {
            continue;
        }
        w.trace(|| format!("leader {id}: proposes {ops:?}"));
        let limits: Vec<Option<u64>> = ops
            .iter()
            .map(|op| match op {
                Op::EnforceTimeLimit { job, .. } => Some(*job),
                _ => None,
            })
            .collect();
        let commands = ops
            .into_iter()
            .map(|op| Command { now_ms: now.now_ms, skipped_ms: now.skipped_ms, op })
            .collect();
        let proposed_ms = w.elapsed_ms();
        let result = replica.write(commands).await;
        if let Ok(outcomes) = &result {
            w.committed(proposed_ms, outcomes, &limits);
            let downs = outcomes.iter().filter(|o| matches!(o, Outcome::NodeDown { .. })).count();
            w.node_downs.fetch_add(downs as u64, std::sync::atomic::Ordering::Relaxed);
        }
        w.trace(|| format!("leader {id}: {result:?}"));
    }
}

/// The jobs a pass proposes to purge, as the checkers must still see them once they have left the
/// live state (`World::purging`).
fn purged_finals(state: &kairos_scheduler::ClusterState, ops: &[Op]) -> Vec<crate::FinalJob> {
    let purged = ops.iter().filter_map(|op| match op {
        Op::PurgeJobs { jobs, .. } => Some(jobs),
        _ => None,
    });
    purged.flatten().filter_map(|id| state.jobs.get(id)).map(crate::FinalJob::of).collect()
}

/// An op in a trace line (a submit without its spec).
fn op_name(op: &Op) -> String {
    match op {
        Op::Submit { request_id, .. } => format!("Submit({request_id:?})"),
        Op::JoinNode { info, credential_epoch } => format!("JoinNode({}, {credential_epoch:?})", info.name),
        other => format!("{other:?}"),
    }
}
