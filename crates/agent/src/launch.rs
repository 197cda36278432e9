//! The launch step: an assignment, read once, becomes the spec of its run — what it executes
//! (argv), with which environment, in which directory, as which kairos user, on which GPUs and
//! cores, limited to what, in which container with which mounts, and where its files live.
//!
//! Pure: nothing here touches the host (no account lookup, no file, no clock). Everything
//! below the runner takes a `RunSpec` (or the piece of it it needs), never the wire type
//! `pb::Assignment`; the runner only reads an assignment through `spec`.
//!
//! ```text
//!   pb::Assignment ──spec──▶ RunSpec ──runner──▶ spawn (account, job files, cgroup, limits,
//!                                                 container) ──▶ exec
//! ```

use std::path::{Path, PathBuf};

use kairos_proto::v1 as pb;
use nix::sys::signal::Signal;

use crate::cgroup_limits::RunLimits;
use crate::container::Bind;
use crate::decide::RunKey;
use crate::gpu::DeviceMap;

/// What the launch step knows of this node.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    pub name: &'a str,
    pub state_dir: &'a Path,
    /// How runs see their GPUs (MIG instances by UUID through their parent's device).
    pub devices: &'a DeviceMap,
    /// The host's cores runs may use.
    pub cores: &'a [u32],
    /// Most processes and threads per run.
    pub pids_max: Option<u64>,
}

/// Where a run's files live: `<state dir>/jobs/<job dir name>/` holds its logs and its
/// checkpoint directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunFiles {
    pub jobs_dir: PathBuf,
    pub job_dir_name: String,
    /// The attempt's log, in the job's directory.
    pub log_name: String,
}

impl RunFiles {
    pub fn of(state_dir: &Path, job: u64, submit_ms: i64, attempt: u32) -> RunFiles {
        RunFiles {
            jobs_dir: jobs_dir(state_dir),
            job_dir_name: job_dir_name(job, submit_ms),
            log_name: log_name(attempt),
        }
    }

    pub fn job_dir(&self) -> PathBuf {
        self.jobs_dir.join(&self.job_dir_name)
    }

    /// Survives attempts (on this node): where the job keeps checkpoints to resume from.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.job_dir().join("checkpoint")
    }

    /// The file the job touches to announce a checkpoint.
    pub fn checkpoint_marker(&self) -> PathBuf {
        self.checkpoint_dir().join(MARKER)
    }
}

/// A run's container: its image and how the run enters it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerSpec {
    pub image: String,
    /// The job's directory at its own path first, then the job's own mounts.
    pub binds: Vec<Bind>,
    /// Where the run starts inside (the container's workdir, else the job's directory).
    pub workdir: String,
    /// The run's GPUs as a CDI spec names them (`CUDA_VISIBLE_DEVICES`'s names).
    pub gpu_names: Vec<String>,
    /// The GPU device minors the run opens (where no CDI spec says otherwise).
    pub gpu_minors: Vec<u32>,
    /// Bounds the writable layer and `/dev/shm` (0: none).
    pub memory_mib: u64,
    /// The agent's directory for the containers' mount points.
    pub base: PathBuf,
}

/// Everything a run is, as the node carries it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    pub key: RunKey,
    /// The kairos user (the Unix account it maps to is looked up at spawn).
    pub user: String,
    pub program: String,
    pub args: Vec<String>,
    /// The job's environment and kairos's, in order; laid over the account's allowlisted base
    /// and the container's own.
    pub env: Vec<(String, String)>,
    pub workdir: PathBuf,
    /// Where the run starts when it cannot enter `workdir` (the submit directory is the
    /// default; the job's directory is the fallback).
    pub fallback_workdir: Option<PathBuf>,
    pub files: RunFiles,
    pub gpus: Vec<u32>,
    /// A fraction of its one GPU, in thousandths (0: whole GPUs).
    pub milli: u32,
    /// Report the run's GPUs idle after this long below this (`Assignment.idle_watch`).
    pub idle_watch: Option<crate::usage::IdleWatch>,
    pub limits: RunLimits,
    pub checkpoint_signal: Signal,
    pub container: Option<ContainerSpec>,
    /// The job's trace context (empty: none).
    pub traceparent: String,
    /// The job's submit time (Unix ms): with the key, what a session grant names.
    pub submit_ms: i64,
    /// An interactive run (on a terminal the agent keeps): its keep-alive, how long it lives
    /// with no session attached.
    pub interactive: Option<std::time::Duration>,
}

