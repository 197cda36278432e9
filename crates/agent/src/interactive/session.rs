//! One session as the agent keeps it between streams: its output (`Ring`), its input (applied
//! once per sequence number, in order), its terminal or process group (resize, signals), how
//! it ended, which stream holds it, and since when none has.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kairos_proto::v1 as pb;
use nix::libc;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tonic::Status;

use super::ring::Ring;
use super::terminal::Pty;
use crate::decide::RunKey;

/// The newest output bytes a session keeps for its streams to resume from.
pub const RING_BYTES: usize = 4 << 20;
/// The signals a client may send a session.
pub const SIGNALS: [i32; 6] =
    [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP, libc::SIGKILL, libc::SIGTSTP];

/// Where a session's input goes.
pub enum Sink {
    Pty(Arc<Pty>),
    /// A pipe to the command's stdin, a tunnel's socket.
    Writer(Box<dyn AsyncWrite + Send + Unpin>),
    /// Input ended (or there is none).
    Closed,
}

struct Input {
    applied: u64,
    sink: Sink,
}

/// Which stream holds a session: each attach takes a new generation; none attached since when.
struct Holder {
    generation: u64,
    detached_since: Option<Instant>,
}

/// A session: an exec'd command, a run's own terminal, or a tunnel.
pub struct Session {
    pub id: String,
    pub run: RunKey,
    pub kind: pb::SessionKind,
    /// Who opened it (its grant's caller): only they resume it (a run's terminal: anyone the
    /// job's grants name).
    pub caller: String,
    pub output: Arc<Ring>,
    pub keep_alive: Duration,
    input: tokio::sync::Mutex<Input>,
    pty: Option<Arc<Pty>>,
    /// The command's process group (exec), for signals without a terminal and the final kill;
    /// cleared before its leader is reaped (the number is never signalled once it may be
    /// reused).
    pgid: Mutex<Option<i32>>,
    exit: watch::Sender<Option<pb::SessionExit>>,
    holder: Mutex<Holder>,
    taken: watch::Sender<u64>,
    /// What the keep-alive does once no stream has held the session for `keep_alive`.
    on_idle: Box<dyn Fn(&Session) + Send + Sync>,
}

impl Session {
    pub fn new(
        (id, run, kind): (String, RunKey, pb::SessionKind),
        sink: Sink,
        pty: Option<Arc<Pty>>,
        keep_alive: Duration,
        on_idle: Box<dyn Fn(&Session) + Send + Sync>,
    ) -> Session {
        Session {
            id,
            run,
            kind,
            caller: String::new(),
            output: Arc::new(Ring::new(RING_BYTES)),
            keep_alive,
            input: tokio::sync::Mutex::new(Input { applied: 0, sink }),
            pty,
            pgid: Mutex::new(None),
            exit: watch::channel(None).0,
            holder: Mutex::new(Holder { generation: 0, detached_since: Some(Instant::now()) }),
            taken: watch::channel(0).0,
            on_idle,
        }
    }

    /// The session as opened by `caller`.
    pub fn with_caller(mut self, caller: &str) -> Session {
        self.caller = caller.to_string();
        self
    }

    /// Whether it has ended.
    pub fn ended(&self) -> bool {
        self.exit.borrow().is_some()
    }

    fn holder(&self) -> std::sync::MutexGuard<'_, Holder> {
        self.holder.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The command's process group, once it is spawned.
    pub fn set_pgid(&self, pgid: i32) {
        *self.pgid.lock().unwrap_or_else(|p| p.into_inner()) = Some(pgid);
    }

