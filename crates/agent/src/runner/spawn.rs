//! A run's process, from its spec: its job directory and log (`jobfs`), its cgroup and limits
//! (`cgroup`, `cgroup_limits`), its container (`container`, `cdi`), its command and
//! environment (`account::base_env` under the spec's), and the child that confines itself
//! before any of the job's code runs (`container_child` for a container). The lifecycle after
//! the spawn (wait, signal, stop, report) is the runner's.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use crate::account::{base_env, UnixAccount};
use crate::cgroup::RunCgroup;
use crate::cgroup_limits::RunLimited;
use crate::container::{ContainerSetup, IdMaps, Identity};
use crate::image::Image;
use crate::interactive::terminal::Pty;
use crate::interactive::ExecContext;
use crate::isolation::Isolation;
use crate::jobfs::Dir;
use crate::launch::{ContainerSpec, RunFiles, RunSpec};

/// Environment variables, in the order they are set.
type EnvPairs = Vec<(String, String)>;

/// What a run used, as its exit report carries it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RunUsed {
    pub max_rss_kib: u64,
    pub cpu_ms: u64,
    pub oom_kills: u32,
}

/// A run's cgroup (where the host has them) and limit directories.
#[derive(Debug)]
pub(super) struct Confined {
    pub cgroup: Option<RunCgroup>,
    pub limited: RunLimited,
}

impl Confined {
    /// Creates the run's cgroup and writes its limits (the reason on failure).
    fn create(spec: &RunSpec, isolation: &Isolation) -> Result<Confined, String> {
        let cgroup = match isolation.cgroups.as_ref().map(|c| c.create(spec.key)).transpose() {
            Ok(cg) => cg,
            Err(e) => return Err(format!("creating the run's cgroup: {e}")),
        };
        match isolation.limiter.apply(spec.key, &spec.limits, cgroup.as_ref().map(RunCgroup::dir)) {
            Ok(limited) => Ok(Confined { cgroup, limited }),
            Err(e) => {
                if let Some(cg) = &cgroup {
                    cg.remove();
                }
                Err(format!("setting the run's limits: {e}"))
            }
        }
    }

    /// Reads what the finished run used (before its directories are removed).
    pub fn usage(&self) -> RunUsed {
        let (peak2, ooms2, cpu) =
            self.cgroup.as_ref().map(|c| crate::cgroup_limits::v2_usage(c.dir())).unwrap_or_default();
        let (peak1, ooms1) = self.limited.memory_usage().map_or((None, None), |(p, o)| (Some(p), Some(o)));
        RunUsed {
            max_rss_kib: peak2.or(peak1).unwrap_or(0),
            cpu_ms: cpu.unwrap_or(0),
            oom_kills: ooms2.unwrap_or(0).max(ooms1.unwrap_or(0)),
        }
    }

    /// Removes the run's directories (its processes are gone).
    pub fn remove(&self) {
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
        self.limited.remove();
    }

    /// Each directory's `cgroup.procs`, opened for writing: the child writes "0" to each
    /// between fork and exec.
    fn procs_files(&self) -> std::io::Result<Vec<OwnedFd>> {
        let mut procs: Vec<OwnedFd> =
            self.cgroup.as_ref().map(RunCgroup::procs_file).transpose()?.into_iter().collect();
        procs.extend(self.limited.procs_files()?);
        Ok(procs)
    }
}

/// The job directory and checkpoint directory of a run, created (or reused) for `account`,
/// and a new log for the attempt — all without trusting what the job left in its directory
/// (`jobfs`).
fn prepare_job_files(files: &RunFiles, account: Option<&UnixAccount>) -> std::io::Result<std::fs::File> {
    let owner = account.map(|a| (a.uid, a.gid));
    let jobs = Dir::create(&files.jobs_dir)?;
    let job = jobs.subdir(&files.job_dir_name, owner, 0o700)?;
    job.subdir("checkpoint", owner, 0o700)?;
    job.create_fresh(&files.log_name, owner)
}

/// A run's spawned process, its new log (which its output is to be copied into) and its
/// cgroup and limit directories; an interactive run's terminal; how a command joins it.
pub(super) struct Spawned {
    pub child: tokio::process::Child,
    pub log: std::fs::File,
    pub confined: Confined,
    pub terminal: Option<Pty>,
    pub exec: ExecContext,
}

/// Spawns `spec`'s run (in `image`'s container when given) as `account`, in its own cgroup
/// and limits; `traceparent` is its launch's trace context. The reason, as the run's lost
/// report says it, when it cannot start (nothing of it is left then).
pub(super) fn spawn(
    spec: &RunSpec,
    isolation: &Isolation,
    (account, image): (Option<&UnixAccount>, Option<&Image>),
    traceparent: Option<String>,
) -> Result<Spawned, String> {
    let confined = Confined::create(spec, isolation)?;
    match start_child(spec, isolation, (account, image), &confined, traceparent) {
        Ok((child, log, terminal, mut exec)) => {
            exec.cgroup = confined.cgroup.as_ref().map(|c| c.dir().to_path_buf());
            exec.limit_dirs = confined.limited.dirs();
            exec.main_pid = child.id().map_or(0, |p| p as i32);
            Ok(Spawned { child, log, confined, terminal, exec })
        }
        Err(e) => {
            confined.remove();
            let who = account.map_or("the agent's user", |a| a.name.as_str());
            Err(format!("starting {:?} in {} as {who}: {e}", spec.program, spec.workdir.display()))
        }
    }
}

