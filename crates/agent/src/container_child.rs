//! The steps of `enter`, in the run's process between fork and exec: only
//! system calls on values prepared before the fork (nothing allocates, nothing locks).
//!
//! ```text
//!  agent ─fork─▶ run process (the agent's child, in the run's cgroup and process group)
//!                 becomes the user; no_new_privs; new user, mount and PID namespaces
//!                 ─fork─▶ init (PID 1 inside): reaps, hands the job's status back, exits
//!                          ─fork─▶ job (PID 2): overlay, pivot, old root detached, mounts,
//!                                   empty bounding set, then exec (returns to the caller)
//!                 waits for init; ends as the job did (its exit code, or its signal)
//! ```
//! The run process and init ignore the signals the agent sends the process group (a checkpoint
//! signal, SIGTERM); the job gets them. SIGKILL and the cgroup's kill end them all.

use std::ffi::CStr;

use nix::libc::{self, c_int};

use crate::container::{ContainerSetup, Mount, MOUNTS_MAX};

/// How long the job's process may take to set its container up (a step that blocks ends it).
const SETUP_DEADLINE_S: u32 = 20;

type Result<T> = std::io::Result<T>;

fn last() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn check(r: c_int) -> Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(last())
    }
}

fn fd_or(r: libc::c_long) -> Result<c_int> {
    if r >= 0 {
        Ok(r as c_int)
    } else {
        Err(last())
    }
}

/// Signals the agent sends a run's process group that the run process and init must outlive.
/// Every signal's disposition back to its default, in a child before it runs a job's code: an
/// agent started with signals ignored (under `nohup`, or by a non-interactive shell in the
/// background, which ignores SIGINT and SIGQUIT) would otherwise hand that on, and a job's
/// shell cannot trap a signal ignored on entry (a terminal's Ctrl-C would do nothing).
pub fn default_signals() {
    set_signals(libc::SIG_DFL);
}

fn set_signals(handler: libc::sighandler_t) {
    for sig in 1..=libc::SIGRTMAX() {
        let keep = [
            libc::SIGKILL,
            libc::SIGSTOP,
            libc::SIGCHLD,
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
        ];
        if !keep.contains(&sig) {
            // SAFETY: signal() with SIG_IGN/SIG_DFL; failures (reserved signals) are harmless.
            unsafe { libc::signal(sig, handler) };
        }
    }
}

/// Closes every descriptor but `keep`.
fn close_all_but(keep: c_int) {
    // SAFETY: close_range on descriptor numbers; none of them is used after.
    unsafe {
        if keep > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, (keep - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (keep + 1) as u32, u32::MAX, 0u32);
    }
}

