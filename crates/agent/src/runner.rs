//! Job processes on this node: launch, stop, and report.
//!
//! Each run (job id + attempt) is a real child process in its own process group and — where
//! the host offers cgroup v2 — its own cgroup (`cgroup.rs`), executing as its submitter's Unix
//! account when the agent runs them so (`account.rs`), with an allowlisted environment,
//! `CUDA_VISIBLE_DEVICES` set to its GPUs and stdout/stderr copied to a per-run log file of
//! bounded size. Stopping a run signals all of it, then kills it (`cgroup.kill`, or SIGKILL to
//! the group) after the grace time; when the main process exits, whatever is left of the run is
//! killed too. A run's exit is reported — and its GPUs handed to another run — only once every
//! process of it has ended.
//!
//! `reconcile` makes the local runs match the controller's level-triggered assignment set:
//!
//! ```text
//!   assigned, not started, unknown here  ─▶ launch (once its GPUs are free here and the
//!                                            agent's lease is valid; deferred until then)
//!   assigned with kill                   ─▶ stop (or report "lost" if it never ran)
//!   assigned with suspend / without      ─▶ freeze / thaw (SIGSTOP / SIGCONT) once per change
//!   assigned, started, unknown here      ─▶ report "lost" (never relaunched)
//!   running here, not assigned           ─▶ kill it (the controller gave it up)
//!   exited here, still assigned          ─▶ report the exit again
//!   running here, assigned as not started ─▶ report "started" again
//! ```

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_proto::v1 as pb;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use crate::account::{base_env, RunAs, UnixAccount, UnixAccounts};
use crate::cgroup::{Cgroups, RunCgroup};
use crate::fence::Lease;
use crate::jobfs::Dir;
#[cfg(test)]
use crate::journal::journal_dir;
pub use crate::journal::{any_run_alive, kill_every_run, kill_orphans, known_runs};
use crate::journal::{group_alive, journal_add, journal_remove, signal_group};

/// A run is a job attempt.
pub use crate::decide::RunKey;
use crate::decide::{self, Action, Local, Lost};

/// How often a running job's checkpoint marker is looked at.
const CHECKPOINT_POLL: Duration = Duration::from_millis(500);
/// How often a run that is being killed is looked at until every process of it is gone.
const GONE_POLL: Duration = Duration::from_millis(20);
/// Default cap on one run's log file.
pub const LOG_MAX_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    Lost,
}

#[derive(Debug)]
struct Run {
    pgid: Option<i32>,
    cgroup: Option<RunCgroup>,
    gpus: Vec<u32>,
    /// A fraction of its one GPU, in thousandths (0: whole GPUs).
    milli: u32,
    checkpoint_signal: Signal,
    exit: Option<Exit>,
    stopping: bool,
    /// Stopped because the agent's lease lapsed: reported lost, so the job is requeued.
    fenced: bool,
    /// The run was frozen (and not thawed since).
    suspended: bool,
    lost_message: String,
    /// Where the run's job announces checkpoints (`<job dir>/checkpoint/.kairos-checkpoint`).
    checkpoint_marker: PathBuf,
    /// The cores granted to it (empty: it asked for none).
    cores: Vec<u32>,
    /// Its container image, kept in the cache while the run lives.
    _image: Option<Arc<crate::image::Image>>,
}

impl Run {
    /// A run chosen for launch whose process is not spawned yet: it holds its GPUs.
    fn launching(a: &pb::Assignment, state_dir: &Path) -> Run {
        Run {
            pgid: None,
            cgroup: None,
            gpus: a.gpu_ids.clone(),
            milli: a.gpu_milli,
            checkpoint_signal: parse_signal(&a.checkpoint_signal, Signal::SIGTERM),
            exit: None,
            stopping: false,
            fenced: false,
            suspended: false,
            lost_message: String::new(),
            checkpoint_marker: checkpoint_marker(state_dir, a),
            cores: Vec::new(),
            _image: None,
        }
    }

