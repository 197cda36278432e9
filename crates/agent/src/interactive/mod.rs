//! Interactive sessions on this node (`AgentLogService.Session`): an interactive run's own
//! terminal (ATTACH), a new command inside a running run (EXEC), a tunnel to a port a run
//! listens on (FORWARD).
//!
//! ```text
//!  controller ─Session(bidi, node credential)─▶ stream::serve: first message `open` with a
//!    grant (verified: MAC, expiry, job, kind, port; the run live here, its user and submit
//!    time) ─▶ a new session (exec::start, a tunnel) or an existing one (the run's terminal,
//!    `resume`) ─▶ pump: `opened`, output from the offset asked for, input applied once per
//!    sequence number and acknowledged, resize, signals, `exit`
//! ```
//! A session outlives its streams: `Sessions` holds it by id until it has ended and no stream
//! has held it for a while (a closed tunnel: at once), or, not ended, until no stream has held
//! it for its keep-alive
//! (then its `on_idle` ends it: an exec'd command is killed, a run's terminal is hung up by the
//! runner). The runner registers an interactive run's terminal (`terminal`) and tells the
//! sessions when a run ends (`run_ended`); nothing here imports the runner: the runs are read
//! through `Runs`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_proto::v1 as pb;
use tonic::Status;

use crate::decide::RunKey;

pub mod exec;
pub mod forward;
pub mod ring;
pub mod session;
pub mod stream;
pub mod terminal;

pub use exec::ExecContext;
pub use session::{Session, Sink};

/// Most sessions not ended per node (a run's own terminal aside), and per run.
pub const SESSIONS_MAX: usize = 32;
pub const SESSIONS_PER_RUN_MAX: usize = 16;
/// How long an ended session waits with no stream for one to resume and read its end.
const ENDED_LINGER: Duration = Duration::from_secs(30);
/// How often the keep-alive looks at a session.
const KEEPER_POLL: Duration = Duration::from_millis(250);

/// A run as sessions see it.
#[derive(Clone)]
pub struct RunView {
    /// The job's kairos user.
    pub user: String,
    pub submit_ms: i64,
    /// Its main process lives (spawned, not exited).
    pub live: bool,
    /// Suspended (frozen) or being stopped: no command joins it.
    pub frozen: bool,
    pub interactive: bool,
    /// How a command joins it (None until its process is spawned).
    pub exec: Option<Arc<ExecContext>>,
}

/// The node's runs, as the runner shows them to sessions.
pub trait Runs: Send + Sync {
    fn view(&self, key: RunKey) -> Option<RunView>;
}

/// The id of an interactive run's own terminal.
pub fn terminal_id(key: RunKey) -> String {
    format!("job-{}-{}", key.0, key.1)
}

/// A new session id: 128 random bits in hex (`getrandom`), not to be guessed.
pub fn session_id() -> Result<String, Status> {
    let mut bytes = [0u8; 16];
    let mut filled = 0;
    while filled < bytes.len() {
        let rest = &mut bytes[filled..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`.
        let n = unsafe { nix::libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(n) {
            Ok(n) => filled += n,
            Err(_) if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                let e = std::io::Error::last_os_error();
                return Err(Status::internal(format!("a session id: getrandom: {e}")));
            }
        }
    }
    Ok(bytes.iter().fold(String::from("s-"), |mut id, b| {
        id.push_str(&format!("{b:02x}"));
        id
    }))
}

#[derive(Default)]
struct Held {
    by_id: BTreeMap<String, Arc<Session>>,
    /// Slots taken by sessions being started, by run.
    starting: BTreeMap<RunKey, usize>,
}

/// The node's sessions by id.
#[derive(Clone, Default)]
pub struct Sessions {
    held: Arc<Mutex<Held>>,
}

/// A slot taken for one session of a run while it starts (given back when dropped: by then
/// the session is held, or never will be).
pub struct Slot {
    sessions: Sessions,
    run: RunKey,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.sessions.lock();
        if let Some(n) = held.starting.get_mut(&self.run) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.starting.remove(&self.run);
            }
        }
    }
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for one more session of `run` (RESOURCE_EXHAUSTED past `SESSIONS_MAX` on the
    /// node or `SESSIONS_PER_RUN_MAX` for the run, counting sessions not ended and those
    /// starting), taken under the lock that counts them.
    pub fn room(&self, run: RunKey) -> Result<Slot, Status> {
        let mut held = self.lock();
        let open = held.by_id.values().filter(|s| s.kind != pb::SessionKind::Attach && !s.ended());
        let (node, of_run) = open.fold((0, 0), |(n, r), s| (n + 1, r + usize::from(s.run == run)));
        let starting = held.starting.values().sum::<usize>();
        let run_starting = held.starting.get(&run).copied().unwrap_or(0);
        if node + starting >= SESSIONS_MAX {
            return Err(Status::resource_exhausted(format!("{SESSIONS_MAX} sessions on this node already")));
        }
        if of_run + run_starting >= SESSIONS_PER_RUN_MAX {
            return Err(Status::resource_exhausted(format!(
                "{SESSIONS_PER_RUN_MAX} sessions of this job already"
            )));
        }
        *held.starting.entry(run).or_default() += 1;
        Ok(Slot { sessions: self.clone(), run })
    }

    /// Holds `session` by its id and starts its keep-alive.
    pub fn insert(&self, session: Arc<Session>) {
        self.lock().by_id.insert(session.id.clone(), session.clone());
        tokio::spawn(self.clone().keep(session));
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.lock().by_id.get(id).cloned()
    }

    /// The sessions of `key`'s run.
    pub fn of_run(&self, key: RunKey) -> Vec<Arc<Session>> {
        self.lock().by_id.values().filter(|s| s.run == key).cloned().collect()
    }

    /// The run `key` ended (`code`/`signal` as its exit): its terminal session ends as it did;
    /// every other session of it is killed and ends "the job ended".
    pub fn run_ended(&self, key: RunKey, (code, signal): (i32, i32)) {
        for s in self.of_run(key) {
            if s.kind == pb::SessionKind::Attach {
                s.finish(pb::SessionExit { code, signal, reason: String::new() });
            } else {
                s.kill();
                s.job_ended();
                s.output.close();
            }
        }
    }

    /// The keep-alive of one session: ends it once no stream held it for its keep-alive, and
    /// forgets it once it has ended and no stream held it for a while.
    async fn keep(self, session: Arc<Session>) {
        let mut idled = false;
        loop {
            tokio::time::sleep(KEEPER_POLL).await;
            let detached = session.detached_for();
            let ended = session.exit().borrow().is_some();
            if ended && detached.is_some_and(|d| d >= ENDED_LINGER.min(session.keep_alive)) {
                break;
            }
            // A closed tunnel is not resumed: its stream (if any) has what it needs.
            if ended && session.kind == pb::SessionKind::Forward {
                break;
            }
            if !ended && !idled && detached.is_some_and(|d| d >= session.keep_alive) {
                tracing::info!(session = %session.id, job = session.run.0, "no client attached for the keep-alive: the session ends");
                session.idle();
                idled = true;
            }
        }
        let mut held = self.lock();
        if held.by_id.get(&session.id).is_some_and(|s| Arc::ptr_eq(s, &session)) {
            held.by_id.remove(&session.id);
        }
    }
}
