//! Reading a job's image: an OCI image layout (a directory) or an archive of one (a tar file),
//! always by whoever calls — the job's user's file-system identity (`super::as_reader`).
//!
//! Inside a layout every name is opened relative to the layout's directory descriptor,
//! component by component, never through a symbolic link (`O_NOFOLLOW`), never blocking
//! (`O_NONBLOCK`: a FIFO opens at once and is refused by its type); only a regular file is read.
//! An archive is never unpacked: its entries are indexed (regular files named `index.json` and
//! `blobs/sha256/HEX` only; links count as missing) and read from the archive's own bytes.
//! Metadata (index, manifests, configs) is refused above `METADATA_MAX` before it is read.
//! No message carries the hash of content: a blob that does not match its digest "is corrupt".

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};
use oci_spec::image::{
    Descriptor, ImageConfiguration, ImageIndex, ImageManifest, Platform, ANNOTATION_REF_NAME,
};
use sha2::{Digest, Sha256};

use super::{fail, platform, PullError};

/// The most an index, manifest or config may weigh.
pub(super) const METADATA_MAX: u64 = 4 << 20;
/// The most entries an archive may list.
const ARCHIVE_ENTRIES_MAX: usize = 100_000;

/// Where an image's files come from.
#[derive(Debug)]
pub(super) enum Store {
    /// A layout directory, held open.
    Layout { dir: OwnedFd, name: String },
    /// A tar of a layout: its regular entries by name, (data offset, size).
    Archive { file: Arc<File>, entries: HashMap<String, (u64, u64)>, name: String },
}

/// A blob opened for reading, and its size.
pub(super) struct Blob {
    pub reader: Box<dyn Read + Send>,
    pub size: u64,
}

/// What an image is, read from its store: the manifest's digest, the config's environment, and
/// its layers (digest, gzip'd).
#[derive(Debug)]
pub(super) struct Manifest {
    pub digest: String,
    pub env: Vec<(String, String)>,
    pub layers: Vec<(String, bool)>,
}

fn kind_name(mode: u32) -> &'static str {
    match SFlag::from_bits_truncate(mode) & SFlag::S_IFMT {
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR | SFlag::S_IFBLK => "a device",
        _ => "not a file",
    }
}

/// `name` opened below `dir` without following a link or blocking.
fn open_in(dir: RawFd, name: &str, directory: bool) -> std::io::Result<OwnedFd> {
    let mut flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    if directory {
        flags |= OFlag::O_DIRECTORY;
    }
    let fd = nix::fcntl::openat(Some(dir), name, flags, Mode::empty())
        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
    // SAFETY: `openat` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fd` as a file, if it is a regular one; its size.
fn regular(fd: OwnedFd, what: &str) -> Result<(File, u64), PullError> {
    let stat = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| PullError(format!("{what}: {e}")))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return fail(format!("{what} is {}, not a regular file", kind_name(stat.st_mode)));
    }
    Ok((File::from(fd), u64::try_from(stat.st_size).unwrap_or(0)))
}

/// Why `what` could not be opened in a layout, in words.
fn open_error(what: &str, e: std::io::Error) -> PullError {
    match e.raw_os_error() {
        Some(nix::libc::ELOOP) => {
            PullError(format!("{what} is a symbolic link (links are not followed inside an image)"))
        }
        _ => PullError(format!("{what}: {e}")),
    }
}

/// Why the directory `name` on the way to `what` could not be opened, in words.
fn dir_error(what: &str, name: &str, e: std::io::Error) -> PullError {
    match e.raw_os_error() {
        // O_DIRECTORY|O_NOFOLLOW on a link says ENOTDIR.
        Some(nix::libc::ENOTDIR | nix::libc::ELOOP) => PullError(format!(
            "{what}: {name}/ is not a directory (it may be a symbolic link: links are not followed inside an image)"
        )),
        _ => PullError(format!("{what}: {e}")),
    }
}

/// The hex of a sha256 `digest`, checked.
fn hex_of(digest: &str) -> Result<&str, PullError> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| {
            PullError(format!(
                "unsupported digest \"{}\" (sha256 only)",
                digest.chars().take(80).collect::<String>()
            ))
        })
}

/// Reads a part of an archive (at an offset, independent of the file's position).
struct Slice {
    file: Arc<File>,
    pos: u64,
    end: u64,
}