    /// SIGKILL to every process of the run.
    fn kill(&self) {
        match (&self.cgroup, self.pgid) {
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
    fn signal(&self, signal: Signal) {
        match (&self.cgroup, self.pgid) {
            (Some(cg), _) => cg.signal(signal),
            (None, Some(pgid)) => signal_group(pgid, signal),
            (None, None) => {}
        }
    }

    fn freeze(&self, frozen: bool) {
        match (&self.cgroup, self.pgid) {
            (Some(cg), _) => cg.freeze(frozen),
            (None, Some(pgid)) => signal_group(pgid, if frozen { Signal::SIGSTOP } else { Signal::SIGCONT }),
            (None, None) => {}
        }
    }
}

/// How runs are isolated on this node.
#[derive(Clone, Debug)]
pub struct Isolation {
    pub accounts: UnixAccounts,
    /// None: process groups only (no cgroup could be created).
    pub cgroups: Option<Cgroups>,
    pub log_max_bytes: u64,
    /// The per-run limits this host enforces (cpuset, memory, pids, GPU devices).
    pub limiter: crate::limits::Limiter,
    /// Most processes and threads per run.
    pub pids_max: Option<u64>,
    /// How runs see their GPUs (MIG instances by UUID through their parent's device).
    pub devices: crate::gpu::DeviceMap,
    /// Container images (None: this node runs no containers).
    pub images: Option<Arc<crate::image::ImageCache>>,
    /// Where CDI specs are read from (what a container's GPUs need in it).
    pub cdi_dirs: Vec<PathBuf>,
}

impl Default for Isolation {
    fn default() -> Self {
        Isolation {
            accounts: UnixAccounts::new(RunAs::Agent),
            cgroups: None,
            log_max_bytes: LOG_MAX_BYTES_DEFAULT,
            limiter: crate::limits::Limiter::none(),
            pids_max: None,
            devices: crate::gpu::DeviceMap::default(),
            images: None,
            cdi_dirs: Vec::new(),
        }
    }
}

impl Isolation {
    /// What `kairos nodes` shows: "cgroup2,submitter,limits=cpuset+memory+pids+devices",
    /// "pgroup,agent,limits=none", …
    pub fn describe(&self) -> String {
        format!(
            "{},{},limits={}",
            if self.cgroups.is_some() { "cgroup2" } else { "pgroup" },
            self.accounts.run_as.as_str(),
            self.limiter.enforced()
        )
    }
}

/// The runs of this node and the channel their reports leave through.
#[derive(Clone)]
pub struct Runner {
    node: String,
    state_dir: PathBuf,
    process_log: crate::audit::ProcessLog,
    isolation: Arc<Isolation>,
    lease: Lease,
    runs: Arc<Mutex<BTreeMap<RunKey, Run>>>,
    /// The latest assignment set, for launches deferred until GPUs free up or the lease renews.
    last_set: Arc<Mutex<Option<pb::AssignmentSet>>>,
    reports: mpsc::Sender<pb::StatusReport>,
}

/// Environment variables, in the order they are set.
type EnvPairs = Vec<(String, String)>;

/// After a checkpoint signal's grace, how long a job has to end on SIGTERM before it is killed.
pub const KILL_WAIT: Duration = Duration::from_secs(10);
/// How often a stopping run is checked (ended, checkpoint reported).
const STOP_POLL: Duration = Duration::from_millis(100);

/// Where a run's log lives.
pub fn log_path(state_dir: &Path, job: u64, submit_ms: i64, attempt: u32) -> PathBuf {
    job_dir(state_dir, job, submit_ms).join(log_name(attempt))
}

/// The file name of an attempt's log in its job's directory.
pub fn log_name(attempt: u32) -> String {
    format!("attempt-{attempt}.log")
}

/// The file a job touches to announce a checkpoint, in its checkpoint directory.
const MARKER: &str = ".kairos-checkpoint";

fn checkpoint_marker(state_dir: &Path, a: &pb::Assignment) -> PathBuf {
    job_dir(state_dir, a.job_id, a.submit_time_ms).join("checkpoint").join(MARKER)
}

/// Where job directories live.
pub fn jobs_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("jobs")
}

/// The name of a job's directory: its id and submit time, so that a job id issued again (a
/// cluster restored from a backup, a new cluster on this agent's state) never finds an earlier
/// job's logs and checkpoints.
pub fn job_dir_name(job: u64, submit_ms: i64) -> String {
    format!("{job}-{submit_ms}")
}

/// The job id a job directory's name carries (`ID-MS`, or `ID` as older agents named them).
pub fn job_of_dir_name(name: &str) -> Option<u64> {
    name.split('-').next()?.parse().ok()
}

/// A job's directory on this node (its runs' logs, its checkpoint directory).
pub fn job_dir(state_dir: &Path, job: u64, submit_ms: i64) -> PathBuf {
    jobs_dir(state_dir).join(job_dir_name(job, submit_ms))
}

/// The job directory and checkpoint directory of a run, created (or reused) for `account`,
/// and a new log for the attempt — all without trusting what the job left in its directory
/// (`jobfs`).
fn prepare_job_files(
    state_dir: &Path,
    a: &pb::Assignment,
    account: Option<&UnixAccount>,
) -> std::io::Result<std::fs::File> {
    let owner = account.map(|a| (a.uid, a.gid));
    let jobs = Dir::create(&jobs_dir(state_dir))?;
    let job = jobs.subdir(&job_dir_name(a.job_id, a.submit_time_ms), owner, 0o700)?;
    job.subdir("checkpoint", owner, 0o700)?;
    job.create_fresh(&log_name(a.attempt), owner)
}

/// Copies a run's output into its log file, up to `max` bytes in all (shared by stdout and
/// stderr); past that it writes one marker, keeps reading (so the job never blocks on a full
/// pipe) and drops the rest.
async fn copy_output(
    mut from: impl tokio::io::AsyncRead + Unpin,
    to: Arc<Mutex<std::fs::File>>,
    written: Arc<std::sync::atomic::AtomicU64>,
    max: u64,
    truncated: impl Fn(),
) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut file = to.lock().unwrap_or_else(|p| p.into_inner());
        let before = written.load(Ordering::Relaxed);
        if before >= max {
            continue;
        }
        let take = (n as u64).min(max - before) as usize;
        let mut result = file.write_all(&buf[..take]);
        written.store(before + take as u64, Ordering::Relaxed);
        if before + take as u64 >= max {
            result = result.and_then(|()| {
                file.write_all(
                    format!("\n[kairos-agent: log truncated at {max} bytes; the job goes on]\n").as_bytes(),
                )
            });
            truncated();
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot write a run's log");
        }
    }
}

