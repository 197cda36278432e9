//! The node the agent holds: taken over from whatever a previous agent left (its watchdog, its
//! runs, its lease), and kept up while the agent lives (fencing, old job directories, the HPC
//! job mapping).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::audit::ProcessLog;
use crate::cgroup::Cgroups;
use crate::fence::{self, Lease};
use crate::runner::Runner;

/// Why the node could not be taken over.
#[derive(Debug, thiserror::Error)]
pub enum TakeOverError {
    #[error("opening --process-log {path}: {source}")]
    ProcessLog { path: PathBuf, source: std::io::Error },
    #[error("starting the fencing watchdog: {0}")]
    Watchdog(std::io::Error),
}

/// What taking the node over needs to know.
pub struct TakeOver<'a> {
    pub name: &'a str,
    pub state_dir: &'a Path,
    /// `--cgroup-root` (None: the cgroup2 mount).
    pub cgroup_root: Option<&'a Path>,
    /// `--process-log`.
    pub process_log: Option<&'a Path>,
}

/// What the agent holds of its node while it runs.
pub struct Node {
    pub cgroups: Option<Cgroups>,
    pub process_log: ProcessLog,
    pub lease: Lease,
    pub watchdog: std::process::Child,
}

/// Takes the node over from whatever a previous agent left: its watchdog stopped, its runs
/// killed, a new lease (nothing to enforce yet), this agent the jobs' subreaper, and a fencing
/// watchdog of its own.
pub async fn take_over(t: &TakeOver<'_>) -> Result<Node, TakeOverError> {
    // Before anything of the node's is touched: a watchdog left by a previous agent goes first.
    fence::stop_previous_watchdog(t.state_dir);
    let cgroups = detect_cgroups(t.name, t.state_dir, t.cgroup_root);
    // Before taking any work: nothing a previous (crashed) agent started may keep running.
    let process_log = open_process_log(t.process_log, t.name)?;
    let orphans = crate::journal::kill_orphans(t.state_dir, cgroups.as_ref(), &process_log).await;
    if orphans > 0 {
        tracing::warn!(orphans, "killed runs left by a previous agent");
    }
    // A new lease file (a previous agent's record is gone with it): nothing to enforce yet.
    let lease = Lease::new(fence::lease_path(t.state_dir));
    // What a job leaves behind is the agent's to reap, not PID 1's (`reaper`).
    match crate::reaper::become_subreaper() {
        Ok(()) => drop(tokio::spawn(crate::reaper::run())),
        Err(e) => {
            tracing::warn!(error = %e, "cannot become the jobs' child subreaper; their orphans go to PID 1")
        }
    }
    let base = cgroups.as_ref().map(Cgroups::base);
    let watchdog =
        fence::spawn_watchdog(t.state_dir, base, t.process_log, t.name).map_err(TakeOverError::Watchdog)?;
    Ok(Node { cgroups, process_log, lease, watchdog })
}

/// The process log at `path` (none without one).
fn open_process_log(path: Option<&Path>, node: &str) -> Result<ProcessLog, TakeOverError> {
    match path {
        Some(path) => ProcessLog::open(path, node)
            .map_err(|source| TakeOverError::ProcessLog { path: path.to_path_buf(), source }),
        None => Ok(ProcessLog::default()),
    }
}

/// A cgroup per run where the node has cgroups to give; process groups otherwise (said loudly).
fn detect_cgroups(name: &str, state_dir: &Path, root: Option<&Path>) -> Option<Cgroups> {
    match Cgroups::detect(name, state_dir, root) {
        Ok(c) => {
            tracing::info!(base = %c.base().display(), "a cgroup per run");
            Some(c)
        }
        Err(why) => {
            tracing::warn!(
                reason = %why,
                "NO CGROUP PER RUN: falling back to process groups; a job process that leaves its group (setsid, daemonize) escapes stop, kill and fencing"
            );
            None
        }
    }
}

