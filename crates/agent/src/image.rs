//! Container images on a node: pulled once per user into a cache, unpacked, and kept while the
//! cache stays under its size bound (the least recently used go first, never one a run uses).
//!
//! An image is an OCI image layout (`oci:/path[:tag]`), an archive of one
//! (`oci-archive:/path.tar[:tag]`), or a registry reference, copied into a layout by `skopeo`
//! where the node has it. Everything about a job's image is done with its user's identity
//! (`Reader`; the agent's own when it runs jobs as itself): the layout or archive is read, and
//! skopeo run, as that user (`source`, `skopeo`), and the layers are unpacked as that user
//! (`unpack`) — the root agent never opens, parses or unpacks what a job supplies with root's
//! powers. Index, manifest and config are `oci-spec`'s types; an image index gives the manifest
//! for the node's own platform (`platform`). A run holds its image by a `Pin`.
//!
//! The cache, `DIR/images/<uid>/<digest>/`: `DIR`, `images/`, `<uid>/` and `<digest>/` are the
//! agent's (mode 0711: the user can pass, not list or write) and hold the agent's own files
//! (`ready`, `size`, `env.json`); `rootfs/` is the user's, unpacked into a temporary sibling
//! and renamed into place. A user's cache hit is only ever that user's own unpacked image.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod guard;
mod platform;
mod skopeo;
mod source;
mod unpack;

/// Why an image cannot be had: the run fails with `image pull failed: …`.
#[derive(Debug, thiserror::Error)]
#[error("image pull failed: {0}")]
pub struct PullError(pub String);

fn fail<T>(what: impl Into<String>) -> Result<T, PullError> {
    Err(PullError(what.into()))
}

/// A prepared image, held by a run: the cache never evicts it while this lives.
#[derive(Debug)]
pub struct Image {
    /// The unpacked root: owned by the job's user, every file readable by it, no setuid bits.
    pub rootfs: PathBuf,
    /// The manifest's digest (`sha256:…`).
    pub digest: String,
    /// The image's environment (its config's `Env`): under the job's own.
    pub env: Vec<(String, String)>,
    _pin: Pin,
}

/// Runs using each cached image, by `<uid>/<hex>`.
type Users = Arc<Mutex<BTreeMap<String, usize>>>;

/// A run's hold on a cached image: counted in `Users` while it lives.
#[derive(Debug)]
struct Pin {
    key: String,
    users: Users,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = users.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                users.remove(&self.key);
            }
        }
    }
}

/// The node's image cache.
#[derive(Debug)]
pub struct ImageCache {
    dir: PathBuf,
    max_bytes: u64,
    /// How long one pull may take (skopeo, reading, unpacking).
    timeout: Duration,
    /// The registry client.
    skopeo: PathBuf,
    /// The platform whose image an index gives (this node's own).
    platform: oci_spec::image::Platform,
    /// Runs using each image; held while an image is taken, installed or evicted.
    users: Users,
    /// One pull at a time per user (others' pulls go on).
    pulls: Mutex<BTreeMap<u32, Arc<Mutex<()>>>>,
}

const READY: &str = "ready";
const SIZE: &str = "size";
const ENV: &str = "env.json";
/// How long a pull may take unless told.
const PULL_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// A new directory `path` with `mode`, the agent's.
fn make_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        other => other?,
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// A name no other temporary directory of this process has.
fn temp_name() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("tmp-{}-{n}", std::process::id())
}

/// A temporary directory of the agent's (mode 0711), removed when dropped (a renamed one is
/// gone already).
struct Work(PathBuf);

impl Work {
    fn new(parent: &Path) -> Result<Work, PullError> {
        let path = parent.join(temp_name());
        discard(&path); // a leftover of a crashed agent under the same name
        std::fs::DirBuilder::new()
            .mode(0o711)
            .create(&path)
            .map_err(|e| PullError(format!("{}: {e}", path.display())))?;
        Ok(Work(path))
    }