/// The job's files, its container, its command (on a new terminal when interactive),
/// confined, spawned; how a command joins it.
fn start_child(
    spec: &RunSpec,
    isolation: &Isolation,
    (account, image): (Option<&UnixAccount>, Option<&Image>),
    confined: &Confined,
    traceparent: Option<String>,
) -> std::io::Result<(tokio::process::Child, std::fs::File, Option<Pty>, ExecContext)> {
    // The job's directory and log belong to the job's user, readable by nobody else.
    let log = prepare_job_files(&spec.files, account)?;
    let (mut container, image_env) = match (image, &spec.container) {
        (Some(image), Some(c)) => {
            let (setup, env) = container_setup(c, image, &isolation.cdi_dirs, account)?;
            (Some(setup), env)
        }
        _ => (None, Vec::new()),
    };
    let exec = ExecContext {
        account: account.cloned(),
        env: run_env(spec, account, &image_env, traceparent.as_deref()),
        workdir: spec.workdir.clone(),
        fallback_workdir: spec.fallback_workdir.clone(),
        container_workdir: container.as_ref().map(|c| c.workdir().to_string_lossy().into_owned()),
        ..ExecContext::default()
    };
    let mut cmd = command(spec, &exec.env);
    let terminal = match spec.interactive {
        Some(_) => {
            let (pty, slave) = crate::interactive::terminal::open(24, 80)?;
            let [i, o, e] = crate::interactive::terminal::stdio_of(&slave)?;
            cmd.stdin(i).stdout(o).stderr(e);
            Some(pty)
        }
        None => {
            cmd.process_group(0);
            None
        }
    };
    let id_maps = container.as_mut().map(ContainerSetup::id_maps).transpose()?;
    let workdirs = (spec.workdir.as_path(), spec.fallback_workdir.as_deref());
    // Held open until the child has written itself into them.
    let _procs = confine(&mut cmd, confined, account, workdirs, (container, terminal.is_some()))?;
    // The slave's copies in `cmd` close with it: the terminal's output ends with the run's.
    let child = spawn_child(&mut cmd, id_maps)?;
    drop(cmd);
    Ok((child, log, terminal, exec))
}

/// Spawns the confined command, recorded as the agent's own: the orphan reaper leaves its exit
/// status to the run. A container's process gets its id maps from a thread of the agent's
/// meanwhile.
fn spawn_child(
    cmd: &mut tokio::process::Command,
    id_maps: Option<IdMaps>,
) -> std::io::Result<tokio::process::Child> {
    let Some(maps) = id_maps else { return crate::reaper::spawn(|| cmd.spawn(), tokio::process::Child::id) };
    let spawned = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| maps.write(&spawned));
        let child = crate::reaper::spawn(|| cmd.spawn(), tokio::process::Child::id);
        spawned.store(true, std::sync::atomic::Ordering::Release);
        let written = writer.join().unwrap_or_else(|_| Err(std::io::Error::other("panicked")));
        match (child, written) {
            (Ok(child), _) => Ok(child),
            (Err(e), Err(why)) => Err(std::io::Error::new(e.kind(), format!("{e} (id maps: {why})"))),
            (Err(e), Ok(())) => Err(e),
        }
    })
}

/// How a run enters its container `c` of `image` — the spec's binds, the run's GPUs (as the
/// node's CDI spec has them, else their device nodes) — and the environment it adds under the
/// job's (the image's, the CDI spec's).
fn container_setup(
    c: &ContainerSpec,
    image: &Image,
    cdi_dirs: &[std::path::PathBuf],
    account: Option<&UnixAccount>,
) -> std::io::Result<(ContainerSetup, EnvPairs)> {
    let mut binds = c.binds.clone();
    let mut env = image.env.clone();
    let cdi = match c.gpu_names.is_empty() {
        true => None,
        false => {
            crate::cdi::edits(cdi_dirs, crate::cdi::GPU_KIND, &c.gpu_names).map_err(std::io::Error::other)?
        }
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
        None => crate::container::gpu_devices(&c.gpu_minors),
    };
    let identity = account.map(|u| Identity { groups: u.groups.clone(), gid: u.gid, uid: u.uid });
    let setup =
        ContainerSetup::new(&image.rootfs, &c.base, &binds, &devices, &c.workdir, identity, c.memory_mib)?;
    Ok((setup, env))
}

