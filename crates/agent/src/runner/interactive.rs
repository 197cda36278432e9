//! The runner's side of interactive sessions: an interactive run's terminal, registered as
//! the session `job-<id>-<attempt>` (its output into the run's log and the session's ring;
//! hung up, then stopped, once no session has been attached for its keep-alive), and the runs
//! as sessions read them (`Runs`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_proto::v1 as pb;
use nix::sys::signal::Signal;

use super::{Output, RunKey, Runner};
use crate::interactive::terminal::{Pty, Tee};
use crate::interactive::{terminal_id, RunView, Runs, Session, Sink};
use crate::launch::RunSpec;

/// After the keep-alive's SIGHUP, how long an interactive run has to end before it is killed.
const HANGUP_GRACE: Duration = Duration::from_secs(5);

impl Runner {
    /// Registers `spec`'s terminal as its session and copies what the run writes on it into
    /// `log` (and the session's output).
    pub(super) fn open_terminal(
        &self,
        spec: &RunSpec,
        pty: Pty,
        log: Arc<Mutex<std::fs::File>>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let key = spec.key;
        let pty = Arc::new(pty);
        let keep_alive = spec.interactive.unwrap_or(Duration::from_secs(60));
        let runner = self.clone();
        let on_idle = Box::new(move |s: &Session| {
            tracing::info!(
                job = key.0,
                attempt = key.1,
                keep_alive_s = s.keep_alive.as_secs(),
                "no session attached for the keep-alive: hanging up"
            );
            runner.stop(key, Signal::SIGHUP, HANGUP_GRACE, None);
        });
        let id = (terminal_id(key), key, pb::SessionKind::Attach);
        let session =
            Arc::new(Session::new(id, Sink::Pty(pty.clone()), Some(pty.clone()), keep_alive, on_idle));
        self.sessions.insert(session.clone());
        let tee: Output = Box::new(Tee { pty, ring: session.output.clone() });
        self.copy_outputs(key, vec![tee], log)
    }
}

impl Runs for Runner {
    fn view(&self, key: RunKey) -> Option<RunView> {
        let runs = self.lock();
        let r = runs.get(&key)?;
        Some(RunView {
            user: r.user.clone(),
            submit_ms: r.submit_ms,
            live: r.exit.is_none() && r.pgid.is_some() && !r.main_exited,
            frozen: r.suspended || r.stopping,
            interactive: r.interactive,
            exec: r.exec.clone(),
        })
    }
}
