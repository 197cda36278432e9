//! A run inside its container image, the way enroot (Slurm's pyxis) does it: no daemon and no
//! runtime process between the agent and the job, and nothing of the image entered with root's
//! powers. Between fork and exec the run's process (`container_child::enter`) first becomes the job's
//! user, then creates a user namespace (the user maps to itself: root inside is nobody outside,
//! and an image's setuid binaries give nothing), a mount namespace and a PID namespace of its own;
//! as that user it mounts a tmpfs for the writable layer, an overlay of the cached image
//! (`image::ImageCache`, unpacked as the same user) over it, and clones the sources of its mounts
//! (the job's directory at its own path, the job's mounts, the host's `/etc/hosts` and
//! `/etc/resolv.conf`, the basic devices and the run's own GPUs, from the node's CDI spec, `cdi`,
//! else `/dev/nvidiaN` and the control devices) — so it reaches only what the user could. It then
//! pivots into the overlay and detaches the host's root before it creates any mount point; every
//! mount point is made component by component relative to a directory descriptor with
//! `O_NOFOLLOW|O_NONBLOCK`. Every mount is `nosuid` (and `nodev` but for device nodes); the job
//! runs with `PR_SET_NO_NEW_PRIVS`, an empty capability bounding set, and sees its own processes
//! only. The run stays the agent's child, in the run's cgroup, with its signals; the namespace,
//! and with it every mount, ends with the run's last process.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::libc;

/// What the child does to enter its container, prepared before the fork (nothing allocates in
/// the child).
pub struct ContainerSetup {
    /// An empty directory of the agent's (traversable by the job's user): the run's tmpfs is
    /// mounted on it, in the run's own mount namespace.
    pub(crate) scratch: CString,
    pub(crate) upper: CString,
    pub(crate) work: CString,
    /// The container's root (the overlay) inside the tmpfs.
    pub(crate) root: CString,
    pub(crate) overlay: CString,
    /// Whom the run becomes before anything else (None: it stays the agent's user).
    pub(crate) identity: Option<Identity>,
    /// `uid_map` and `gid_map`: the user maps to itself (written by the agent, `IdMaps`).
    pub(crate) uid_map: CString,
    pub(crate) gid_map: CString,
    /// The pipes over which the agent writes the run's id maps (`ContainerSetup::id_maps`).
    pub(crate) sync: Option<Sync>,
    /// The writable layer's tmpfs options and `/dev/shm`'s size: the run's memory limit, or
    /// a quarter of the host's memory each where it has none.
    pub(crate) layer_options: CString,
    pub(crate) shm_size: CString,
    pub(crate) mounts: Vec<Mount>,
    /// Symbolic links in `/dev`: target, name.
    pub(crate) links: Vec<(CString, CString)>,
    /// The working directory inside the container.
    workdir: CString,
}

/// The descriptors of the id-map hand-over: the run's process writes its pid on `child_write`
/// once it has its user namespace and waits on `child_read`; the agent reads `agent_read`,
/// writes the maps as root, and says so on `agent_write`. (No process of the run writes its
/// own maps: that would need it dumpable, and the processes that never exec are copies of the
/// agent.)
#[derive(Clone, Copy)]
pub(crate) struct Sync {
    pub(crate) child_write: libc::c_int,
    pub(crate) child_read: libc::c_int,
    pub(crate) agent_read: libc::c_int,
    pub(crate) agent_write: libc::c_int,
}