/// Drops every capability this process holds (in its user namespace): empties its permitted,
/// effective and inheritable sets (the one capset of the container's processes and of a
/// session's exec, `interactive::exec`).
pub(crate) fn drop_capabilities() -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header { version: 0x2008_0522, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset with a v3 header and two data words, as the kernel expects.
    match unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Becomes the user and enters the container `setup` describes: in the child, between fork and
/// exec. Returns in the job's process only (PID 2 of the run's PID namespace, under a minimal
/// init); the process the agent spawned stays outside, waits for the job and ends as it did.
/// Only system calls on prepared values (async-signal-safe).
pub(crate) fn enter(setup: &ContainerSetup) -> Result<()> {
    // SAFETY: system calls on values prepared before the fork; from the unshare on, the
    // namespaces are this process's own.
    unsafe {
        let sync = setup.sync.ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // The agent's ends of the hand-over pipes are not this process's to hold.
        libc::close(sync.agent_read);
        libc::close(sync.agent_write);
        libc::alarm(SETUP_DEADLINE_S);
        // Its processes never run anything of the host from where the agent stands: the pivot
        // moves a working directory at the old root (init's and this one's too).
        check(libc::chdir(c"/".as_ptr()))?;
        if let Some(id) = &setup.identity {
            check(libc::setgroups(id.groups.len(), id.groups.as_ptr()))?;
            check(libc::setgid(id.gid))?;
            check(libc::setuid(id.uid))?;
        }
        // Never dumpable (the change of user made it so): the processes that do not exec are
        // copies of the agent, whose memory and descriptors no job may read.
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID))?;
        // The agent writes the id maps (the user maps to itself) and says when they are there.
        let pid = libc::getpid();
        if libc::write(sync.child_write, (&pid as *const libc::pid_t).cast(), 4) != 4 {
            return Err(last());
        }
        let mut done = 0u8;
        if libc::read(sync.child_read, (&mut done as *mut u8).cast(), 1) != 1 || done != b'1' {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        libc::close(sync.child_write);
        libc::close(sync.child_read);
        libc::alarm(0);
        let mut pipe = [-1 as c_int; 2];
        check(libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC))?;
        let [read, write] = pipe;
        set_signals(libc::SIG_IGN);
        let init = libc::fork();
        if init < 0 {
            return Err(last());
        }
        if init > 0 {
            libc::close(write);
            relay(init, read)
        }
        set_signals(libc::SIG_DFL);
        let job = libc::fork();
        if job < 0 {
            libc::_exit(126);
        }
        if job > 0 {
            libc::close(read);
            reap(job, write)
        }
        libc::close(read);
        libc::close(write);
        libc::alarm(SETUP_DEADLINE_S);
        mount_all(setup)?;
        for cap in 0..64 {
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        // The deadline stays armed through the working directory; the caller ends it just
        // before exec (`ContainerSetup::set_up`).
    }
    Ok(())
}

/// The run process: waits for init, reads the job's status from it, and ends the same way.
fn relay(init: libc::pid_t, from: c_int) -> ! {
    close_all_but(from);
    let _ = drop_capabilities();
    // SAFETY: waitpid/read into a local, then this process's own end.
    unsafe {
        let mut init_status: c_int = 0;
        while libc::waitpid(init, &mut init_status, 0) < 0 && *libc::__errno_location() == libc::EINTR {}
        let mut job_status: c_int = 0;
        let n = libc::read(from, (&mut job_status as *mut c_int).cast(), std::mem::size_of::<c_int>());
        let status = if n == std::mem::size_of::<c_int>() as isize { job_status } else { init_status };
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(1)
    }
}

/// Init (PID 1 of the run's namespace): reaps whatever ends, hands the job's status to the run
/// process when the job ends, and exits (the kernel then kills what is left inside).
fn reap(job: libc::pid_t, to: c_int) -> ! {
    close_all_but(to);
    let _ = drop_capabilities();
    // SAFETY: prctl on a static name; waitpid into a local; write of a local.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"kairos-init".as_ptr(), 0, 0, 0);
        loop {
            let mut status: c_int = 0;
            let pid = libc::waitpid(-1, &mut status, 0);
            if pid == job {
                libc::write(to, (&status as *const c_int).cast(), std::mem::size_of::<c_int>());
                libc::_exit(0);
            }
            if pid < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(1);
            }
        }
    }
}

/// A detached mount of a new `fstype` file system with `options`, and `attrs`.
fn new_mount(fstype: &CStr, options: &[(&CStr, &CStr)], attrs: u64) -> Result<c_int> {
    // SAFETY: the new mount API on NUL-terminated strings; descriptors closed on exec.
    unsafe {
        let fs = fd_or(libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), libc::FSOPEN_CLOEXEC))?;
        for (key, value) in options {
            let set = libc::FSCONFIG_SET_STRING;
            fd_or(libc::syscall(libc::SYS_fsconfig, fs, set, key.as_ptr(), value.as_ptr(), 0))?;
        }
        let create = libc::FSCONFIG_CMD_CREATE;
        fd_or(libc::syscall(
            libc::SYS_fsconfig,
            fs,
            create,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0,
        ))?;
        let mnt = fd_or(libc::syscall(libc::SYS_fsmount, fs, libc::FSMOUNT_CLOEXEC, attrs));
        libc::close(fs);
        mnt
    }
}

