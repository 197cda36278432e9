//! A cgroup (v2) per run: every process a job starts — setsid'd, double-forked, daemonized —
//! stays in its run's cgroup, so the agent kills it with `cgroup.kill`, suspends it with
//! `cgroup.freeze`, and knows it ended when `cgroup.events` says `populated 0`.
//!
//! Layout: `<hierarchy>/kairos/<node>-<hash of the state dir>/run-<job>-<attempt>`, so several
//! agents on one host (tests, chaos hosts) never touch each other's runs, and a restarted agent
//! (same state dir) finds what its predecessor left. Detected at start (`Cgroups::detect`);
//! where no cgroup can be created the agent falls back to process groups and says so.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::decide::RunKey;

/// Where this agent's run cgroups live.
#[derive(Clone, Debug)]
pub struct Cgroups {
    base: PathBuf,
}

/// One run's cgroup.
#[derive(Clone, Debug)]
pub struct RunCgroup {
    dir: PathBuf,
}

/// Whether the cgroup hierarchies of `mountinfo` (/proc/self/mountinfo's text) favour dynamic
/// modifications, and the first cgroup2 mount point (None: no cgroup2 mount). Without the
/// `favordynmods` option, moving a process into a cgroup (every run's start) waits for an RCU
/// grace period of the kernel's global cgroup lock — 5 to 30 ms each on a small VM; with it
/// (on any hierarchy, v1 too: the lock is global), ~0.1 ms. Linux ≥ 6.0.
pub fn favors_dynmods(mountinfo: &str) -> Option<(bool, String)> {
    let (mut favoured, mut v2) = (false, None);
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let mut fields = right.split_whitespace();
        let fstype = fields.next().unwrap_or("");
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        favoured |= fields.nth(1).unwrap_or("").split(',').any(|o| o == "favordynmods");
        if fstype == "cgroup2" && v2.is_none() {
            v2 = left.split_whitespace().nth(4).map(str::to_string);
        }
    }
    v2.map(|mount| (favoured, mount))
}

/// Whether a kernel release string (`uname -r`) is at least `major.minor`.
fn release_at_least(release: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Says once, at start, when run starts pay the cgroup lock's grace period (`favors_dynmods`)
/// on a kernel that has the option.
pub fn warn_without_favordynmods() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if let Some((false, mount)) = favors_dynmods(&info).filter(|_| release_at_least(release.trim(), (6, 0))) {
        tracing::warn!(
            "cgroup2 is mounted without favordynmods: each run's start waits 5-30 ms for the kernel's \
             cgroup lock (mount -o remount,favordynmods {mount}; see docs/operations.md)"
        );
    }
}

/// The cgroup2 mount points of this mount namespace (from /proc/self/mountinfo).
fn cgroup2_mounts() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    info.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount))
        })
        .collect()
}

