//! The live-run journal: one file per running process group under `<state dir>/live`, so an
//! agent that crashed and restarted (and the fencing watchdog, a process of its own) can find
//! and kill what runs — the run cgroups, and the journaled groups that are still ours — before
//! any new work is taken.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::cgroup::Cgroups;
use crate::decide::RunKey;

pub(crate) fn signal_group(pgid: i32, signal: Signal) {
    // ESRCH (the group is already gone) is the expected end of a stop.
    let _ = killpg(Pid::from_raw(pgid), signal);
}

/// The live-run journal: one file per running process group, so an agent that crashed and
/// restarted can kill what its predecessor left running before it takes any new work.
pub(crate) fn journal_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("live")
}

pub(crate) fn journal_add(state_dir: &Path, key: RunKey, pgid: i32) {
    let dir = journal_dir(state_dir);
    let start = proc_starttime(pgid).unwrap_or(0);
    let result = std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(dir.join(format!("{}-{}", key.0, key.1)), format!("{pgid} {start}\n")));
    if let Err(e) = result {
        tracing::warn!(error = %e, job = key.0, "cannot journal a live run");
    }
}

pub(crate) fn journal_remove(state_dir: &Path, key: RunKey) {
    let path = journal_dir(state_dir).join(format!("{}-{}", key.0, key.1));
    if let Err(e) = std::fs::remove_file(&path) {
        // A run that never got its process group journaled has no entry.
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), error = %e, "cannot remove a live-run journal entry");
        }
    }
}

/// A process's start time in clock ticks since boot (field 22 of /proc/PID/stat).
fn proc_starttime(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Whether some process of group `pgid` is still running. Zombies do not count: a run
/// orphaned by a crashed agent is reparented to PID 1, which in a container may never reap it,
/// and a zombie holds no GPU (signals to it succeed, so `kill(0)` alone would call it alive).
pub(crate) fn group_alive(pgid: i32) -> bool {
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
/// environment carries that job id and attempt). In `--run-as agent` mode jobs run as the
/// agent's user and can write into its state directory, so a journal entry alone must not be
/// enough to kill a group.
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

/// The journaled groups that are still ours: (run, pgid). A group is ours if its leader still
/// has the recorded start time, or if the leader is gone but a member carries the run's
/// identity (the kernel does not reuse a pid that is still some group's id).
fn journaled_groups(state_dir: &Path) -> Vec<(RunKey, i32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(journal_dir(state_dir)) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let mut fields = text.split_whitespace();
        let pgid: Option<i32> = fields.next().and_then(|v| v.parse().ok());
        // The file is named JOB-ATTEMPT.
        let name = entry.file_name().to_string_lossy().to_string();
        let key: Option<RunKey> =
            name.split_once('-').and_then(|(j, a)| Some((j.parse().ok()?, a.parse().ok()?)));
        if let (Some(pgid), Some(key)) = (pgid.filter(|p| *p > 1), key) {
            out.push((key, pgid, entry.path()));
        }
    }
    out
}

fn journaled_start(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.split_whitespace().nth(1)?.parse().ok()
}

fn group_is_ours(pgid: i32, key: RunKey, journal: &Path) -> bool {
    let start = journaled_start(journal);
    proc_starttime(pgid).is_none_or(|now| Some(now) == start) && group_runs(pgid, key)
}

/// SIGKILL to every run this agent's state dir knows of — run cgroups, and journaled process
/// groups that are still ours — without waiting. The watchdog's fence; returns the runs hit.
pub fn kill_every_run(state_dir: &Path, cgroups: Option<&Cgroups>) -> Vec<RunKey> {
    let mut killed = cgroups.map(Cgroups::kill_all).unwrap_or_default();
    for (key, pgid, path) in journaled_groups(state_dir) {
        if group_alive(pgid) && group_is_ours(pgid, key, &path) {
            signal_group(pgid, Signal::SIGKILL);
            if !killed.contains(&key) {
                killed.push(key);
            }
        }
    }
    killed
}

/// Every run this agent's state dir knows of (a run cgroup or a journal entry), live or ended:
/// the agent removes both only after it has logged the run's end.
pub fn known_runs(state_dir: &Path, cgroups: Option<&Cgroups>) -> BTreeSet<RunKey> {
    let mut keys: BTreeSet<RunKey> =
        cgroups.map(|c| c.runs().into_iter().map(|(k, _)| k).collect()).unwrap_or_default();
    keys.extend(journaled_groups(state_dir).into_iter().map(|(k, _, _)| k));
    keys
}

/// Whether some run this agent's state dir knows of still has a live process.
pub fn any_run_alive(state_dir: &Path, cgroups: Option<&Cgroups>) -> bool {
    cgroups.is_some_and(|c| c.runs().iter().any(|(_, r)| r.populated()))
        || journaled_groups(state_dir)
            .iter()
            .any(|(key, pgid, path)| group_alive(*pgid) && group_is_ours(*pgid, *key, path))
}

/// What a sweep of a previous agent's runs found: the runs it killed (and their journaled
/// groups, to wait for) and those that had ended while no agent watched.
#[derive(Default)]
struct Orphans {
    killed: Vec<RunKey>,
    groups: Vec<i32>,
    ended: Vec<RunKey>,
}

impl Orphans {
    /// Kills the populated run cgroups; an empty one outlived its run (a run's cgroup goes only
    /// after its end is logged, and the previous agent may have died before it could even
    /// journal the run): it ended while no agent watched.
    fn sweep_cgroups(&mut self, cgroups: &Cgroups) {
        for (key, run) in cgroups.runs() {
            if run.populated() {
                tracing::warn!(job = key.0, attempt = key.1, "killing a run left by a previous agent");
                run.kill();
                self.killed.push(key);
            } else {
                self.ended.push(key);
            }
        }
    }

    /// Kills the journaled groups that are still ours and clears the journal.
    async fn sweep_journal(&mut self, state_dir: &Path) {
        for (key, pgid, path) in journaled_groups(state_dir) {
            let mut ours = false;
            // A process in the middle of an exec shows no environment for a moment: look again.
            for _ in 0..5 {
                ours = group_is_ours(pgid, key, &path);
                if ours || !group_alive(pgid) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if ours && group_alive(pgid) {
                tracing::warn!(pgid, file = %path.display(), "killing a run left by a previous agent");
                signal_group(pgid, Signal::SIGKILL);
                self.groups.push(pgid);
                if !self.killed.contains(&key) {
                    self.killed.push(key);
                }
            } else if !group_alive(pgid) && !self.killed.contains(&key) && !self.ended.contains(&key) {
                self.ended.push(key);
            }
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "cannot clear a journal entry");
            }
        }
    }
}