/// A detached clone of the host's `m.src` (looked up as the run's user), with its attributes;
/// -1 for an optional one whose source is missing.
fn clone_source(m: &Mount) -> Result<c_int> {
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as u32;
    // SAFETY: open_tree on a NUL-terminated path; mount_setattr on a prepared struct.
    unsafe {
        let tree = libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, m.src.as_ptr(), flags);
        if tree < 0 {
            return if m.optional { Ok(-1) } else { Err(last()) };
        }
        let tree = tree as c_int;
        let mut set = libc::MOUNT_ATTR_NOSUID;
        if !m.device {
            set |= libc::MOUNT_ATTR_NODEV;
        }
        if m.read_only {
            set |= libc::MOUNT_ATTR_RDONLY;
        }
        let attr = libc::mount_attr { attr_set: set, attr_clr: 0, propagation: 0, userns_fd: 0 };
        let at = libc::AT_EMPTY_PATH | libc::AT_RECURSIVE;
        let size = std::mem::size_of::<libc::mount_attr>();
        fd_or(libc::syscall(libc::SYS_mount_setattr, tree, c"".as_ptr(), at, &attr, size))?;
        Ok(tree)
    }
}

/// Whether descriptor `fd` is a directory.
fn is_dir(fd: c_int) -> Result<bool> {
    // SAFETY: fstat into a zeroed local.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        check(libc::fstat(fd, &mut st))?;
        Ok(st.st_mode & libc::S_IFMT == libc::S_IFDIR)
    }
}

/// The directory `name` under `dir` (made when missing), never through a link: an `O_PATH`
/// descriptor of it.
fn subdir(dir: c_int, name: &CStr, create: bool) -> Result<c_int> {
    // SAFETY: *at calls relative to a directory descriptor on a NUL-terminated name.
    unsafe {
        if create
            && libc::mkdirat(dir, name.as_ptr(), 0o755) != 0
            && *libc::__errno_location() != libc::EEXIST
        {
            return Err(last());
        }
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        fd_or(libc::openat(dir, name.as_ptr(), flags).into())
    }
}

