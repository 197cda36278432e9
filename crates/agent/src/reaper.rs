//! The agent as its jobs' child subreaper: a process a job leaves behind (a daemonised helper,
//! a pipeline stage whose parent exited, whatever a cancelled run's cgroup kill hits) is
//! reparented to the agent instead of PID 1 — which may reap slowly or, in a container, never —
//! and the agent reaps it as soon as it exits.
//!
//! The agent's own children (job main processes, the watchdog) are reaped by whoever waits on
//! them (tokio, `std::process::Child::wait`): reaping one of those here would take its exit
//! status away. So every own child is spawned through `spawn`, which records its pid under the
//! same lock the reaper holds while it looks, and the reaper reaps nothing while a spawn is in
//! progress: a zombie child of the agent that is not recorded, when none is being spawned, is
//! an adopted orphan, and only those are reaped. The lock is not held across a spawn (one that
//! waits, an exec into a frozen run say, holds up no other).

use std::collections::BTreeSet;
use std::sync::Mutex;

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

/// The agent's own children: their pids (recorded at spawn; forgotten once gone from /proc),
/// and how many spawns are in progress.
struct Own {
    pids: BTreeSet<i32>,
    spawning: usize,
}

static OWN: Mutex<Own> = Mutex::new(Own { pids: BTreeSet::new(), spawning: 0 });

fn own() -> std::sync::MutexGuard<'static, Own> {
    OWN.lock().unwrap_or_else(|p| p.into_inner())
}

/// One spawn in progress (counted until dropped, however the spawn ends).
struct Spawning;

impl Spawning {
    fn start() -> Spawning {
        own().spawning += 1;
        Spawning
    }
}

impl Drop for Spawning {
    fn drop(&mut self) {
        let mut own = own();
        own.spawning = own.spawning.saturating_sub(1);
    }
}

/// Makes this process the subreaper of its descendants (`PR_SET_CHILD_SUBREAPER`).
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only; no memory is passed.
    let rc = unsafe { nix::libc::prctl(nix::libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Spawns an own child with `spawn` and records its pid (under the reaper's lock, before the
/// spawn counts as ended): it is never taken for an orphan, however soon it exits.
pub fn spawn<C>(
    spawn: impl FnOnce() -> std::io::Result<C>,
    pid: impl Fn(&C) -> Option<u32>,
) -> std::io::Result<C> {
    let spawning = Spawning::start();
    let child = spawn()?;
    let mut own = own();
    if let Some(p) = pid(&child) {
        own.pids.insert(p as i32);
    }
    drop(own);
    drop(spawning);
    Ok(child)
}

/// The pids of this process's children that have exited and wait to be reaped (zombies), from
/// /proc (`State: Z`, `PPid` this process).
fn zombie_children() -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // "PID (COMM) STATE PPID …": COMM may hold anything, so read after its last ')'.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return false };
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            let ppid = fields.next().and_then(|p| p.parse::<i32>().ok());
            state == Some("Z") && ppid == Some(me)
        })
        .collect()
}

/// Reaps every exited orphan the agent adopted; returns how many.
pub fn reap_orphans() -> usize {
    reap_among(zombie_children())
}

/// Reaps those of `zombies` (exited children) that are not the agent's own; none while a
/// spawn is in progress (its child may not be recorded yet).
fn reap_among(zombies: Vec<i32>) -> usize {
    let mut own = own();
    if own.spawning > 0 {
        return 0;
    }
    own.pids.retain(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
    let mut reaped = 0;
    for pid in zombies {
        if own.pids.contains(&pid) {
            continue;
        }
        if matches!(waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)), Ok(s) if s.pid().is_some()) {
            reaped += 1;
        }
    }
    reaped
}

/// Reaps adopted orphans whenever a child exits (SIGCHLD), and every few seconds besides.
pub async fn run() {
    let mut sigchld = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGCHLD stream; reaping orphans every few seconds only");
            None
        }
    };
    loop {
        match &mut sigchld {
            Some(s) => {
                // A timeout is as good as a SIGCHLD: either way, look for orphans now.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.recv()).await;
            }
            None => tokio::time::sleep(std::time::Duration::from_secs(5)).await,
        }
        let reaped = tokio::task::spawn_blocking(reap_orphans).await.unwrap_or(0);
        if reaped > 0 {
            tracing::debug!(reaped, "reaped orphaned processes of jobs");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_orphans_are_reaped_and_an_own_child_keeps_its_exit_status() {
        // An own child that exits at once: recorded at spawn, its status stays for its waiter.
        let mut mine =
            spawn(|| std::process::Command::new("sh").args(["-c", "exit 7"]).spawn(), |c| Some(c.id()))
                .unwrap();
        // A child not spawned through `spawn` stands for an adopted orphan.
        let orphan = std::process::Command::new("true").spawn().unwrap();
        let orphan_pid = orphan.id() as i32;
        std::mem::forget(orphan);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !zombie_children().contains(&orphan_pid) {
            assert!(std::time::Instant::now() < deadline, "the orphan never exited");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        while !zombie_children().contains(&(mine.id() as i32)) {
            assert!(std::time::Instant::now() < deadline, "the own child never exited");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Only these two: other tests' children in this process are not this test's to reap.
        // (Nothing is reaped while another test spawns: tried again until none does.)
        let mut reaped = reap_among(vec![orphan_pid, mine.id() as i32]);
        while reaped == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            reaped = reap_among(vec![orphan_pid, mine.id() as i32]);
        }
        assert_eq!(reaped, 1);
        assert!(!std::path::Path::new(&format!("/proc/{orphan_pid}")).exists(), "the orphan was reaped");
        assert_eq!(mine.wait().unwrap().code(), Some(7), "the own child's status is still there");
    }

    #[test]
    fn a_spawn_that_waits_holds_up_no_other_and_no_orphan_is_reaped_meanwhile() {
        let (entered, wait) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let slow = std::thread::spawn(move || {
            spawn(
                || {
                    let _ = entered.0.send(());
                    let _ = wait.1.recv_timeout(std::time::Duration::from_secs(10));
                    std::process::Command::new("true").spawn()
                },
                |c| Some(c.id()),
            )
        });
        entered.1.recv().unwrap();
        let since = std::time::Instant::now();
        let mut quick = spawn(|| std::process::Command::new("true").spawn(), |c| Some(c.id())).unwrap();
        assert!(since.elapsed() < std::time::Duration::from_secs(5), "held up by the other spawn");
        assert!(own().spawning > 0);
        assert_eq!(reap_among(vec![i32::MAX]), 0, "reaped while a spawn was in progress");
        wait.0.send(()).unwrap();
        let mut slow = slow.join().unwrap().unwrap();
        assert!(quick.wait().unwrap().success() && slow.wait().unwrap().success());
    }
}
