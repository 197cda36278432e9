//! Job processes on this node: launch, stop, and report.
//!
//! Each run (job id + attempt) is a real child process in its own process group, with
//! `CUDA_VISIBLE_DEVICES` set to its GPUs and stdout/stderr appended to a per-run log file.
//! Stopping a run signals the whole group (SIGTERM, then SIGKILL after the grace time); when
//! the main process exits, whatever is left of its group is killed too, so no stray child keeps
//! a GPU busy.
//!
//! `reconcile` makes the local runs match the controller's level-triggered assignment set:
//!
//! ```text
//!   assigned, not started, unknown here  ─▶ launch
//!   assigned with kill                   ─▶ stop (or report "lost" if it never ran)
//!   assigned with suspend / without      ─▶ SIGSTOP / SIGCONT the group (once per change)
//!   assigned, started, unknown here      ─▶ report "lost" (never relaunched)
//!   running here, not assigned           ─▶ SIGKILL its group (the controller gave it up)
//!   exited here, still assigned          ─▶ report the exit again
//!   running here, assigned as not started ─▶ report "started" again
//! ```

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_proto::v1 as pb;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::mpsc;

/// A run is a job attempt.
pub type RunKey = (u64, u32);

/// How often a running job's checkpoint marker is looked at.
const CHECKPOINT_POLL: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    Lost,
}

#[derive(Debug)]
struct Run {
    pgid: Option<i32>,
    exit: Option<Exit>,
    stopping: bool,
    /// The group was sent SIGSTOP (and not SIGCONT since).
    suspended: bool,
    lost_message: String,
}

/// The runs of this node and the channel their reports leave through.
#[derive(Clone)]
pub struct Runner {
    node: String,
    state_dir: PathBuf,
    process_log: crate::audit::ProcessLog,
    runs: Arc<Mutex<BTreeMap<RunKey, Run>>>,
    reports: mpsc::Sender<pb::StatusReport>,
}

/// Where a run's log lives.
pub fn log_path(state_dir: &Path, job: u64, attempt: u32) -> PathBuf {
    state_dir.join("jobs").join(job.to_string()).join(format!("attempt-{attempt}.log"))
}

fn signal_group(pgid: i32, signal: Signal) {
    // ESRCH (the group is already gone) is the expected end of a stop.
    let _ = killpg(Pid::from_raw(pgid), signal);
}

/// The live-run journal: one file per running process group, so an agent that crashed and
/// restarted can kill what its predecessor left running before it takes any new work.
fn journal_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("live")
}

fn journal_add(state_dir: &Path, key: RunKey, pgid: i32) {
    let dir = journal_dir(state_dir);
    let start = proc_starttime(pgid).unwrap_or(0);
    let result = std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(dir.join(format!("{}-{}", key.0, key.1)), format!("{pgid} {start}\n")));
    if let Err(e) = result {
        tracing::warn!(error = %e, job = key.0, "cannot journal a live run");
    }
}

fn journal_remove(state_dir: &Path, key: RunKey) {
    let _ = std::fs::remove_file(journal_dir(state_dir).join(format!("{}-{}", key.0, key.1)));
}

/// A process's start time in clock ticks since boot (field 22 of /proc/PID/stat).
fn proc_starttime(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Whether some process of group `pgid` is still running. Zombies do not count: a run
/// orphaned by a crashed agent is reparented to PID 1, which in a container may never reap it,
/// and a zombie holds no GPU (signals to it succeed, so `kill(0)` alone would call it alive).
fn group_alive(pgid: i32) -> bool {
    if killpg(Pid::from_raw(pgid), None).is_err() {
        return false;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else { return true };
    procs.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).any(|pid| {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
        let mut fields = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace()).into_iter().flatten();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
        pgrp == Some(pgid) && !matches!(state, Some("Z") | Some("X"))
    })
}