/// Makes the child confine itself before any of the job's code runs: into the run's cgroup
/// (through the returned `cgroup.procs` file, which must stay open until the spawn), to the
/// job's account — or, for a container, into the container as that account
/// (`container_child::enter`) — then into its working directory, entered as that account,
/// after the switch: as root the chdir would pass directories the job's user may not enter.
fn confine(
    cmd: &mut tokio::process::Command,
    cgroup: Option<&RunCgroup>,
    limited: &crate::limits::RunLimited,
    account: Option<&crate::account::UnixAccount>,
    (workdir, fallback): (&Path, Option<&Path>),
    container: Option<crate::container::Plan>,
) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
    let mut procs: Vec<std::os::fd::OwnedFd> =
        cgroup.map(RunCgroup::procs_file).transpose()?.into_iter().collect();
    procs.extend(limited.procs_files()?);
    let procs_fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
    let ids = account.map(|a| {
        let groups: Vec<nix::unistd::Gid> = a.groups.iter().map(|g| nix::unistd::Gid::from_raw(*g)).collect();
        (groups, nix::unistd::Gid::from_raw(a.gid), nix::unistd::Uid::from_raw(a.uid))
    });
    let cpath = |p: &Path| {
        std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()))
            .map_err(|_| std::io::Error::other("the working directory holds a NUL byte"))
    };
    let workdir = match &container {
        Some(plan) => plan.workdir().to_owned(),
        None => cpath(workdir)?,
    };
    // The submit directory where the node can enter it, else the job's own (said on stderr).
    let fallback = match (&container, fallback) {
        (None, Some(f)) => Some((
            cpath(f)?,
            format!(
                "kairos-agent: cannot enter the submit directory {}; the job runs in {}\n",
                workdir.to_string_lossy(),
                f.display()
            ),
        )),
        _ => None,
    };
    // SAFETY: between fork and exec the child only makes system calls (write, the container's
    // namespaces and mounts, setgroups, setgid, setuid, chdir) on values prepared before the
    // fork; nothing allocates or locks.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &procs_fds {
                // Into the run's cgroup (and its limits) before any of the job's code runs.
                if nix::libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            match &container {
                // Becomes the user first, then enters its container.
                Some(plan) => crate::container_child::enter(plan)?,
                None => {
                    if let Some((groups, gid, uid)) = &ids {
                        nix::unistd::setgroups(groups)?;
                        nix::unistd::setgid(*gid)?;
                        nix::unistd::setuid(*uid)?;
                    }
                }
            }
            if nix::libc::chdir(workdir.as_ptr()) != 0 {
                let Some((own, note)) = &fallback else { return Err(std::io::Error::last_os_error()) };
                if nix::libc::chdir(own.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                nix::libc::write(2, note.as_ptr().cast(), note.len());
            }
            if let Some(plan) = &container {
                plan.set_up();
            }
            // Nothing the agent holds reaches the job (a descriptor it inherited without
            // close-on-exec, say): everything past stderr closes on exec.
            nix::libc::syscall(nix::libc::SYS_close_range, 3u32, u32::MAX, nix::libc::CLOSE_RANGE_CLOEXEC);
            Ok(())
        });
    }
    Ok(procs)
}

/// What a run used, as its exit report carries it.
#[derive(Clone, Copy, Debug, Default)]
struct RunUsed {
    max_rss_kib: u64,
    cpu_ms: u64,
    oom_kills: u32,
}

/// Reads what a finished run used from its cgroups (before they are removed).
fn run_usage(cgroup: Option<&RunCgroup>, limited: &crate::limits::RunLimited) -> RunUsed {
    let (peak2, ooms2, cpu) = cgroup.map(|c| crate::limits::v2_usage(c.dir())).unwrap_or_default();
    let (peak1, ooms1) = limited.memory_usage().map_or((None, None), |(p, o)| (Some(p), Some(o)));
    RunUsed {
        max_rss_kib: peak2.or(peak1).unwrap_or(0),
        cpu_ms: cpu.unwrap_or(0),
        oom_kills: ooms2.unwrap_or(0).max(ooms1.unwrap_or(0)),
    }
}