/// The agent's side of the id-map hand-over, for one spawn: `write` (a thread of its own)
/// waits for the run's pid, writes its maps, and lets it go on.
pub struct IdMaps {
    fds: Vec<std::os::fd::OwnedFd>,
    agent_read: libc::c_int,
    agent_write: libc::c_int,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

/// How long the agent waits for a run's process to ask for its id maps.
const ID_MAPS_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

impl IdMaps {
    /// Writes the maps of the run's process once it asks, until `spawned` is set (the spawn
    /// returned) or the wait ends. In a thread of its own while the spawn waits.
    pub fn write(self, spawned: &std::sync::atomic::AtomicBool) -> std::io::Result<()> {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        let started = std::time::Instant::now();
        let mut pid = [0u8; 4];
        loop {
            let mut poll = libc::pollfd { fd: self.agent_read, events: libc::POLLIN, revents: 0 };
            // SAFETY: poll on one descriptor this object owns.
            let ready = unsafe { libc::poll(&mut poll, 1, 100) };
            if ready > 0 {
                // SAFETY: read into a local buffer of the given length.
                let n = unsafe { libc::read(self.agent_read, pid.as_mut_ptr().cast(), 4) };
                if n != 4 {
                    return Err(std::io::Error::other("the run's process ended before its user namespace"));
                }
                break;
            }
            if spawned.load(Ordering::Acquire) || started.elapsed() > ID_MAPS_WAIT {
                return Err(std::io::Error::other("the run's process did not ask for its id maps"));
            }
        }
        let pid = i32::from_ne_bytes(pid);
        let proc_file =
            |name: &str| std::fs::OpenOptions::new().write(true).open(format!("/proc/{pid}/{name}"));
        proc_file("setgroups")?.write_all(b"deny")?;
        proc_file("uid_map")?.write_all(&self.uid_map)?;
        proc_file("gid_map")?.write_all(&self.gid_map)?;
        // SAFETY: write of one byte from a static buffer to a descriptor this object owns.
        if unsafe { libc::write(self.agent_write, b"1".as_ptr().cast(), 1) } != 1 {
            return Err(std::io::Error::last_os_error());
        }
        drop(self.fds);
        Ok(())
    }
}

/// A Unix identity: supplementary groups, gid, uid.
pub struct Identity {
    pub groups: Vec<libc::gid_t>,
    pub gid: libc::gid_t,
    pub uid: libc::uid_t,
}

/// A bind mount into the container.
pub(crate) struct Mount {
    /// The host path, cloned (`open_tree`) as the job's user before the pivot.
    pub(crate) src: CString,
    /// Where inside: its path's components under `/`.
    pub(crate) at: Vec<CString>,
    pub(crate) read_only: bool,
    /// A device node: the mount keeps device access (no `nodev`).
    pub(crate) device: bool,
    /// Left out when the source is missing or the image has no plain directory for it
    /// (`/etc/hosts` in an image without `/etc`).
    pub(crate) optional: bool,
}

/// The basic devices every container gets.
const BASIC_DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// The NVIDIA control devices a CUDA program opens besides its GPUs.
const NVIDIA_CONTROL: [&str; 4] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];
/// The most mounts one container takes (the job's own, its devices, its CDI spec's).
pub(crate) const MOUNTS_MAX: usize = 256;
/// The most mounts of the job's own one container takes.
const USER_BINDS_MAX: usize = 64;

fn c(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other(format!("{} holds a NUL byte", p.display())))
}

/// The components of an absolute path inside the container; `.`, `..` and `/` alone refused.
fn components(inside: &str) -> std::io::Result<Vec<CString>> {
    let path = Path::new(inside);
    let mut out = Vec::new();
    for comp in path.components() {
        match comp {
            Component::RootDir => {}
            Component::Normal(name) => out.push(c(Path::new(name))?),
            _ => {
                return Err(std::io::Error::other(format!(
                    "mount point {inside:?} is not a plain absolute path"
                )))
            }
        }
    }
    if !path.is_absolute() || out.is_empty() {
        return Err(std::io::Error::other(format!("mount point {inside:?} is not a plain absolute path")));
    }
    Ok(out)
}

/// A mount: host source, path inside, read-only, and whether the job asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    pub src: PathBuf,
    pub dst: String,
    pub read_only: bool,
    pub the_jobs: bool,
}

/// The device nodes of GPU `minors` and the NVIDIA control devices, where no CDI spec says
/// otherwise.
pub fn gpu_devices(minors: &[u32]) -> Vec<(PathBuf, String)> {
    if minors.is_empty() {
        return Vec::new();
    }
    let names =
        minors.iter().map(|m| format!("nvidia{m}")).chain(NVIDIA_CONTROL.iter().map(|d| d.to_string()));
    names.map(|n| (Path::new("/dev").join(&n), format!("/dev/{n}"))).collect()
}

fn cstr(s: String) -> std::io::Result<CString> {
    CString::new(s).map_err(std::io::Error::other)
}

/// Symbolic links in the container's `/dev`: target, name.
const DEV_LINKS: [(&str, &str); 4] = [
    ("/proc/self/fd", "fd"),
    ("/proc/self/fd/0", "stdin"),
    ("/proc/self/fd/1", "stdout"),
    ("/proc/self/fd/2", "stderr"),
];

