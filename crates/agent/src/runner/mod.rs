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
//!
//! A launch reads its assignment once, into a `RunSpec` (`launch::spec`, pure); from there on
//! nothing sees the wire type. `spawn` turns the spec into a confined child (its cgroup and
//! limits, job files, container, command); `run` is a run as held here, `stop` stops runs,
//! `output` copies a run's output into its log, `interactive` keeps an interactive run's
//! terminal as a session (`crate::interactive`) and shows the runs to sessions. Nothing below the runner imports it or
//! `launch`.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_proto::v1 as pb;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use crate::account::UnixAccount;
use crate::cgroup::RunCgroup;
use crate::decide::{self, Action, Lost};
use crate::fence::Lease;
use crate::image::Image;
use crate::isolation::Isolation;
use crate::jobfs::Dir;
use crate::journal::{group_alive, journal_add, journal_remove, signal_group};
use crate::launch::{parse_signal, RunFiles, RunSpec};

/// A run is a job attempt.
pub use crate::decide::RunKey;
pub use run::Exit;
use run::{local_of, Run};
use spawn::{Confined, RunUsed, Spawned};

mod interactive;
mod output;
mod run;
mod spawn;
mod stop;

/// A run's output, as its log copies it.
type Output = Box<dyn tokio::io::AsyncRead + Send + Unpin>;

fn boxed(o: impl tokio::io::AsyncRead + Send + Unpin + 'static) -> Output {
    Box::new(o)
}

