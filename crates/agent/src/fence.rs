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
//! the server and docs/design.md § fencing).
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

/// The lease file: one fixed-size record "PID DEADLINE_MONO_MS CHECK", space-padded.
pub fn lease_path(state_dir: &Path) -> PathBuf {
    state_dir.join("lease")
}

/// Bytes of the lease record. The file is this long from its creation and every renewal
/// overwrites it in place, so renewing needs no new disk block: a job that fills the disk the
/// state directory is on cannot stop its node's lease from moving forward (the watchdog would
/// then kill every run of a healthy node).
const LEASE_RECORD: usize = 64;

/// What a lease record checks itself with: a read that overlaps a renewal is seen as torn.
fn lease_check(pid: i32, deadline: u64) -> u64 {
    (u64::from(pid as u32) ^ deadline.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 8
}

fn encode_lease(pid: i32, deadline: u64) -> [u8; LEASE_RECORD] {
    let text = format!("{pid} {deadline} {}", lease_check(pid, deadline));
    let mut record = [b' '; LEASE_RECORD];
    record[..text.len()].copy_from_slice(text.as_bytes());
    record[LEASE_RECORD - 1] = b'\n';
    record
}

fn decode_lease(text: &str) -> Option<(i32, u64)> {
    let mut f = text.split_whitespace();
    let (pid, deadline, check): (i32, u64, u64) =
        (f.next()?.parse().ok()?, f.next()?.parse().ok()?, f.next()?.parse().ok()?);
    (check == lease_check(pid, deadline) && f.next().is_none()).then_some((pid, deadline))
}

/// The lease the file holds (None: no file, or no valid record after a few reads — a read
/// overlapping a renewal is read again).
fn read_lease(path: &Path) -> Option<(i32, u64)> {
    for _ in 0..3 {
        let text = std::fs::read_to_string(path).ok()?;
        if let Some(lease) = decode_lease(&text) {
            return Some(lease);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// Creates the lease file at its full size (no valid record yet: nothing for a watchdog to
/// enforce until the first renewal).
fn create_lease_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    // A previous agent's file goes; a missing one is what `create_new` needs, and any other
    // error shows there.
    let _ = std::fs::remove_file(path);
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path)?;
    std::os::unix::fs::FileExt::write_all_at(&file, &[b' '; LEASE_RECORD], 0)?;
    file.sync_all()?;
    Ok(file)
}

/// The lease a controller grants with every answered call: runs may go on for `lease` after the
/// call was sent, and the watchdog kills what is left `grace` after that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTerms {
    pub lease: Duration,
    pub grace: Duration,
}

/// What one answered call renews: the lease is valid until `valid_until`; the watchdog kills
/// every run at `hard_deadline`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewal<T> {
    pub valid_until: T,
    pub hard_deadline: T,
}

/// A clock the lease is counted on: CLOCK_MONOTONIC milliseconds (`mono_ms`, the agent) or an
/// `Instant` (the simulation's clock).
pub trait LeaseClock: Copy {
    /// `self + d`; a sum past the clock's end is clamped (the ms clock) or is `self` (an
    /// `Instant`: no lease rather than a panic).
    fn after(self, d: Duration) -> Self;
}

