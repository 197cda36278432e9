//! Size limits and validity checks for what users and agents send.
//!
//! The API edge calls these to answer bad input with a precise error before anything is
//! proposed; apply calls them again, so an entry that bypassed the edge still changes nothing.

use std::collections::BTreeSet;

use thiserror::Error;

use crate::model::{JobSpec, NodeInfo};

pub const NAME_LEN_MAX: usize = 256;
pub const ARGV_LEN_MAX: usize = 1024;
pub const ENV_LEN_MAX: usize = 256;
/// Upper bound on the bytes of argv, env and workdir together.
pub const SPEC_BYTES_MAX: usize = 128 * 1024;
pub const GPUS_PER_JOB_MAX: u32 = 1024;
pub const GPUS_PER_NODE_MAX: usize = 64;
pub const TIME_LIMIT_S_MAX: u64 = 365 * 24 * 3600;
/// Most CPUs one task may ask for.
pub const CPUS_PER_TASK_MAX: u32 = 8192;
/// Most memory one task may ask for (64 TiB).
pub const MEM_PER_TASK_MAX_MIB: u64 = 64 << 20;
/// Most nodes one gang job may span.
pub const TASKS_MAX: u32 = 256;
/// Most retries of failed runs one job may ask for.
pub const RETRIES_MAX: u32 = 100;
/// Most jobs one job may depend on.
pub const AFTER_OK_MAX: usize = 64;
/// Longest client-chosen submit request id.
pub const REQUEST_ID_LEN_MAX: usize = 128;

/// Why a job spec or node description is not acceptable; each names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValidationError {
    #[error("container: {0}")]
    BadContainer(String),
    #[error("cpus: a job without GPUs asks for at least 1 CPU")]
    NoGpus,
    #[error("cpus: {0} per task is more than the limit of {CPUS_PER_TASK_MAX}")]
    TooManyCpus(u32),
    #[error("memory_mib: {0} MiB per task is more than the limit of {MEM_PER_TASK_MAX_MIB} MiB")]
    TooMuchMemory(u64),
    #[error("gpus: {0} is more than the limit of {GPUS_PER_JOB_MAX}")]
    TooManyGpus(u32),
    #[error("argv: the command is empty")]
    EmptyCommand,
    #[error("argv: the program name is empty")]
    EmptyProgram,
    #[error("{field}: too long ({len} > {max})")]
    TooLong { field: &'static str, len: usize, max: usize },
    #[error("{field}: contains a NUL byte")]
    NulByte { field: &'static str },
    #[error("env: invalid variable name \"{0}\"")]
    BadEnvName(String),
    #[error("env: {0} is set by kairos for every job and cannot be overridden")]
    ReservedEnv(String),
    #[error("time_limit_s: must be between 1 and {TIME_LIMIT_S_MAX}")]
    BadTimeLimit,
    #[error("name: must not be empty")]
    EmptyName,
    #[error("gpus: duplicate GPU index {0}")]
    DuplicateGpu(u32),
    #[error("tasks: 1 to {TASKS_MAX} nodes")]
    BadTasks,
    #[error(
        "array: 1 to {ARRAY_TASKS_MAX} distinct indices, ascending, each at most {ARRAY_INDEX_MAX}, \
         and a task limit (%N) of at least 1"
    )]
    BadArray,
    #[error("dependencies (after_ok, after_any, after_not_ok): at most {AFTER_OK_MAX} jobs in all")]
    TooManyDependencies,
    #[error("{0}")]
    BadTopology(crate::topology::TopologyError),
    #[error("retries: at most {RETRIES_MAX}")]
    TooManyRetries,
    #[error("gpu_model: 1 to 64 characters")]
    BadGpuModel,
    #[error("reservation: 1 to 64 characters")]
    BadReservation,
    #[error("interactive: a single-task job that is not an array, elastic, fractional or retried; keep_alive_s at most 86400 and only for an interactive job")]
    BadInteractive,
    #[error("gpu_milli: a fraction of one GPU is 1 to 999 thousandths, of one GPU (gpus 1), for a single-task job that is not elastic")]
    BadGpuFraction,
    #[error("min_gpus: {min} must be between 1 and gpus ({gpus})")]
    BadMinGpus { min: u32, gpus: u32 },
    #[error("min_gpus: a gang shrinks by whole nodes; use min_tasks (--min-nodes) with a gang")]
    ElasticGang,
    #[error("min_tasks: {min} must be between 1 and tasks ({tasks}), on a gang")]
    BadMinTasks { min: u32, tasks: u32 },
    #[error("checkpoint.signal: unknown signal \"{0}\" (use one of {CHECKPOINT_SIGNALS_TEXT})")]
    BadCheckpointSignal(String),
    #[error("checkpoint.grace_s: {0} is more than a day")]
    BadCheckpointGrace(u64),
}

