//! Per-run resource limits: the granted cores (cpuset), memory without swap, a process count,
//! and GPU device access (a run may open only its own `/dev/nvidiaN` and the control devices).
//!
//! Production hosts are cgroup v2 only: there the limits are files of the run's own cgroup
//! (`cpuset.cpus`, `memory.max`, `memory.swap.max`, `pids.max`) where the agent's cgroup
//! delegates those controllers. Hosts with cgroup v1 controllers mounted (this project's test
//! machines) get a directory per run under each v1 controller in use, which the run's first
//! process joins between fork and exec, like the v2 cgroup. Device rules are enforced through
//! v1 `devices` (on v2 they need an eBPF program, not built yet: `enforced()` then omits
//! "devices", so `kairos nodes` says so).
//!
//! Usage for accounting (peak memory, CPU time, OOM kills) is read back before a run's
//! directories are removed.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crate::decide::RunKey;

/// The NVIDIA character devices' major number; minors 0..=253 are GPUs, 254 nvidia-modeset,
/// 255 nvidiactl.
pub const NVIDIA_MAJOR: u32 = 195;
/// Highest GPU minor number.
const GPU_MINOR_MAX: u32 = 253;

/// A v1 controller the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Controller {
    Cpuset,
    Memory,
    Pids,
    Devices,
}

impl Controller {
    const ALL: [Controller; 4] =
        [Controller::Cpuset, Controller::Memory, Controller::Pids, Controller::Devices];

    fn name(self) -> &'static str {
        match self {
            Controller::Cpuset => "cpuset",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Devices => "devices",
        }
    }
}

/// What one run is limited to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunLimits {
    /// The cores it may run on (empty: no cpuset).
    pub cores: Vec<u32>,
    /// Memory limit, bytes (None: none).
    pub memory_bytes: Option<u64>,
    /// Most processes and threads.
    pub pids_max: Option<u64>,
    /// GPU minors it may open (every other NVIDIA GPU device is denied).
    pub gpus: Vec<u32>,
}

/// Where this agent's per-run limit directories live.
#[derive(Clone, Debug)]
pub struct Limiter {
    /// (controller, the agent's directory under its v1 mount).
    v1: Vec<(Controller, PathBuf)>,
    /// The v2 run cgroups carry cpuset/memory/pids themselves (controllers delegated).
    v2: Vec<Controller>,
    /// Every core the node lets runs use.
    cores: Vec<u32>,
}

/// One run's limit directories.
#[derive(Clone, Debug, Default)]
pub struct RunLimited {
    dirs: Vec<(Controller, PathBuf)>,
}

/// The v1 mount point of each controller (from /proc/self/mountinfo).
fn v1_mounts() -> Vec<(Controller, PathBuf)> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let mut out = Vec::new();
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let Some(mount) = left.split_whitespace().nth(4) else { continue };
        let mut fields = right.split_whitespace();
        if fields.next() != Some("cgroup") {
            continue;
        }
        let options: Vec<&str> = fields.nth(1).unwrap_or_default().split(',').collect();
        for c in Controller::ALL {
            if options.contains(&c.name()) && !out.iter().any(|(k, _)| *k == c) {
                out.push((c, PathBuf::from(mount)));
            }
        }
    }
    out
}

/// Parses a cpuset list ("0-3,8,10-11").
pub fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b.min(a.saturating_add(65_536)));
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

fn cpu_list(cores: &[u32]) -> String {
    cores.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn write(dir: &Path, file: &str, value: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(file))
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| {
            std::io::Error::new(e.kind(), format!("writing {value:?} to {}: {e}", dir.join(file).display()))
        })
}

fn read(dir: &Path, file: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(file)).ok()
}

/// The number after `key` in a "key value" file (memory.events, cpu.stat, memory.oom_control).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