/// A run's environment, in order: the account's allowlisted base, the container's own (its
/// PATH, say) under the job's, the launch's trace context (the job joins its own spans to it).
/// Kept for the commands exec'd into the run.
fn run_env(
    spec: &RunSpec,
    account: Option<&UnixAccount>,
    image_env: &[(String, String)],
    traceparent: Option<&str>,
) -> EnvPairs {
    let mut env: EnvPairs = base_env(std::env::vars(), account).into_iter().collect();
    env.extend(image_env.iter().cloned());
    env.extend(spec.env.iter().cloned());
    if let Some(tp) = traceparent {
        env.push(("TRACEPARENT".into(), tp.to_string()));
    }
    env
}

/// The job's command: its argv with its environment, output piped (an interactive run's
/// terminal replaces the pipes, and its process group comes with its session).
fn command(spec: &RunSpec, env: &EnvPairs) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(env.iter().cloned())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(false);
    cmd
}

/// What the child does between fork and exec, prepared before the fork.
struct ChildSteps {
    procs_fds: Vec<i32>,
    ids: Option<(Vec<nix::unistd::Gid>, nix::unistd::Gid, nix::unistd::Uid)>,
    workdir: std::ffi::CString,
    /// The job's own directory, and what the run's stderr is told, where the submit directory
    /// cannot be entered.
    fallback: Option<(std::ffi::CString, String)>,
    container: Option<ContainerSetup>,
    /// On a terminal: the child leads a new session whose controlling terminal it is.
    terminal: bool,
}

fn cpath(p: &Path) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()))
        .map_err(|_| std::io::Error::other("the working directory holds a NUL byte"))
}

impl ChildSteps {
    fn new(
        procs: &[OwnedFd],
        account: Option<&UnixAccount>,
        (workdir, fallback): (&Path, Option<&Path>),
        (container, terminal): (Option<ContainerSetup>, bool),
    ) -> std::io::Result<ChildSteps> {
        let ids = account.map(|a| {
            let groups: Vec<nix::unistd::Gid> =
                a.groups.iter().map(|g| nix::unistd::Gid::from_raw(*g)).collect();
            (groups, nix::unistd::Gid::from_raw(a.gid), nix::unistd::Uid::from_raw(a.uid))
        });
        let workdir = match &container {
            Some(setup) => setup.workdir().to_owned(),
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
        let procs_fds = procs.iter().map(|f| f.as_raw_fd()).collect();
        Ok(ChildSteps { procs_fds, ids, workdir, fallback, container, terminal })
    }

    /// In the child: into the run's cgroups, to the job's account (or into its container as
    /// that account), into its working directory; everything past stderr closes on exec.
    ///
    /// # Safety
    /// Only between fork and exec: it makes system calls on values prepared before the fork;
    /// nothing allocates or locks.
    unsafe fn run(&self) -> std::io::Result<()> {
        crate::container_child::default_signals();
        if self.terminal {
            crate::interactive::terminal::become_controlling()?;
        }
        for fd in &self.procs_fds {
            // Into the run's cgroup (and its limits) before any of the job's code runs.
            if nix::libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        match &self.container {
            // Becomes the user first, then enters its container.
            Some(setup) => crate::container_child::enter(setup)?,
            None => {
                if let Some((groups, gid, uid)) = &self.ids {
                    nix::unistd::setgroups(groups)?;
                    nix::unistd::setgid(*gid)?;
                    nix::unistd::setuid(*uid)?;
                }
            }
        }
        if nix::libc::chdir(self.workdir.as_ptr()) != 0 {
            let Some((own, note)) = &self.fallback else { return Err(std::io::Error::last_os_error()) };
            if nix::libc::chdir(own.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Best effort: the note is a courtesy on the run's stderr; the run goes on without it.
            nix::libc::write(2, note.as_ptr().cast(), note.len());
        }
        if let Some(setup) = &self.container {
            setup.set_up();
        }
        // Nothing the agent holds reaches the job (a descriptor it inherited without
        // close-on-exec, say): everything past stderr closes on exec.
        nix::libc::syscall(nix::libc::SYS_close_range, 3u32, u32::MAX, nix::libc::CLOSE_RANGE_CLOEXEC);
        Ok(())
    }
}

/// Makes the child confine itself before any of the job's code runs: into the run's cgroup
/// (through the returned `cgroup.procs` files, which must stay open until the spawn), to the
/// job's account — or, for a container, into the container as that account
/// (`container_child::enter`) — then into its working directory, entered as that account,
/// after the switch: as root the chdir would pass directories the job's user may not enter.
fn confine(
    cmd: &mut tokio::process::Command,
    confined: &Confined,
    account: Option<&UnixAccount>,
    workdirs: (&Path, Option<&Path>),
    container: (Option<ContainerSetup>, bool),
) -> std::io::Result<Vec<OwnedFd>> {
    let procs = confined.procs_files()?;
    let steps = ChildSteps::new(&procs, account, workdirs, container)?;
    // SAFETY: between fork and exec the child only makes system calls (write, the container's
    // namespaces and mounts, setgroups, setgid, setuid, chdir) on values prepared before the
    // fork; nothing allocates or locks.
    unsafe {
        cmd.pre_exec(move || steps.run());
    }
    Ok(procs)
}