/// A container's mounts: the basic devices and `devices` (only those under `/dev`), the host's
/// name files, then `binds` (the job's at most `USER_BINDS_MAX`; `MOUNTS_MAX` in all).
fn mounts(binds: &[Bind], devices: &[(PathBuf, String)]) -> std::io::Result<Vec<Mount>> {
    let mut mounts = Vec::new();
    let basic = BASIC_DEVICES.iter().map(|d| (Path::new("/dev").join(d), format!("/dev/{d}")));
    for (host, inside) in basic.chain(devices.iter().cloned()) {
        if !inside.starts_with("/dev/") {
            continue;
        }
        let at = components(&inside)?;
        mounts.push(Mount { src: c(&host)?, at, read_only: false, device: true, optional: true });
    }
    for etc in ["/etc/hosts", "/etc/resolv.conf"] {
        let at = components(etc)?;
        mounts.push(Mount { src: c(Path::new(etc))?, at, read_only: true, device: false, optional: true });
    }
    if binds.iter().filter(|b| b.the_jobs).count() > USER_BINDS_MAX {
        return Err(std::io::Error::other(format!("more than {USER_BINDS_MAX} container mounts")));
    }
    for b in binds {
        let at = components(&b.dst)?;
        mounts.push(Mount { src: c(&b.src)?, at, read_only: b.read_only, device: false, optional: false });
    }
    if mounts.len() > MOUNTS_MAX {
        return Err(std::io::Error::other(format!("more than {MOUNTS_MAX} mounts in one container")));
    }
    Ok(mounts)
}

/// The overlay's options: the image read-only under the run's writable layer in `scratch`.
fn overlay_options(rootfs: &Path, scratch: &Path) -> std::io::Result<String> {
    let overlay = format!(
        "lowerdir={},upperdir={},workdir={}",
        rootfs.display(),
        scratch.join("upper").display(),
        scratch.join("work").display()
    );
    if overlay.matches(',').count() != 2 || overlay.matches('=').count() != 3 {
        return Err(std::io::Error::other("an image path holds a comma or an equals sign"));
    }
    Ok(overlay)
}

impl ContainerSetup {
    /// The setup for a run of `rootfs` as `identity` (None: the agent's own user), whose tmpfs is
    /// mounted under `base` (the agent's `containers` directory), binding `binds` (the job's
    /// directory first) and `devices` (on the host, under /dev inside: the run's GPUs,
    /// `gpu_devices` or a CDI spec's), and starting in `workdir` inside. Nothing of the job's is
    /// looked at here (as root): its sources are opened by the run's process, as its user.
    pub fn new(
        rootfs: &Path,
        base: &Path,
        binds: &[Bind],
        devices: &[(PathBuf, String)],
        workdir: &str,
        identity: Option<Identity>,
        memory_mib: u64,
    ) -> std::io::Result<ContainerSetup> {
        let scratch = base.join("mnt");
        std::fs::create_dir_all(&scratch)?;
        for d in [base, scratch.as_path()] {
            std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        }
        let mounts = mounts(binds, devices)?;
        let overlay = overlay_options(rootfs, &scratch)?;
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = match &identity {
            Some(id) => (id.uid, id.gid),
            None => unsafe { (libc::geteuid(), libc::getegid()) },
        };
        let (layer_options, shm_size) = match memory_mib {
            0 => ("size=25%,mode=0755".to_string(), "25%".to_string()),
            m => (format!("size={m}m,mode=0755"), format!("{m}m")),
        };
        Ok(ContainerSetup {
            upper: c(&scratch.join("upper"))?,
            work: c(&scratch.join("work"))?,
            root: c(&scratch.join("root"))?,
            scratch: c(&scratch)?,
            overlay: cstr(overlay)?,
            identity,
            uid_map: cstr(format!("{uid} {uid} 1\n"))?,
            gid_map: cstr(format!("{gid} {gid} 1\n"))?,
            sync: None,
            layer_options: cstr(layer_options)?,
            shm_size: cstr(shm_size)?,
            mounts,
            links: DEV_LINKS
                .iter()
                .map(|(target, at)| Ok((cstr(target.to_string())?, cstr(at.to_string())?)))
                .collect::<std::io::Result<_>>()?,
            workdir: CString::new(workdir).map_err(|_| std::io::Error::other("NUL in the workdir"))?,
        })
    }

    /// The working directory inside the container (the caller changes to it after entering).
    pub fn workdir(&self) -> &std::ffi::CStr {
        &self.workdir
    }