impl Limiter {
    /// The limits this host can enforce for the agent whose v2 run cgroups live in `v2_base`
    /// (its last two components name the agent's v1 directories too).
    pub fn detect(v2_base: Option<&Path>) -> Limiter {
        let name = v2_base
            .map(|b| {
                let last = b.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
                PathBuf::from("kairos").join(last)
            })
            .unwrap_or_else(|| PathBuf::from("kairos").join(format!("agent-{}", std::process::id())));
        let mut v2 = Vec::new();
        if let Some(parent) = v2_base {
            let delegated = read(parent, "cgroup.subtree_control").unwrap_or_default();
            for c in [Controller::Cpuset, Controller::Memory, Controller::Pids] {
                if delegated.split_whitespace().any(|w| w == c.name()) {
                    v2.push(c);
                }
            }
        }
        let mut v1 = Vec::new();
        for (c, mount) in v1_mounts() {
            if v2.contains(&c) {
                continue;
            }
            let dir = mount.join(&name);
            if c == Controller::Cpuset && prepare_cpuset(&mount, &name).is_err() {
                continue;
            }
            if std::fs::create_dir_all(&dir).is_ok() {
                v1.push((c, dir));
            }
        }
        let cores = v1
            .iter()
            .find(|(c, _)| *c == Controller::Cpuset)
            .and_then(|(_, d)| read(d, "cpuset.cpus"))
            .map(|s| parse_cpu_list(&s))
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| {
                let n = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
                (0..n).collect()
            });
        Limiter { v1, v2, cores }
    }

    /// A limiter that enforces nothing (no cgroups on this host).
    pub fn none() -> Limiter {
        let n = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
        Limiter { v1: Vec::new(), v2: Vec::new(), cores: (0..n).collect() }
    }

    /// Keeps the highest-numbered `n` cores from runs (the system's and the agent's).
    pub fn with_reserved_cores(mut self, n: u32) -> Limiter {
        let keep = self.cores.len().saturating_sub(n as usize).max(1);
        self.cores.truncate(keep);
        self
    }

    /// The host's cores runs may use.
    pub fn cores(&self) -> &[u32] {
        &self.cores
    }

    /// Which limits runs get here, for `kairos nodes`: e.g. "cpuset+memory+pids+devices".
    pub fn enforced(&self) -> String {
        let has = |c: Controller| self.v2.contains(&c) || self.v1.iter().any(|(k, _)| *k == c);
        let names: Vec<&str> = Controller::ALL.iter().filter(|c| has(**c)).map(|c| c.name()).collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join("+")
        }
    }

    /// Creates run `key`'s limit directories (v1) and writes its limits there and into its v2
    /// cgroup `v2_run` (where delegated).
    pub fn apply(
        &self,
        key: RunKey,
        limits: &RunLimits,
        v2_run: Option<&Path>,
    ) -> std::io::Result<RunLimited> {
        let mut run = RunLimited::default();
        let result = (|| {
            for (c, base) in &self.v1 {
                let dir = base.join(format!("run-{}-{}", key.0, key.1));
                match std::fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
                run.dirs.push((*c, dir.clone()));
                self.write_limits(*c, &dir, limits, false)?;
            }
            if let Some(v2) = v2_run {
                for c in &self.v2 {
                    self.write_limits(*c, v2, limits, true)?;
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(run),
            Err(e) => {
                run.remove();
                Err(e)
            }
        }
    }

    fn write_limits(&self, c: Controller, dir: &Path, limits: &RunLimits, v2: bool) -> std::io::Result<()> {
        match c {
            Controller::Cpuset => {
                let cores = if limits.cores.is_empty() { &self.cores } else { &limits.cores };
                write(dir, "cpuset.cpus", &cpu_list(cores))?;
                if !v2 {
                    let mems =
                        dir.parent().and_then(|p| read(p, "cpuset.mems")).unwrap_or_else(|| "0".into());
                    write(dir, "cpuset.mems", mems.trim())?;
                }
            }
            Controller::Memory => {
                if let Some(bytes) = limits.memory_bytes {
                    if v2 {
                        write(dir, "memory.max", &bytes.to_string())?;
                        // Absent without swap accounting: the memory limit above holds either way.
                        let _ = write(dir, "memory.swap.max", "0");
                    } else {
                        write(dir, "memory.limit_in_bytes", &bytes.to_string())?;
                        // No swap: memory and swap together may not exceed the limit.
                        if dir.join("memory.memsw.limit_in_bytes").exists() {
                            write(dir, "memory.memsw.limit_in_bytes", &bytes.to_string())?;
                        }
                        // Best effort: a kernel without it still enforces the limits above.
                        let _ = write(dir, "memory.swappiness", "0");
                    }
                }
            }
            Controller::Pids => {
                if let Some(max) = limits.pids_max {
                    write(dir, "pids.max", &max.to_string())?;
                }
            }
            Controller::Devices => {
                // Default allow, with every other GPU's device denied (its own and the control
                // devices, 254/255, stay open). One rule per write, all through one open file:
                // ~250 rules, and an open and close each took ~3 ms of every launch.
                let path = dir.join("devices.deny");
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?;
                for minor in (0..=GPU_MINOR_MAX).filter(|m| !limits.gpus.contains(m)) {
                    let rule = format!("c {NVIDIA_MAJOR}:{minor} rwm");
                    file.write_all(rule.as_bytes()).map_err(|e| {
                        std::io::Error::new(e.kind(), format!("writing {rule:?} to {}: {e}", path.display()))
                    })?;
                }
            }
        }
        Ok(())
    }
}

/// A v1 cpuset directory needs its cores and memory nodes set before anything can join: the
/// agent's directories inherit the mount root's.
fn prepare_cpuset(mount: &Path, name: &Path) -> std::io::Result<()> {
    let (cpus, mems) =
        (read(mount, "cpuset.cpus").unwrap_or_default(), read(mount, "cpuset.mems").unwrap_or_default());
    let mut dir = mount.to_path_buf();
    for part in name.components() {
        dir.push(part);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if read(&dir, "cpuset.cpus").is_some_and(|s| s.trim().is_empty()) {
            write(&dir, "cpuset.cpus", cpus.trim())?;
        }
        if read(&dir, "cpuset.mems").is_some_and(|s| s.trim().is_empty()) {
            write(&dir, "cpuset.mems", mems.trim())?;
        }
    }
    Ok(())
}

impl RunLimited {
    /// The run's v1 memory directory, if it has one.
    pub fn memory_dir(&self) -> Option<&Path> {
        self.dirs.iter().find(|(k, _)| *k == Controller::Memory).map(|(_, d)| d.as_path())
    }

    /// The run's limit directories (each with a `cgroup.procs`).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(_, d)| d.clone()).collect()
    }

    /// Each directory's `cgroup.procs`, opened for writing: the child writes "0" to each
    /// between fork and exec.
    pub fn procs_files(&self) -> std::io::Result<Vec<OwnedFd>> {
        self.dirs
            .iter()
            .map(|(_, d)| {
                std::fs::OpenOptions::new().write(true).open(d.join("cgroup.procs")).map(OwnedFd::from)
            })
            .collect()
    }

    /// Peak memory (KiB) and OOM kills recorded in the v1 memory directory, if any.
    pub fn memory_usage(&self) -> Option<(u64, u32)> {
        let (_, dir) = self.dirs.iter().find(|(c, _)| *c == Controller::Memory)?;
        let peak = read(dir, "memory.max_usage_in_bytes")?.trim().parse::<u64>().ok()? / 1024;
        let ooms = read(dir, "memory.oom_control").and_then(|t| keyed(&t, "oom_kill ")).unwrap_or(0);
        Some((peak, ooms as u32))
    }

    /// Removes the run's directories (they must be empty: its processes are gone).
    pub fn remove(&self) {
        for (_, d) in &self.dirs {
            if let Err(e) = std::fs::remove_dir(d) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %d.display(), error = %e, "cannot remove a run's limit directory");
                }
            }
        }
    }
}

