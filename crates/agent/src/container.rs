//! A run inside its container image, the way enroot (Slurm's pyxis) does it: no daemon and no
//! runtime process between the agent and the job. Between fork and exec the run's process
//! enters a mount namespace of its own whose root is an overlay of the cached image
//! (`image::ImageCache`) under a writable tmpfs layer, with `/proc`, a `/dev` holding only the
//! basic devices and the run's own GPUs (from the node's CDI spec, `cdi`, else `/dev/nvidiaN`
//! of its GPUs and the control devices), the host's `/etc/hosts` and `/etc/resolv.conf`, the job's
//! directory at its own path, and the job's mounts. Everything else is a bare run's: the
//! process is the agent's child, in the run's cgroup, as the submitter, with its signals. The
//! namespace, and with it every mount, ends with the run's last process.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::libc;

/// What the child does to enter its container, prepared before the fork (nothing allocates in
/// the child).
pub struct Plan {
    /// An empty directory of the agent's: the tmpfs for the writable layer is mounted on it.
    scratch: CString,
    upper: CString,
    work: CString,
    /// An empty directory of the agent's: the container's root is mounted on it.
    root: CString,
    /// Where the old root goes at the pivot: on the host (under `root`), and inside.
    put_old: CString,
    old_root: CString,
    overlay: CString,
    /// Directories to make in the new root (mount points), parents first.
    dirs: Vec<CString>,
    /// Empty files to make in the new root (mount points of files and devices).
    files: Vec<CString>,
    /// Bind mounts: host path, path in the new root (under `root`), read-only.
    binds: Vec<(CString, CString, bool)>,
    /// The job's own mounts (by index into `binds`) and their host paths: opened as the job's
    /// user, so the root agent binds only what that user could reach.
    user_sources: Vec<(usize, CString)>,
    proc_dir: CString,
    dev_dir: CString,
    shm_dir: CString,
    links: Vec<(CString, CString)>,
    /// The working directory inside the container.
    workdir: CString,
}

/// The basic devices every container gets.
const BASIC_DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// Where the host's root stays, inside the container, until the mounts are made.
const OLD_ROOT: &str = ".kairos-old-root";
/// The NVIDIA control devices a CUDA program opens besides its GPUs.
const NVIDIA_CONTROL: [&str; 4] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];

fn c(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other(format!("{} holds a NUL byte", p.display())))
}

/// Every directory from `root` down to `path` (exclusive of `root`), parents first.
fn with_parents(root: &Path, path: &Path, out: &mut Vec<PathBuf>) {
    let mut chain: Vec<PathBuf> =
        path.ancestors().take_while(|p| *p != root && p.starts_with(root)).map(Path::to_path_buf).collect();
    chain.reverse();
    for p in chain {
        if !out.contains(&p) {
            out.push(p);
        }
    }
}

/// A mount: host source, path inside, read-only, and whether the job asked for it (then its
/// user must be able to open the source).
pub struct Bind {
    pub src: PathBuf,
    pub dst: String,
    pub read_only: bool,
    pub the_jobs: bool,
}

/// The most mounts of the job's own one container takes.
const USER_BINDS_MAX: usize = 64;

impl Bind {
    /// `SRC:DST`, `SRC:DST:ro` or `SRC:DST:rw` (as the controller checked them).
    pub fn parse(text: &str) -> Option<Bind> {
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
}

/// The job's own mounts (by index) and their host sources.
fn user_sources(mounts: &[(PathBuf, PathBuf, bool, bool)]) -> std::io::Result<Vec<(usize, CString)>> {
    let theirs: Vec<(usize, CString)> = mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| m.3)
        .map(|(i, m)| Ok((i, c(&m.0)?)))
        .collect::<std::io::Result<_>>()?;
    if theirs.len() > USER_BINDS_MAX {
        return Err(std::io::Error::other(format!("more than {USER_BINDS_MAX} container mounts")));
    }
    Ok(theirs)
}

