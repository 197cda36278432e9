//! Write batching (group commit): concurrent commands share one Raft entry, so one fsync on a
//! quorum serves many clients. Each caller still gets its own outcome.
//!
//! ```text
//!   write(cmd) ─▶ queue (bounded) ─▶ [up to BATCH_COMMANDS_MAX commands] ─▶ Replica::write
//!        ▲                                                                       │
//!        └──────────────── its own Outcome (or the batch's error) ◀──────────────┘
//! ```
//!
//! No artificial delay: while an entry is being committed, new commands queue up and form the
//! next batch, so batches grow exactly when the log is the bottleneck. One entry is in flight
//! at a time while entries commit promptly (fuller entries: every append, fsync and apply pays
//! its fixed cost once for more commands); a second starts only once the one in flight has
//! taken `SECOND_AFTER` (`next_start`), so an entry that cannot commit does not hold every later
//! command back for its whole write timeout.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_consensus::Replica;
use kairos_scheduler::{Command, Outcome};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::time::Instant;
use tonic::Status;

use crate::context::write_status;

/// Most commands in one log entry.
pub const BATCH_COMMANDS_MAX: usize = 512;
/// Most bytes of commands (as encoded) in one log entry, so an entry replicates within a
/// heartbeat interval (a larger single command goes alone).
pub const BATCH_BYTES_MAX: usize = 256 * 1024;
/// Most entries being committed at once. Two, not one: with one, an entry that cannot commit
/// (quorum lost) would hold every later command for its whole write timeout before they even
/// start theirs — a submit answered after 10 s instead of 5 (e2e
/// `follower_loss_is_invisible_and_losing_quorum_stops_writes_but_not_reads`).
const IN_FLIGHT_MAX: usize = 2;
/// How long the entry in flight may take before a second one starts beside it: well above a
/// healthy commit under load (a few ms), well below the write timeout.
const SECOND_AFTER: Duration = Duration::from_millis(25);
/// Most commands waiting for a batch; beyond this, callers wait.
const QUEUE_MAX: usize = 8192;

type Reply = oneshot::Sender<Result<Outcome, Status>>;

#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<(Command, Reply)>,
}

impl Batcher {
    /// Starts the batching task for `replica`.
    pub fn start(replica: Replica) -> Batcher {
        let (tx, rx) = mpsc::channel(QUEUE_MAX);
        tokio::spawn(run(replica, rx));
        Batcher { tx }
    }

    pub async fn write(&self, cmd: Command) -> Result<Outcome, Status> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((cmd, reply))
            .await
            .map_err(|_| Status::unavailable("the controller is shutting down"))?;
        rx.await.map_err(|_| Status::unavailable("the controller is shutting down"))?
    }
}

/// The command's encoding, as its log entry carries it: made here once (the batch's size bound
/// needs it anyway) and taken into the entry as is (`Request::with_encoded`).
fn encode(cmd: &Command) -> Vec<u8> {
    serde_json::to_vec(cmd).unwrap_or_default()
}

/// When the next entry may start, given when each entry in flight started: now when none is,
/// `SECOND_AFTER` after the oldest started when one is, and only once one ends (`None`) when
/// `IN_FLIGHT_MAX` are.
fn next_start(in_flight: &[Instant], now: Instant) -> Option<Instant> {
    match in_flight.iter().min() {
        None => Some(now),
        Some(_) if in_flight.len() >= IN_FLIGHT_MAX => None,
        Some(oldest) => Some(now.max(*oldest + SECOND_AFTER)),
    }
}

/// The start times of the entries in flight; every change is announced (`changed`).
#[derive(Clone)]
struct InFlight {
    starts: Arc<Mutex<Vec<(u64, Instant)>>>,
    changed: watch::Sender<u64>,
}