/// Peak memory (KiB), OOM kills and CPU time (ms) of a v2 run cgroup, where it reports them.
pub fn v2_usage(dir: &Path) -> (Option<u64>, Option<u32>, Option<u64>) {
    let peak = read(dir, "memory.peak").and_then(|s| s.trim().parse::<u64>().ok()).map(|b| b / 1024);
    let ooms = read(dir, "memory.events").and_then(|t| keyed(&t, "oom_kill ")).map(|n| n as u32);
    let cpu = read(dir, "cpu.stat").and_then(|t| keyed(&t, "usage_usec ")).map(|us| us / 1000);
    (peak, ooms, cpu)
}

/// Removes this agent's empty v1 directories (at exit).
pub fn remove_empty(limiter: &Limiter) {
    for (_, base) in &limiter.v1 {
        remove_empty_base(base);
    }
}

/// Removes the empty v1 directories of the agent whose v2 base is `v2_base`, without detecting
/// (creating) anything: what its watchdog does when the agent was killed before its own exit.
pub fn remove_empty_v1_of(v2_base: &Path) {
    let Some(last) = v2_base.file_name() else { return };
    for (_, mount) in v1_mounts() {
        remove_empty_base(&mount.join("kairos").join(last));
    }
}

/// Removes a v1 base's empty run directories, then the base and, once empty, the shared
/// `kairos` directory above it.
fn remove_empty_base(base: &Path) {
    if let Ok(entries) = std::fs::read_dir(base) {
        for e in entries.flatten().filter(|e| e.path().is_dir()) {
            // A directory still in use (a live run's) stays: only empty ones go.
            let _ = std::fs::remove_dir(e.path());
        }
    }
    if std::fs::remove_dir(base).is_ok() {
        if let Some(parent) = base.parent() {
            // Shared by every agent of the host: removed only once empty.
            let _ = std::fs::remove_dir(parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_empty_v1_directories_are_removed_by_name_without_the_agent() {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let name = format!("unit-{}-{nanos:08x}", std::process::id());
        let v2_base = Path::new("/nonexistent-v2/kairos").join(&name);
        let limiter = Limiter::detect(Some(&v2_base));
        // Where this host has no writable v1 hierarchy there is nothing to leave behind.
        let bases: Vec<PathBuf> = limiter.v1.iter().map(|(_, d)| d.clone()).collect();
        for base in &bases {
            std::fs::create_dir(base.join("run-1-0")).unwrap();
        }
        remove_empty_v1_of(&v2_base);
        let left: Vec<&PathBuf> = bases.iter().filter(|b| b.exists()).collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn cpu_lists_and_keyed_files_parse() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list(""), Vec::<u32>::new());
        assert_eq!(keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill "), Some(3));
    }
}