/// The agent's periodic work, as tasks to abort.
pub struct KeptUp {
    /// Fencing and the sweep of old job directories: stopped before the agent stops its runs.
    pub fencing: [tokio::task::AbortHandle; 2],
    /// The HPC job mapping's writer, if asked for.
    pub job_map: Option<tokio::task::AbortHandle>,
}

/// The agent's periodic work: fencing (when the lease lapses, every run is stopped; the
/// watchdog kills what is left at the hard deadline, should this process be unable to), the
/// sweep of job directories older than `retention`, and the HPC job mapping in `job_map`.
pub fn keep_up(runner: &Runner, lease: &Lease, retention: Duration, job_map: Option<PathBuf>) -> KeptUp {
    let fencer = {
        let (runner, lease) = (runner.clone(), lease.clone());
        every(Duration::from_millis(100), move || fence_lapsed(&runner, &lease))
    };
    let sweeper = {
        let runner = runner.clone();
        every(Duration::from_secs(600), move || sweep_job_dirs(&runner, retention))
    };
    let job_map = job_map.map(|dir| {
        let runner = runner.clone();
        every(Duration::from_secs(1), move || {
            if let Err(e) = crate::jobmap::write(&dir, &runner.running_gpus()) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot write the HPC job mapping");
            }
        })
    });
    KeptUp { fencing: [fencer, sweeper], job_map }
}

/// Stops every run once the lease has lapsed.
fn fence_lapsed(runner: &Runner, lease: &Lease) {
    if lease.lapsed() {
        runner.fence(lease.grace());
    }
}

/// Runs `step` every `every`, for the life of the agent.
fn every(every: Duration, mut step: impl FnMut() + Send + 'static) -> tokio::task::AbortHandle {
    let task = tokio::spawn(async move {
        loop {
            step();
            tokio::time::sleep(every).await;
        }
    });
    task.abort_handle()
}

/// Removes job directories untouched for `retention` whose job has no run on this node.
pub fn sweep_job_dirs(runner: &Runner, retention: Duration) {
    let Ok(entries) = std::fs::read_dir(crate::launch::jobs_dir(runner.state_dir())) else { return };
    let live: std::collections::BTreeSet<u64> = runner.running().into_iter().map(|(job, _)| job).collect();
    for e in entries.flatten() {
        let Some(job) = e.file_name().to_str().and_then(crate::launch::job_of_dir_name) else {
            continue;
        };
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > retention);
        if old && !live.contains(&job) {
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => tracing::info!(job, "job directory removed after its retention"),
                Err(err) => tracing::warn!(job, error = %err, "cannot remove an old job directory"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unopenable_process_log_stops_the_take_over_and_none_is_no_log() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir").join("processes.jsonl");
        let err = open_process_log(Some(&missing), "n1").err().expect("a log in a missing directory");
        assert!(err.to_string().contains("--process-log"), "{err}");
        assert!(open_process_log(None, "n1").is_ok());
        assert!(open_process_log(Some(&dir.path().join("p.jsonl")), "n1").is_ok());
    }

    #[tokio::test]
    async fn old_job_directories_are_swept_and_recent_or_unrecognised_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, _rx) = tokio::sync::mpsc::channel(4);
        let runner = Runner::new("n1", dir.path(), tx);
        let jobs = crate::launch::jobs_dir(dir.path());
        let old = crate::launch::job_dir(dir.path(), 7, 1_000);
        let recent = crate::launch::job_dir(dir.path(), 8, 1_000);
        let other = jobs.join("not-a-job");
        for d in [&old, &recent, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        let long_ago = std::time::SystemTime::now() - Duration::from_secs(3 * 3600);
        for d in [&old, &other] {
            std::fs::File::open(d).unwrap().set_modified(long_ago).unwrap();
        }
        sweep_job_dirs(&runner, Duration::from_secs(3600));
        assert!(!old.exists(), "past its retention, no run here: removed");
        assert!(recent.exists() && other.exists());
    }
}