impl InFlight {
    fn starts(&self) -> Vec<Instant> {
        self.starts.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(_, t)| *t).collect()
    }

    fn begin(&self, id: u64, at: Instant) {
        self.starts.lock().unwrap_or_else(|p| p.into_inner()).push((id, at));
        self.changed.send_modify(|v| *v += 1);
    }

    fn end(&self, id: u64) {
        self.starts.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
        self.changed.send_modify(|v| *v += 1);
    }

    /// Waits until the next entry may start (`next_start`).
    async fn wait_turn(&self, seen: &mut watch::Receiver<u64>) {
        loop {
            seen.borrow_and_update();
            let now = Instant::now();
            match next_start(&self.starts(), now) {
                Some(at) if at <= now => return,
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => return,
                        r = seen.changed() => if r.is_err() { return },
                    }
                }
                None => {
                    if seen.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

async fn run(replica: Replica, mut rx: mpsc::Receiver<(Command, Reply)>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    let (changed, mut seen) = watch::channel(0u64);
    let in_flight = InFlight { starts: Arc::default(), changed };
    let mut next_id = 0u64;
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        in_flight.wait_turn(&mut seen).await;
        let Some(first) = rx.recv().await else { return };
        let mut encoded = vec![encode(&first.0)];
        let mut bytes = encoded[0].len();
        let mut batch = vec![first];
        while batch.len() < BATCH_COMMANDS_MAX && bytes < BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(item) => {
                    encoded.push(encode(&item.0));
                    bytes += encoded[encoded.len() - 1].len();
                    batch.push(item);
                }
                Err(_) => break,
            }
        }
        let replica = replica.clone();
        next_id += 1;
        let id = next_id;
        in_flight.begin(id, Instant::now());
        let in_flight = in_flight.clone();
        tokio::spawn(async move {
            let (commands, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
            let count = commands.len();
            match replica.write_request(kairos_consensus::Request::with_encoded(commands, &encoded)).await {
                Ok(outcomes) if outcomes.len() == count => {
                    for (reply, outcome) in replies.into_iter().zip(outcomes) {
                        let _ = reply.send(Ok(outcome));
                    }
                }
                Ok(outcomes) => {
                    let status =
                        Status::internal(format!("{count} commands gave {} outcomes", outcomes.len()));
                    for reply in replies {
                        let _ = reply.send(Err(status.clone()));
                    }
                }
                Err(e) => {
                    let status = write_status(e);
                    for reply in replies {
                        let _ = reply.send(Err(status.clone()));
                    }
                }
            }
            in_flight.end(id);
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_entry_starts_only_beside_a_slow_one_and_never_a_third() {
        let t0 = Instant::now();
        assert_eq!(next_start(&[], t0), Some(t0), "nothing in flight: at once");
        let later = t0 + Duration::from_millis(3);
        assert_eq!(next_start(&[t0], later), Some(t0 + SECOND_AFTER), "one prompt entry: wait for it");
        let slow = t0 + SECOND_AFTER + Duration::from_millis(1);
        assert_eq!(next_start(&[t0], slow), Some(slow), "one slow entry: a second beside it");
        assert_eq!(next_start(&[t0, later], slow), None, "two in flight: only once one ends");
    }

    #[tokio::test(start_paused = true)]
    async fn the_turn_comes_when_the_entry_in_flight_ends_or_turns_slow() {
        let (changed, mut seen) = watch::channel(0u64);
        let in_flight = InFlight { starts: Arc::default(), changed };
        let t0 = Instant::now();
        in_flight.wait_turn(&mut seen).await;
        assert_eq!(Instant::now(), t0, "an idle pipeline starts at once");
        // One in flight that ends after 5 ms: the next starts then.
        in_flight.begin(1, Instant::now());
        let ender = in_flight.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            ender.end(1);
        });
        in_flight.wait_turn(&mut seen).await;
        assert_eq!(Instant::now() - t0, Duration::from_millis(5));
        // One in flight that never ends: the next starts beside it after SECOND_AFTER.
        let t1 = Instant::now();
        in_flight.begin(2, t1);
        in_flight.wait_turn(&mut seen).await;
        assert_eq!(Instant::now() - t1, SECOND_AFTER);
        // Two in flight: only an end lets a third start.
        in_flight.begin(3, Instant::now());
        let waited = tokio::time::timeout(Duration::from_secs(60), in_flight.wait_turn(&mut seen)).await;
        assert!(waited.is_err(), "a third entry started beside two");
        in_flight.end(2);
        in_flight.wait_turn(&mut seen).await;
    }

    #[test]
    fn an_entry_carries_the_batch_s_encodings_as_its_own() {
        let commands: Vec<Command> = ["alice", "bob \"quoted\" ü"]
            .iter()
            .enumerate()
            .map(|(i, by)| Command {
                now_ms: i as i64,
                op: kairos_scheduler::Op::Hold { job: 7, by: by.to_string() },
            })
            .collect();
        let encoded: Vec<Vec<u8>> = commands.iter().map(encode).collect();
        let made = kairos_consensus::Request::with_encoded(commands.clone(), &encoded);
        let plain = kairos_consensus::Request::new(commands);
        assert_eq!(serde_json::to_vec(&made).unwrap(), serde_json::to_vec(&plain).unwrap());
        let back: kairos_consensus::Request =
            serde_json::from_slice(&serde_json::to_vec(&made).unwrap()).unwrap();
        assert_eq!(back, plain);
    }
}