/// The mount point `at` under `root` for a directory (`dir`) or a file: every component opened
/// relative to its parent's descriptor, none through a link, a file made without blocking; an
/// `O_PATH` descriptor of it. None when `optional` and a parent is missing or not a directory.
fn mount_point(root: c_int, at: &[impl AsRef<CStr>], dir: bool, optional: bool) -> Result<Option<c_int>> {
    let Some((last_name, parents)) = at.split_last() else {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    };
    let last_name = last_name.as_ref();
    // SAFETY: dup/close of descriptors this process owns; *at calls on NUL-terminated names.
    unsafe {
        let mut cur = libc::fcntl(root, libc::F_DUPFD_CLOEXEC, 0);
        if cur < 0 {
            return Err(last());
        }
        for name in parents {
            let next = subdir(cur, name.as_ref(), !optional);
            libc::close(cur);
            match next {
                Ok(fd) => cur = fd,
                Err(_) if optional => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        let got = if dir {
            subdir(cur, last_name, true)
        } else {
            let make = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
            let made = libc::openat(cur, last_name.as_ptr(), make | libc::O_CLOEXEC, 0o644);
            if made >= 0 {
                libc::close(made);
            } else if *libc::__errno_location() != libc::EEXIST {
                libc::close(cur);
                return Err(last());
            }
            let fd = fd_or(
                libc::openat(cur, last_name.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .into(),
            );
            // An existing mount point must be a plain file (not a link, a FIFO, a device).
            let mut st: libc::stat = std::mem::zeroed();
            match fd {
                Ok(fd) if libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG => {
                    Ok(fd)
                }
                Ok(fd) => {
                    libc::close(fd);
                    Err(std::io::Error::from_raw_os_error(libc::ELOOP))
                }
                Err(e) => Err(e),
            }
        };
        libc::close(cur);
        match got {
            Ok(fd) => Ok(Some(fd)),
            Err(_) if optional => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Attaches the detached mount `tree` at `at` under `root`.
fn attach(tree: c_int, root: c_int, at: &[impl AsRef<CStr>], optional: bool) -> Result<()> {
    let Some(target) = mount_point(root, at, is_dir(tree)?, optional)? else { return Ok(()) };
    let flags = libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH;
    // SAFETY: move_mount between two descriptors this process owns.
    let r = unsafe { libc::syscall(libc::SYS_move_mount, tree, c"".as_ptr(), target, c"".as_ptr(), flags) };
    // SAFETY: closing an own descriptor.
    unsafe { libc::close(target) };
    fd_or(r).map(|_| ())
}

/// The container's file systems, as the user in its namespaces: the overlay, the detached
/// mounts made while the host is in view, the pivot, the host's root detached, then every mount
/// placed.
fn mount_all(setup: &ContainerSetup) -> Result<()> {
    let none = std::ptr::null::<libc::c_char>();
    let mut trees = [-1 as c_int; MOUNTS_MAX];
    // SAFETY: mount system calls on NUL-terminated strings prepared before the fork.
    unsafe {
        check(libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()))?;
        let tmpfs = c"tmpfs".as_ptr();
        // The writable layer: its pages are charged to the run's memory limit.
        let flags = libc::MS_NOSUID | libc::MS_NODEV;
        check(libc::mount(tmpfs, setup.scratch.as_ptr(), tmpfs, flags, setup.layer_options.as_ptr().cast()))?;
        for d in [&setup.upper, &setup.work, &setup.root] {
            check(libc::mkdir(d.as_ptr(), 0o755))?;
        }
        let overlay = c"overlay".as_ptr();
        check(libc::mount(overlay, setup.root.as_ptr(), overlay, flags, setup.overlay.as_ptr().cast()))?;
        let (nosuid, nodev, noexec) =
            (libc::MOUNT_ATTR_NOSUID, libc::MOUNT_ATTR_NODEV, libc::MOUNT_ATTR_NOEXEC);
        // /proc of the run's PID namespace: made while a full /proc is in view (the kernel's
        // condition for a proc mount in a user namespace).
        let proc_ = new_mount(c"proc", &[], nosuid | nodev | noexec)?;
        let dev = new_mount(c"tmpfs", &[(c"mode", c"0755"), (c"size", c"64k")], nosuid | noexec)?;
        let shm = new_mount(c"tmpfs", &[(c"mode", c"1777"), (c"size", &setup.shm_size)], nosuid | nodev)?;
        for (k, m) in setup.mounts.iter().enumerate() {
            trees[k] = clone_source(m)?;
        }
        // Into the overlay; the host's root leaves before anything is made inside.
        check(libc::chdir(setup.root.as_ptr()))?;
        if libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0 {
            return Err(last());
        }
        check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
        check(libc::chdir(c"/".as_ptr()))?;
        let root =
            fd_or(libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC).into())?;
        attach(dev, root, &[c"dev"], false)?;
        let devdir = subdir(root, c"dev", false)?;
        check(libc::mkdirat(devdir, c"shm".as_ptr(), 0o1777))?;
        attach(shm, devdir, &[c"shm"], false)?;
        for (target, at) in &setup.links {
            check(libc::symlinkat(target.as_ptr(), devdir, at.as_ptr()))?;
        }
        libc::close(devdir);
        for (k, m) in setup.mounts.iter().enumerate() {
            if trees[k] >= 0 {
                attach(trees[k], root, &m.at, m.optional)?;
            }
        }
        // Last: while mount points were made, no /proc link could lead anywhere.
        attach(proc_, root, &[c"proc"], false)?;
        libc::close(root);
    }
    Ok(())
}
