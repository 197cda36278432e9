//! The filesystem: a passthrough onto a backing directory whose file data goes through the
//! `overlay` page cache. Names (create, mkdir, unlink, rename) reach the backing directory at
//! once, as in LazyFS; file contents reach it only at `fsync`/`fdatasync` of the file — never at
//! `close`, `sync_file_range` or any time-based write-back.
//!
//! Inode numbers are the backing files' own, so a file renamed or unlinked while open keeps its
//! unsynced changes.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, DirEntryExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::overlay::{Change, Pending};

/// Attributes and names are never cached by the kernel: every call sees the overlay.
const TTL: Duration = Duration::ZERO;

#[derive(Default)]
struct Inode {
    /// Where it is under the backing directory; None once unlinked.
    path: Option<PathBuf>,
    /// Open while the kernel holds it open or while it has unsynced changes.
    file: Option<File>,
    opens: u32,
    pending: Pending,
}

#[derive(Default)]
struct Inner {
    inodes: HashMap<u64, Inode>,
    /// Order number of the next change (a torn write-back keeps the order of writes).
    seq: u64,
}

/// Cheap to clone: the FUSE session holds one, the signal handling another.
#[derive(Clone)]
pub struct LazyFs {
    backing: PathBuf,
    /// The backing directory's own inode number (shown as FUSE's root, 1).
    root_ino: u64,
    inner: Arc<Mutex<Inner>>,
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from(e)
}

