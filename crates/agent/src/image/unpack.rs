//! Applying an image's layers into a root file system, by whoever calls — the job's user's
//! file-system identity (`super::as_reader`), so every file made is the user's and nothing is
//! written where the user could not write.
//!
//! Ownerships are not kept, setuid and setgid bits are dropped, device nodes and FIFOs are
//! skipped; links land only inside the root (tar's `unpack_in` checks every path), and whiteouts
//! never remove anything outside it. What a layer expands to is counted as it streams: past the
//! bound (or the deadline) the pull stops, so a gzip bomb costs neither memory nor the disk.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::source::{hex, Store};
use super::{fail, PullError};

/// How much a pull may still expand to, and until when.
#[derive(Debug)]
pub(super) struct Budget {
    pub limit: u64,
    left: u64,
    deadline: Instant,
    over: bool,
    late: bool,
}

impl Budget {
    pub fn new(limit: u64, deadline: Instant) -> Budget {
        Budget { limit, left: limit, deadline, over: false, late: false }
    }

    fn late(&mut self) -> bool {
        self.late = self.late || Instant::now() > self.deadline;
        self.late
    }

    fn take(&mut self, n: u64) -> std::io::Result<()> {
        if self.late() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the pull's deadline passed"));
        }
        if n > self.left {
            self.over = true;
            return Err(std::io::Error::other("the image expands past its bound"));
        }
        self.left -= n;
        Ok(())
    }

    /// Why an unpacking error happened, when the budget was the cause.
    fn cause(&self) -> Option<String> {
        if self.over {
            Some(format!(
                "the image expands to more than {} MiB (the image cache's bound); refused",
                self.limit >> 20
            ))
        } else if self.late {
            Some("the pull took longer than its deadline".into())
        } else {
            None
        }
    }
}

/// Counts what is read through against a budget.
struct Bounded<'b, R> {
    inner: R,
    budget: &'b mut Budget,
}

impl<R: Read> Read for Bounded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.budget.take(n as u64)?;
        Ok(n)
    }
}

/// Reads through to a sha256 of what was read.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    deadline: Instant,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if Instant::now() > self.deadline {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the pull's deadline passed"));
        }
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Applies `layers` (digest, gzip'd) of `store` in order into `rootfs` (an empty directory the
/// caller can write); the bytes of file data written.
pub(super) fn layers(
    store: &Store,
    layers: &[(String, bool)],
    rootfs: &Path,
    budget: &mut Budget,
) -> Result<u64, PullError> {
    let root = rootfs.canonicalize().map_err(|e| PullError(format!("{}: {e}", rootfs.display())))?;
    let mut modes = BTreeMap::new();
    let mut size = 0;
    for (digest, gz) in layers {
        let blob = store.blob(digest)?;
        if blob.size > budget.limit {
            return fail(format!(
                "layer {digest} is larger than {} MiB (the image cache's bound); refused",
                budget.limit >> 20
            ));
        }
        let raw = std::io::BufReader::with_capacity(256 << 10, blob.reader.take(blob.size));
        let mut hashing = Hashing { inner: raw, hash: Sha256::new(), deadline: budget.deadline };
        let applied = if *gz {
            let mut stream =
                Bounded { inner: flate2::read::GzDecoder::new(&mut hashing), budget: &mut *budget };
            apply(&mut stream, &root, &mut modes)
        } else {
            let mut stream = Bounded { inner: &mut hashing, budget: &mut *budget };
            apply(&mut stream, &root, &mut modes)
        };
        let applied = match applied {
            Ok(n) => n,
            Err(e) => {
                if let Some(why) = budget.cause() {
                    return fail(format!("layer {digest}: {why}"));
                }
                // Bytes that are not the layer named are called so, whatever they unpacked to.
                let rest = std::io::copy(&mut hashing, &mut std::io::sink());
                if rest.is_ok() && format!("sha256:{}", hex(&hashing.hash.finalize())) != *digest {
                    return fail(format!("layer {digest} is corrupt (it does not match its digest)"));
                }
                return fail(format!("layer {digest}: {e}"));
            }
        };
        size += applied;
        if size > budget.limit {
            return fail(format!(
                "layer {digest}: the image's files are larger than {} MiB (the image cache's bound); refused",
                budget.limit >> 20
            ));
        }
        // The rest of the blob (tar padding) counts for the digest.
        std::io::copy(&mut hashing, &mut std::io::sink())
            .map_err(|e| PullError(format!("layer {digest}: {e}")))?;
        if format!("sha256:{}", hex(&hashing.hash.finalize())) != *digest {
            return fail(format!("layer {digest} is corrupt (it does not match its digest)"));
        }
    }
    // Directories get their own modes last (kept writable while layers land in them), the
    // owner always able to read and enter them.
    for (rel, mode) in modes {
        let path = root.join(&rel);
        let still = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            && path.canonicalize().is_ok_and(|real| real == path);
        if still {
            // Only the image's own modes are lost (the directory stays owner-writable): logged.
            if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)) {
                tracing::warn!(path = %path.display(), error = %e, "image: cannot restore a directory's mode");
            }
        }
    }
    Ok(size)
}

