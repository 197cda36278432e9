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

use crate::context::write_status;

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

/// The command's encoded size, counted as it is written (no buffer: this runs per submit).
fn encoded_len(cmd: &Command) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, cmd) {
        Ok(()) => count.0,
        Err(_) => 0,
    }
}

async fn run(replica: Replica, mut rx: mpsc::Receiver<(Command, Reply)>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let Some(first) = rx.recv().await else { return };
        let mut bytes = encoded_len(&first.0);
        let mut batch = vec![first];
        while batch.len() < BATCH_COMMANDS_MAX && bytes < BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(item) => {
                    bytes += encoded_len(&item.0);
                    batch.push(item);
                }
                Err(_) => break,
            }
        }
        let replica = replica.clone();
        tokio::spawn(async move {
            let (commands, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
            let count = commands.len();
            match replica.write(commands).await {
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
    fn the_counted_size_is_the_encoded_size() {
        let spec = kairos_scheduler::model::JobSpec::new(
            "job \"quoted\"",
            "alice",
            vec!["echo".into(), "ü".into()],
            2,
        );
        let cmd = Command {
            now_ms: 7,
            op: kairos_scheduler::Op::Submit {
                spec,
                request_id: Some("r-1".into()),
                hold: false,
                limits: None,
            },
        };
        assert_eq!(encoded_len(&cmd), serde_json::to_vec(&cmd).unwrap().len());
    }
}
