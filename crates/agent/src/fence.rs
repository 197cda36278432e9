//! Fencing: an agent runs jobs only while it holds a lease from the leader.
//!
//! Every heartbeat (and registration) the leader answers renews the lease to
//! `sent + lease_ms`, where `sent` is when the agent sent that call — no later than when the
//! leader saw it. When the lease lapses the agent stops its runs (checkpoint signal,
//! `fence_grace_ms`, kill) and launches nothing until a renewal. An agent that cannot act
//! (SIGSTOPped, wedged) is covered by its watchdog, a separate process: the agent writes the
//! hard deadline `sent + lease_ms + fence_grace_ms` to `<state-dir>/lease`, and the watchdog
//! kills every run of the node (run cgroups, journaled process groups) once the deadline
//! passes. The leader declares the node down — and requeues its jobs — only a node timeout
//! after it last saw a heartbeat, and lease + grace is 0.7 of that (see `Timing::lease` in
//! the server and ARCHITECTURE.md).
//!
//! Times are CLOCK_MONOTONIC milliseconds, which both processes read and which keeps running
//! while a process is stopped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::cgroup::Cgroups;

/// How often the watchdog looks at the lease.
const WATCHDOG_POLL: Duration = Duration::from_millis(100);

/// Milliseconds of CLOCK_MONOTONIC.
pub fn mono_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
        .unwrap_or(0)
}

/// The lease file: "PID DEADLINE_MONO_MS" of the agent that holds it.
pub fn lease_path(state_dir: &Path) -> PathBuf {
    state_dir.join("lease")
}