/// How often a running job's checkpoint marker is looked at.
const CHECKPOINT_POLL: Duration = Duration::from_millis(500);
/// How often a run that is being killed is looked at until every process of it is gone.
const GONE_POLL: Duration = Duration::from_millis(20);
/// After a checkpoint signal's grace, how long a job has to end on SIGTERM before it is killed.
pub const KILL_WAIT: Duration = Duration::from_secs(10);

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
    /// Every run's measured usage (`usage`).
    usage: crate::usage::Usage,
    /// The node's interactive sessions (an interactive run's terminal is one).
    sessions: crate::interactive::Sessions,
    /// The agent is shutting down (`stop_all`): nothing more launches, and a run whose spawn
    /// was under way is killed as soon as it exists.
    closing: Arc<std::sync::atomic::AtomicBool>,
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
            usage: Default::default(),
            sessions: Default::default(),
            closing: Arc::default(),
        }
    }

    /// The node's interactive sessions.
    pub fn sessions(&self) -> &crate::interactive::Sessions {
        &self.sessions
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Where runs' reports leave (for the usage sampler's idle reports).
    pub fn reports(&self) -> mpsc::Sender<pb::StatusReport> {
        self.reports.clone()
    }

    /// The runs' measured usage (sampled by `usage::sampler`).
    pub fn usage(&self) -> &crate::usage::Usage {
        &self.usage
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
        self.report_with(key, exit, message, (RunUsed::default(), None));
    }

    fn report_with(
        &self,
        key: RunKey,
        exit: Option<Exit>,
        message: String,
        (usage, measured): (RunUsed, Option<pb::RunUsageStats>),
    ) {
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
            usage: measured,
            idle_since_ms: 0,
        };
        if let Err(mpsc::error::TrySendError::Full(report)) = self.reports.try_send(report) {
            let tx = self.reports.clone();
            tokio::spawn(async move {
                if tx.send(report).await.is_err() {
                    tracing::debug!("a run's report dropped: the agent is shutting down");
                }
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
    /// others wait for the next call (a run's end, a lease renewal, a new set). Each is read
    /// once, into its spec (`launch::spec`), under the lock that marks it launching: its cores
    /// are picked among those no live run holds.
    pub fn launch_ready(&self) {
        let mut launch = Vec::new();
        let mut refused = Vec::new();
        {
            // Chosen and marked under one lock, from the set `reconcile` stored under the same
            // lock: concurrent callers (a new set, a run's end, a lease renewal) never launch a
            // run twice, nor one a newer set no longer assigns.
            let mut runs = self.lock();
            if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let Some(set) = self.last_set.lock().unwrap_or_else(|p| p.into_inner()).clone() else { return };
            let assigned = decide::assigned_of(&set.runs);
            let ready = decide::launches(&assigned, &local_of(&runs), self.lease.valid());
            for a in &set.runs {
                let key = (a.job_id, a.attempt);
                if !ready.contains(&key) {
                    if !a.kill && !a.started && !runs.contains_key(&key) && self.lease.valid() {
                        tracing::info!(job = a.job_id, attempt = a.attempt, gpus = ?a.gpu_ids, "launch waits: a GPU's previous run has not ended");
                    }
                    continue;
                }
                let granted: Vec<Vec<u32>> =
                    runs.values().filter(|r| r.exit.is_none()).map(|r| r.cores.clone()).collect();
                match crate::launch::spec(a, &self.node_facts(), &granted) {
                    Ok(spec) => {
                        runs.insert(key, Run::launching(&spec));
                        launch.push(spec);
                    }
                    Err(rejected) => {
                        // Marked under the lock too: a concurrent pass does not refuse it again.
                        runs.insert(key, Run::failed(rejected.why.to_string()));
                        refused.push(rejected);
                    }
                }
            }
        }
        for r in refused {
            self.launch_failed(r.key, &r.files, r.why.to_string());
        }
        for spec in launch {
            self.launch(spec);
        }
    }

    /// What the launch step knows of this node.
    fn node_facts(&self) -> crate::launch::Node<'_> {
        crate::launch::Node {
            name: &self.node,
            state_dir: &self.state_dir,
            devices: &self.isolation.devices,
            cores: self.isolation.limiter.cores(),
            pids_max: self.isolation.pids_max,
        }
    }

    fn launch_failed(&self, key: RunKey, files: &RunFiles, message: String) {
        tracing::warn!(job = key.0, %message, "launch failed");
        self.process_log.exit(key.0, key.1, "not started");
        // Into the attempt's log when its job directory is there (a job's own file is never
        // followed, nor anything but a regular file of one link appended to).
        if let Ok(dir) = Dir::open(&files.job_dir()) {
            let log = match dir.open_existing(&files.log_name, true) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => dir.create_fresh(&files.log_name, None),
                other => other,
            };
            let written = log.and_then(|mut f| {
                std::io::Write::write_all(&mut f, format!("kairos-agent: {message}\n").as_bytes())
            });
            if let Err(e) = written {
                tracing::warn!(job = key.0, error = %e, "cannot write why a launch failed into its log");
            }
        }
        self.lock().insert(key, Run::failed(message.clone()));
        self.report(key, Some(Exit::Lost), message);
    }

    /// Starts a run as its job's account; one in a container once its image is ready (pulled
    /// off the runner's path). Failures to start are reported as a lost run with the reason.
    fn launch(&self, spec: RunSpec) {
        let account = match self.isolation.accounts.resolve(&spec.user) {
            Ok(account) => account,
            Err(message) => return self.launch_failed(spec.key, &spec.files, message),
        };
        let Some(image) = spec.container.as_ref().map(|c| c.image.clone()) else {
            // The spawn waits for the child's set-up (its cgroups joined, the exec): off the
            // agent's async tasks, so a stop or another launch is not held behind it.
            let (this, key, files) = (self.clone(), spec.key, spec.files.clone());
            let spawning = tokio::task::spawn_blocking(move || this.start(spec, account, None));
            let this = self.clone();
            tokio::spawn(async move {
                if let Err(e) = spawning.await {
                    this.launch_failed(key, &files, format!("the launch failed: {e}"));
                }
            });
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            let pulled = match this.isolation.images.clone() {
                None => Err(crate::image::PullError(
                    "this node runs no containers (kairos-agent --container-runtime none)".into(),
                )),
                Some(cache) => {
                    // A job's own image is read as its user.
                    let reader = account.as_ref().map(|u| crate::image::Reader {
                        uid: u.uid,
                        gid: u.gid,
                        groups: u.groups.clone(),
                    });
                    let name = image.clone();
                    tokio::task::spawn_blocking(move || cache.prepare(&name, reader.as_ref()))
                        .await
                        .unwrap_or_else(|e| Err(crate::image::PullError(e.to_string())))
                }
            };
            match pulled {
                Ok(pulled) => {
                    let note = format!("{image} (digest {})", pulled.digest);
                    this.report_status(spec.key, pb::RunStatus::Image, note);
                    // The spawn waits for the container's set-up (bounded by its deadline):
                    // off the agent's async tasks.
                    let pulled = Arc::new(pulled);
                    let started =
                        tokio::task::spawn_blocking(move || this.start(spec, account, Some(pulled)));
                    if let Err(e) = started.await {
                        tracing::warn!(error = %e, "starting a container run");
                    }
                }
                Err(e) => this.launch_failed(spec.key, &spec.files, e.to_string()),
            }
        });
    }

    /// Starts a run's process (in `image`'s container when given: `spawn`), then its watchers.
    fn start(&self, spec: RunSpec, account: Option<UnixAccount>, image: Option<Arc<Image>>) {
        let key = spec.key;
        // Logged before the spawn: the logged interval must cover the process's life.
        self.process_log.start(key.0, key.1, &spec.gpus, None);
        // The launch joins the job's trace; the job gets it as TRACEPARENT to join its own spans.
        let trace = (!spec.traceparent.is_empty()).then(|| {
            let parent = kairos_telemetry::traces::context_of(&spec.traceparent);
            let attributes = vec![
                opentelemetry::KeyValue::new("kairos.job_id", key.0 as i64),
                opentelemetry::KeyValue::new("kairos.attempt", i64::from(key.1)),
                opentelemetry::KeyValue::new("kairos.node", self.node.clone()),
            ];
            kairos_telemetry::traces::start("launch", &parent, attributes)
        });
        let traceparent = trace.as_ref().and_then(kairos_telemetry::traces::traceparent);
        let spawned = spawn::spawn(&spec, &self.isolation, (account.as_ref(), image.as_deref()), traceparent);
        if let Some(trace) = &trace {
            kairos_telemetry::traces::end(trace);
        }
        match spawned {
            Ok(spawned) => self.started(spec, spawned, image),
            Err(message) => self.launch_failed(key, &spec.files, message),
        }
    }

    /// A run's process is spawned: its output goes to its log, it is recorded and journaled,
    /// reported started, and watched (checkpoints, exit).
    fn started(&self, spec: RunSpec, spawned: Spawned, image: Option<Arc<Image>>) {
        let Spawned { mut child, log, confined, terminal, exec } = spawned;
        let key = spec.key;
        let pgid = child.id().map(|p| p as i32);
        tracing::info!(job = key.0, attempt = key.1, ?pgid, gpus = ?spec.gpus, user = %spec.user, "run started");
        let log = Arc::new(Mutex::new(log));
        let copiers = match terminal {
            Some(pty) => self.open_terminal(&spec, pty, log),
            None => {
                let pipes = [child.stdout.take().map(boxed), child.stderr.take().map(boxed)];
                self.copy_outputs(key, pipes.into_iter().flatten().collect(), log)
            }
        };
        self.spawned(&spec, pgid, (confined.cgroup.clone(), Arc::new(exec)), image);
        let dirs = crate::usage::CgroupDirs {
            v2: confined.cgroup.as_ref().map(|c| c.dir().to_path_buf()),
            v1_memory: confined.limited.memory_dir().map(Path::to_path_buf),
        };
        let now = crate::usage::now_ms();
        self.usage.start(key, &spec.gpus, spec.milli, spec.idle_watch, dirs, now);
        if let Some(pgid) = pgid {
            journal_add(&self.state_dir, key, pgid);
        }
        self.report(key, None, String::new());
        self.watch_checkpoints(key, spec.files.checkpoint_marker());
        tokio::spawn(self.clone().watch_exit(key, child, pgid, confined, copiers));
    }

    /// Records the spawned run; a stop or a fence that came while it was being spawned still
    /// applies.
    fn spawned(
        &self,
        spec: &RunSpec,
        pgid: Option<i32>,
        (cgroup, exec): (Option<RunCgroup>, Arc<crate::interactive::ExecContext>),
        image: Option<Arc<Image>>,
    ) {
        let mut runs = self.lock();
        // What was decided while it launched (a stop, a fence, a suspension, the agent's
        // shutdown, a set that no longer assigns it) holds for it now.
        let (stopping, fenced, suspended) =
            runs.get(&spec.key).map(|r| (r.stopping, r.fenced, r.suspended)).unwrap_or_default();
        let closing = self.closing.load(std::sync::atomic::Ordering::SeqCst);
        let assigned = self
            .last_set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|set| set.runs.iter().any(|a| (a.job_id, a.attempt) == spec.key));
        let stopping = stopping || closing || !assigned;
        let run = Run {
            pgid,
            cgroup,
            stopping,
            fenced,
            suspended,
            _image: image,
            exec: Some(exec),
            ..Run::launching(spec)
        };
        let lends = suspended && !stopping && !fenced;
        if stopping || fenced {
            run.kill();
        } else if suspended {
            run.freeze(true);
        }
        runs.insert(spec.key, run);
        drop(runs);
        if lends {
            // Frozen now: its GPUs are lent to what waited for them.
            self.launch_ready();
        }
    }

    /// Waits for the run's main process, then for every process of it to be gone and its
    /// output copied; records and reports how it ended (a fenced run as lost), and launches
    /// what waited for its GPUs.
    async fn watch_exit(
        self,
        key: RunKey,
        mut child: tokio::process::Child,
        pgid: Option<i32>,
        confined: Confined,
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
        // The main process is gone: nothing of the run may outlive it (no session opens in it
        // from now on), and the run ends only when its last process has.
        self.main_exited(key).await;
        self.wait_gone(key, pgid, confined.cgroup.as_ref()).await;
        for c in copiers {
            if let Err(e) = c.await {
                tracing::warn!(job = key.0, error = %e, "copying a run's output ended abnormally");
            }
        }
        tracing::info!(job = key.0, attempt = key.1, ?exit, "run exited");
        self.sessions.run_ended(key, exit.code_and_signal());
        if let Some(cg) = confined.cgroup.as_ref() {
            sweep(key, cg).await;
        }
        let how = match exit {
            Exit::Code(c) => format!("exit {c}"),
            Exit::Signal(s) => format!("signal {s}"),
            Exit::Lost => "lost".to_string(),
        };
        self.process_log.exit(key.0, key.1, &how);
        journal_remove(self.state_dir(), key);
        let usage = confined.usage();
        let measured = self.usage.finish(key, crate::usage::now_ms());
        confined.remove();
        let mut message = String::new();
        if let Some(run) = self.lock().get_mut(&key) {
            if run.fenced {
                exit = Exit::Lost;
                message = "stopped on its node: the agent's lease lapsed (no controller answered)".into();
                run.lost_message = message.clone();
            }
            run.exit = Some(exit);
        }
        self.report_with(key, Some(exit), message, (usage, measured));
        self.launch_ready();
    }

    /// Sends a report about a run that changes nothing of it (its log truncated, its image).
    fn report_status(&self, key: RunKey, status: pb::RunStatus, message: String) {
        // Informational (nothing of the run changes): dropped when the channel is full.
        let _ = self.reports.try_send(pb::StatusReport {
            node_id: self.node.clone(),
            job_id: key.0,
            attempt: key.1,
            status: status as i32,
            message,
            ..Default::default()
        });
    }

    /// Copies the run's output (its stdout and stderr, or its terminal) into the run's log, up
    /// to the log's bound (the controller is told once when it is reached).
    fn copy_outputs(
        &self,
        key: RunKey,
        from: Vec<Output>,
        log: Arc<Mutex<std::fs::File>>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        // The log is new: nothing of it is written yet.
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let max = self.isolation.log_max_bytes;
        let note = {
            let runner = self.clone();
            move || {
                let message = format!("the log reached {max} bytes; later output is dropped");
                runner.report_status(key, pb::RunStatus::LogTruncated, message);
            }
        };
        let copy = |o| tokio::spawn(output::copy_output(o, log.clone(), written.clone(), max, note.clone()));
        from.into_iter().map(copy).collect()
    }

    /// Marks `key`'s main process exited (its view is no longer live) and closes the run to
    /// commands: one spawning now has joined once this returns; none joins after.
    async fn main_exited(&self, key: RunKey) {
        let exec = self.lock().get_mut(&key).and_then(|r| {
            r.main_exited = true;
            r.exec.clone()
        });
        if let Some(exec) = exec {
            // The lock may be held by a spawn in progress: waited for off the runtime.
            if let Err(e) = tokio::task::spawn_blocking(move || exec.close()).await {
                tracing::warn!(job = key.0, error = %e, "closing a run to sessions");
            }
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
                    if runner.reports.send(report).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

/// How long the last sweep of an ended run's cgroup may take.
const SWEEP_WAIT: Duration = Duration::from_secs(5);

/// Kills whatever is still in `cg` (a session's command joined late, say) until it is empty,
/// bounded by `SWEEP_WAIT`: nothing of the run holds its GPUs once its exit is reported.
async fn sweep(key: RunKey, cg: &RunCgroup) {
    let deadline = tokio::time::Instant::now() + SWEEP_WAIT;
    while cg.populated() {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                job = key.0,
                attempt = key.1,
                "processes left in an ended run's cgroup do not die"
            );
            return;
        }
        cg.kill();
        tokio::time::sleep(GONE_POLL).await;
    }
}

#[cfg(test)]
mod session_tests;
#[cfg(test)]
mod tests;
