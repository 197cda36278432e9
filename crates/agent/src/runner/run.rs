//! A run as the runner holds it (its process group, cgroup, GPUs, how it ended), the
//! signals that reach all of it, and the runs as `decide` reads them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use nix::sys::signal::Signal;

use crate::cgroup::RunCgroup;
use crate::decide::{Local, RunKey};
use crate::journal::signal_group;
use crate::launch::RunSpec;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    Lost,
}

impl Exit {
    /// As a session's exit says it: the code (-1 for a signal or a lost run) and the signal.
    pub fn code_and_signal(self) -> (i32, i32) {
        match self {
            Exit::Code(c) => (c, 0),
            Exit::Signal(s) => (-1, s),
            Exit::Lost => (-1, 0),
        }
    }
}

#[derive(Debug)]
pub(super) struct Run {
    pub(super) pgid: Option<i32>,
    pub(super) cgroup: Option<RunCgroup>,
    pub(super) gpus: Vec<u32>,
    /// A fraction of its one GPU, in thousandths (0: whole GPUs).
    pub(super) milli: u32,
    pub(super) checkpoint_signal: Signal,
    pub(super) exit: Option<Exit>,
    /// Its main process was reaped (the run may not have ended: what is left is killed).
    pub(super) main_exited: bool,
    pub(super) stopping: bool,
    /// Stopped because the agent's lease lapsed: reported lost, so the job is requeued.
    pub(super) fenced: bool,
    /// The run was frozen (and not thawed since).
    pub(super) suspended: bool,
    pub(super) lost_message: String,
    /// Where the run's job announces checkpoints (`<job dir>/checkpoint/.kairos-checkpoint`).
    pub(super) checkpoint_marker: PathBuf,
    /// The cores granted to it (empty: it asked for none).
    pub(super) cores: Vec<u32>,
    /// Its container image, kept in the cache while the run lives.
    pub(super) _image: Option<Arc<crate::image::Image>>,
    /// Its kairos user and its job's submit time (what a session grant names).
    pub(super) user: String,
    pub(super) submit_ms: i64,
    pub(super) interactive: bool,
    /// How a command joins it (once spawned).
    pub(super) exec: Option<Arc<crate::interactive::ExecContext>>,
}

impl Run {
    /// A run chosen for launch whose process is not spawned yet: it holds its GPUs and cores.
    pub(super) fn launching(spec: &RunSpec) -> Run {
        Run {
            pgid: None,
            cgroup: None,
            gpus: spec.gpus.clone(),
            milli: spec.milli,
            checkpoint_signal: spec.checkpoint_signal,
            exit: None,
            main_exited: false,
            stopping: false,
            fenced: false,
            suspended: false,
            lost_message: String::new(),
            checkpoint_marker: spec.files.checkpoint_marker(),
            cores: spec.limits.cores.clone(),
            _image: None,
            user: spec.user.clone(),
            submit_ms: spec.submit_ms,
            interactive: spec.interactive.is_some(),
            exec: None,
        }
    }

    /// A run that could not start: lost, with the reason.
    pub(super) fn failed(message: String) -> Run {
        Run {
            pgid: None,
            cgroup: None,
            gpus: Vec::new(),
            milli: 0,
            checkpoint_signal: Signal::SIGTERM,
            exit: Some(Exit::Lost),
            main_exited: false,
            stopping: false,
            fenced: false,
            suspended: false,
            lost_message: message,
            checkpoint_marker: PathBuf::new(),
            cores: Vec::new(),
            _image: None,
            user: String::new(),
            submit_ms: 0,
            interactive: false,
            exec: None,
        }
    }

    /// The run's process group while its leader (the main process) is not reaped: after, the
    /// number may be reused, and what is left of the run is `wait_gone`'s.
    fn group(&self) -> Option<i32> {
        self.pgid.filter(|_| !self.main_exited)
    }

    /// SIGKILL to every process of the run.
    pub(super) fn kill(&self) {
        match (&self.cgroup, self.group()) {
            (Some(cg), pgid) => {
                cg.kill();
                if let Some(pgid) = pgid {
                    signal_group(pgid, Signal::SIGKILL);
                }
            }
            (None, Some(pgid)) => signal_group(pgid, Signal::SIGKILL),
            (None, None) => {}
        }
    }

    /// `signal` to every process of the run.
    pub(super) fn signal(&self, signal: Signal) {
        match (&self.cgroup, self.group()) {
            (Some(cg), _) => cg.signal(signal),
            (None, Some(pgid)) => signal_group(pgid, signal),
            (None, None) => {}
        }
    }

    pub(super) fn freeze(&self, frozen: bool) {
        match (&self.cgroup, self.group()) {
            (Some(cg), _) => cg.freeze(frozen),
            (None, Some(pgid)) => signal_group(pgid, if frozen { Signal::SIGSTOP } else { Signal::SIGCONT }),
            (None, None) => {}
        }
    }
}

/// The node's runs as `decide` reads them.
pub(super) fn local_of(runs: &BTreeMap<RunKey, Run>) -> BTreeMap<RunKey, Local> {
    runs.iter()
        .map(|(key, r)| {
            let local = Local {
                gpus: r.gpus.clone(),
                milli: r.milli,
                spawned: r.pgid.is_some() || r.cgroup.is_some(),
                ended: r.exit.is_some(),
                stopping: r.stopping,
                suspended: r.suspended,
            };
            (*key, local)
        })
        .collect()
}