    /// `signal` to the command's process group while its leader is not reaped (under the lock
    /// that `leader_exited` clears it under).
    fn signal_group(&self, signal: i32) {
        let pgid = self.pgid.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pgid) = pgid.filter(|p| *p > 1) {
            // SAFETY: kill of a process group whose leader is not reaped, so not reused.
            unsafe { libc::kill(-pgid, signal) };
        }
    }

    /// The command's leader has exited and is about to be reaped: what is left of its process
    /// group is killed, and the group is never signalled again.
    pub fn leader_exited(&self) {
        let mut pgid = self.pgid.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pgid) = pgid.take().filter(|p| *p > 1) {
            // SAFETY: kill of a process group whose leader is not reaped, so not reused.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }

    /// Applies one chunk of input unless its sequence number was applied already; the last
    /// sequence number applied. A gap (a chunk missing before it) is refused.
    pub async fn apply(&self, stdin: pb::SessionStdin) -> Result<u64, Status> {
        let mut input = self.input.lock().await;
        if stdin.seq <= input.applied {
            return Ok(input.applied);
        }
        if stdin.seq != input.applied + 1 {
            return Err(Status::invalid_argument(format!(
                "input {} after {}: a chunk is missing",
                stdin.seq, input.applied
            )));
        }
        let written = match &mut input.sink {
            Sink::Pty(pty) => pty.write_all(&stdin.data).await,
            Sink::Writer(w) => match w.write_all(&stdin.data).await {
                Ok(()) if stdin.eof => w.shutdown().await,
                other => other,
            },
            Sink::Closed => Ok(()),
        };
        input.applied = stdin.seq;
        if stdin.eof && !matches!(input.sink, Sink::Pty(_)) {
            input.sink = Sink::Closed;
        }
        if let Err(e) = written {
            // The command stopped reading (it ended, or closed its stdin): the input is dropped.
            tracing::debug!(session = %self.id, error = %e, "session input dropped");
            input.sink = Sink::Closed;
        }
        Ok(input.applied)
    }

    /// The last input sequence number applied.
    pub async fn applied(&self) -> u64 {
        self.input.lock().await.applied
    }

    /// The client's terminal size (sessions without a terminal ignore it).
    pub fn resize(&self, size: &pb::TerminalSize) {
        if let Some(pty) = &self.pty {
            let clamp = |v: u32| v.min(u32::from(u16::MAX)) as u16;
            if let Err(e) = pty.resize(clamp(size.rows), clamp(size.cols)) {
                tracing::debug!(session = %self.id, error = %e, "resizing a session's terminal");
            }
        }
    }

    /// `signal` for the terminal's foreground process group (else the command's group).
    pub fn signal(&self, signal: i32) -> Result<(), Status> {
        if !SIGNALS.contains(&signal) {
            return Err(Status::invalid_argument(format!(
                "signal {signal}: only SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGKILL and SIGTSTP"
            )));
        }
        match &self.pty {
            Some(pty) => {
                if let Err(e) = pty.signal(signal) {
                    tracing::debug!(session = %self.id, error = %e, "signalling a session's terminal");
                }
            }
            None => self.signal_group(signal),
        }
        Ok(())
    }

    /// SIGKILL to the command's process group (exec), while its leader is not reaped.
    pub fn kill(&self) {
        self.signal_group(libc::SIGKILL);
    }

    /// Records how the session ended (the first word stands).
    pub fn finish(&self, exit: pb::SessionExit) {
        self.exit.send_if_modified(|e| e.is_none() && e.replace(exit).is_none());
    }

    /// The session's run ended: so it says, even where its command was already killed with it.
    pub fn job_ended(&self) {
        self.exit.send_modify(|e| {
            let exit = e.get_or_insert_with(|| pb::SessionExit { code: -1, ..Default::default() });
            if exit.reason.is_empty() {
                exit.reason = "the job ended".into();
            }
        });
    }

    /// How the session ended, when it has.
    pub fn exit(&self) -> watch::Receiver<Option<pb::SessionExit>> {
        self.exit.subscribe()
    }

    /// A stream takes the session over: its generation (an earlier stream sees `taken`
    /// change and ends).
    pub fn attach(&self) -> u64 {
        let generation = {
            let mut holder = self.holder();
            holder.generation += 1;
            holder.detached_since = None;
            holder.generation
        };
        self.taken.send_replace(generation);
        generation
    }

    /// Which generation holds the session (changes at every takeover).
    pub fn taken(&self) -> watch::Receiver<u64> {
        self.taken.subscribe()
    }

    /// The stream of `generation` ends; the keep-alive counts from now unless another holds it.
    pub fn detach(&self, generation: u64) {
        let mut holder = self.holder();
        if holder.generation == generation {
            holder.detached_since = Some(Instant::now());
        }
    }

    /// How long no stream has held the session (None: one holds it).
    pub fn detached_for(&self) -> Option<Duration> {
        self.holder().detached_since.map(|t| t.elapsed())
    }

    /// The keep-alive's action (once).
    pub fn idle(&self) {
        (self.on_idle)(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_whose_leader_exited_is_killed_once_and_never_signalled_after() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        let mut leader = std::process::Command::new("sleep").arg("60").process_group(0).spawn().unwrap();
        let id = ("s-test".to_string(), (1, 0), pb::SessionKind::Exec);
        let s = Session::new(id, Sink::Closed, None, Duration::from_secs(60), Box::new(|_| {}));
        s.set_pgid(leader.id() as i32);
        s.leader_exited();
        assert_eq!(leader.wait().unwrap().signal(), Some(libc::SIGKILL), "the group was killed");
        assert_eq!(*s.pgid.lock().unwrap(), None, "the group is still signalled");
        assert!(s.signal(libc::SIGTERM).is_ok());
        assert!(s.signal(libc::SIGUSR1).is_err(), "a signal not listed");
    }
}