/// An entry's path as a relative path of normal components; None when it has `..`.
fn relative(path: &Path) -> Option<PathBuf> {
    let mut rel = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::Normal(p) => rel.push(p),
            std::path::Component::ParentDir => return None,
            _ => {}
        }
    }
    Some(rel)
}

/// One layer's tar stream into `root` (canonical): whiteouts (`.wh.NAME`, `.wh..wh..opq`)
/// remove what lower layers put there; nothing lands outside `root`. Directory modes wanted
/// go to `modes` (applied once every layer is in); the bytes of file data written.
fn apply(stream: &mut dyn Read, root: &Path, modes: &mut BTreeMap<PathBuf, u32>) -> std::io::Result<u64> {
    let mut archive = tar::Archive::new(super::guard::TarGuard::new(stream));
    archive.set_preserve_permissions(true);
    // No setuid, no setgid: the sticky bit (/tmp) stays.
    archive.set_mask(0o6000);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let mut size = 0;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let kind = entry.header().entry_type();
        if matches!(kind, tar::EntryType::Block | tar::EntryType::Char | tar::EntryType::Fifo) {
            continue;
        }
        let Some(rel) = relative(&entry.path()?) else { continue };
        let name = rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if let Some(hidden) = name.strip_prefix(".wh.") {
            // The directory as it really is (links followed): a link of a lower layer may lead
            // out of the image, and nothing outside it is ever removed.
            let parent = root.join(rel.parent().unwrap_or(Path::new("")));
            let parent = match parent.canonicalize() {
                Ok(real) if real.starts_with(root) => real,
                _ => continue,
            };
            if hidden.contains('/') || hidden == ".." || hidden == "." {
                continue;
            }
            // A whiteout that cannot be applied fails the pull: the file it hides would show.
            let whiteout = |path: &Path| {
                remove(path)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("whiteout {}: {e}", path.display())))
            };
            if hidden == ".wh..opq" {
                for child in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
                    whiteout(&child.path())?;
                }
            } else {
                whiteout(&parent.join(hidden))?;
            }
            continue;
        }
        let mode = entry.header().mode().unwrap_or(0o644);
        size += entry.size();
        let unpacked = entry.unpack_in(root).map_err(|e| {
            // tar names the file but keeps the cause in the source.
            let cause = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
            std::io::Error::new(e.kind(), format!("{e}{cause}"))
        })?;
        if !unpacked || rel.as_os_str().is_empty() {
            continue;
        }
        let path = root.join(&rel);
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() {
            // Writable by its owner until the last layer is in.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode((mode & 0o1777) | 0o700))?;
            modes.insert(rel, (mode & 0o1777) | 0o500);
        } else if meta.is_file() && mode & 0o400 == 0 {
            // The owner can read every file (a job's user reads its image).
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode((mode & 0o777) | 0o400))?;
        }
    }
    Ok(size)
}

/// Removes what a whiteout hides (a directory with its tree); what is not there is no error.
fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