/// `/proc/self/fd/FD` into `buf`, NUL-terminated, without allocating.
fn fd_path(fd: libc::c_int, buf: &mut [u8; 32]) -> *const libc::c_char {
    let prefix = b"/proc/self/fd/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (fd.unsigned_abs(), 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for k in 0..len {
        buf[prefix.len() + k] = digits[len - 1 - k];
    }
    buf[prefix.len() + len] = 0;
    buf.as_ptr().cast()
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

impl Plan {
    /// The plan for a run of `rootfs` whose mount points are made under `base` (the agent's
    /// `containers` directory), binding `binds` (the job's directory first) and `devices` (on
    /// the host, under /dev inside: the run's GPUs, `gpu_devices` or a CDI spec's), and
    /// starting in `workdir` inside.
    pub fn new(
        rootfs: &Path,
        base: &Path,
        binds: &[Bind],
        devices: &[(PathBuf, String)],
        workdir: &str,
    ) -> std::io::Result<Plan> {
        let scratch = base.join("scratch");
        let root = base.join("root");
        for d in [&scratch, &root] {
            std::fs::create_dir_all(d)?;
        }
        // Mount points are made, and mounts placed, after the pivot: a path inside resolves
        // within the container (an image's symlink cannot lead them onto the host), while the
        // host's paths are reached through the old root until it is detached.
        let top = Path::new("/");
        let (mut dirs, mut files, mut mounts) = (Vec::new(), Vec::new(), Vec::new());
        for name in ["/proc", "/dev"] {
            with_parents(top, Path::new(name), &mut dirs);
        }
        let basic = BASIC_DEVICES.iter().map(|d| (Path::new("/dev").join(d), format!("/dev/{d}")));
        for (host, inside) in basic.chain(devices.iter().cloned()) {
            if host.exists() && inside.starts_with("/dev/") {
                files.push(PathBuf::from(&inside));
                mounts.push((host, PathBuf::from(inside), false, false));
            }
        }
        for etc in ["/etc/hosts", "/etc/resolv.conf"] {
            if Path::new(etc).is_file() && rootfs.join("etc").is_dir() {
                files.push(PathBuf::from(etc));
                mounts.push((PathBuf::from(etc), PathBuf::from(etc), true, false));
            }
        }
        for b in binds {
            let inside = PathBuf::from(&b.dst);
            if b.src.is_dir() {
                with_parents(top, &inside, &mut dirs);
            } else {
                with_parents(top, inside.parent().unwrap_or(top), &mut dirs);
                files.push(inside.clone());
            }
            mounts.push((b.src.clone(), inside, b.read_only, b.the_jobs));
        }
        let overlay = format!(
            "lowerdir={},upperdir={},workdir={}",
            rootfs.display(),
            scratch.join("upper").display(),
            scratch.join("work").display()
        );
        if overlay.matches(',').count() != 2 {
            return Err(std::io::Error::other("an image path holds a comma"));
        }
        let old_root = Path::new("/").join(OLD_ROOT);
        let cs = |v: Vec<PathBuf>| v.iter().map(|p| c(p)).collect::<std::io::Result<Vec<_>>>();
        Ok(Plan {
            upper: c(&scratch.join("upper"))?,
            work: c(&scratch.join("work"))?,
            scratch: c(&scratch)?,
            overlay: CString::new(overlay).map_err(|_| std::io::Error::other("NUL in a path"))?,
            put_old: c(&root.join(OLD_ROOT))?,
            old_root: c(&old_root)?,
            proc_dir: CString::from(c"/proc"),
            dev_dir: CString::from(c"/dev"),
            shm_dir: CString::from(c"/dev/shm"),
            links: [
                ("/proc/self/fd", "/dev/fd"),
                ("/proc/self/fd/0", "/dev/stdin"),
                ("/proc/self/fd/1", "/dev/stdout"),
                ("/proc/self/fd/2", "/dev/stderr"),
            ]
            .iter()
            .map(|(target, at)| {
                Ok((
                    CString::new(*target).map_err(std::io::Error::other)?,
                    CString::new(*at).map_err(std::io::Error::other)?,
                ))
            })
            .collect::<std::io::Result<_>>()?,
            root: c(&root)?,
            dirs: cs(dirs)?,
            files: cs(files)?,
            binds: mounts
                .iter()
                .map(|(s, d, ro, _)| Ok((c(&old_root.join(s.strip_prefix("/").unwrap_or(s)))?, c(d)?, *ro)))
                .collect::<std::io::Result<_>>()?,
            user_sources: user_sources(&mounts)?,
            workdir: CString::new(workdir).map_err(|_| std::io::Error::other("NUL in the workdir"))?,
        })
    }