/// Whether some live process of group `pgid` was started by an agent for `key` (its
/// environment carries that job id and attempt). Jobs run as the agent's user and can write
/// into its state directory, so a journal entry alone must not be enough to kill a group.
fn group_runs(pgid: i32, key: RunKey) -> bool {
    let want_job = format!("KAIROS_JOB_ID={}", key.0).into_bytes();
    let want_attempt = format!("KAIROS_RESTART_COUNT={}", key.1).into_bytes();
    let Ok(procs) = std::fs::read_dir("/proc") else { return false };
    procs.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).any(|pid| {
        let in_group = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')')?.1.split_whitespace().nth(2)?.parse::<i32>().ok())
            == Some(pgid);
        in_group
            && std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
                vars.contains(&want_job.as_slice()) && vars.contains(&want_attempt.as_slice())
            })
    })
}

/// Kills every process group a previous agent journaled as live and waits (bounded) until they
/// are gone. Returns how many groups were killed.
///
/// A group is ours if its leader still has the recorded start time, or if the leader is gone but
/// the group still exists (the kernel does not reuse a pid that is still some group's id).
pub async fn kill_orphans(state_dir: &Path, log: &crate::audit::ProcessLog) -> usize {
    let Ok(entries) = std::fs::read_dir(journal_dir(state_dir)) else { return 0 };
    let mut killed = Vec::new();
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let mut fields = text.split_whitespace();
        let pgid: Option<i32> = fields.next().and_then(|v| v.parse().ok());
        let start: Option<u64> = fields.next().and_then(|v| v.parse().ok());
        // The file is named JOB-ATTEMPT.
        let name = entry.file_name().to_string_lossy().to_string();
        let key: Option<RunKey> =
            name.split_once('-').and_then(|(j, a)| Some((j.parse().ok()?, a.parse().ok()?)));
        if let (Some(pgid), Some(key)) = (pgid.filter(|p| *p > 1), key) {
            // Ours: the leader still has the recorded start time, or (leader gone) a member of
            // the group carries this run's identity.
            let mut ours = false;
            // A process in the middle of an exec shows no environment for a moment: look again.
            for _ in 0..5 {
                ours = proc_starttime(pgid).is_none_or(|now| Some(now) == start) && group_runs(pgid, key);
                if ours || !group_alive(pgid) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if ours && group_alive(pgid) {
                tracing::warn!(pgid, file = %entry.path().display(), "killing a run left by a previous agent");
                signal_group(pgid, Signal::SIGKILL);
                killed.push((pgid, key));
            } else if !group_alive(pgid) {
                // It ended while no agent watched: its end is only known to be before now.
                log.exit(key.0, key.1, "ended unwatched");
            }
        }
        let _ = std::fs::remove_file(entry.path());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while killed.iter().any(|(p, _)| group_alive(*p)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (pgid, key) in &killed {
        if !group_alive(*pgid) {
            log.exit(key.0, key.1, "orphan killed");
        }
    }
    killed.len()
}

impl Runner {
    pub fn new(node: &str, state_dir: &Path, reports: mpsc::Sender<pb::StatusReport>) -> Self {
        Runner {
            node: node.to_string(),
            state_dir: state_dir.to_path_buf(),
            process_log: Default::default(),
            runs: Arc::default(),
            reports,
        }
    }

    /// Records every process start and exit in `log`.
    pub fn with_process_log(mut self, log: crate::audit::ProcessLog) -> Self {
        self.process_log = log;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RunKey, Run>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Runs whose process is alive, for heartbeats.
    pub fn running(&self) -> Vec<RunKey> {
        self.lock().iter().filter(|(_, r)| r.exit.is_none()).map(|(k, _)| *k).collect()
    }

    /// Whether `key` is known here and has finished (or is not known at all).
    pub fn finished(&self, key: RunKey) -> bool {
        self.lock().get(&key).is_none_or(|r| r.exit.is_some())
    }

    fn report(&self, key: RunKey, exit: Option<Exit>, message: String) {
        let (status, exit_code, signal) = match exit {
            None => (pb::RunStatus::Started, 0, 0),
            Some(Exit::Code(c)) => (pb::RunStatus::Exited, c, 0),
            Some(Exit::Signal(s)) => (pb::RunStatus::Exited, 0, s),
            Some(Exit::Lost) => (pb::RunStatus::Lost, 0, 0),
        };
        let report = pb::StatusReport {
            node_id: self.node.clone(),
            job_id: key.0,
            attempt: key.1,
            status: status as i32,
            exit_code,
            signal,
            message,
        };
        if let Err(mpsc::error::TrySendError::Full(report)) = self.reports.try_send(report) {
            let tx = self.reports.clone();
            tokio::spawn(async move {
                let _ = tx.send(report).await;
            });
        }
    }

    /// Makes the local runs match the controller's assignment set.
    pub fn reconcile(&self, set: &pb::AssignmentSet) {
        let assigned: BTreeMap<RunKey, &pb::Assignment> =
            set.runs.iter().map(|a| ((a.job_id, a.attempt), a)).collect();
        let mut launch = Vec::new();
        let mut stop = Vec::new();
        let mut reports = Vec::new();
        {
            let mut runs = self.lock();
            for (key, a) in &assigned {
                // Pause or continue first, so a preemptor launched below never shares a GPU
                // with a process that still computes (a stopped run is continued by `stop`,
                // after its stop signal is queued).
                if let Some(run) = runs.get_mut(key).filter(|r| r.exit.is_none() && !a.kill) {
                    if a.suspend != run.suspended {
                        let suspend = a.suspend;
                        if let Some(pgid) = run.pgid {
                            let signal = if suspend { Signal::SIGSTOP } else { Signal::SIGCONT };
                            tracing::info!(job = key.0, attempt = key.1, %signal, "suspend state changes");
                            signal_group(pgid, signal);
                        }
                        run.suspended = suspend;
                    }
                }
                match runs.get(key) {
                    Some(run) => match run.exit {
                        Some(exit) => reports.push((*key, Some(exit), run.lost_message.clone())),
                        None if a.kill && !run.stopping => {
                            stop.push((*key, a.kill_grace_s, a.kill_signal.clone()))
                        }
                        // Our "started" report was lost (e.g. in a failover): say it again.
                        None if !a.started => reports.push((*key, None, String::new())),
                        None => {}
                    },
                    None if a.kill => {
                        reports.push((*key, Some(Exit::Lost), "stopped before it started".into()))
                    }
                    None if a.started => reports.push((
                        *key,
                        Some(Exit::Lost),
                        format!("node \"{}\" has no process for this run (agent restarted?)", self.node),
                    )),
                    None => launch.push((*a).clone()),
                }
            }
            let mut forget = Vec::new();
            for (key, run) in runs.iter_mut() {
                if assigned.contains_key(key) {
                    continue;
                }
                match (run.exit, run.pgid) {
                    (None, Some(pgid)) => {
                        tracing::warn!(
                            job = key.0,
                            attempt = key.1,
                            "killing a run the controller no longer assigns"
                        );
                        signal_group(pgid, Signal::SIGKILL);
                    }
                    _ => forget.push(*key),
                }
            }
            for key in forget {
                runs.remove(&key);
            }
        }
        for (key, exit, message) in reports {
            self.report(key, exit, message);
        }
        for (key, grace, signal) in stop {
            let signal = signal.parse::<Signal>().unwrap_or(Signal::SIGTERM);
            self.stop(key, signal, Duration::from_secs(u64::from(grace)));
        }
        for a in launch {
            self.launch(&a);
        }
    }

    /// Starts a run. Failures to start are reported as a lost run with the reason.
    fn launch(&self, a: &pb::Assignment) {
        let key = (a.job_id, a.attempt);
        let path = log_path(&self.state_dir, a.job_id, a.attempt);
        let job_dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| self.state_dir.clone());
        let checkpoint_dir = job_dir.join("checkpoint");
        // Logged before the spawn: the logged interval must cover the process's life.
        self.process_log.start(a.job_id, a.attempt, &a.gpu_ids, None);
        let spawned = (|| -> std::io::Result<tokio::process::Child> {
            std::fs::create_dir_all(&checkpoint_dir)?;
            let log = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
            let gpus: Vec<String> = a.gpu_ids.iter().map(u32::to_string).collect();
            let program = a.argv.first().ok_or_else(|| std::io::Error::other("empty command"))?;
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(&a.argv[1..])
                .envs(&a.env)
                .env("KAIROS_JOB_ID", a.job_id.to_string())
                .env("KAIROS_RESTART_COUNT", a.attempt.to_string())
                .env("KAIROS_NODE", &self.node)
                // Survives attempts (on this node): where the job keeps checkpoints to resume from.
                .env("KAIROS_CHECKPOINT_DIR", &checkpoint_dir)
                .env("CUDA_VISIBLE_DEVICES", gpus.join(","))
                // An elastic job's GPU count changes between attempts.
                .env("KAIROS_GPUS", gpus.len().to_string())
                .env(
                    "KAIROS_CHECKPOINT_SIGNAL",
                    if a.checkpoint_signal.is_empty() { "SIGUSR1" } else { a.checkpoint_signal.as_str() },
                )
                // torchrun-compatible gang environment (one task per node).
                .env("RANK", a.rank.to_string())
                .env("WORLD_SIZE", a.world_size.max(1).to_string())
                .env("LOCAL_RANK", "0")
                .env("LOCAL_WORLD_SIZE", "1")
                .env(
                    "MASTER_ADDR",
                    if a.master_addr.is_empty() { "127.0.0.1" } else { a.master_addr.as_str() },
                )
                .env("MASTER_PORT", a.master_port.to_string())
                .current_dir(if a.workdir.is_empty() { job_dir.as_path() } else { Path::new(&a.workdir) })
                .stdin(std::process::Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0)
                .kill_on_drop(false);
            cmd.spawn()
        })();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let message = format!("starting {:?}: {e}", a.argv.first().cloned().unwrap_or_default());
                tracing::warn!(job = a.job_id, %message, "launch failed");
                self.process_log.exit(a.job_id, a.attempt, "not started");
                let _ = std::fs::write(&path, format!("kairos-agent: {message}\n"));
                self.lock().insert(
                    key,
                    Run {
                        pgid: None,
                        exit: Some(Exit::Lost),
                        stopping: false,
                        suspended: false,
                        lost_message: message.clone(),
                    },
                );
                self.report(key, Some(Exit::Lost), message);
                return;
            }
        };
        let pgid = child.id().map(|p| p as i32);
        tracing::info!(job = a.job_id, attempt = a.attempt, ?pgid, gpus = ?a.gpu_ids, "run started");
        self.lock().insert(
            key,
            Run { pgid, exit: None, stopping: false, suspended: false, lost_message: String::new() },
        );
        if let Some(pgid) = pgid {
            journal_add(&self.state_dir, key, pgid);
        }
        self.report(key, None, String::new());
        self.watch_checkpoints(key, checkpoint_dir.join(".kairos-checkpoint"));
        let runner = self.clone();
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => match (status.code(), status.signal()) {
                    (Some(code), _) => Exit::Code(code),
                    (None, Some(sig)) => Exit::Signal(sig),
                    (None, None) => Exit::Lost,
                },
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for a run");
                    Exit::Lost
                }
            };
            if let Some(pgid) = pgid {
                // The main process is gone: nothing of its group may outlive it.
                signal_group(pgid, Signal::SIGKILL);
            }
            tracing::info!(job = key.0, attempt = key.1, ?exit, "run exited");
            let how = match exit {
                Exit::Code(c) => format!("exit {c}"),
                Exit::Signal(s) => format!("signal {s}"),
                Exit::Lost => "lost".to_string(),
            };
            runner.process_log.exit(key.0, key.1, &how);
            journal_remove(runner.state_dir(), key);
            if let Some(run) = runner.lock().get_mut(&key) {
                run.exit = Some(exit);
            }
            runner.report(key, Some(exit), String::new());
        });
    }

    /// Reports each new checkpoint the run announces by touching `marker`, while it runs.
    fn watch_checkpoints(&self, key: RunKey, marker: PathBuf) {
        let runner = self.clone();
        let launched = std::time::SystemTime::now();
        tokio::spawn(async move {
            let mut seen = launched;
            while !runner.finished(key) {
                tokio::time::sleep(CHECKPOINT_POLL).await;
                let Ok(modified) = std::fs::metadata(&marker).and_then(|m| m.modified()) else { continue };
                if modified > seen {
                    seen = modified;
                    let report = pb::StatusReport {
                        node_id: runner.node.clone(),
                        job_id: key.0,
                        attempt: key.1,
                        status: pb::RunStatus::Checkpointed as i32,
                        exit_code: 0,
                        signal: 0,
                        message: String::new(),
                    };
                    let _ = runner.reports.send(report).await;
                }
            }
        });
    }

    /// Asks a run's process group to stop: `signal` now (SIGTERM, or SIGUSR1 to checkpoint
    /// before a preemption), SIGKILL after `grace` unless it has exited.
    fn stop(&self, key: RunKey, signal: Signal, grace: Duration) {
        let (pgid, suspended) = {
            let mut runs = self.lock();
            let Some(run) = runs.get_mut(&key) else { return };
            run.stopping = true;
            (run.pgid, std::mem::take(&mut run.suspended))
        };
        let Some(pgid) = pgid else { return };
        tracing::info!(job = key.0, attempt = key.1, %signal, "stopping run");
        signal_group(pgid, signal);
        if suspended {
            // The signal is pending; the process handles it as soon as it continues.
            signal_group(pgid, Signal::SIGCONT);
        }
        let runner = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if !runner.finished(key) {
                signal_group(pgid, Signal::SIGKILL);
            }
        });
    }

    /// Stops every run (agent shutdown): SIGTERM, then SIGKILL after `grace`.
    pub async fn stop_all(&self, grace: Duration) {
        let groups: Vec<i32> =
            self.lock().values().filter(|r| r.exit.is_none()).filter_map(|r| r.pgid).collect();
        for pgid in &groups {
            signal_group(*pgid, Signal::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.running().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for pgid in &groups {
            signal_group(*pgid, Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(job: u64, argv: &[&str], started: bool, kill: bool) -> pb::Assignment {
        pb::Assignment {
            job_id: job,
            attempt: 0,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: Default::default(),
            workdir: String::new(),
            gpu_ids: vec![3, 5],
            started,
            kill,
            kill_grace_s: 1,
            rank: 0,
            world_size: 1,
            master_addr: String::new(),
            master_port: 29500,
            kill_signal: "SIGTERM".into(),
            suspend: false,
            checkpoint_signal: "SIGUSR1".into(),
        }
    }

    async fn next(rx: &mut mpsc::Receiver<pb::StatusReport>) -> pb::StatusReport {
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("a report in time")
            .expect("open")
    }

    fn set(runs: Vec<pb::Assignment>) -> pb::AssignmentSet {
        pb::AssignmentSet { runs, applied_index: 1 }
    }

    #[tokio::test]
    async fn launches_once_reports_exit_and_never_relaunches() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let runner = Runner::new("n1", dir.path(), tx);
        let a =
            assignment(7, &["sh", "-c", "echo $CUDA_VISIBLE_DEVICES $KAIROS_JOB_ID; exit 4"], false, false);
        runner.reconcile(&set(vec![a.clone()]));
        let started = next(&mut rx).await;
        assert_eq!((started.job_id, started.status), (7, pb::RunStatus::Started as i32));
        let exited = next(&mut rx).await;
        assert_eq!((exited.status, exited.exit_code), (pb::RunStatus::Exited as i32, 4));
        let log = std::fs::read_to_string(log_path(dir.path(), 7, 0)).unwrap();
        assert_eq!(log, "3,5 7\n");
        // The same set again (the controller has not applied the exit yet): the exit is
        // reported again, and the run is not launched a second time.
        runner.reconcile(&set(vec![a]));
        let again = next(&mut rx).await;
        assert_eq!((again.status, again.exit_code), (pb::RunStatus::Exited as i32, 4));
        assert_eq!(std::fs::read_to_string(log_path(dir.path(), 7, 0)).unwrap(), "3,5 7\n");
    }

    #[tokio::test]
    async fn a_started_run_this_agent_lacks_is_lost_not_relaunched() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let runner = Runner::new("n1", dir.path(), tx);
        runner.reconcile(&set(vec![assignment(9, &["true"], true, false)]));
        let r = next(&mut rx).await;
        assert_eq!((r.job_id, r.status), (9, pb::RunStatus::Lost as i32));
        assert!(!log_path(dir.path(), 9, 0).exists(), "the run was launched");
    }

    #[tokio::test]
    async fn kill_stops_the_group_and_unassigned_runs_are_killed() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let runner = Runner::new("n1", dir.path(), tx);
        let a = assignment(1, &["sleep", "300"], false, false);
        let b = assignment(2, &["sleep", "300"], false, false);
        runner.reconcile(&set(vec![a.clone(), b]));
        next(&mut rx).await;
        next(&mut rx).await;
        assert_eq!(runner.running().len(), 2);
        // Job 1 is to be killed; job 2 is no longer assigned at all.
        runner.reconcile(&set(vec![pb::Assignment { kill: true, ..a }]));
        let mut exits = [next(&mut rx).await, next(&mut rx).await];
        exits.sort_by_key(|r| r.job_id);
        assert_eq!(exits.iter().map(|r| (r.job_id, r.signal)).collect::<Vec<_>>(), vec![(1, 15), (2, 9)]);
        assert!(runner.running().is_empty());
    }

    #[tokio::test]
    async fn a_run_that_ended_unreaped_is_logged_as_ended_when_the_agent_restarts() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        // A process that exits and stays a zombie (nobody reaps it), as an orphan under a
        // PID 1 that never reaps would.
        let mut child = std::process::Command::new("true").process_group(0).spawn().unwrap();
        let pgid = child.id() as i32;
        std::fs::create_dir_all(journal_dir(dir.path())).unwrap();
        std::fs::write(journal_dir(dir.path()).join("9-2"), format!("{pgid} 0\n")).unwrap();
        let zombie = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            std::fs::read_to_string(format!("/proc/{pgid}/stat")).is_ok_and(|s| s.contains(") Z "))
        });
        assert!(zombie, "the child did not become a zombie");
        assert!(!group_alive(pgid), "a zombie counted as a live run");
        let path = dir.path().join("processes.jsonl");
        let log = crate::audit::ProcessLog::open(&path, "n1").unwrap();
        assert_eq!(kill_orphans(dir.path(), &log).await, 0);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""job":9,"attempt":2"#) && text.contains("ended unwatched"), "{text}");
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn a_restarted_agent_kills_the_runs_its_predecessor_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let runner = Runner::new("n1", dir.path(), tx);
        runner.reconcile(&set(vec![assignment(
            4,
            &["sh", "-c", "sleep 300 & exec sleep 300"],
            false,
            false,
        )]));
        next(&mut rx).await;
        let pgid = {
            let runs = runner.lock();
            runs[&(4, 0)].pgid.unwrap()
        };
        assert!(group_alive(pgid));
        // The agent "crashes": its runner is gone but the processes live on.
        drop(runner);
        assert_eq!(kill_orphans(dir.path(), &Default::default()).await, 1);
        assert!(!group_alive(pgid), "the orphaned group survived");
        assert_eq!(kill_orphans(dir.path(), &Default::default()).await, 0, "the journal was cleared");
    }

    #[tokio::test]
    async fn a_planted_journal_entry_cannot_kill_a_foreign_group() {
        let dir = tempfile::tempdir().unwrap();
        // A foreign group whose leader is gone and whose survivor is not a kairos run.
        use std::os::unix::process::CommandExt;
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 300 >/dev/null 2>&1 & echo $!"])
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = leader.id() as i32;
        let _ = leader.wait();
        assert!(group_alive(pgid));
        // A job (same uid as the agent) plants a journal entry naming it.
        std::fs::create_dir_all(journal_dir(dir.path())).unwrap();
        std::fs::write(journal_dir(dir.path()).join("7-0"), format!("{pgid} 0\n")).unwrap();
        assert_eq!(kill_orphans(dir.path(), &Default::default()).await, 0);
        assert!(group_alive(pgid), "a foreign group was killed");
        signal_group(pgid, Signal::SIGKILL);
    }

    #[tokio::test]
    async fn a_touched_checkpoint_marker_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let runner = Runner::new("n1", dir.path(), tx);
        let script = "sleep 0.7; touch $KAIROS_CHECKPOINT_DIR/.kairos-checkpoint; sleep 300";
        runner.reconcile(&set(vec![assignment(5, &["sh", "-c", script], false, false)]));
        assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
        let r = next(&mut rx).await;
        assert_eq!((r.job_id, r.status), (5, pb::RunStatus::Checkpointed as i32));
        runner.stop_all(Duration::from_secs(1)).await;
    }

    /// The scheduling state of process `pid` ('T' = stopped), from /proc.
    fn proc_state(pid: i32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).unwrap_or('?')
    }

    /// Waits (bounded, generously: a loaded machine may keep a process in D state a while)
    /// until `pid` is stopped, or running/sleeping.
    async fn wait_for_state(pid: i32, stopped: bool) {
        for _ in 0..600 {
            let state = proc_state(pid);
            if (stopped && state == 'T') || (!stopped && matches!(state, 'S' | 'R')) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("process {pid} is in state {} (wanted stopped = {stopped})", proc_state(pid));
    }

    #[tokio::test]
    async fn suspend_stops_the_group_resume_continues_it_and_a_kill_still_lands() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let runner = Runner::new("n1", dir.path(), tx);
        let a = assignment(6, &["sh", "-c", "exec sleep 300"], false, false);
        runner.reconcile(&set(vec![a.clone()]));
        assert_eq!(next(&mut rx).await.status, pb::RunStatus::Started as i32);
        let pid = runner.lock()[&(6, 0)].pgid.unwrap();
        wait_for_state(pid, false).await;
        let suspended = pb::Assignment { started: true, suspend: true, ..a.clone() };
        runner.reconcile(&set(vec![suspended.clone()]));
        wait_for_state(pid, true).await;
        runner.reconcile(&set(vec![pb::Assignment { suspend: false, ..suspended.clone() }]));
        wait_for_state(pid, false).await;
        // Cancelled while suspended: the stop signal is delivered (continued after it), not
        // left pending until the SIGKILL after the grace.
        runner.reconcile(&set(vec![suspended.clone()]));
        wait_for_state(pid, true).await;
        let killed = pb::Assignment { kill: true, kill_grace_s: 30, ..suspended };
        runner.reconcile(&set(vec![killed]));
        let r = next(&mut rx).await;
        assert_eq!((r.job_id, r.status, r.signal), (6, pb::RunStatus::Exited as i32, 15));
    }

    #[tokio::test]
    async fn a_command_that_cannot_start_is_reported_lost_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let runner = Runner::new("n1", dir.path(), tx);
        runner.reconcile(&set(vec![assignment(3, &["/no/such/program"], false, false)]));
        let r = next(&mut rx).await;
        assert_eq!(r.status, pb::RunStatus::Lost as i32);
        assert!(r.message.contains("/no/such/program"), "{}", r.message);
    }
}
