//! Write batching (group commit): concurrent commands share one Raft entry, so one fsync on a
//! quorum serves many clients. Each caller still gets its own outcome.
//!
//! ```text
//!   write(cmd) ─▶ queue (bounded) ─▶ [up to BATCH_COMMANDS_MAX commands] ─▶ Replica::write
//!        ▲                                                                       │
//!        └──────────────── its own Outcome (or the batch's error) ◀──────────────┘
//! ```
//!
//! No artificial delay: while up to `IN_FLIGHT_MAX` entries are being committed, new commands
//! queue up and form the next batch, so batches grow exactly when the log is the bottleneck.

use std::sync::Arc;

use kairos_consensus::Replica;
use kairos_scheduler::{Command, Outcome};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tonic::Status;

use crate::status::write_status;

/// Most commands in one log entry.
pub const BATCH_COMMANDS_MAX: usize = 512;
/// Most bytes of commands (as encoded) in one log entry, so an entry replicates within a
/// heartbeat interval (a larger single command goes alone).
pub const BATCH_BYTES_MAX: usize = 256 * 1024;
/// Most entries being committed at once. Two, not one: one in flight gave fuller entries and
/// ~10 % more submits/s under the bench's load, but an entry that cannot commit (quorum lost)
/// then holds every later command for its whole write timeout before they even start theirs —
/// a submit answered after 10 s instead of 5 (e2e
/// `follower_loss_is_invisible_and_losing_quorum_stops_writes_but_not_reads`).
const IN_FLIGHT_MAX: usize = 2;
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

async fn run(replica: Replica, mut rx: mpsc::Receiver<(Command, Reply)>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
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
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_carries_the_batch_s_encodings_as_its_own() {
        let commands: Vec<Command> = ["alice", "bob \"quoted\" ü"]
            .iter()
            .enumerate()
            .map(|(i, by)| Command {
                skipped_ms: 0,
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
