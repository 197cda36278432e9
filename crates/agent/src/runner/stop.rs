//! Stopping runs: one (its signal, a grace, a kill), all of them when the agent's lease lapses
//! (fencing), all of them at shutdown.

use std::time::Duration;

use nix::sys::signal::Signal;

use super::{RunKey, Runner};

/// How often a stopping run is checked (ended, checkpoint reported).
const STOP_POLL: Duration = Duration::from_millis(100);

impl Runner {
    /// Asks a run to stop: `signal` now to all of it (SIGTERM, or the checkpoint signal before a
    /// preemption), a kill after `grace` unless it has ended. With `then_term` (after a
    /// checkpoint signal), the grace ends early once the job reports its checkpoint, SIGTERM
    /// follows, and the kill only after `then_term` more: work done after the checkpoint is
    /// saved by a job that checkpoints on SIGTERM, not thrown away (as Slurm's KillWait).
    pub(super) fn stop(&self, key: RunKey, signal: Signal, grace: Duration, then_term: Option<Duration>) {
        {
            let mut runs = self.lock();
            let Some(run) = runs.get_mut(&key) else { return };
            if run.exit.is_some() {
                return;
            }
            run.stopping = true;
            tracing::info!(job = key.0, attempt = key.1, %signal, "stopping run");
            run.signal(signal);
            // As Slurm: SIGCONT with it, so a process the job stopped itself handles it too.
            run.signal(Signal::SIGCONT);
            if std::mem::take(&mut run.suspended) {
                // The signal is pending; the process handles it as soon as it is thawed.
                run.freeze(false);
            }
        }
        let runner = self.clone();
        let marker = self.lock().get(&key).map(|r| r.checkpoint_marker.clone()).unwrap_or_default();
        let touched = move || std::fs::metadata(&marker).and_then(|m| m.modified()).ok();
        // A checkpoint is reported by touching the marker: any change from now on counts (file
        // times come from a coarse clock, so a comparison with the time now could miss one).
        let before = touched();
        tokio::spawn(async move {
            let ended = || runner.lock().get(&key).is_none_or(|r| r.exit.is_some());
            let checkpointed = || touched().is_some_and(|t| Some(t) != before);
            let deadline = tokio::time::Instant::now() + grace;
            while tokio::time::Instant::now() < deadline {
                if ended() || (then_term.is_some() && checkpointed()) {
                    break;
                }
                tokio::time::sleep(STOP_POLL).await;
            }
            if let Some(wait) = then_term.filter(|_| !ended()) {
                if let Some(run) = runner.lock().get(&key).filter(|r| r.exit.is_none()) {
                    tracing::info!(job = key.0, attempt = key.1, "grace over: SIGTERM");
                    run.signal(Signal::SIGTERM);
                }
                let deadline = tokio::time::Instant::now() + wait;
                while tokio::time::Instant::now() < deadline && !ended() {
                    tokio::time::sleep(STOP_POLL).await;
                }
            }
            if let Some(run) = runner.lock().get(&key).filter(|r| r.exit.is_none()) {
                run.kill();
            }
        });
    }

    /// Fencing: the agent's lease lapsed, so the leader may soon give this node's jobs to other
    /// nodes. Every run gets its checkpoint signal, is killed after `grace`, and is reported lost.
    pub fn fence(&self, grace: Duration) {
        let keys: Vec<(RunKey, Signal)> = {
            let mut runs = self.lock();
            runs.iter_mut()
                .filter(|(_, r)| r.exit.is_none() && !r.fenced)
                .map(|(k, r)| {
                    r.fenced = true;
                    (*k, r.checkpoint_signal)
                })
                .collect()
        };
        for (key, signal) in keys {
            tracing::warn!(job = key.0, attempt = key.1, "lease lapsed: stopping the run");
            // Fencing keeps its hard deadline: the kill comes at the grace.
            self.stop(key, signal, grace, None);
        }
    }

    /// Stops every run (agent shutdown): SIGTERM, then a kill after `grace`; waits (bounded)
    /// until they are gone.
    pub async fn stop_all(&self, grace: Duration) {
        // Under the runs' lock: a launch either is marked before (and its spawn is killed as soon
        // as the run exists) or does not start.
        {
            let mut runs = self.lock();
            self.closing.store(true, std::sync::atomic::Ordering::SeqCst);
            for run in runs.values_mut().filter(|r| r.exit.is_none()) {
                run.stopping = true;
                run.signal(Signal::SIGTERM);
                run.freeze(false);
            }
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.running().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for run in self.lock().values().filter(|r| r.exit.is_none()) {
            run.kill();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !self.running().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