    /// A new, empty directory `name` in it owned by `owner` (mode 0755).
    fn owned_dir(&self, name: &str, owner: (u32, u32)) -> Result<PathBuf, PullError> {
        let path = self.0.join(name);
        let made = || -> std::io::Result<()> {
            std::fs::DirBuilder::new().mode(0o700).create(&path)?;
            let dir = std::fs::File::open(&path)?;
            std::os::unix::fs::fchown(&dir, Some(owner.0), Some(owner.1))?;
            dir.set_permissions(std::fs::Permissions::from_mode(0o755))
        };
        made().map_err(|e| PullError(format!("{}: {e}", path.display())))?;
        Ok(path)
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        discard(&self.0);
    }
}

/// What a reference names.
enum Reference {
    Layout(PathBuf, Option<String>),
    Archive(PathBuf, Option<String>),
    Registry(String),
}

impl Reference {
    fn parse(reference: &str) -> Reference {
        let split = |rest: &str| match rest.split_once(':') {
            Some((p, t)) => (PathBuf::from(p), Some(t.to_string())),
            None => (PathBuf::from(rest), None),
        };
        if let Some(rest) = reference.strip_prefix("oci:") {
            let (path, tag) = split(rest);
            return Reference::Layout(path, tag);
        }
        if let Some(rest) = reference.strip_prefix("oci-archive:") {
            let (path, tag) = split(rest);
            return Reference::Archive(path, tag);
        }
        Reference::Registry(reference.strip_prefix("docker://").unwrap_or(reference).to_string())
    }
}