impl LeaseClock for u64 {
    fn after(self, d: Duration) -> u64 {
        self.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

impl LeaseClock for std::time::Instant {
    fn after(self, d: Duration) -> Self {
        self.checked_add(d).unwrap_or(self)
    }
}

impl LeaseClock for tokio::time::Instant {
    fn after(self, d: Duration) -> Self {
        self.checked_add(d).unwrap_or(self)
    }
}

impl LeaseTerms {
    /// The terms a registration's answer carries (ms); a controller that hands out no lease
    /// (an older version) grants ten heartbeat intervals.
    pub fn of_ms(lease_ms: u64, grace_ms: u64, interval: Duration) -> LeaseTerms {
        let lease = match lease_ms {
            0 => interval * 10,
            ms => Duration::from_millis(ms),
        };
        LeaseTerms { lease, grace: Duration::from_millis(grace_ms) }
    }

    /// The lease arithmetic, one function for the agent and the simulation: a call sent at
    /// `sent` (no later than the leader saw it) and answered makes the lease valid until
    /// `sent + lease`, and the runs' hard deadline `sent + lease + grace`.
    pub fn renewal<T: LeaseClock>(self, sent: T) -> Renewal<T> {
        let valid_until = sent.after(self.lease);
        Renewal { valid_until, hard_deadline: valid_until.after(self.grace) }
    }
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
    /// The lease file, open and at its full size (None: it could not be created).
    record: Option<std::fs::File>,
}

impl Lease {
    /// A lease that never lapses (unit tests; an agent without fencing).
    pub fn unfenced() -> Lease {
        Lease(Arc::new(LeaseInner {
            until: AtomicU64::new(u64::MAX),
            grace_ms: AtomicU64::new(0),
            record: None,
        }))
    }

    /// A lapsed lease kept in memory only, with no watchdog to tell (the scale harness's
    /// agents, `kairos-bench agents`).
    pub fn in_memory() -> Lease {
        Lease(Arc::new(LeaseInner { until: AtomicU64::new(0), grace_ms: AtomicU64::new(0), record: None }))
    }

    /// A lapsed lease whose deadline the watchdog reads from `file` (created now, at its full
    /// size).
    pub fn new(file: PathBuf) -> Lease {
        let record = create_lease_file(&file)
            .map_err(|e| tracing::error!(error = %e, file = %file.display(), "cannot create the lease file: the watchdog cannot fence this node"))
            .ok();
        Lease(Arc::new(LeaseInner { until: AtomicU64::new(0), grace_ms: AtomicU64::new(0), record }))
    }

    /// The leader answered a call: the lease is valid until `renewal.valid_until` (mono ms,
    /// `LeaseTerms::renewal`), and never moves back.
    pub fn renew(&self, renewal: Renewal<u64>) {
        let Renewal { valid_until: until, hard_deadline } = renewal;
        let previous = self.0.until.fetch_max(until, Ordering::SeqCst);
        self.0.grace_ms.store(hard_deadline.saturating_sub(until), Ordering::SeqCst);
        if until <= previous {
            return;
        }
        if let Some(record) = &self.0.record {
            // In place, in blocks the file already has (see LEASE_RECORD); a torn read fails
            // the record's check and is read again.
            let bytes = encode_lease(std::process::id() as i32, hard_deadline);
            if let Err(e) = std::os::unix::fs::FileExt::write_all_at(record, &bytes, 0) {
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
    /// The record is blanked in place (the file, and its blocks, stay for the next renewal).
    pub fn release(&self) {
        if let Some(record) = &self.0.record {
            if let Err(e) = std::os::unix::fs::FileExt::write_all_at(record, &[b' '; LEASE_RECORD], 0) {
                tracing::warn!(error = %e, "cannot release the lease file");
            }
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
    let mut logged: std::collections::BTreeSet<crate::decide::RunKey> = Default::default();
    loop {
        std::thread::sleep(WATCHDOG_POLL);
        let lease = read_lease(&lease_file);
        if lease.is_some_and(|(pid, _)| pid != w.parent) {
            std::process::exit(0); // a new agent holds the lease; it killed what was left
        }
        let parent_alive = nix::unistd::getppid().as_raw() == w.parent;
        let expired = lease.is_some_and(|(_, deadline)| mono_ms() >= deadline);
        if expired {
            let killed = crate::journal::kill_every_run(w.state_dir, w.cgroups);
            if !killed.is_empty() {
                eprintln!("kairos-agent watchdog: the agent's lease lapsed; killing runs {killed:?}");
            }
            let until = std::time::Instant::now() + GONE_WAIT;
            while crate::journal::any_run_alive(w.state_dir, w.cgroups) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Every run of the node has ended by now — killed here, or ended on its own while
            // the agent could not record it (stopped): log it, so the process log's intervals
            // end no later than the deadline, not when the agent wakes up.
            if !crate::journal::any_run_alive(w.state_dir, w.cgroups) {
                for key in crate::journal::known_runs(w.state_dir, w.cgroups) {
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
            && !crate::journal::any_run_alive(w.state_dir, w.cgroups)
        {
            if let Some(c) = w.cgroups {
                c.remove_empty();
                // The v1 limit directories too: an agent killed outright never removed them.
                crate::cgroup_limits::remove_empty_v1_of(c.base());
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
    if let Err(e) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::Signal::SIGKILL)
    {
        // ESRCH: it has just exited; the wait below sees it gone either way.
        tracing::debug!(pid = old, error = %e, "the previous watchdog was not signalled");
    }
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
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg(WATCHDOG_ARG)
        .arg(state_dir)
        .arg(std::process::id().to_string())
        .arg(or_dash(cgroup_base))
        .arg(or_dash(process_log))
        .arg(node)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    let child = crate::reaper::spawn(|| cmd.spawn(), |c| Some(c.id()))?;
    std::fs::write(&pid_file, format!("{}\n", child.id()))?;
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(lease_ms: u64, grace_ms: u64) -> LeaseTerms {
        LeaseTerms { lease: Duration::from_millis(lease_ms), grace: Duration::from_millis(grace_ms) }
    }

    #[test]
    fn a_renewal_runs_from_when_the_call_was_sent_and_the_deadline_adds_the_grace() {
        let r = terms(60_000, 500).renewal(1_000u64);
        assert_eq!(r, Renewal { valid_until: 61_000, hard_deadline: 61_500 });
        // Past the clock's end: clamped, never wrapped round to an early deadline.
        let far = terms(60_000, 500).renewal(u64::MAX - 10);
        assert_eq!(far, Renewal { valid_until: u64::MAX, hard_deadline: u64::MAX });
        let t0 = std::time::Instant::now();
        let r = terms(2_000, 300).renewal(t0);
        assert_eq!(r.valid_until - t0, Duration::from_millis(2_000));
        assert_eq!(r.hard_deadline - t0, Duration::from_millis(2_300));
    }

    #[test]
    fn a_controller_granting_no_lease_gets_ten_heartbeat_intervals() {
        let interval = Duration::from_millis(700);
        assert_eq!(LeaseTerms::of_ms(0, 100, interval), terms(7_000, 100));
        assert_eq!(LeaseTerms::of_ms(4_000, 100, interval), terms(4_000, 100));
    }

    #[test]
    fn a_lease_is_valid_until_it_lapses_and_only_moves_forward() {
        let dir = tempfile::tempdir().unwrap();
        let lease = Lease::new(lease_path(dir.path()));
        assert!(!lease.valid() && !lease.lapsed());
        let now = mono_ms();
        lease.renew(terms(60_000, 500).renewal(now));
        assert_eq!(lease.grace(), Duration::from_millis(500));
        assert!(lease.valid() && !lease.lapsed());
        let (pid, deadline) = read_lease(&lease_path(dir.path())).unwrap();
        assert_eq!((pid, deadline), (std::process::id() as i32, now + 60_500));
        // An older answer does not move it back.
        lease.renew(terms(60_000, 500).renewal(now - 50_000));
        assert_eq!(read_lease(&lease_path(dir.path())).unwrap().1, now + 60_500);
        // Released: nothing for the watchdog to enforce, and the next renewal is read again (the
        // file stays: a renewal written into a removed file would never reach the watchdog).
        lease.release();
        assert_eq!(read_lease(&lease_path(dir.path())), None);
        lease.renew(terms(60_000, 500).renewal(now + 1));
        assert_eq!(read_lease(&lease_path(dir.path())).unwrap().1, now + 60_501);
        let short = Lease::new(lease_path(dir.path()));
        short.renew(terms(1000, 100).renewal(now.saturating_sub(10_000)));
        assert!(!short.valid() && short.lapsed());
        assert!(Lease::unfenced().valid());
    }

    #[test]
    fn a_torn_or_foreign_lease_record_is_no_lease() {
        let good = encode_lease(42, 1_000_000);
        assert_eq!(decode_lease(std::str::from_utf8(&good).unwrap()), Some((42, 1_000_000)));
        // Half of a renewal over the previous record: the check fails.
        let newer = encode_lease(42, 1_999_999);
        let mixed = [&newer[..12], &good[12..]].concat();
        assert_eq!(decode_lease(std::str::from_utf8(&mixed).unwrap()), None);
        assert_eq!(decode_lease("42 1000000\n"), None, "a record without its check");
        assert_eq!(decode_lease(&" ".repeat(LEASE_RECORD)), None);
    }

    /// A tmpfs of its own, unmounted when dropped.
    struct Tmpfs(tempfile::TempDir);

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0.path()).status();
        }
    }

    #[test]
    fn a_full_disk_does_not_stop_the_lease_from_moving_forward() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mounting a small tmpfs needs root (CI runs as root)");
            return;
        }
        let fs = Tmpfs(tempfile::tempdir().unwrap());
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k,mode=0700", "kairos-lease-test"])
            .arg(fs.0.path())
            .status()
            .unwrap();
        assert!(mounted.success());
        let lease = Lease::new(lease_path(fs.0.path()));
        let now = mono_ms();
        lease.renew(terms(1_000, 100).renewal(now));
        assert_eq!(read_lease(&lease_path(fs.0.path())).unwrap().1, now + 1_100);
        // A job fills the disk.
        let mut filler = std::fs::File::create(fs.0.path().join("jobs-data")).unwrap();
        let full = loop {
            if let Err(e) = std::io::Write::write_all(&mut filler, &[7u8; 4096]) {
                break e;
            }
        };
        assert_eq!(full.raw_os_error(), Some(nix::libc::ENOSPC), "{full}");
        lease.renew(terms(1_000, 100).renewal(now + 500));
        assert_eq!(
            read_lease(&lease_path(fs.0.path())).unwrap(),
            (std::process::id() as i32, now + 1_600),
            "the renewal did not reach the watchdog's file"
        );
        drop(lease);
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
