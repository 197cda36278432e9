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
//! has held it for a while, or, not ended, until no stream has held it for its keep-alive
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

/// Most sessions per node (a run's own terminal aside).
pub const SESSIONS_MAX: usize = 32;
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

/// The node's sessions by id.
#[derive(Clone, Default)]
pub struct Sessions {
    by_id: Arc<Mutex<BTreeMap<String, Arc<Session>>>>,
    next: Arc<std::sync::atomic::AtomicU64>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Session>>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new id for a session of `key`.
    pub fn new_id(&self, key: RunKey) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nonce = crate::usage::now_ms();
        format!("s-{}-{}-{nonce:x}-{n}", key.0, key.1)
    }

    /// Whether one more session may start (RESOURCE_EXHAUSTED past `SESSIONS_MAX`).
    pub fn room(&self) -> Result<(), Status> {
        let n = self.lock().values().filter(|s| s.kind != pb::SessionKind::Attach).count();
        match n < SESSIONS_MAX {
            true => Ok(()),
            false => Err(Status::resource_exhausted(format!("{SESSIONS_MAX} sessions on this node already"))),
        }
    }

    /// Holds `session` by its id and starts its keep-alive.
    pub fn insert(&self, session: Arc<Session>) {
        self.lock().insert(session.id.clone(), session.clone());
        tokio::spawn(self.clone().keep(session));
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.lock().get(id).cloned()
    }

    /// The sessions of `key`'s run.
    pub fn of_run(&self, key: RunKey) -> Vec<Arc<Session>> {
        self.lock().values().filter(|s| s.run == key).cloned().collect()
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
            if !ended && !idled && detached.is_some_and(|d| d >= session.keep_alive) {
                tracing::info!(session = %session.id, job = session.run.0, "no client attached for the keep-alive: the session ends");
                session.idle();
                idled = true;
            }
        }
        let mut all = self.lock();
        if all.get(&session.id).is_some_and(|s| Arc::ptr_eq(s, &session)) {
            all.remove(&session.id);
        }
    }
}