impl ImageCache {
    /// The cache in `dir`, at most `max_bytes` unpacked (and no image bigger). What an earlier
    /// agent left half made (or in an older form) is removed.
    pub fn new(dir: &Path, max_bytes: u64) -> std::io::Result<ImageCache> {
        std::fs::create_dir_all(dir)?;
        make_dir(dir, 0o711)?;
        let images = dir.join("images");
        make_dir(&images, 0o711)?;
        for entry in std::fs::read_dir(&images)?.flatten() {
            let path = entry.path();
            let per_user = entry.file_name().to_str().is_some_and(|n| n.parse::<u32>().is_ok())
                && entry.file_type().is_ok_and(|t| t.is_dir());
            if !per_user {
                // Not a user's directory (an image of the shared cache this one replaces).
                tracing::info!(path = %path.display(), "image cache: removing what is not a user's images");
                discard(&path);
                continue;
            }
            for image in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                let name = image.file_name();
                if name.to_string_lossy().starts_with("tmp-") || !image.path().join(READY).exists() {
                    discard(&image.path());
                }
            }
        }
        Ok(ImageCache {
            dir: dir.to_path_buf(),
            max_bytes,
            timeout: PULL_TIMEOUT,
            skopeo: "skopeo".into(),
            platform: platform::node(),
            users: Arc::default(),
            pulls: Mutex::default(),
        })
    }

    /// How long one pull may take (default 15 minutes).
    pub fn with_pull_timeout(mut self, timeout: Duration) -> ImageCache {
        self.timeout = timeout;
        self
    }

    /// The registry client to run (default `skopeo` on the system's search path).
    pub fn with_skopeo(mut self, program: &Path) -> ImageCache {
        self.skopeo = program.to_path_buf();
        self
    }

    /// The image `reference`, unpacked (pulled first if the cache lacks it). Blocking, bounded
    /// by the pull timeout. Everything is done as `reader` (the job's user; None: the agent's
    /// own), so a job can name only an image its user could read, and gets its user's own
    /// copy.
    pub fn prepare(&self, reference: &str, reader: Option<&Reader>) -> Result<Image, PullError> {
        let deadline = Instant::now() + self.timeout;
        let owner = match reader {
            Some(r) => (r.uid, r.gid),
            None => (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw()),
        };
        let lock = self.pulls.lock().unwrap_or_else(|p| p.into_inner()).entry(owner.0).or_default().clone();
        let _pulling = lock.lock().unwrap_or_else(|p| p.into_inner());
        let home_of_user = self.dir.join("images").join(owner.0.to_string());
        make_dir(&home_of_user, 0o711).map_err(|e| PullError(format!("{}: {e}", home_of_user.display())))?;

        let mut work = None;
        let (store, tag) = match Reference::parse(reference) {
            Reference::Layout(path, tag) => {
                (as_reader(reader, || source::Store::layout(&path, reference))?, tag)
            }
            Reference::Archive(path, tag) => {
                (as_reader(reader, || source::Store::archive(&path, reference))?, tag)
            }
            Reference::Registry(remote) => {
                let w = Work::new(&home_of_user)?;
                let pulled = w.owned_dir("pull", owner)?;
                let skopeo = skopeo::Skopeo { program: &self.skopeo, timeout: self.timeout };
                skopeo.copy(&remote, reference, &pulled, reader, deadline)?;
                let layout = pulled.join("layout");
                let store = as_reader(reader, || source::Store::layout(&layout, reference))?;
                work = Some(w);
                (store, Some("pulled".to_string()))
            }
        };
        let manifest = as_reader(reader, || store.manifest(tag.as_deref(), &self.platform))?;
        let hex = manifest.digest.trim_start_matches("sha256:").to_string();
        let key = format!("{}/{hex}", owner.0);
        let home = home_of_user.join(&hex);
        let image = match self.take(&key, &home, &manifest.digest) {
            Some(image) => image,
            None => {
                let w = match work.take() {
                    Some(w) => w,
                    None => Work::new(&home_of_user)?,
                };
                let rootfs = w.owned_dir("rootfs", owner)?;
                let mut budget = unpack::Budget::new(self.max_bytes, deadline);
                let size =
                    as_reader(reader, || unpack::layers(&store, &manifest.layers, &rootfs, &mut budget))?;
                drop(store);
                discard(&w.0.join("pull"));
                let caching = |e: std::io::Error| PullError(format!("caching: {e}"));
                std::fs::write(w.0.join(SIZE), size.to_string()).map_err(caching)?;
                std::fs::write(w.0.join(ENV), serde_json::to_vec(&manifest.env).unwrap_or_default())
                    .map_err(caching)?;
                self.install(&w, &home, &key, reference, &manifest.digest)?
            }
        };
        self.evict();
        Ok(image)
    }

    /// The cached image `key` at `home`, taken for a run (and now the most recently used); None
    /// when it is not ready.
    fn take(&self, key: &str, home: &Path, digest: &str) -> Option<Image> {
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        self.take_locked(&mut users, key, home, digest)
    }

    fn take_locked(
        &self,
        users: &mut BTreeMap<String, usize>,
        key: &str,
        home: &Path,
        digest: &str,
    ) -> Option<Image> {
        let ready = std::fs::File::options().append(true).open(home.join(READY)).ok()?;
        // The mark only orders eviction: failing to touch it makes the image look older, no more.
        let _ = ready.set_modified(std::time::SystemTime::now());
        *users.entry(key.to_string()).or_default() += 1;
        let env: Vec<(String, String)> = std::fs::read(home.join(ENV))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Some(Image {
            rootfs: home.join("rootfs"),
            digest: digest.to_string(),
            env,
            _pin: Pin { key: key.to_string(), users: self.users.clone() },
        })
    }

    /// Moves the unpacked image in `work` to `home`, marks it ready and takes it.
    fn install(
        &self,
        work: &Work,
        home: &Path,
        key: &str,
        reference: &str,
        digest: &str,
    ) -> Result<Image, PullError> {
        let caching = |e: std::io::Error| PullError(format!("caching: {e}"));
        let (image, trash) = {
            let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
            // Something half made at `home` (no run holds what is not ready) goes aside first.
            let trash = home.with_file_name(temp_name());
            let moved = std::fs::rename(home, &trash).is_ok();
            std::fs::rename(&work.0, home).map_err(caching)?;
            std::fs::write(home.join(READY), reference).map_err(caching)?;
            let image = self.take_locked(&mut users, key, home, digest);
            (image, moved.then_some(trash))
        };
        if let Some(trash) = trash {
            discard(&trash);
        }
        image.ok_or_else(|| PullError("caching: the image went before it was taken".into()))
    }

    /// Removes the least recently used images no run uses until the cache fits its bound.
    fn evict(&self) {
        let mut gone = Vec::new();
        {
            let users = self.users.lock().unwrap_or_else(|p| p.into_inner());
            let mut cached: Vec<(std::time::SystemTime, u64, PathBuf, String)> = Vec::new();
            let per_user = std::fs::read_dir(self.dir.join("images")).into_iter().flatten().flatten();
            for user in per_user {
                let uid = user.file_name().to_string_lossy().into_owned();
                for image in std::fs::read_dir(user.path()).into_iter().flatten().flatten() {
                    let path = image.path();
                    let Ok(used) = path.join(READY).metadata().and_then(|m| m.modified()) else { continue };
                    let size =
                        std::fs::read_to_string(path.join(SIZE)).ok().and_then(|s| s.trim().parse().ok());
                    let key = format!("{uid}/{}", image.file_name().to_string_lossy());
                    cached.push((used, size.unwrap_or(0), path, key));
                }
            }
            cached.sort();
            let mut total: u64 = cached.iter().map(|c| c.1).sum();
            for (_, size, path, key) in cached {
                if total <= self.max_bytes {
                    break;
                }
                if users.contains_key(&key) {
                    continue;
                }
                tracing::info!(image = %key, bytes = size, "image cache: evicting the least recently used");
                // Moved aside at once (a pull of it now makes a new one), removed unlocked.
                let aside = path.with_file_name(temp_name());
                if std::fs::rename(&path, &aside).is_ok() {
                    gone.push(aside);
                } else {
                    // Unmarked first, so a crash midway leaves a half image the next start removes.
                    let _ = std::fs::remove_file(path.join(READY));
                    gone.push(path);
                }
                total = total.saturating_sub(size);
            }
        }
        for path in gone {
            discard(&path);
        }
    }
}