/// Signals a job may ask to be sent for a checkpoint (catchable, and not used for control).
pub const CHECKPOINT_SIGNALS: &[&str] = &["SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"];
const CHECKPOINT_SIGNALS_TEXT: &str = "SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT";
/// Longest checkpoint grace a job may ask for (the QoS grace is the tighter bound).
pub const CHECKPOINT_GRACE_S_MAX: u64 = 24 * 3600;

/// The canonical name ("SIGUSR2") of a checkpoint signal given as "SIGUSR2" or "usr2" (names
/// only: signal numbers differ between platforms).
pub fn checkpoint_signal(name: &str) -> Result<&'static str, ValidationError> {
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    CHECKPOINT_SIGNALS
        .iter()
        .find(|s| **s == full)
        .copied()
        .ok_or_else(|| ValidationError::BadCheckpointSignal(name.chars().take(32).collect()))
}

fn check_len(field: &'static str, len: usize, max: usize) -> Result<(), ValidationError> {
    if len > max {
        return Err(ValidationError::TooLong { field, len, max });
    }
    Ok(())
}

fn check_text(field: &'static str, s: &str, max: usize) -> Result<(), ValidationError> {
    check_len(field, s.len(), max)?;
    if s.contains('\0') {
        return Err(ValidationError::NulByte { field });
    }
    Ok(())
}

/// Most tasks one job array may have.
pub const ARRAY_TASKS_MAX: usize = 10_000;
/// Largest index of an array task.
pub const ARRAY_INDEX_MAX: u32 = 1_000_000;

/// Variables the agent sets for every job (GPU binding, identity, gang rendezvous).
pub const RESERVED_ENV: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

fn is_reserved_env(name: &str) -> bool {
    name.starts_with("KAIROS_") || RESERVED_ENV.contains(&name)
}

/// Checks a job spec's shape and size. The QoS itself is checked by the caller that knows it.
/// Mounts one container may ask for.
pub const CONTAINER_MOUNTS_MAX: usize = 32;
/// The longest image reference or path.
const CONTAINER_TEXT_MAX: usize = 1024;

/// A path inside or outside a container: absolute, normal (no `..`, no empty or `.` parts), no
/// control characters or `:`.
fn clean_path(what: &str, p: &str) -> Result<(), String> {
    let normal = p.starts_with('/')
        && p.len() <= CONTAINER_TEXT_MAX
        && p.split('/').skip(1).all(|c| c != ".." && c != ".")
        && (p == "/" || !p.split('/').skip(1).any(str::is_empty))
        && !p.chars().any(|c| c.is_control() || c == ':');
    if normal {
        Ok(())
    } else {
        Err(format!(
            "{what} \"{}\" must be an absolute path without \"..\", \".\", \"//\" or \":\"",
            p.chars().take(80).collect::<String>()
        ))
    }
}