impl LazyFs {
    pub fn new(backing: &Path) -> std::io::Result<LazyFs> {
        let root_ino = std::fs::metadata(backing)?.ino();
        let mut inner = Inner::default();
        inner.inodes.insert(1, Inode { path: Some(PathBuf::new()), ..Inode::default() });
        Ok(LazyFs { backing: backing.to_path_buf(), root_ino, inner: Arc::new(Mutex::new(inner)) })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fuse_ino(&self, ino: u64) -> u64 {
        if ino == self.root_ino {
            1
        } else {
            ino
        }
    }

    fn full(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    fn path_of(inner: &Inner, ino: INodeNo) -> Result<PathBuf, Errno> {
        inner.inodes.get(&ino.0).and_then(|i| i.path.clone()).ok_or(Errno::ENOENT)
    }

    fn attr(&self, inner: &Inner, ino: u64, md: &std::fs::Metadata) -> FileAttr {
        let ft = md.file_type();
        let kind = FileType::from_std(ft).unwrap_or(FileType::RegularFile);
        let size = match inner.inodes.get(&ino) {
            Some(i) if ft.is_file() => i.pending.len(md.len()),
            _ => md.len(),
        };
        let time = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(md.atime(), md.atime_nsec()),
            mtime: time(md.mtime(), md.mtime_nsec()),
            ctime: time(md.ctime(), md.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (md.mode() & 0o7777) as u16,
            nlink: md.nlink() as u32,
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Metadata of an inode: from its open file if it has one (it may be unlinked), else its path.
    fn metadata(&self, inner: &Inner, ino: INodeNo) -> Result<std::fs::Metadata, Errno> {
        let node = inner.inodes.get(&ino.0).ok_or(Errno::ENOENT)?;
        match (&node.file, &node.path) {
            (Some(f), _) => f.metadata().map_err(errno),
            (None, Some(p)) => std::fs::symlink_metadata(self.full(p)).map_err(errno),
            (None, None) => Err(Errno::ENOENT),
        }
    }

    /// Registers `rel` (just looked up or created) and returns its attributes.
    fn enter(&self, inner: &mut Inner, rel: PathBuf) -> Result<FileAttr, Errno> {
        let md = std::fs::symlink_metadata(self.full(&rel)).map_err(errno)?;
        let ino = self.fuse_ino(md.ino());
        inner.inodes.entry(ino).or_default().path = Some(rel);
        Ok(self.attr(inner, ino, &md))
    }

    fn open_file(&self, inner: &mut Inner, ino: INodeNo) -> Result<(), Errno> {
        let path = Self::path_of(inner, ino)?;
        let node = inner.inodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
        if node.file.is_none() {
            let f =
                std::fs::OpenOptions::new().read(true).write(true).open(self.full(&path)).map_err(errno)?;
            node.file = Some(f);
        }
        node.opens += 1;
        Ok(())
    }

    fn with_file<T>(
        inner: &mut Inner,
        ino: INodeNo,
        f: impl FnOnce(&File, &mut Pending) -> std::io::Result<T>,
    ) -> Result<T, Errno> {
        let node = inner.inodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
        let file = node.file.as_ref().ok_or(Errno::EBADF)?;
        f(file, &mut node.pending).map_err(errno)
    }

    /// Forgets renamed or removed names under `from` (a directory's children move with it).
    fn rename_paths(inner: &mut Inner, from: &Path, to: Option<&Path>) {
        for node in inner.inodes.values_mut() {
            let Some(p) = &node.path else { continue };
            if let Ok(rest) = p.strip_prefix(from) {
                node.path =
                    to.map(|t| if rest.as_os_str().is_empty() { t.to_path_buf() } else { t.join(rest) });
            }
        }
    }

    /// Removes `name` under `parent` from the backing directory (`how`: a file or a directory)
    /// and forgets it; a file still open keeps its inode until released.
    fn remove(
        &self,
        parent: INodeNo,
        name: &OsStr,
        how: fn(PathBuf) -> std::io::Result<()>,
        reply: ReplyEmpty,
    ) {
        let mut inner = self.lock();
        let res = Self::path_of(&inner, parent).and_then(|p| {
            let rel = p.join(name);
            how(self.full(&rel)).map_err(errno)?;
            Self::rename_paths(&mut inner, &rel, None);
            inner.inodes.retain(|_, n| n.path.is_some() || n.opens > 0);
            Ok(())
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Power cut with a torn write-back: every unsynced change reaches the disk in the order it
    /// was made, except the last write, of which only the first half does; then the files are
    /// synced. (The caller exits right after, holding the lock so nothing else lands.)
    pub fn torn_write_back(&self) -> std::io::Result<usize> {
        let mut inner = self.lock();
        let mut all = Vec::new();
        for (ino, node) in inner.inodes.iter_mut() {
            for (seq, change) in node.pending.take() {
                all.push((seq, *ino, change));
            }
        }
        all.sort_by_key(|(seq, _, _)| *seq);
        if let Some(last) = all.iter().rposition(|(_, _, c)| matches!(c, Change::Write { .. })) {
            let (seq, ino, change) = all.remove(last);
            all.truncate(last);
            if let Some(t) = change.torn() {
                all.push((seq, ino, t));
            }
        }
        let n = all.len();
        for (_, ino, change) in &all {
            if let Some(f) = inner.inodes.get(ino).and_then(|n| n.file.as_ref()) {
                change.apply(f)?;
            }
        }
        for node in inner.inodes.values() {
            if let Some(f) = &node.file {
                f.sync_all()?;
            }
        }
        std::mem::forget(inner);
        Ok(n)
    }

    /// Clean shutdown: every unsynced change is written through.
    pub fn write_back_all(&self) -> std::io::Result<()> {
        let mut inner = self.lock();
        for node in inner.inodes.values_mut() {
            if let Some(f) = &node.file {
                node.pending.sync(f)?;
            }
        }
        Ok(())
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut inner = self.lock();
        let res = Self::path_of(&inner, parent).and_then(|p| self.enter(&mut inner, p.join(name)));
        match res {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let inner = self.lock();
        match self.metadata(&inner, ino) {
            Ok(md) => reply.attr(&TTL, &self.attr(&inner, ino.0, &md)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut inner = self.lock();
        let res = (|| {
            let path = Self::path_of(&inner, ino).ok();
            if let (Some(mode), Some(p)) = (mode, &path) {
                std::fs::set_permissions(self.full(p), std::fs::Permissions::from_mode(mode))
                    .map_err(errno)?;
            }
            if let (true, Some(p)) = (uid.is_some() || gid.is_some(), &path) {
                std::os::unix::fs::chown(self.full(p), uid, gid).map_err(errno)?;
            }
            if let Some(len) = size {
                let opened = inner.inodes.get(&ino.0).is_some_and(|n| n.file.is_some());
                if !opened {
                    self.open_file(&mut inner, ino)?;
                    if let Some(n) = inner.inodes.get_mut(&ino.0) {
                        n.opens -= 1;
                    }
                }
                inner.seq += 1;
                let seq = inner.seq;
                Self::with_file(&mut inner, ino, |f, p| {
                    p.push(seq, Change::Truncate { len }, f.metadata()?.len());
                    Ok(())
                })?;
            }
            let md = self.metadata(&inner, ino)?;
            Ok(self.attr(&inner, ino.0, &md))
        })();
        match res {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let mut inner = self.lock();
        let res = Self::path_of(&inner, parent).and_then(|p| {
            let rel = p.join(name);
            std::fs::DirBuilder::new().mode(mode & !umask).create(self.full(&rel)).map_err(errno)?;
            self.enter(&mut inner, rel)
        });
        match res {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, std::fs::remove_file, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, std::fs::remove_dir, reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut inner = self.lock();
        let res = (|| {
            if flags.bits() != 0 {
                return Err(Errno::EINVAL);
            }
            let from = Self::path_of(&inner, parent)?.join(name);
            let to = Self::path_of(&inner, newparent)?.join(newname);
            std::fs::rename(self.full(&from), self.full(&to)).map_err(errno)?;
            // Whatever was at `to` is gone (its unsynced changes with it unless still open).
            Self::rename_paths(&mut inner, &to, None);
            Self::rename_paths(&mut inner, &from, Some(&to));
            inner.inodes.retain(|_, n| n.path.is_some() || n.opens > 0);
            Ok(())
        })();
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut inner = self.lock();
        match self.open_file(&mut inner, ino) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut inner = self.lock();
        let res = Self::path_of(&inner, parent).and_then(|p| {
            let rel = p.join(name);
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .create_new(flags & libc::O_EXCL != 0)
                .mode(mode & !umask)
                .open(self.full(&rel))
                .map_err(errno)?;
            let attr = self.enter(&mut inner, rel)?;
            self.open_file(&mut inner, attr.ino)?;
            Ok(attr)
        });
        match res {
            Ok(attr) => reply.created(&TTL, &attr, Generation(0), FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut inner = self.lock();
        match Self::with_file(&mut inner, ino, |f, p| p.read(f, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut inner = self.lock();
        inner.seq += 1;
        let seq = inner.seq;
        let res = Self::with_file(&mut inner, ino, |f, p| {
            p.push(seq, Change::Write { offset, data: data.to_vec() }, f.metadata()?.len());
            Ok(())
        });
        match res {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _owner: LockOwner, reply: ReplyEmpty) {
        // close() is not a sync.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut inner = self.lock();
        if let Some(node) = inner.inodes.get_mut(&ino.0) {
            node.opens = node.opens.saturating_sub(1);
            // Unsynced changes keep the file open: a later open and fsync must find them.
            if node.opens == 0 && node.pending.is_empty() {
                node.file = None;
            }
        }
        inner.inodes.retain(|_, n| n.path.is_some() || n.opens > 0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let mut inner = self.lock();
        match Self::with_file(&mut inner, ino, |f, p| p.sync(f)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let inner = self.lock();
        let res = Self::path_of(&inner, ino).and_then(|p| {
            let mut entries =
                vec![(ino.0, FileType::Directory, ".".into()), (1, FileType::Directory, "..".into())];
            for e in std::fs::read_dir(self.full(&p)).map_err(errno)? {
                let e = e.map_err(errno)?;
                let kind = e.file_type().ok().and_then(FileType::from_std).unwrap_or(FileType::RegularFile);
                entries.push((self.fuse_ino(e.ino()), kind, e.file_name()));
            }
            Ok(entries)
        });
        match res {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(ino), (i + 1) as u64, kind, &name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let inner = self.lock();
        let res = Self::path_of(&inner, ino)
            .and_then(|p| File::open(self.full(&p)).and_then(|d| d.sync_all()).map_err(errno));
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match nix::sys::statvfs::statvfs(&self.backing) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                s.name_max() as u32,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}