fn safe_name(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .take(64)
        .collect()
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl Cgroups {
    /// The run cgroups of agent `node` with state dir `state_dir` under `root` (a cgroup2
    /// hierarchy, or a cgroup in it delegated to the agent); by default the first cgroup2 mount.
    /// `Err` says why none can be used.
    pub fn detect(node: &str, state_dir: &Path, root: Option<&Path>) -> Result<Cgroups, String> {
        let root = match root {
            Some(r) => r.to_path_buf(),
            None => cgroup2_mounts().into_iter().next().ok_or("no cgroup2 hierarchy is mounted")?,
        };
        let base = root.join("kairos").join(format!(
            "{}-{:08x}",
            safe_name(node),
            fnv1a(&state_dir.to_string_lossy()) as u32
        ));
        std::fs::create_dir_all(&base).map_err(|e| format!("creating {}: {e}", base.display()))?;
        let cg = Cgroups { base };
        // A probe run cgroup shows whether kill, freeze and events work here.
        let probe = cg.base.join("probe");
        // Whether it could be made shows in what it holds, checked next.
        let _ = std::fs::create_dir(&probe);
        let usable = ["cgroup.kill", "cgroup.freeze", "cgroup.events", "cgroup.procs"]
            .iter()
            .all(|f| probe.join(f).exists());
        // Left behind it is empty and removed with the base (`remove_empty`).
        let _ = std::fs::remove_dir(&probe);
        if usable {
            Ok(cg)
        } else {
            Err(format!("{} has no cgroup.kill/cgroup.freeze (kernel before 5.14?)", root.display()))
        }
    }

    /// The run cgroups under `base` (as `detect` found them; the watchdog gets the path).
    pub fn at(base: PathBuf) -> Cgroups {
        Cgroups { base }
    }

    pub fn base(&self) -> &Path {
        &self.base
    }

    fn dir(&self, key: RunKey) -> PathBuf {
        self.base.join(format!("run-{}-{}", key.0, key.1))
    }

    /// Creates run `key`'s cgroup (an existing one is reused: it can only be a leftover that
    /// `kill_all` emptied).
    pub fn create(&self, key: RunKey) -> std::io::Result<RunCgroup> {
        let dir = self.dir(key);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        Ok(RunCgroup { dir })
    }

    /// The run cgroups present now, with their runs.
    pub fn runs(&self) -> Vec<(RunKey, RunCgroup)> {
        let Ok(entries) = std::fs::read_dir(&self.base) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let (job, attempt) = name.strip_prefix("run-")?.split_once('-')?;
                Some(((job.parse().ok()?, attempt.parse().ok()?), RunCgroup { dir: e.path() }))
            })
            .collect()
    }

    /// Kills every run cgroup (the watchdog, a restarted agent) and removes the empty ones.
    /// Returns the runs that had live processes.
    pub fn kill_all(&self) -> Vec<RunKey> {
        let mut killed = Vec::new();
        for (key, cg) in self.runs() {
            if cg.populated() {
                cg.kill();
                killed.push(key);
            }
        }
        killed
    }

    /// Removes the run cgroups that are empty, the base when nothing is left, and the shared
    /// `kairos` parent when no other agent of this host uses it.
    pub fn remove_empty(&self) {
        for (_, cg) in self.runs() {
            if !cg.populated() {
                cg.remove();
            }
        }
        if std::fs::remove_dir(&self.base).is_ok() {
            if let Some(parent) = self.base.parent() {
                // The parent is shared (other agents' bases): removed only once empty.
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

impl RunCgroup {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs` opened for writing (close-on-exec): a child writes "0" to it between
    /// fork and exec to enter the cgroup before it runs any of the job's code.
    pub fn procs_file(&self) -> std::io::Result<OwnedFd> {
        let f = std::fs::OpenOptions::new().write(true).open(self.dir.join("cgroup.procs"))?;
        Ok(OwnedFd::from(f))
    }

    fn write(&self, file: &str, value: &str) -> std::io::Result<()> {
        std::fs::OpenOptions::new().write(true).open(self.dir.join(file))?.write_all(value.as_bytes())
    }

    /// The pids in the cgroup now.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// SIGKILL to every process of the run (`cgroup.kill`; each pid where that fails).
    pub fn kill(&self) {
        if self.write("cgroup.kill", "1").is_err() {
            for pid in self.pids() {
                // ESRCH (the process is already gone) is the expected end of a kill.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }

    /// `signal` to every process of the run.
    pub fn signal(&self, signal: Signal) {
        for pid in self.pids() {
            // ESRCH (the process is already gone) is the expected end of a stop.
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    /// Freezes (or thaws) the whole run.
    pub fn freeze(&self, frozen: bool) {
        if let Err(e) = self.write("cgroup.freeze", if frozen { "1" } else { "0" }) {
            tracing::warn!(error = %e, cgroup = %self.dir.display(), "cannot (un)freeze a run");
        }
    }

    /// Whether some process of the run is alive (`cgroup.events`: `populated 1`). A cgroup
    /// that cannot be read is gone.
    pub fn populated(&self) -> bool {
        std::fs::read_to_string(self.dir.join("cgroup.events"))
            .map(|s| s.lines().any(|l| l.trim() == "populated 1"))
            .unwrap_or(false)
    }

    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(cgroup = %self.dir.display(), error = %e, "cannot remove a run's cgroup");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn favordynmods_is_read_from_the_cgroup_mounts_super_options_on_kernels_that_have_it() {
        let without = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                       35 31 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
        assert_eq!(favors_dynmods(without), Some((false, "/sys/fs/cgroup/unified".into())));
        let with = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate,favordynmods\n";
        assert_eq!(favors_dynmods(with), Some((true, "/sys/fs/cgroup".into())));
        // The lock is global: a v1 hierarchy's option counts; no cgroup2 at all says nothing.
        let v1_too =
            format!("{without}36 31 0:31 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids,favordynmods\n");
        assert_eq!(favors_dynmods(&v1_too).map(|f| f.0), Some(true));
        let v1_only = "35 31 0:30 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(favors_dynmods(v1_only), None);
        assert!(release_at_least("6.18.0-1-cloud-amd64", (6, 0)));
        assert!(release_at_least("6.0", (6, 0)));
        assert!(!release_at_least("5.15.0-91-generic", (6, 0)));
        assert!(!release_at_least("garbage", (6, 0)));
    }

    #[test]
    fn cgroup2_mounts_are_read_from_mountinfo() {
        // Whatever this host has, the parser returns only absolute paths.
        assert!(cgroup2_mounts().iter().all(|p| p.is_absolute()));
        assert_eq!(safe_name("node/a b"), "node_a_b");
        assert_ne!(fnv1a("/a"), fnv1a("/b"));
    }

    #[test]
    fn a_missing_hierarchy_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        // A plain directory is no cgroup: no cgroup.kill appears in a child.
        let e = Cgroups::detect("n1", dir.path(), Some(dir.path())).unwrap_err();
        assert!(e.contains("cgroup.kill"), "{e}");
    }
}