impl Read for Slice {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = usize::try_from(self.end.saturating_sub(self.pos)).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// An archive entry's path as `a/b/c` (`./` dropped); None when it has any other component.
fn entry_name(path: &Path) -> Option<String> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::Normal(p) => parts.push(p.to_str()?),
            _ => return None,
        }
    }
    Some(parts.join("/"))
}

fn wanted(name: &str) -> bool {
    name == "index.json"
        || name
            .strip_prefix("blobs/sha256/")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl Store {
    /// Opens the layout directory `path` (`reference` names it in messages).
    pub fn layout(path: &Path, reference: &str) -> Result<Store, PullError> {
        let opened = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        );
        match opened {
            // SAFETY: `open` returned a new descriptor that nothing else owns.
            Ok(fd) => Ok(Store::Layout { dir: unsafe { OwnedFd::from_raw_fd(fd) }, name: reference.into() }),
            Err(nix::Error::ENOENT | nix::Error::EACCES | nix::Error::ENOTDIR | nix::Error::EPERM) => {
                fail(format!(
                    "{reference}: no OCI image layout at {} (no index.json the job's user can read)",
                    path.display()
                ))
            }
            Err(e) => fail(format!("{reference}: {e}")),
        }
    }

    /// Opens the archive `path` and indexes its entries.
    pub fn archive(path: &Path, reference: &str) -> Result<Store, PullError> {
        let file = std::fs::File::options()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
            .open(path)
            .map_err(|e| PullError(format!("{reference}: {e}")))?;
        let (file, _) = regular(OwnedFd::from(file), reference)?;
        let mut entries = HashMap::new();
        let mut archive = tar::Archive::new(super::guard::TarGuard::new(&file));
        let listed = archive.entries_with_seek().map_err(|e| PullError(format!("{reference}: {e}")))?;
        for (n, entry) in listed.enumerate() {
            if n >= ARCHIVE_ENTRIES_MAX {
                return fail(format!("{reference}: more than {ARCHIVE_ENTRIES_MAX} entries in the archive"));
            }
            let entry = entry.map_err(|e| PullError(format!("{reference}: reading the archive: {e}")))?;
            let Some(name) = entry.path().ok().and_then(|p| entry_name(&p)) else { continue };
            if !wanted(&name) {
                continue;
            }
            let kind = entry.header().entry_type();
            if kind == tar::EntryType::Regular || kind == tar::EntryType::Continuous {
                entries.insert(name, (entry.raw_file_position(), entry.size()));
            } else {
                // A link (or anything else) is not followed: the name counts as missing.
                entries.remove(&name);
            }
        }
        Ok(Store::Archive { file: Arc::new(file), entries, name: reference.into() })
    }

    /// The file `name` of the store (`blobs/sha256/HEX` or `index.json`), opened.
    fn open(&self, name: &str, what: &str) -> Result<Blob, PullError> {
        match self {
            Store::Layout { dir, .. } => {
                let mut parts: Vec<&str> = name.split('/').collect();
                let last = parts.pop().unwrap_or_default();
                let mut at: Option<OwnedFd> = None;
                for p in parts {
                    let base = at.as_ref().map_or(dir.as_raw_fd(), |f| f.as_raw_fd());
                    at = Some(open_in(base, p, true).map_err(|e| dir_error(what, p, e))?);
                }
                let base = at.as_ref().map_or(dir.as_raw_fd(), |f| f.as_raw_fd());
                let fd = open_in(base, last, false).map_err(|e| open_error(what, e))?;
                let (file, size) = regular(fd, what)?;
                Ok(Blob { reader: Box::new(file), size })
            }
            Store::Archive { file, entries, name: archive } => match entries.get(name) {
                Some(&(pos, size)) => Ok(Blob {
                    reader: Box::new(Slice { file: file.clone(), pos, end: pos.saturating_add(size) }),
                    size,
                }),
                None => fail(format!("{what}: no such regular file in {archive} (links are not followed)")),
            },
        }
    }

    /// Blob `digest`, opened.
    pub fn blob(&self, digest: &str) -> Result<Blob, PullError> {
        let hex = hex_of(digest)?;
        self.open(&format!("blobs/sha256/{hex}"), &format!("blob {digest}"))
    }

    /// The layout's index.json, read (bounded).
    fn index(&self) -> Result<Vec<u8>, PullError> {
        let blob = match self {
            Store::Layout { dir, name } => match open_in(dir.as_raw_fd(), "index.json", false) {
                Ok(fd) => {
                    let (file, size) = regular(fd, "index.json")?;
                    Blob { reader: Box::new(file), size }
                }
                Err(e) if matches!(e.raw_os_error(), Some(nix::libc::ENOENT | nix::libc::EACCES)) => {
                    return fail(format!(
                        "{name}: no OCI image layout there (no index.json the job's user can read)"
                    ))
                }
                Err(e) => return Err(open_error("index.json", e)),
            },
            Store::Archive { .. } => self.open("index.json", "index.json")?,
        };
        read_bounded(blob, "index.json")
    }

    /// Blob `digest` (a manifest or config), read (bounded) and checked against its digest.
    fn metadata(&self, digest: &str, what: &str) -> Result<Vec<u8>, PullError> {
        let bytes = read_bounded(self.blob(digest)?, &format!("{what} {digest}"))?;
        if hex_of(digest)? != hex(&Sha256::digest(&bytes)) {
            return fail(format!("blob {digest} is corrupt (it does not match its digest)"));
        }
        Ok(bytes)
    }

    /// The image `tag` names (the only one, or the one tagged "latest", when no tag is given; of
    /// several so tagged, the one for `node`): an image index is followed to `node`'s manifest.
    pub fn manifest(&self, tag: Option<&str>, node: &Platform) -> Result<Manifest, PullError> {
        let index: ImageIndex = parse(&self.index()?, "index.json")?;
        let tag_of = |d: &Descriptor| d.annotations().as_ref()?.get(ANNOTATION_REF_NAME).cloned();
        let want = tag.or((index.manifests().len() != 1).then_some("latest"));
        let tagged: Vec<&Descriptor> =
            index.manifests().iter().filter(|d| want.is_none() || tag_of(d).as_deref() == want).collect();
        let mut desc = match tagged.as_slice() {
            [] => {
                let tags: Vec<String> = index.manifests().iter().filter_map(tag_of).take(20).collect();
                let tag = tag.unwrap_or("latest");
                return fail(format!("no image tagged {tag:?} in the layout (tags: {})", tags.join(", ")));
            }
            [one] => (*one).clone(),
            several => platform::choose(several, node)?.clone(),
        };
        if platform::is_index(desc.media_type()) {
            let digest = desc.digest().to_string();
            let nested: ImageIndex = parse(&self.metadata(&digest, "image index")?, "image index")?;
            desc = platform::choose(&nested.manifests().iter().collect::<Vec<_>>(), node)?.clone();
            if platform::is_index(desc.media_type()) {
                return fail("image indexes nested too deep");
            }
        }
        self.image(desc.digest().as_ref())
    }

    /// The image manifest `digest`: its layers and its config's environment.
    fn image(&self, digest: &str) -> Result<Manifest, PullError> {
        let manifest: ImageManifest = parse(&self.metadata(digest, "manifest")?, "manifest")?;
        let mut layers = Vec::new();
        for layer in manifest.layers() {
            let kind = layer.media_type().as_ref();
            let gz = kind.ends_with("gzip");
            if !gz && !kind.ends_with("tar") {
                return fail(format!("layer type {kind} is not supported (tar and tar+gzip are)"));
            }
            layers.push((layer.digest().to_string(), gz));
        }
        let config = manifest.config().digest().as_ref();
        let config: ImageConfiguration = parse(&self.metadata(config, "image config")?, "image config")?;
        let env = config.config().as_ref().and_then(|c| c.env().as_ref());
        let env = env.into_iter().flatten();
        let env =
            env.filter_map(|e| e.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect();
        Ok(Manifest { digest: digest.to_string(), env, layers })
    }
}

/// All of `blob`, refused above `METADATA_MAX` before it is read, and read no further.
fn read_bounded(blob: Blob, what: &str) -> Result<Vec<u8>, PullError> {
    let too_big = || PullError(format!("{what} is larger than {} MiB (refused)", METADATA_MAX >> 20));
    if blob.size > METADATA_MAX {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(blob.size).unwrap_or(0));
    blob.reader
        .take(METADATA_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| PullError(format!("{what}: {e}")))?;
    if bytes.len() as u64 > METADATA_MAX {
        return Err(too_big());
    }
    Ok(bytes)
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `bytes` as an OCI document of type `T`.
fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, PullError> {
    serde_json::from_slice(bytes).map_err(|e| PullError(format!("{what}: {e}")))
}