    /// Enters the container: in the child, between fork and exec, before the user changes to
    /// `user` (groups, gid, uid; None: the agent's own). Only system calls on prepared values
    /// (async-signal-safe).
    pub fn enter(&self, user: Option<(&[libc::gid_t], libc::gid_t, libc::uid_t)>) -> std::io::Result<()> {
        let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
        let none = std::ptr::null::<libc::c_char>();
        // SAFETY: system calls on NUL-terminated strings prepared before the fork; the mount
        // namespace is this process's own from the first call on.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()))?;
            let tmpfs = c"tmpfs".as_ptr();
            // The writable layer: its pages are charged to the run's memory limit.
            check(libc::mount(
                tmpfs,
                self.scratch.as_ptr(),
                tmpfs,
                libc::MS_NOSUID | libc::MS_NODEV,
                c"size=50%,mode=0755".as_ptr().cast(),
            ))?;
            check(libc::mkdir(self.upper.as_ptr(), 0o755))?;
            check(libc::mkdir(self.work.as_ptr(), 0o755))?;
            let overlay = c"overlay".as_ptr();
            check(libc::mount(overlay, self.root.as_ptr(), overlay, 0, self.overlay.as_ptr().cast()))?;
            // The job's own mount sources, opened as its user: what it cannot reach is refused.
            let mut fds = [-1 as libc::c_int; USER_BINDS_MAX];
            if let Some(user) = user {
                self.open_as(user, &mut fds)?;
            }
            // The pivot first: from here a path resolves inside the container, the host's
            // reached only through the old root (for the binds' sources).
            if libc::mkdir(self.put_old.as_ptr(), 0o700) != 0 && *libc::__errno_location() != libc::EEXIST {
                return Err(std::io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_pivot_root, self.root.as_ptr(), self.put_old.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            check(libc::chdir(c"/".as_ptr()))?;
            for d in &self.dirs {
                if libc::mkdir(d.as_ptr(), 0o755) != 0 && *libc::__errno_location() != libc::EEXIST {
                    return Err(std::io::Error::last_os_error());
                }
            }
            let proc_ = c"proc".as_ptr();
            check(libc::mount(
                proc_,
                self.proc_dir.as_ptr(),
                proc_,
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                tmpfs,
                self.dev_dir.as_ptr(),
                tmpfs,
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"mode=0755,size=64k".as_ptr().cast(),
            ))?;
            check(libc::mkdir(self.shm_dir.as_ptr(), 0o1777))?;
            check(libc::mount(
                tmpfs,
                self.shm_dir.as_ptr(),
                tmpfs,
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=1777".as_ptr().cast(),
            ))?;
            for (target, at) in &self.links {
                check(libc::symlink(target.as_ptr(), at.as_ptr()))?;
            }
            for f in &self.files {
                let fd = libc::open(f.as_ptr(), libc::O_CREAT | libc::O_RDONLY | libc::O_CLOEXEC, 0o644);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            for (i, (src, dst, ro)) in self.binds.iter().enumerate() {
                // A source opened as the user is bound through its descriptor.
                let mut path = [0u8; 32];
                let opened = self.user_sources.iter().position(|(at, _)| *at == i).map(|k| fds[k]);
                let src = match opened {
                    Some(fd) if fd >= 0 => fd_path(fd, &mut path),
                    _ => src.as_ptr(),
                };
                check(libc::mount(src, dst.as_ptr(), none, libc::MS_BIND | libc::MS_REC, std::ptr::null()))?;
                if *ro {
                    let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
                    check(libc::mount(none, dst.as_ptr(), none, flags, std::ptr::null()))?;
                }
            }
            // The host's root leaves the container.
            check(libc::umount2(self.old_root.as_ptr(), libc::MNT_DETACH))?;
            check(libc::rmdir(self.old_root.as_ptr()))?;
        }
        Ok(())
    }

    /// Opens the job's own mount sources (O_PATH) with `user`'s file-system identity, then
    /// takes root's back. In the child, before the pivot.
    fn open_as(
        &self,
        (groups, gid, uid): (&[libc::gid_t], libc::gid_t, libc::uid_t),
        fds: &mut [libc::c_int; USER_BINDS_MAX],
    ) -> std::io::Result<()> {
        // SAFETY: system calls on values prepared before the fork; the identity changes are
        // this process's own (it becomes the user for good right after).
        unsafe {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::setfsgid(gid);
            libc::setfsuid(uid);
            for (k, (_, host)) in self.user_sources.iter().enumerate() {
                fds[k] = libc::open(host.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if fds[k] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            libc::setfsuid(0);
            libc::setfsgid(0);
        }
        Ok(())
    }

    /// The working directory inside the container (the caller changes to it after the user
    /// change, as for a bare run).
    pub fn workdir(&self) -> &std::ffi::CStr {
        &self.workdir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_binds_the_job_its_mounts_and_only_its_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        let job = dir.path().join("jobs/7-1");
        std::fs::create_dir_all(&job).unwrap();
        let data = dir.path().join("data.txt");
        std::fs::write(&data, "x").unwrap();
        let binds = [
            Bind { src: job.clone(), dst: job.display().to_string(), read_only: false, the_jobs: false },
            Bind { src: data.clone(), dst: "/inputs/data.txt".into(), read_only: true, the_jobs: true },
        ];
        let plan =
            Plan::new(&rootfs, &dir.path().join("containers"), &binds, &gpu_devices(&[3]), "/work").unwrap();
        let has = |v: &[CString], p: &Path| v.iter().any(|c| c.as_bytes() == p.as_os_str().as_bytes());
        // The job's directory at its own path inside, its parents made first.
        let pos = |p: &Path| plan.dirs.iter().position(|d| d.as_bytes() == p.as_os_str().as_bytes());
        assert!(pos(&job).is_some() && pos(job.parent().unwrap()) < pos(&job), "{:?}", plan.dirs);
        // A file mount gets a file as its mount point; read-only as asked; host sources are
        // reached through the old root, until it is detached.
        assert!(has(&plan.files, Path::new("/inputs/data.txt")));
        let from_host = Path::new("/").join(OLD_ROOT).join(data.strip_prefix("/").unwrap());
        assert!(plan.binds.iter().any(|(s, _, ro)| s.as_bytes() == from_host.as_os_str().as_bytes() && *ro));
        // Only the run's GPU device would be bound (none exist on this machine: none is).
        assert!(!plan.binds.iter().any(|(s, _, _)| s.as_bytes().ends_with(b"/dev/nvidia0")));
        assert!(plan.binds.iter().any(|(_, d, _)| d.as_bytes() == b"/dev/null"));
        let put_old = dir.path().join("containers/root").join(OLD_ROOT);
        assert_eq!(plan.put_old.as_bytes(), put_old.as_os_str().as_bytes());
        assert_eq!(plan.workdir().to_bytes(), b"/work");
        // The job's own mount, and only it, is opened as its user.
        assert_eq!(plan.user_sources.len(), 1);
        assert_eq!(plan.user_sources[0].1.as_bytes(), data.as_os_str().as_bytes());
        let mut buf = [0u8; 32];
        let p = fd_path(1234, &mut buf);
        // SAFETY: fd_path wrote a NUL-terminated string into buf.
        assert_eq!(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes(), b"/proc/self/fd/1234");
        assert!(plan.overlay.to_bytes().starts_with(b"lowerdir="));
    }
}