/// An assignment that cannot become a run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaunchError {
    #[error("empty command")]
    EmptyCommand,
    #[error("container mount {0:?} is not SRC:DST[:ro]")]
    BadMount(String),
}

/// A refused assignment: which run, where its log goes, and why.
#[derive(Debug, thiserror::Error)]
#[error("{why}")]
pub struct Rejected {
    pub key: RunKey,
    pub files: RunFiles,
    pub why: LaunchError,
}

/// The file a job touches to announce a checkpoint, in its checkpoint directory.
const MARKER: &str = ".kairos-checkpoint";

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

/// The file name of an attempt's log in its job's directory.
pub fn log_name(attempt: u32) -> String {
    format!("attempt-{attempt}.log")
}

/// Where a run's log lives.
pub fn log_path(state_dir: &Path, job: u64, submit_ms: i64, attempt: u32) -> PathBuf {
    job_dir(state_dir, job, submit_ms).join(log_name(attempt))
}

/// The signal named `name` ("SIGUSR1"), or `fallback`.
pub fn parse_signal(name: &str, fallback: Signal) -> Signal {
    name.parse::<Signal>().unwrap_or(fallback)
}

/// `SRC:DST`, `SRC:DST:ro` or `SRC:DST:rw` (as the controller checked them): a mount the job
/// asked for.
pub fn parse_bind(text: &str) -> Option<Bind> {
    let parts: Vec<&str> = text.split(':').collect();
    let (src, dst, read_only) = match parts.as_slice() {
        [src, dst] | [src, dst, "rw"] => (*src, *dst, false),
        [src, dst, "ro"] => (*src, *dst, true),
        _ => return None,
    };
    (src.starts_with('/') && dst.starts_with('/')).then(|| Bind {
        src: src.into(),
        dst: dst.into(),
        read_only,
        the_jobs: true,
    })
}

/// The spec of `a`'s run on `node`; `granted` are the cores live runs of the node hold (a run
/// asking for cores gets those no live run holds first).
pub fn spec(a: &pb::Assignment, node: &Node, granted: &[Vec<u32>]) -> Result<RunSpec, Rejected> {
    let key = (a.job_id, a.attempt);
    let files = RunFiles::of(node.state_dir, a.job_id, a.submit_time_ms, a.attempt);
    let reject = |why| Rejected { key, files: files.clone(), why };
    let Some(program) = a.argv.first() else { return Err(reject(LaunchError::EmptyCommand)) };
    let container = container(a, node, &files).map_err(reject)?;
    let limits = RunLimits {
        cores: if a.cpus > 0 { pick_cores(node.cores, granted, a.cpus) } else { Vec::new() },
        memory_bytes: (a.memory_mib > 0).then(|| a.memory_mib.saturating_mul(1 << 20)),
        pids_max: node.pids_max,
        gpus: node.devices.minors(&a.gpu_ids),
    };
    let job_dir = files.job_dir();
    Ok(RunSpec {
        key,
        user: a.user.clone(),
        program: program.clone(),
        args: a.argv[1..].to_vec(),
        env: env(a, node, &files, limits.cores.len()),
        workdir: if a.workdir.is_empty() { job_dir.clone() } else { PathBuf::from(&a.workdir) },
        fallback_workdir: a.workdir_is_submit_dir.then_some(job_dir),
        files,
        gpus: a.gpu_ids.clone(),
        milli: a.gpu_milli,
        idle_watch: a.idle_watch.as_ref().map(|w| crate::usage::IdleWatch {
            after_ms: w.after_s.saturating_mul(1000).min(i64::MAX as u64) as i64,
            below_milli: w.below_milli,
        }),
        limits,
        checkpoint_signal: parse_signal(&a.checkpoint_signal, Signal::SIGTERM),
        container,
        traceparent: a.traceparent.clone(),
        submit_ms: a.submit_time_ms,
        interactive: a.interactive.then(|| std::time::Duration::from_secs(u64::from(a.keep_alive_s.max(1)))),
    })
}