/// The node's runs as `decide` reads them.
fn local_of(runs: &BTreeMap<RunKey, Run>) -> BTreeMap<RunKey, Local> {
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

/// The signal named `name` ("SIGUSR1"), or `fallback`.
fn parse_signal(name: &str, fallback: Signal) -> Signal {
    name.parse::<Signal>().unwrap_or(fallback)
}

impl Runner {
    pub fn new(node: &str, state_dir: &Path, reports: mpsc::Sender<pb::StatusReport>) -> Self {
        Runner {
            node: node.to_string(),
            state_dir: state_dir.to_path_buf(),
            process_log: Default::default(),
            isolation: Arc::default(),
            lease: Lease::unfenced(),
            runs: Arc::default(),
            last_set: Arc::default(),
            reports,
        }
    }

    /// Records every process start and exit in `log`.
    pub fn with_process_log(mut self, log: crate::audit::ProcessLog) -> Self {
        self.process_log = log;
        self
    }

    /// Runs execute as, and are contained by, what `isolation` says.
    pub fn with_isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = Arc::new(isolation);
        self
    }

    /// Launches only while `lease` is valid.
    pub fn with_lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RunKey, Run>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Live runs' job ids and GPUs (for dcgm-exporter's job mapping).
    pub fn running_gpus(&self) -> Vec<(u64, Vec<u32>)> {
        self.lock().iter().filter(|(_, r)| r.exit.is_none()).map(|(k, r)| (k.0, r.gpus.clone())).collect()
    }

    /// Runs with a live process, for heartbeats.
    pub fn running(&self) -> Vec<RunKey> {
        self.lock().iter().filter(|(_, r)| r.exit.is_none()).map(|(k, _)| *k).collect()
    }

    /// Whether `key` is known here and has finished (or is not known at all).
    pub fn finished(&self, key: RunKey) -> bool {
        self.lock().get(&key).is_none_or(|r| r.exit.is_some())
    }

    fn report(&self, key: RunKey, exit: Option<Exit>, message: String) {
        self.report_with(key, exit, message, RunUsed::default());
    }

    fn report_with(&self, key: RunKey, exit: Option<Exit>, message: String, usage: RunUsed) {
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
            max_rss_kib: usage.max_rss_kib,
            cpu_time_ms: usage.cpu_ms,
            oom_kills: usage.oom_kills,
        };
        if let Err(mpsc::error::TrySendError::Full(report)) = self.reports.try_send(report) {
            let tx = self.reports.clone();
            tokio::spawn(async move {
                let _ = tx.send(report).await;
            });
        }
    }

    /// Makes the local runs match the controller's assignment set: carries out what
    /// `decide::reconcile` says, then launches what may start (`launch_ready`).
    pub fn reconcile(&self, set: &pb::AssignmentSet) {
        let assigned = decide::assigned_of(&set.runs);
        let mut stop = Vec::new();
        let mut reports = Vec::new();
        {
            let mut runs = self.lock();
            for action in decide::reconcile(&assigned, &local_of(&runs)) {
                match action {
                    Action::Freeze(key, frozen) => {
                        if let Some(run) = runs.get_mut(&key) {
                            tracing::info!(
                                job = key.0,
                                attempt = key.1,
                                suspend = frozen,
                                "suspend state changes"
                            );
                            run.freeze(frozen);
                            run.suspended = frozen;
                        }
                    }
                    Action::ReportExit(key) => {
                        if let Some(run) = runs.get(&key) {
                            reports.push((key, run.exit, run.lost_message.clone()));
                        }
                    }
                    Action::ReportStarted(key) => reports.push((key, None, String::new())),
                    Action::ReportLost(key, why) => {
                        let message = match why {
                            Lost::StoppedBeforeStart => "stopped before it started".to_string(),
                            Lost::NoProcess => format!(
                                "node \"{}\" has no process for this run (agent restarted?)",
                                self.node
                            ),
                        };
                        reports.push((key, Some(Exit::Lost), message));
                    }
                    Action::Stop { key, signal, grace_s } => stop.push((key, grace_s, signal)),
                    Action::Kill(key) => {
                        if let Some(run) = runs.get_mut(&key) {
                            if !run.stopping {
                                tracing::warn!(
                                    job = key.0,
                                    attempt = key.1,
                                    "killing a run the controller no longer assigns"
                                );
                            }
                            run.stopping = true;
                            run.kill();
                        }
                    }
                    Action::Forget(key) => {
                        runs.remove(&key);
                    }
                }
            }
            *self.last_set.lock().unwrap_or_else(|p| p.into_inner()) = Some(set.clone());
        }
        for (key, exit, message) in reports {
            self.report(key, exit, message);
        }
        for (key, grace, signal) in stop {
            let signal = parse_signal(&signal, Signal::SIGTERM);
            // A checkpoint signal asks for a checkpoint; SIGTERM then asks the job to end.
            let then = (signal != Signal::SIGTERM && signal != Signal::SIGKILL).then_some(KILL_WAIT);
            self.stop(key, signal, Duration::from_secs(u64::from(grace)), then);
        }
        self.launch_ready();
    }

    /// Launches the assigned runs that may start now (`decide::launches`: the lease is valid and
    /// none of their GPUs is held by a run of this node whose processes have not all ended). The
    /// others wait for the next call (a run's end, a lease renewal, a new set).
    pub fn launch_ready(&self) {
        let mut launch = Vec::new();
        {
            // Chosen and marked under one lock, from the set `reconcile` stored under the same
            // lock: concurrent callers (a new set, a run's end, a lease renewal) never launch a
            // run twice, nor one a newer set no longer assigns.
            let mut runs = self.lock();
            let Some(set) = self.last_set.lock().unwrap_or_else(|p| p.into_inner()).clone() else { return };
            let assigned = decide::assigned_of(&set.runs);
            let ready = decide::launches(&assigned, &local_of(&runs), self.lease.valid());
            for a in &set.runs {
                let key = (a.job_id, a.attempt);
                if ready.contains(&key) {
                    runs.insert(key, Run::launching(a, &self.state_dir));
                    launch.push(a.clone());
                } else if !a.kill && !a.started && !runs.contains_key(&key) && self.lease.valid() {
                    tracing::info!(job = a.job_id, attempt = a.attempt, gpus = ?a.gpu_ids, "launch waits: a GPU's previous run has not ended");
                }
            }
        }
        for a in launch {
            self.launch(&a);
        }
    }

    fn launch_failed(&self, a: &pb::Assignment, message: String) {
        let key = (a.job_id, a.attempt);
        tracing::warn!(job = a.job_id, %message, "launch failed");
        self.process_log.exit(a.job_id, a.attempt, "not started");
        // Into the attempt's log when its job directory is there (a job's own file is never
        // followed, nor anything but a regular file of one link appended to).
        if let Ok(dir) = Dir::open(&job_dir(&self.state_dir, a.job_id, a.submit_time_ms)) {
            let name = log_name(a.attempt);
            let log = match dir.open_existing(&name, true) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => dir.create_fresh(&name, None),
                other => other,
            };
            if let Ok(mut f) = log {
                let _ = std::io::Write::write_all(&mut f, format!("kairos-agent: {message}\n").as_bytes());
            }
        }
        self.lock().insert(
            key,
            Run {
                pgid: None,
                cgroup: None,
                gpus: Vec::new(),
                milli: 0,
                checkpoint_signal: Signal::SIGTERM,
                exit: Some(Exit::Lost),
                stopping: false,
                fenced: false,
                suspended: false,
                lost_message: message.clone(),
                checkpoint_marker: PathBuf::new(),
                cores: Vec::new(),
                _image: None,
            },
        );
        self.report(key, Some(Exit::Lost), message);
    }

    /// Starts a run; one in a container once its image is ready (pulled off the runner's
    /// path). Failures to start are reported as a lost run with the reason.
    fn launch(&self, a: &pb::Assignment) {
        let Some(container) = a.container.clone().filter(|c| !c.image.is_empty()) else {
            return self.start(a, None);
        };
        let (this, a) = (self.clone(), a.clone());
        tokio::spawn(async move {
            let pulled = match this.isolation.images.clone() {
                None => Err(crate::image::PullError(
                    "this node runs no containers (kairos-agent --container-runtime none)".into(),
                )),
                Some(cache) => {
                    let image = container.image.clone();
                    // A job's own image is read as its user.
                    let reader = match this.isolation.accounts.resolve(&a.user) {
                        Ok(account) => account.map(|u| crate::image::Reader {
                            uid: u.uid,
                            gid: u.gid,
                            groups: u.groups.clone(),
                        }),
                        Err(message) => return this.launch_failed(&a, message),
                    };
                    tokio::task::spawn_blocking(move || cache.prepare(&image, reader.as_ref()))
                        .await
                        .unwrap_or_else(|e| Err(crate::image::PullError(e.to_string())))
                }
            };
            match pulled {
                Ok(image) => {
                    let key = (a.job_id, a.attempt);
                    let note = format!("{} (digest {})", container.image, image.digest);
                    this.report_status(key, pb::RunStatus::Image, note);
                    // The spawn waits for the container's set-up (bounded by its deadline):
                    // off the agent's async tasks.
                    let image = Arc::new(image);
                    let started = tokio::task::spawn_blocking(move || this.start(&a, Some(image)));
                    if let Err(e) = started.await {
                        tracing::warn!(error = %e, "starting a container run");
                    }
                }
                Err(e) => this.launch_failed(&a, e.to_string()),
            }
        });
    }

    /// Sends a report about a run that changes nothing of it (its log truncated, its image).
    fn report_status(&self, key: RunKey, status: pb::RunStatus, message: String) {
        let _ = self.reports.try_send(pb::StatusReport {
            node_id: self.node.clone(),
            job_id: key.0,
            attempt: key.1,
            status: status as i32,
            message,
            ..Default::default()
        });
    }

    /// Starts a run's process (in `image`'s container when given).
    fn start(&self, a: &pb::Assignment, image: Option<Arc<crate::image::Image>>) {
        let key = (a.job_id, a.attempt);
        let account = match self.isolation.accounts.resolve(&a.user) {
            Ok(account) => account,
            Err(message) => return self.launch_failed(a, message),
        };
        let job_dir = job_dir(&self.state_dir, a.job_id, a.submit_time_ms);
        let workdir = if a.workdir.is_empty() { job_dir.clone() } else { PathBuf::from(&a.workdir) };
        // Logged before the spawn: the logged interval must cover the process's life.
        self.process_log.start(a.job_id, a.attempt, &a.gpu_ids, None);
        let cgroup = match self.isolation.cgroups.as_ref().map(|c| c.create(key)).transpose() {
            Ok(cg) => cg,
            Err(e) => return self.launch_failed(a, format!("creating the run's cgroup: {e}")),
        };
        let limits = self.run_limits(a);
        let limited = match self.isolation.limiter.apply(key, &limits, cgroup.as_ref().map(RunCgroup::dir)) {
            Ok(l) => l,
            Err(e) => {
                if let Some(cg) = &cgroup {
                    cg.remove();
                }
                return self.launch_failed(a, format!("setting the run's limits: {e}"));
            }
        };
        // The launch joins the job's trace; the job gets it as TRACEPARENT to join its own spans.
        let trace = (!a.traceparent.is_empty()).then(|| {
            let parent = kairos_telemetry::traces::context_of(&a.traceparent);
            let attributes = vec![
                opentelemetry::KeyValue::new("kairos.job_id", a.job_id as i64),
                opentelemetry::KeyValue::new("kairos.attempt", i64::from(a.attempt)),
                opentelemetry::KeyValue::new("kairos.node", self.node.clone()),
            ];
            kairos_telemetry::traces::start("launch", &parent, attributes)
        });
        let traceparent = trace.as_ref().and_then(kairos_telemetry::traces::traceparent);
        let spawned = (|| -> std::io::Result<(tokio::process::Child, Arc<Mutex<std::fs::File>>)> {
            // The job's directory and log belong to the job's user, readable by nobody else.
            let log = prepare_job_files(&self.state_dir, a, account.as_ref())?;
            let (mut container, image_env) =
                match self.container_plan(a, image.as_deref(), &job_dir, account.as_ref())? {
                    Some((plan, env)) => (Some(plan), env),
                    None => (None, Vec::new()),
                };
            let mut cmd =
                self.job_command(a, account.as_ref(), &image_env, &job_dir.join("checkpoint"), traceparent)?;
            cmd.env("KAIROS_CPUS", limits.cores.len().to_string());
            if a.cpus > 0 {
                cmd.env("SLURM_CPUS_PER_TASK", a.cpus.to_string())
                    .env("SLURM_CPUS_ON_NODE", a.cpus.to_string());
            }
            if a.memory_mib > 0 {
                cmd.env("SLURM_MEM_PER_NODE", a.memory_mib.to_string());
            }
            let id_maps = container.as_mut().map(crate::container::Plan::id_maps).transpose()?;
            // Held open until the child has written itself into them.
            let fallback = a.workdir_is_submit_dir.then_some(job_dir.as_path());
            let _procs = confine(
                &mut cmd,
                cgroup.as_ref(),
                &limited,
                account.as_ref(),
                (&workdir, fallback),
                container,
            )?;
            // Recorded as the agent's own: the orphan reaper leaves its exit status to the run.
            // A container's process gets its id maps from a thread of the agent's meanwhile.
            let child = match id_maps {
                None => crate::reaper::spawn(|| cmd.spawn(), tokio::process::Child::id)?,
                Some(maps) => {
                    let spawned = std::sync::atomic::AtomicBool::new(false);
                    std::thread::scope(|s| {
                        let writer = s.spawn(|| maps.write(&spawned));
                        let child = crate::reaper::spawn(|| cmd.spawn(), tokio::process::Child::id);
                        spawned.store(true, std::sync::atomic::Ordering::Release);
                        let written =
                            writer.join().unwrap_or_else(|_| Err(std::io::Error::other("panicked")));
                        match (child, written) {
                            (Ok(child), _) => Ok(child),
                            (Err(e), Err(why)) => {
                                Err(std::io::Error::new(e.kind(), format!("{e} (id maps: {why})")))
                            }
                            (Err(e), Ok(())) => Err(e),
                        }
                    })?
                }
            };
            Ok((child, Arc::new(Mutex::new(log))))
        })();
        if let Some(trace) = &trace {
            kairos_telemetry::traces::end(trace);
        }
        let (mut child, log) = match spawned {
            Ok(spawned) => spawned,
            Err(e) => {
                if let Some(cg) = &cgroup {
                    cg.remove();
                }
                limited.remove();
                let who = account.as_ref().map_or("the agent's user", |a| a.name.as_str());
                let program = a.argv.first().cloned().unwrap_or_default();
                return self.launch_failed(
                    a,
                    format!("starting {program:?} in {} as {who}: {e}", workdir.display()),
                );
            }
        };
        let pgid = child.id().map(|p| p as i32);
        tracing::info!(job = a.job_id, attempt = a.attempt, ?pgid, gpus = ?a.gpu_ids, user = %a.user, "run started");
        let copiers = self.copy_outputs(key, &mut child, log);
        self.spawned(a, pgid, cgroup.clone(), limits.cores, image);
        if let Some(pgid) = pgid {
            journal_add(&self.state_dir, key, pgid);
        }
        self.report(key, None, String::new());
        self.watch_checkpoints(key, checkpoint_marker(&self.state_dir, a));
        tokio::spawn(self.clone().watch_exit(key, child, pgid, (cgroup, limited), copiers));
    }

    /// How a run of `a` in `image` enters its container — the job's directory bound at its own
    /// path (its checkpoints and outputs), the job's mounts, the run's GPUs (as the node's CDI
    /// spec has them, else their device nodes); it starts in the container's workdir, else the
    /// job's directory — and the environment it adds under the job's (the image's, the CDI
    /// spec's). None for a bare run.
    fn container_plan(
        &self,
        a: &pb::Assignment,
        image: Option<&crate::image::Image>,
        job_dir: &Path,
        account: Option<&UnixAccount>,
    ) -> std::io::Result<Option<(crate::container::Plan, EnvPairs)>> {
        let (Some(image), Some(c)) = (image, a.container.as_ref()) else { return Ok(None) };
        let own = job_dir.display().to_string();
        let mut binds = vec![crate::container::Bind {
            src: job_dir.to_path_buf(),
            dst: own.clone(),
            read_only: false,
            the_jobs: false,
        }];
        for m in &c.mounts {
            // Its source is looked up by the run's process, as the job's user.
            let bind = crate::container::Bind::parse(m)
                .ok_or_else(|| std::io::Error::other(format!("container mount {m:?} is not SRC:DST[:ro]")))?;
            binds.push(bind);
        }
        let workdir = if c.workdir.is_empty() { own } else { c.workdir.clone() };
        let mut env = image.env.clone();
        let names: Vec<String> = match a.gpu_ids.is_empty() {
            true => Vec::new(),
            false => self.isolation.devices.visible(&a.gpu_ids).split(',').map(str::to_string).collect(),
        };
        let cdi = match names.is_empty() {
            true => None,
            false => crate::cdi::edits(&self.isolation.cdi_dirs, crate::cdi::GPU_KIND, &names)
                .map_err(std::io::Error::other)?,
        };
        let devices = match cdi {
            Some(edits) => {
                let mounts = edits.mounts.into_iter().filter(|(host, _, _)| host.exists());
                binds.extend(mounts.map(|(src, dst, read_only)| crate::container::Bind {
                    src,
                    dst,
                    read_only,
                    the_jobs: false,
                }));
                env.extend(edits.env);
                edits.devices
            }
            None => crate::container::gpu_devices(&self.isolation.devices.minors(&a.gpu_ids)),
        };
        let base = self.state_dir.join("containers");
        let identity =
            account.map(|u| crate::container::Identity { groups: u.groups.clone(), gid: u.gid, uid: u.uid });
        let plan = crate::container::Plan::new(
            &image.rootfs,
            &base,
            &binds,
            &devices,
            &workdir,
            identity,
            a.memory_mib,
        )?;
        Ok(Some((plan, env)))
    }

    /// The job's command: its argv with the environment a run gets (kairos's, Slurm-like and
    /// torchrun-compatible variables, its GPUs as CUDA sees them), output piped, its own process
    /// group.
    fn job_command(
        &self,
        a: &pb::Assignment,
        account: Option<&crate::account::UnixAccount>,
        image_env: &[(String, String)],
        checkpoint_dir: &Path,
        traceparent: Option<String>,
    ) -> std::io::Result<tokio::process::Command> {
        let visible = self.isolation.devices.visible(&a.gpu_ids);
        let program = a.argv.first().ok_or_else(|| std::io::Error::other("empty command"))?;
        let or = |value: &'_ str, default: &'static str| -> String {
            if value.is_empty() { default } else { value }.to_string()
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(&a.argv[1..])
            .env_clear()
            .envs(base_env(std::env::vars(), account))
            // A container's own (its PATH, say), under the job's.
            .envs(image_env.iter().cloned())
            .envs(&a.env)
            .env("KAIROS_JOB_ID", a.job_id.to_string())
            .env("KAIROS_RESTART_COUNT", a.attempt.to_string())
            .env("KAIROS_NODE", &self.node)
            // Survives attempts (on this node): where the job keeps checkpoints to resume from.
            .env("KAIROS_CHECKPOINT_DIR", checkpoint_dir)
            .env("CUDA_VISIBLE_DEVICES", visible)
            // A fraction of a GPU: its share of the SMs and of the memory where MPS serves
            // the GPU (not enforced otherwise; see docs/gpus.md), and the fraction itself.
            .envs(
                (a.gpu_milli > 0)
                    .then(|| {
                        [
                            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", a.gpu_milli.div_ceil(10).to_string()),
                            ("KAIROS_GPU_FRACTION", format!("{:.3}", f64::from(a.gpu_milli) / 1000.0)),
                        ]
                    })
                    .into_iter()
                    .flatten(),
            )
            // The indices are NVML's, which follow the PCI bus; CUDA's default order (fastest
            // first) can differ, so a job would use GPUs it was not given.
            .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            // An elastic job's GPU count changes between attempts.
            .env("KAIROS_GPUS", a.gpu_ids.len().to_string())
            .env("KAIROS_CHECKPOINT_SIGNAL", or(&a.checkpoint_signal, "SIGTERM"))
            // torchrun-compatible gang environment (one task per node).
            .env("RANK", a.rank.to_string())
            .env("WORLD_SIZE", a.world_size.max(1).to_string())
            .env("LOCAL_RANK", "0")
            .env("LOCAL_WORLD_SIZE", "1")
            .env("MASTER_ADDR", or(&a.master_addr, "127.0.0.1"))
            .env("MASTER_PORT", a.master_port.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        if let Some(limit) = self.isolation.devices.fraction_memory_limit(&a.gpu_ids, a.gpu_milli) {
            cmd.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", limit);
        }
        if let Some(tp) = &traceparent {
            cmd.env("TRACEPARENT", tp);
        }
        Ok(cmd)
    }

    /// Copies the child's stdout and stderr into the run's log, up to the log's bound (the
    /// controller is told once when it is reached).
    fn copy_outputs(
        &self,
        key: RunKey,
        child: &mut tokio::process::Child,
        log: Arc<Mutex<std::fs::File>>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        // The log is new: nothing of it is written yet.
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let max = self.isolation.log_max_bytes;
        let note = {
            let (reports, node) = (self.reports.clone(), self.node.clone());
            move || {
                let _ = reports.try_send(pb::StatusReport {
                    node_id: node.clone(),
                    job_id: key.0,
                    attempt: key.1,
                    status: pb::RunStatus::LogTruncated as i32,
                    exit_code: 0,
                    signal: 0,
                    message: format!("the log reached {max} bytes; later output is dropped"),
                    ..Default::default()
                });
            }
        };
        let copy = |o| tokio::spawn(copy_output(o, log.clone(), written.clone(), max, note.clone()));
        let stdout =
            child.stdout.take().map(|o| copy(Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>));
        let stderr =
            child.stderr.take().map(|o| copy(Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>));
        [stdout, stderr].into_iter().flatten().collect()
    }

    /// Records the spawned run; a stop or a fence that came while it was being spawned still
    /// applies.
    fn spawned(
        &self,
        a: &pb::Assignment,
        pgid: Option<i32>,
        cgroup: Option<RunCgroup>,
        cores: Vec<u32>,
        image: Option<Arc<crate::image::Image>>,
    ) {
        let key = (a.job_id, a.attempt);
        let mut runs = self.lock();
        let (stopping, fenced) = runs.get(&key).map(|r| (r.stopping, r.fenced)).unwrap_or_default();
        let run = Run {
            pgid,
            cgroup,
            gpus: a.gpu_ids.clone(),
            milli: a.gpu_milli,
            checkpoint_signal: parse_signal(&a.checkpoint_signal, Signal::SIGTERM),
            exit: None,
            stopping,
            fenced,
            suspended: false,
            lost_message: String::new(),
            checkpoint_marker: checkpoint_marker(&self.state_dir, a),
            cores,
            _image: image,
        };
        if stopping || fenced {
            run.kill();
        }
        runs.insert(key, run);
    }

    /// Waits for the run's main process, then for every process of it to be gone and its
    /// output copied; records and reports how it ended (a fenced run as lost), and launches
    /// what waited for its GPUs.
    async fn watch_exit(
        self,
        key: RunKey,
        mut child: tokio::process::Child,
        pgid: Option<i32>,
        (cgroup, limited): (Option<RunCgroup>, crate::limits::RunLimited),
        copiers: Vec<tokio::task::JoinHandle<()>>,
    ) {
        let mut exit = match child.wait().await {
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
        // The main process is gone: nothing of the run may outlive it, and the run ends only
        // when its last process has.
        self.wait_gone(key, pgid, cgroup.as_ref()).await;
        for c in copiers {
            let _ = c.await;
        }
        tracing::info!(job = key.0, attempt = key.1, ?exit, "run exited");
        let how = match exit {
            Exit::Code(c) => format!("exit {c}"),
            Exit::Signal(s) => format!("signal {s}"),
            Exit::Lost => "lost".to_string(),
        };
        self.process_log.exit(key.0, key.1, &how);
        journal_remove(self.state_dir(), key);
        let usage = run_usage(cgroup.as_ref(), &limited);
        if let Some(cg) = &cgroup {
            cg.remove();
        }
        limited.remove();
        let mut message = String::new();
        if let Some(run) = self.lock().get_mut(&key) {
            if run.fenced {
                exit = Exit::Lost;
                message = "stopped on its node: the agent's lease lapsed (no controller answered)".into();
                run.lost_message = message.clone();
            }
            run.exit = Some(exit);
        }
        self.report_with(key, Some(exit), message, usage);
        self.launch_ready();
    }

    /// What a run is limited to: its GPUs' devices, its memory, and its cores — granted ones
    /// (not another live run's where the host has enough), or for a run that asked for none
    /// the cores no live run was granted.
    fn run_limits(&self, a: &pb::Assignment) -> crate::limits::RunLimits {
        let all = self.isolation.limiter.cores();
        let granted: Vec<Vec<u32>> =
            self.lock().values().filter(|r| r.exit.is_none()).map(|r| r.cores.clone()).collect();
        let cores = if a.cpus > 0 { crate::limits::pick_cores(all, &granted, a.cpus) } else { Vec::new() };
        crate::limits::RunLimits {
            cores,
            memory_bytes: (a.memory_mib > 0).then(|| a.memory_mib.saturating_mul(1 << 20)),
            pids_max: self.isolation.pids_max,
            gpus: self.isolation.devices.minors(&a.gpu_ids),
        }
    }

    /// Kills what is left of a run whose main process ended and waits until every process of it
    /// is gone (killing again now and then: a process may fork while it is being killed).
    async fn wait_gone(&self, key: RunKey, pgid: Option<i32>, cgroup: Option<&RunCgroup>) {
        let alive = || cgroup.map(RunCgroup::populated).unwrap_or(false) || pgid.is_some_and(group_alive);
        let mut polls = 0u64;
        while alive() {
            if polls.is_multiple_of(50) {
                if let Some(cg) = cgroup {
                    cg.kill();
                }
                if let Some(pgid) = pgid {
                    signal_group(pgid, Signal::SIGKILL);
                }
            }
            if polls == 500 {
                tracing::warn!(
                    job = key.0,
                    attempt = key.1,
                    "a run's processes do not die; its GPUs stay held"
                );
            }
            polls += 1;
            tokio::time::sleep(GONE_POLL).await;
        }
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
                        ..Default::default()
                    };
                    let _ = runner.reports.send(report).await;
                }
            }
        });
    }

    /// Asks a run to stop: `signal` now to all of it (SIGTERM, or the checkpoint signal before a
    /// preemption), a kill after `grace` unless it has ended. With `then_term` (after a
    /// checkpoint signal), the grace ends early once the job reports its checkpoint, SIGTERM
    /// follows, and the kill only after `then_term` more: work done after the checkpoint is
    /// saved by a job that checkpoints on SIGTERM, not thrown away (as Slurm's KillWait).
    fn stop(&self, key: RunKey, signal: Signal, grace: Duration, then_term: Option<Duration>) {
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
        for run in self.lock().values().filter(|r| r.exit.is_none()) {
            run.signal(Signal::SIGTERM);
            run.freeze(false);
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

#[cfg(test)]
#[path = "runner_tests.rs"]
mod tests;