/// An image reference: `oci:` or `oci-archive:` with an absolute path (and an optional
/// `:tag`), or a registry reference of `[A-Za-z0-9._/:@-]`.
fn check_image(image: &str) -> Result<(), String> {
    if image.is_empty() || image.len() > CONTAINER_TEXT_MAX {
        return Err(format!("image: 1 to {CONTAINER_TEXT_MAX} characters"));
    }
    for scheme in ["oci:", "oci-archive:"] {
        if let Some(rest) = image.strip_prefix(scheme) {
            let path = rest.split_once(':').map_or(rest, |(p, _)| p);
            return clean_path("image path", path);
        }
    }
    let reference = image.strip_prefix("docker://").unwrap_or(image);
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._/:@-".contains(c);
    if reference.is_empty() || !reference.chars().all(allowed) || reference.starts_with(['/', '-', '.']) {
        return Err(format!(
            "image \"{}\": oci:/PATH, oci-archive:/PATH.tar, or a registry reference such as docker://registry/name:tag",
            image.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

/// A container, and the spec's host workdir (a container job has none).
fn check_container(c: &crate::model::Container, host_workdir: &str) -> Result<(), String> {
    if !host_workdir.is_empty() {
        return Err(
            "a container job starts in its container's workdir (--container-workdir), not a host directory"
                .into(),
        );
    }
    check_image(&c.image)?;
    if c.mounts.len() > CONTAINER_MOUNTS_MAX {
        return Err(format!("at most {CONTAINER_MOUNTS_MAX} mounts"));
    }
    for m in &c.mounts {
        clean_path("mount source", &m.src)?;
        clean_path("mount destination", &m.dst)?;
        if m.dst == "/"
            || m.dst == "/proc"
            || m.dst.starts_with("/proc/")
            || m.dst == "/dev"
            || m.dst.starts_with("/dev/")
        {
            return Err(format!(
                "mount destination \"{}\": /, /proc and /dev are the container's own",
                m.dst
            ));
        }
    }
    if !c.workdir.is_empty() {
        clean_path("workdir", &c.workdir)?;
    }
    Ok(())
}

/// What one task asks for: GPUs (or a fraction of one), CPUs, memory.
fn check_shape(spec: &JobSpec) -> Result<(), ValidationError> {
    if spec.gpus == 0 && spec.cpus == 0 {
        return Err(ValidationError::NoGpus);
    }
    if spec.cpus > CPUS_PER_TASK_MAX {
        return Err(ValidationError::TooManyCpus(spec.cpus));
    }
    if spec.mem_mib > MEM_PER_TASK_MAX_MIB {
        return Err(ValidationError::TooMuchMemory(spec.mem_mib));
    }
    if spec.gpus > GPUS_PER_JOB_MAX {
        return Err(ValidationError::TooManyGpus(spec.gpus));
    }
    let whole_only = spec.gpus != 1 || spec.tasks > 1 || spec.min_gpus.is_some() || spec.min_tasks.is_some();
    if spec.gpu_milli > 0 && (spec.gpu_milli >= crate::model::GPU_MILLI || whole_only) {
        return Err(ValidationError::BadGpuFraction);
    }
    Ok(())
}

/// The command: a program, and argv, environment and working directory within their sizes
/// (no reserved or malformed environment names).
fn check_command(spec: &JobSpec) -> Result<(), ValidationError> {
    let program = spec.argv.first().ok_or(ValidationError::EmptyCommand)?;
    if program.is_empty() {
        return Err(ValidationError::EmptyProgram);
    }
    check_text("name", &spec.name, NAME_LEN_MAX)?;
    check_text("user", &spec.user, NAME_LEN_MAX)?;
    check_text("workdir", &spec.workdir, 4096)?;
    check_len("argv", spec.argv.len(), ARGV_LEN_MAX)?;
    check_len("env", spec.env.len(), ENV_LEN_MAX)?;
    let mut bytes = spec.workdir.len();
    for arg in &spec.argv {
        check_text("argv", arg, SPEC_BYTES_MAX)?;
        bytes += arg.len();
    }
    for (k, v) in &spec.env {
        if is_reserved_env(k) {
            return Err(ValidationError::ReservedEnv(k.clone()));
        }
        let valid_name = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(ValidationError::BadEnvName(k.chars().take(64).collect()));
        }
        check_text("env", v, SPEC_BYTES_MAX)?;
        bytes += k.len() + v.len();
    }
    check_len("argv+env+workdir bytes", bytes, SPEC_BYTES_MAX)?;
    Ok(())
}

/// An array's indices (ascending, bounded) and its limit of tasks at once.
fn check_array(array: &crate::model::ArraySpec) -> Result<(), ValidationError> {
    let ordered = array.indices.windows(2).all(|w| w[0] < w[1]);
    if array.indices.is_empty()
        || array.indices.len() > ARRAY_TASKS_MAX
        || !ordered
        || array.indices.last().is_some_and(|i| *i > ARRAY_INDEX_MAX)
        || array.id != 0
    {
        return Err(ValidationError::BadArray);
    }
    if array.max_running == Some(0) {
        return Err(ValidationError::BadArray);
    }
    Ok(())
}

/// An interactive job is one process on one terminal: one task, no array, no elastic or
/// fractional shape; a keep-alive is an interactive job's alone, and bounded.
fn check_interactive(spec: &JobSpec) -> Result<(), ValidationError> {
    let interactive = spec.profile == crate::model::Profile::Interactive;
    let bad_shape = interactive
        && (spec.tasks != 1
            || spec.array.is_some()
            || spec.min_gpus.is_some()
            || spec.min_tasks.is_some()
            || spec.gpu_milli != 0
            || spec.retries != 0);
    let bad_keep_alive =
        spec.keep_alive_s > crate::model::KEEP_ALIVE_MAX_S || (!interactive && spec.keep_alive_s != 0);
    match bad_shape || bad_keep_alive {
        true => Err(ValidationError::BadInteractive),
        false => Ok(()),
    }
}

pub fn validate_spec(spec: &JobSpec) -> Result<(), ValidationError> {
    check_shape(spec)?;
    check_command(spec)?;
    if spec.tasks == 0 || spec.tasks > TASKS_MAX {
        return Err(ValidationError::BadTasks);
    }
    if let Some(c) = &spec.container {
        check_container(c, &spec.workdir).map_err(ValidationError::BadContainer)?;
    }
    if spec.retries > RETRIES_MAX {
        return Err(ValidationError::TooManyRetries);
    }
    if let Some(t) = &spec.topology {
        t.validate().map_err(ValidationError::BadTopology)?;
    }
    if spec.dependencies().count() > AFTER_OK_MAX {
        return Err(ValidationError::TooManyDependencies);
    }
    if let Some(array) = &spec.array {
        check_array(array)?;
    }
    if spec.gpu_model.as_ref().is_some_and(|m| m.is_empty() || m.len() > 64 || m.contains('\0')) {
        return Err(ValidationError::BadGpuModel);
    }
    if spec.reservation.as_ref().is_some_and(|r| r.is_empty() || r.len() > 64 || r.contains('\0')) {
        return Err(ValidationError::BadReservation);
    }
    check_interactive(spec)?;
    if let Some(limit) = spec.time_limit_s {
        if limit == 0 || limit > TIME_LIMIT_S_MAX {
            return Err(ValidationError::BadTimeLimit);
        }
    }
    if let Some(min) = spec.min_gpus {
        if min == 0 || min > spec.gpus {
            return Err(ValidationError::BadMinGpus { min, gpus: spec.gpus });
        }
        if spec.tasks > 1 {
            return Err(ValidationError::ElasticGang);
        }
    }
    if let Some(min) = spec.min_tasks {
        if min == 0 || min > spec.tasks || spec.tasks < 2 {
            return Err(ValidationError::BadMinTasks { min, tasks: spec.tasks });
        }
    }
    if let Some(signal) = &spec.checkpoint_signal {
        if checkpoint_signal(signal)? != &**signal {
            return Err(ValidationError::BadCheckpointSignal(signal.chars().take(32).collect()));
        }
    }
    if let Some(grace) = spec.checkpoint_grace_s.filter(|g| *g > CHECKPOINT_GRACE_S_MAX) {
        return Err(ValidationError::BadCheckpointGrace(grace));
    }
    if let Some(tp) = &spec.traceparent {
        // A W3C traceparent is 55 characters; later versions may add fields.
        check_text("traceparent", tp, 128)?;
    }
    Ok(())
}

/// Checks a node description sent by an agent.
pub fn validate_node(info: &NodeInfo) -> Result<(), ValidationError> {
    if info.name.is_empty() {
        return Err(ValidationError::EmptyName);
    }
    check_text("name", &info.name, 128)?;
    check_text("addr", &info.addr, 256)?;
    check_text("isolation", &info.isolation, 64)?;
    check_len("gpus", info.gpus.len(), GPUS_PER_NODE_MAX)?;
    check_len("labels", info.labels.len(), 64)?;
    let mut seen = BTreeSet::new();
    for gpu in &info.gpus {
        if !seen.insert(gpu.index) {
            return Err(ValidationError::DuplicateGpu(gpu.index));
        }
        check_text("gpu uuid", &gpu.uuid, 128)?;
        check_text("gpu model", &gpu.model, 128)?;
    }
    Ok(())
}

#[cfg(test)]
mod container_tests {
    use super::*;
    use crate::model::{Container, ContainerMount};

    fn spec_with(image: &str, mounts: &[&str], workdir: &str) -> JobSpec {
        let mut s = JobSpec::new("c", "alice", vec!["true".into()], 1);
        s.container = Some(Box::new(Container {
            image: image.into(),
            mounts: mounts.iter().map(|m| ContainerMount::parse(m).expect("mount")).collect(),
            workdir: workdir.into(),
        }));
        s
    }

    #[test]
    fn container_images_mounts_and_workdirs_are_checked() {
        for ok in [
            spec_with("oci:/srv/images/pytorch", &["/data:/data:ro", "/scratch/a:/ckpt"], "/workspace"),
            spec_with("oci-archive:/srv/img.tar:v2", &[], ""),
            spec_with("docker://nvcr.io/nvidia/pytorch:24.01-py3", &[], ""),
            spec_with("ubuntu@sha256:0123abcd", &[], ""),
        ] {
            assert_eq!(validate_spec(&ok), Ok(()), "{:?}", ok.container);
        }
        for (bad, says) in [
            (spec_with("oci:relative/path", &[], ""), "absolute"),
            (spec_with("oci:/a/../etc", &[], ""), "absolute"),
            (spec_with("", &[], ""), "1 to"),
            (spec_with("bad image$", &[], ""), "registry reference"),
            (spec_with("-rm", &[], ""), "registry reference"),
            (spec_with("oci:/img", &["/a:/proc/x"], ""), "container's own"),
            (spec_with("oci:/img", &["/a:/"], ""), "container's own"),
            (spec_with("oci:/img", &["/a/..:/b"], ""), "absolute"),
            (spec_with("oci:/img", &[], "work"), "absolute"),
        ] {
            let e = validate_spec(&bad).unwrap_err().to_string();
            assert!(e.starts_with("container: ") && e.contains(says), "{e} lacks {says}");
        }
        let many: Vec<String> = (0..=CONTAINER_MOUNTS_MAX).map(|i| format!("/h{i}:/c{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(validate_spec(&spec_with("oci:/img", &many, "")).is_err());
        assert_eq!(ContainerMount::parse("/a:/b:xx"), None);
        assert_eq!(ContainerMount::parse("/a:/b:ro").map(|m| m.text()).as_deref(), Some("/a:/b:ro"));
    }
}