/// The container of `a`'s run (None: a bare run): the job's directory bound at its own path (its
/// checkpoints and outputs), then the job's mounts; it starts in the container's workdir, else
/// the job's directory.
fn container(
    a: &pb::Assignment,
    node: &Node,
    files: &RunFiles,
) -> Result<Option<ContainerSpec>, LaunchError> {
    let Some(c) = a.container.as_ref().filter(|c| !c.image.is_empty()) else { return Ok(None) };
    let job_dir = files.job_dir();
    let own = job_dir.display().to_string();
    let mut binds = vec![Bind { src: job_dir, dst: own.clone(), read_only: false, the_jobs: false }];
    for m in &c.mounts {
        // Its source is looked up by the run's process, as the job's user.
        binds.push(parse_bind(m).ok_or_else(|| LaunchError::BadMount(m.clone()))?);
    }
    let gpu_names = match a.gpu_ids.is_empty() {
        true => Vec::new(),
        false => node.devices.visible(&a.gpu_ids).split(',').map(str::to_string).collect(),
    };
    Ok(Some(ContainerSpec {
        image: c.image.clone(),
        binds,
        workdir: if c.workdir.is_empty() { own } else { c.workdir.clone() },
        gpu_names,
        gpu_minors: node.devices.minors(&a.gpu_ids),
        memory_mib: a.memory_mib,
        base: node.state_dir.join("containers"),
    }))
}

/// The environment kairos gives a run, over the job's own (`--env`): its identity, its GPUs as
/// CUDA sees them, Slurm-like and torchrun-compatible variables.
fn env(a: &pb::Assignment, node: &Node, files: &RunFiles, cores: usize) -> Vec<(String, String)> {
    let or = |value: &str, default: &str| if value.is_empty() { default } else { value }.to_string();
    let mut env: Vec<(String, String)> = a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut set = |k: &str, v: String| env.push((k.to_string(), v));
    set("KAIROS_JOB_ID", a.job_id.to_string());
    set("KAIROS_RESTART_COUNT", a.attempt.to_string());
    set("KAIROS_NODE", node.name.to_string());
    set("KAIROS_CHECKPOINT_DIR", files.checkpoint_dir().display().to_string());
    set("CUDA_VISIBLE_DEVICES", node.devices.visible(&a.gpu_ids));
    if a.gpu_milli > 0 {
        // A fraction of a GPU: its share of the SMs and of the memory where MPS serves the GPU
        // (not enforced otherwise; see docs/gpus.md), and the fraction itself.
        set("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", a.gpu_milli.div_ceil(10).to_string());
        set("KAIROS_GPU_FRACTION", format!("{:.3}", f64::from(a.gpu_milli) / 1000.0));
    }
    // The indices are NVML's, which follow the PCI bus; CUDA's default order (fastest first)
    // can differ, so a job would use GPUs it was not given.
    set("CUDA_DEVICE_ORDER", "PCI_BUS_ID".into());
    // An elastic job's GPU count changes between attempts.
    set("KAIROS_GPUS", a.gpu_ids.len().to_string());
    set("KAIROS_CHECKPOINT_SIGNAL", or(&a.checkpoint_signal, "SIGTERM"));
    // torchrun-compatible gang environment (one task per node).
    set("RANK", a.rank.to_string());
    set("WORLD_SIZE", a.world_size.max(1).to_string());
    set("LOCAL_RANK", "0".into());
    set("LOCAL_WORLD_SIZE", "1".into());
    set("MASTER_ADDR", or(&a.master_addr, "127.0.0.1"));
    set("MASTER_PORT", a.master_port.to_string());
    if let Some(limit) = node.devices.fraction_memory_limit(&a.gpu_ids, a.gpu_milli) {
        set("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", limit);
    }
    set("KAIROS_CPUS", cores.to_string());
    if a.cpus > 0 {
        set("SLURM_CPUS_PER_TASK", a.cpus.to_string());
        set("SLURM_CPUS_ON_NODE", a.cpus.to_string());
    }
    if a.memory_mib > 0 {
        set("SLURM_MEM_PER_NODE", a.memory_mib.to_string());
    }
    env
}

/// The cores to grant a run asking for `count`: cores no live run was granted first (in
/// order), then the least shared; at most as many as the host has.
pub fn pick_cores(all: &[u32], granted: &[Vec<u32>], count: u32) -> Vec<u32> {
    if count == 0 {
        return Vec::new();
    }
    let mut by_use: Vec<(usize, u32)> =
        all.iter().map(|c| (granted.iter().filter(|g| g.contains(c)).count(), *c)).collect();
    by_use.sort();
    let mut out: Vec<u32> = by_use.into_iter().take(count as usize).map(|(_, c)| c).collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
#[path = "launch_tests.rs"]
mod tests;