/// Whom a job's image is read, pulled and unpacked as: its user's ids.
#[derive(Clone, Debug)]
pub struct Reader {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The capability sets of the calling thread (capset(2)).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Gives the calling thread (only) `r`'s file-system identity and no capabilities.
fn become_reader(r: &Reader) -> Result<(), PullError> {
    use nix::libc::{c_long, syscall, SYS_capset, SYS_setfsgid, SYS_setfsuid, SYS_setgroups};
    let header = CapHeader { version: 0x2008_0522, pid: 0 };
    let none = [CapData::default(); 2];
    // SAFETY: raw system calls change this thread's credentials only (the libc wrappers would
    // change every thread's); the thread ends right after its work. `setfsuid(-1)` changes
    // nothing and answers the current id.
    let (groups, fsuid, fsgid, caps) = unsafe {
        let groups = syscall(SYS_setgroups, r.groups.len(), r.groups.as_ptr());
        syscall(SYS_setfsgid, r.gid as c_long);
        syscall(SYS_setfsuid, r.uid as c_long);
        let fsuid = syscall(SYS_setfsuid, -1 as c_long);
        let fsgid = syscall(SYS_setfsgid, -1 as c_long);
        let caps = syscall(SYS_capset, &header as *const CapHeader, none.as_ptr());
        (groups, fsuid, fsgid, caps)
    };
    if groups != 0 || fsuid != c_long::from(r.uid) || fsgid != c_long::from(r.gid) || caps != 0 {
        return fail(format!("taking the job's user's identity: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// `f` run with `reader`'s file-system identity and no capabilities (in a thread of its own,
/// whose credentials change alone and end with it), or as the agent when None.
fn as_reader<T: Send>(
    reader: Option<&Reader>,
    f: impl FnOnce() -> Result<T, PullError> + Send,
) -> Result<T, PullError> {
    let Some(r) = reader else { return f() };
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new().name("kairos-image".into()).spawn_scoped(s, || {
            become_reader(r)?;
            f()
        });
        match thread {
            Ok(t) => t.join().unwrap_or_else(|_| fail("reading the image panicked")),
            Err(e) => fail(format!("starting the image reader: {e}")),
        }
    })
}

/// Removes a file or tree of the cache. A failure is logged, never fatal: the space stays used
/// until the next start or eviction tries again.
fn discard(path: &Path) {
    let gone = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    if let Err(e) = gone.or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) }) {
        tracing::warn!(path = %path.display(), error = %e, "image cache: cannot remove");
    }
}

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;