/// Kills every run a previous agent left (its run cgroups, and the process groups it journaled
/// as live) and waits (bounded) until they are gone. Returns how many runs were killed.
pub async fn kill_orphans(
    state_dir: &Path,
    cgroups: Option<&Cgroups>,
    log: &crate::audit::ProcessLog,
) -> usize {
    let mut found = Orphans::default();
    if let Some(cg) = cgroups {
        found.sweep_cgroups(cg);
    }
    found.sweep_journal(state_dir).await;
    // Ended while no agent watched: the end is only known to be before now. Once logged, their
    // cgroups go (a later restart must not log the end again).
    for key in &found.ended {
        log.exit(key.0, key.1, "ended unwatched");
    }
    for (key, run) in cgroups.map(Cgroups::runs).unwrap_or_default() {
        if found.ended.contains(&key) && !run.populated() {
            run.remove();
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let alive = || {
        found.groups.iter().any(|p| group_alive(*p))
            || cgroups.is_some_and(|cg| cg.runs().iter().any(|(_, r)| r.populated()))
    };
    while alive() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !alive() {
        for key in &found.killed {
            log.exit(key.0, key.1, "orphan killed");
        }
    }
    if let Some(cg) = cgroups {
        cg.remove_empty();
        // The base is needed again for this agent's runs.
        if let Err(e) = std::fs::create_dir_all(cg.base()) {
            tracing::warn!(dir = %cg.base().display(), error = %e, "cannot create the run cgroups' base again");
        }
    }
    found.killed.len()
}