fn read_lease(path: &Path) -> Option<(i32, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut f = text.split_whitespace();
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

/// The agent's lease, shared by its session (renews), its runner (launches only while valid)
/// and its fence task (stops runs when it lapses).
#[derive(Clone, Debug)]
pub struct Lease(Arc<LeaseInner>);

#[derive(Debug)]
struct LeaseInner {
    /// Valid until this CLOCK_MONOTONIC ms (0: never renewed; u64::MAX: no fencing).
    until: AtomicU64,
    grace_ms: AtomicU64,
    file: Option<PathBuf>,
}

impl Lease {
    /// A lease that never lapses (unit tests; an agent without fencing).
    pub fn unfenced() -> Lease {
        Lease(Arc::new(LeaseInner {
            until: AtomicU64::new(u64::MAX),
            grace_ms: AtomicU64::new(0),
            file: None,
        }))
    }

    /// A lapsed lease whose deadline the watchdog reads from `file`.
    pub fn new(file: PathBuf) -> Lease {
        Lease(Arc::new(LeaseInner {
            until: AtomicU64::new(0),
            grace_ms: AtomicU64::new(0),
            file: Some(file),
        }))
    }

    /// The leader answered a call sent at `sent` (mono ms): valid until `sent + lease_ms`.
    pub fn renew(&self, sent: u64, lease_ms: u64, grace_ms: u64) {
        let until = sent.saturating_add(lease_ms);
        let previous = self.0.until.fetch_max(until, Ordering::SeqCst);
        self.0.grace_ms.store(grace_ms, Ordering::SeqCst);
        if until <= previous {
            return;
        }
        if let Some(file) = &self.0.file {
            // Written whole under another name and renamed, so the watchdog never reads half.
            let tmp = file.with_extension("tmp");
            let text = format!("{} {}\n", std::process::id(), until.saturating_add(grace_ms));
            if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, file)) {
                tracing::warn!(error = %e, "cannot write the lease file for the watchdog");
            }
        }
    }

    pub fn valid(&self) -> bool {
        mono_ms() < self.0.until.load(Ordering::SeqCst)
    }

    /// Whether a lease was held and has lapsed.
    pub fn lapsed(&self) -> bool {
        let until = self.0.until.load(Ordering::SeqCst);
        until != 0 && mono_ms() >= until
    }

    pub fn grace(&self) -> Duration {
        Duration::from_millis(self.0.grace_ms.load(Ordering::SeqCst))
    }

    /// The agent stops on purpose: the watchdog has nothing to enforce.
    pub fn release(&self) {
        if let Some(file) = &self.0.file {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// How long the watchdog waits for the runs it killed to be gone before it logs their ends.
const GONE_WAIT: Duration = Duration::from_secs(10);

/// What the watchdog watches.
pub struct Watch<'a> {
    pub state_dir: &'a Path,
    pub cgroups: Option<&'a Cgroups>,
    /// The agent whose lease it enforces.
    pub parent: i32,
    /// Where the ends of the runs it kills are logged, with their real times.
    pub process_log: crate::audit::ProcessLog,
}

/// The watchdog process: kills every run of the node once the lease deadline of its agent
/// passes, and logs each killed run's end once its last process is gone; exits when another
/// agent holds the lease, or when its agent is gone and nothing is left to kill.
pub fn watchdog(w: &Watch<'_>) -> ! {
    let lease_file = lease_path(w.state_dir);
    let mut logged: std::collections::BTreeSet<crate::runner::RunKey> = Default::default();
    loop {
        std::thread::sleep(WATCHDOG_POLL);
        let lease = read_lease(&lease_file);
        if lease.is_some_and(|(pid, _)| pid != w.parent) {
            std::process::exit(0); // a new agent holds the lease; it killed what was left
        }
        let parent_alive = nix::unistd::getppid().as_raw() == w.parent;
        let expired = lease.is_some_and(|(_, deadline)| mono_ms() >= deadline);
        if expired {
            let killed = crate::runner::kill_every_run(w.state_dir, w.cgroups);
            if !killed.is_empty() {
                eprintln!("kairos-agent watchdog: the agent's lease lapsed; killing runs {killed:?}");
            }
            let until = std::time::Instant::now() + GONE_WAIT;
            while crate::runner::any_run_alive(w.state_dir, w.cgroups) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Every run of the node has ended by now — killed here, or ended on its own while
            // the agent could not record it (stopped): log it, so the process log's intervals
            // end no later than the deadline, not when the agent wakes up.
            if !crate::runner::any_run_alive(w.state_dir, w.cgroups) {
                for key in crate::runner::known_runs(w.state_dir, w.cgroups) {
                    if logged.insert(key) {
                        w.process_log.exit(key.0, key.1, "ended by the lease deadline (watchdog)");
                    }
                }
            }
        } else {
            logged.clear();
        }
        if !parent_alive
            && (expired || lease.is_none())
            && !crate::runner::any_run_alive(w.state_dir, w.cgroups)
        {
            if let Some(c) = w.cgroups {
                c.remove_empty();
            }
            std::process::exit(0);
        }
    }
}

/// Kills the watchdog a previous agent on this state dir left, and waits (bounded) until it is
/// gone. A starting agent does this before it touches anything: an orphaned watchdog whose
/// agent is gone removes the node's empty cgroups when it exits, and would otherwise remove the
/// cgroup base the new agent has just created (a restarted agent's first launch then failed,
/// "creating the run's cgroup: No such file or directory").
pub fn stop_previous_watchdog(state_dir: &Path) {
    let pid_file = state_dir.join("watchdog.pid");
    let Some(old) = std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok()) else {
        return;
    };
    let is_watchdog = || {
        let cmdline = std::fs::read(format!("/proc/{old}/cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).into_owned();
        text.contains(WATCHDOG_ARG) && text.contains(&*state_dir.to_string_lossy())
    };
    if !is_watchdog() {
        return;
    }
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::Signal::SIGKILL);
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while is_watchdog() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The argument that starts the watchdog mode of the agent binary.
pub const WATCHDOG_ARG: &str = "__kairos_watchdog";

/// Starts the watchdog for this agent (the same binary, in watchdog mode:
/// `__kairos_watchdog STATE_DIR AGENT_PID CGROUP_BASE|- PROCESS_LOG|- NODE`), after stopping
/// one a previous agent on this state dir may have left.
pub fn spawn_watchdog(
    state_dir: &Path,
    cgroup_base: Option<&Path>,
    process_log: Option<&Path>,
    node: &str,
) -> std::io::Result<std::process::Child> {
    let pid_file = state_dir.join("watchdog.pid");
    stop_previous_watchdog(state_dir);
    let or_dash = |p: Option<&Path>| p.map(|p| p.as_os_str().to_owned()).unwrap_or_else(|| "-".into());
    let child = std::process::Command::new(std::env::current_exe()?)
        .arg(WATCHDOG_ARG)
        .arg(state_dir)
        .arg(std::process::id().to_string())
        .arg(or_dash(cgroup_base))
        .arg(or_dash(process_log))
        .arg(node)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    std::fs::write(&pid_file, format!("{}\n", child.id()))?;
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_valid_until_it_lapses_and_only_moves_forward() {
        let dir = tempfile::tempdir().unwrap();
        let lease = Lease::new(lease_path(dir.path()));
        assert!(!lease.valid() && !lease.lapsed());
        let now = mono_ms();
        lease.renew(now, 60_000, 500);
        assert!(lease.valid() && !lease.lapsed());
        let (pid, deadline) = read_lease(&lease_path(dir.path())).unwrap();
        assert_eq!((pid, deadline), (std::process::id() as i32, now + 60_500));
        // An older answer does not move it back.
        lease.renew(now - 50_000, 60_000, 500);
        assert_eq!(read_lease(&lease_path(dir.path())).unwrap().1, now + 60_500);
        let short = Lease::new(lease_path(dir.path()));
        short.renew(now.saturating_sub(10_000), 1000, 100);
        assert!(!short.valid() && short.lapsed());
        assert!(Lease::unfenced().valid());
    }

    #[test]
    fn a_previous_agents_watchdog_is_stopped_and_gone_before_the_new_agent_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        // A stand-in with a watchdog's command line for this state dir (a shell that stays).
        let mut old = std::process::Command::new("sh")
            .args(["-c", "while :; do sleep 1; done", WATCHDOG_ARG])
            .arg(dir.path())
            .spawn()
            .unwrap();
        std::fs::write(dir.path().join("watchdog.pid"), format!("{}\n", old.id())).unwrap();
        // Until the stand-in has exec'd, /proc shows the test binary's command line (a previous
        // agent's watchdog has long been running): wait for its own (a cold CI run raced this).
        let exec_by = std::time::Instant::now() + Duration::from_secs(5);
        while !std::fs::read(format!("/proc/{}/cmdline", old.id()))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(WATCHDOG_ARG))
        {
            assert!(std::time::Instant::now() < exec_by, "the stand-in never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A process listed there that is no watchdog of this dir (a reused pid) is left alone.
        let mut other = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let other_dir = tempfile::tempdir().unwrap();
        std::fs::write(other_dir.path().join("watchdog.pid"), format!("{}\n", other.id())).unwrap();
        stop_previous_watchdog(other_dir.path());
        assert!(other.try_wait().unwrap().is_none(), "a process that is no watchdog was killed");
        stop_previous_watchdog(dir.path());
        let until = std::time::Instant::now() + Duration::from_secs(5);
        let status = loop {
            match old.try_wait().unwrap() {
                Some(status) => break status,
                None if std::time::Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                None => {
                    let _ = old.kill();
                    panic!("the previous watchdog was left running");
                }
            }
        };
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));
        let _ = other.kill();
        let _ = other.wait();
    }
}