    /// The pipes of the id-map hand-over (closed on exec): this setup's side for the run's
    /// process, and the agent's, to run while the spawn waits.
    pub fn id_maps(&mut self) -> std::io::Result<IdMaps> {
        let pipe = || -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
        };
        let (up_read, up_write) = pipe()?;
        let (down_read, down_write) = pipe()?;
        use std::os::fd::AsRawFd;
        self.sync = Some(Sync {
            child_write: up_write.as_raw_fd(),
            child_read: down_read.as_raw_fd(),
            agent_read: up_read.as_raw_fd(),
            agent_write: down_write.as_raw_fd(),
        });
        Ok(IdMaps {
            agent_read: up_read.as_raw_fd(),
            agent_write: down_write.as_raw_fd(),
            fds: vec![up_read, up_write, down_read, down_write],
            uid_map: self.uid_map.as_bytes().to_vec(),
            gid_map: self.gid_map.as_bytes().to_vec(),
        })
    }

    /// In the run's process after its working directory is entered: the set-up deadline
    /// ends (an alarm left armed would outlive the exec).
    pub fn set_up(&self) {
        // SAFETY: alarm has no memory arguments.
        unsafe { libc::alarm(0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity { groups: vec![1001, 27], gid: 1001, uid: 1001 }
    }

    #[test]
    fn the_plan_binds_the_job_its_mounts_and_only_its_gpus_as_the_user() {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        let job = dir.path().join("jobs/7-1");
        let binds = [
            Bind { src: job.clone(), dst: job.display().to_string(), read_only: false, the_jobs: false },
            Bind { src: "/data/x".into(), dst: "/inputs/data.txt".into(), read_only: true, the_jobs: true },
        ];
        let base = dir.path().join("containers");
        let setup =
            ContainerSetup::new(&rootfs, &base, &binds, &gpu_devices(&[3]), "/work", Some(identity()), 0)
                .unwrap();
        let at = |m: &Mount| {
            let parts: Vec<&str> = m.at.iter().map(|p| p.to_str().unwrap()).collect();
            format!("/{}", parts.join("/"))
        };
        let find = |inside: &str| setup.mounts.iter().find(|m| at(m) == inside);
        // The job's directory at its own path, its mount read-only as asked; neither optional.
        let own = find(&job.display().to_string()).expect("the job's directory");
        assert!(!own.optional && !own.read_only && !own.device);
        let data = find("/inputs/data.txt").expect("the job's mount");
        assert!(data.read_only && !data.optional && data.src.as_bytes() == b"/data/x");
        // Its GPU and the control devices keep device access; the basic devices too.
        for d in ["/dev/nvidia3", "/dev/nvidiactl", "/dev/null"] {
            assert!(find(d).is_some_and(|m| m.device), "{d}");
        }
        assert!(find("/dev/nvidia0").is_none(), "another GPU's device");
        // The host's name files only where the image has /etc (decided inside, as the user).
        assert!(find("/etc/hosts").is_some_and(|m| m.optional && m.read_only));
        // The user maps to itself; the tmpfs's mount point is under the agent's directory,
        // traversable by the user.
        assert_eq!(setup.uid_map.as_bytes(), b"1001 1001 1\n");
        assert_eq!(setup.gid_map.as_bytes(), b"1001 1001 1\n");
        assert_eq!(setup.scratch.as_bytes(), base.join("mnt").as_os_str().as_bytes());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(base.join("mnt")).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(setup.workdir().to_bytes(), b"/work");
        assert!(setup.overlay.to_bytes().starts_with(b"lowerdir="));
        assert_eq!(setup.links.len(), 4);
    }

    #[test]
    fn mount_points_that_climb_or_are_not_absolute_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for dst in ["/a/../../etc", "relative", "/", "./x"] {
            let binds = [Bind { src: "/x".into(), dst: dst.into(), read_only: false, the_jobs: true }];
            let setup = ContainerSetup::new(dir.path(), &dir.path().join("c"), &binds, &[], "/", None, 0);
            assert!(setup.is_err(), "{dst} accepted");
        }
        let many: Vec<Bind> = (0..=USER_BINDS_MAX)
            .map(|i| Bind { src: "/x".into(), dst: format!("/m{i}"), read_only: false, the_jobs: true })
            .collect();
        assert!(ContainerSetup::new(dir.path(), &dir.path().join("c"), &many, &[], "/", None, 0).is_err());
        let comma = dir.path().join("a,upperdir=/etc");
        assert!(ContainerSetup::new(&comma, &dir.path().join("c"), &[], &[], "/", None, 0).is_err());
    }
}
