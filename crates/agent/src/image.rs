//! Container images on a node: pulled once into a cache, unpacked, and kept while the cache
//! stays under its size bound (the least recently used go first, never one a run uses).
//!
//! An image is an OCI image layout (`oci:/path[:tag]`), an archive of one
//! (`oci-archive:/path.tar[:tag]`), or a registry reference, copied into a layout by `skopeo`
//! where the node has it. The layout's manifest and layers are checked against their sha256
//! digests, the layers applied in order (whiteouts included) into `images/<digest>/rootfs`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

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
    pub rootfs: PathBuf,
    /// The manifest's digest (`sha256:…`).
    pub digest: String,
    /// The image's environment (its config's `Env`): under the job's own.
    pub env: Vec<(String, String)>,
    _lease: Lease,
}

#[derive(Debug)]
struct Lease {
    digest: String,
    users: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = users.get_mut(&self.digest) {
            *n -= 1;
            if *n == 0 {
                users.remove(&self.digest);
            }
        }
    }
}

/// The node's image cache.
#[derive(Debug)]
pub struct ImageCache {
    dir: PathBuf,
    max_bytes: u64,
    /// Runs using each image, by digest.
    users: Arc<Mutex<BTreeMap<String, usize>>>,
    /// One pull or eviction at a time.
    busy: Mutex<()>,
}

const READY: &str = "ready";
const SIZE: &str = "size";
const ENV: &str = "env.json";

impl ImageCache {
    pub fn new(dir: &Path, max_bytes: u64) -> std::io::Result<ImageCache> {
        std::fs::create_dir_all(dir.join("images"))?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        Ok(ImageCache { dir: dir.to_path_buf(), max_bytes, users: Arc::default(), busy: Mutex::new(()) })
    }

    /// The image `reference`, unpacked (pulled first if the cache lacks it). Blocking. A local
    /// layout or archive is read as `reader` (the job's user; None: the agent's own), so a job
    /// can name only an image its user could read.
    pub fn prepare(&self, reference: &str, reader: Option<&Reader>) -> Result<Image, PullError> {
        let _busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let scratch = tempdir_in(&self.dir)?;
        let cached = self.cache(reference, reader, &scratch);
        let _ = std::fs::remove_dir_all(&scratch);
        let digest = cached?;
        let home = self.dir.join("images").join(digest.trim_start_matches("sha256:"));
        // Used now: the most recent (eviction goes by this time).
        if let Ok(f) = std::fs::File::options().append(true).open(home.join(READY)) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        *self.users.lock().unwrap_or_else(|p| p.into_inner()).entry(digest.clone()).or_default() += 1;
        let env: Vec<(String, String)> = std::fs::read(home.join(ENV))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let image = Image {
            rootfs: home.join("rootfs"),
            digest: digest.clone(),
            env,
            _lease: Lease { digest, users: self.users.clone() },
        };
        self.evict();
        Ok(image)
    }

    /// Puts the image `reference` in the cache unless it is there; its digest.
    fn cache(&self, reference: &str, reader: Option<&Reader>, scratch: &Path) -> Result<String, PullError> {
        let (layout, tag, reader) = self.layout_of(reference, scratch, reader)?;
        let source = as_reader(reader, || open_image(&layout, tag.as_deref()))?;
        let home = self.dir.join("images").join(source.digest.trim_start_matches("sha256:"));
        if home.join(READY).exists() {
            return Ok(source.digest);
        }
        let _ = std::fs::remove_dir_all(&home);
        let unpacking = scratch.join("rootfs");
        let size = unpack(source.layers, &unpacking)?;
        let caching = |e: std::io::Error| PullError(format!("caching: {e}"));
        std::fs::create_dir_all(&home).map_err(caching)?;
        std::fs::rename(&unpacking, home.join("rootfs")).map_err(caching)?;
        std::fs::write(home.join(SIZE), size.to_string()).map_err(caching)?;
        std::fs::write(home.join(ENV), serde_json::to_vec(&source.env).unwrap_or_default())
            .map_err(caching)?;
        std::fs::write(home.join(READY), reference).map_err(caching)?;
        Ok(source.digest)
    }

    /// Removes the least recently used images no run uses until the cache fits its bound.
    fn evict(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("images")) else { return };
        let mut cached: Vec<(std::time::SystemTime, u64, PathBuf, String)> = entries
            .flatten()
            .filter_map(|e| {
                let used = e.path().join(READY).metadata().and_then(|m| m.modified()).ok()?;
                let size = std::fs::read_to_string(e.path().join(SIZE)).ok()?.trim().parse().ok()?;
                let digest = format!("sha256:{}", e.file_name().to_string_lossy());
                Some((used, size, e.path(), digest))
            })
            .collect();
        cached.sort();
        let mut total: u64 = cached.iter().map(|c| c.1).sum();
        let users = self.users.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (_, size, path, digest) in cached {
            if total <= self.max_bytes {
                break;
            }
            if users.contains_key(&digest) {
                continue;
            }
            tracing::info!(image = %digest, bytes = size, "image cache: evicting the least recently used");
            // The marker first: a half-removed image is never taken for a ready one.
            let _ = std::fs::remove_file(path.join(READY));
            let _ = std::fs::remove_dir_all(&path);
            total = total.saturating_sub(size);
        }
    }

    /// The OCI layout `reference` names (unpacked or pulled into `scratch` where needed), the
    /// tag asked for, and whom to read it as (`reader` for the job's own layout; the agent for
    /// what it made in `scratch`).
    fn layout_of<'r>(
        &self,
        reference: &str,
        scratch: &Path,
        reader: Option<&'r Reader>,
    ) -> Result<(PathBuf, Option<String>, Option<&'r Reader>), PullError> {
        let split = |rest: &str| match rest.split_once(':') {
            Some((p, t)) => (PathBuf::from(p), Some(t.to_string())),
            None => (PathBuf::from(rest), None),
        };
        if let Some(rest) = reference.strip_prefix("oci:") {
            let (path, tag) = split(rest);
            let exists = as_reader(reader, || Ok(path.join("index.json").is_file()))?;
            if !exists {
                return fail(format!(
                    "{reference}: no OCI image layout at {} (no index.json the job's user can read)",
                    path.display()
                ));
            }
            return Ok((path, tag, reader));
        }
        if let Some(rest) = reference.strip_prefix("oci-archive:") {
            let (path, tag) = split(rest);
            let file = as_reader(reader, || {
                std::fs::File::open(&path).map_err(|e| PullError(format!("{reference}: {e}")))
            })?;
            let layout = scratch.join("layout");
            let mut archive = tar::Archive::new(file);
            archive
                .unpack(&layout)
                .map_err(|e| PullError(format!("{reference}: unpacking the archive: {e}")))?;
            return Ok((layout, tag, None));
        }
        let remote = reference.strip_prefix("docker://").unwrap_or(reference);
        let layout = scratch.join("layout");
        let out = std::process::Command::new("skopeo")
            .args(["copy", "--quiet", &format!("docker://{remote}")])
            .arg(format!("oci:{}:pulled", layout.display()))
            .stdin(std::process::Stdio::null())
            .output();
        match out {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fail(format!("{reference}: registry images are pulled with skopeo, which this node lacks"))
            }
            Err(e) => fail(format!("{reference}: running skopeo: {e}")),
            Ok(o) if !o.status.success() => {
                let why = String::from_utf8_lossy(&o.stderr);
                fail(format!("{reference}: {}", why.trim().chars().take(300).collect::<String>()))
            }
            Ok(_) => Ok((layout, Some("pulled".into()), None)),
        }
    }
}

/// Whom a job's own image files are read as: its user's ids.
#[derive(Clone, Debug)]
pub struct Reader {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// `f` run with `reader`'s file-system identity (in a thread of its own, whose credentials
/// change alone and end with it), or as the agent when None.
fn as_reader<T: Send>(
    reader: Option<&Reader>,
    f: impl FnOnce() -> Result<T, PullError> + Send,
) -> Result<T, PullError> {
    let Some(r) = reader else { return f() };
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: raw system calls change this thread's credentials only (the libc
            // wrappers would change every thread's); the thread ends right after `f`.
            let changed = unsafe {
                nix::libc::syscall(nix::libc::SYS_setgroups, r.groups.len(), r.groups.as_ptr()) == 0
                    && nix::libc::syscall(nix::libc::SYS_setfsgid, r.gid) >= 0
                    && nix::libc::syscall(nix::libc::SYS_setfsuid, r.uid) >= 0
            };
            if !changed {
                return fail(format!(
                    "taking the job's user's identity: {}",
                    std::io::Error::last_os_error()
                ));
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| fail("reading the image panicked"))
    })
}

/// What an image is, read from its layout: the manifest's digest, the config's environment,
/// and its layers (digest, gzip'd, opened).
struct Source {
    digest: String,
    env: Vec<(String, String)>,
    layers: Vec<(String, bool, std::fs::File)>,
}

/// The image `tag` names in `layout`, its layers opened (by whoever calls: see `as_reader`).
fn open_image(layout: &Path, tag: Option<&str>) -> Result<Source, PullError> {
    let (digest, config, layers) = manifest(layout, tag)?;
    let env = image_env(layout, &config)?;
    let layers = layers
        .into_iter()
        .map(|(d, gz)| {
            let file =
                std::fs::File::open(blob(layout, &d)?).map_err(|e| PullError(format!("layer {d}: {e}")))?;
            Ok((d, gz, file))
        })
        .collect::<Result<_, PullError>>()?;
    Ok(Source { digest, env, layers })
}

/// A new private directory under `dir`.
fn tempdir_in(dir: &Path) -> Result<PathBuf, PullError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("tmp-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir(&path).map_err(|e| PullError(format!("{}: {e}", path.display())))?;
    Ok(path)
}

/// The path of blob `digest` in `layout`, after checking the digest's form.
fn blob(layout: &Path, digest: &str) -> Result<PathBuf, PullError> {
    let hex =
        digest.strip_prefix("sha256:").filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    match hex {
        Some(h) => Ok(layout.join("blobs/sha256").join(h)),
        None => fail(format!(
            "unsupported digest \"{}\" (sha256 only)",
            digest.chars().take(80).collect::<String>()
        )),
    }
}

/// Blob `digest`, read whole and checked against its digest.
fn read_blob(layout: &Path, digest: &str) -> Result<Vec<u8>, PullError> {
    let path = blob(layout, digest)?;
    let bytes = std::fs::read(&path).map_err(|e| PullError(format!("blob {digest}: {e}")))?;
    let got = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
    if got != digest {
        return fail(format!("blob {digest} is corrupt (its content is {got})"));
    }
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json(bytes: &[u8], what: &str) -> Result<serde_json::Value, PullError> {
    serde_json::from_slice(bytes).map_err(|e| PullError(format!("{what}: {e}")))
}

/// A layer: its digest and whether it is gzip-compressed.
type Layer = (String, bool);

/// The image config's `Env` (`KEY=VALUE` each) from blob `config`.
fn image_env(layout: &Path, config: &str) -> Result<Vec<(String, String)>, PullError> {
    let body = json(&read_blob(layout, config)?, "image config")?;
    let env = body["config"]["Env"].as_array().cloned().unwrap_or_default();
    Ok(env
        .iter()
        .filter_map(|e| e.as_str()?.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect())
}

/// The manifest `tag` names in the layout (the only one, or the one tagged "latest", when no
/// tag is given): its digest, its config's digest and its layers. An image index is followed to its linux/amd64
/// (else first) manifest.
fn manifest(layout: &Path, tag: Option<&str>) -> Result<(String, String, Vec<Layer>), PullError> {
    let index_bytes =
        std::fs::read(layout.join("index.json")).map_err(|e| PullError(format!("index.json: {e}")))?;
    let index = json(&index_bytes, "index.json")?;
    let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
    let tag_of = |m: &serde_json::Value| {
        m["annotations"]["org.opencontainers.image.ref.name"].as_str().map(str::to_string)
    };
    let chosen = match tag {
        Some(t) => manifests.iter().find(|m| tag_of(m).as_deref() == Some(t)),
        None if manifests.len() == 1 => manifests.first(),
        None => manifests.iter().find(|m| tag_of(m).as_deref() == Some("latest")),
    };
    let Some(mut desc) = chosen.cloned() else {
        let tags: Vec<String> = manifests.iter().filter_map(tag_of).collect();
        return fail(format!(
            "no image tagged {:?} in the layout (tags: {})",
            tag.unwrap_or("latest"),
            tags.join(", ")
        ));
    };
    for _ in 0..2 {
        let digest = desc["digest"].as_str().unwrap_or_default().to_string();
        let body = json(&read_blob(layout, &digest)?, "manifest")?;
        if let Some(nested) = body["manifests"].as_array() {
            let amd64 = nested
                .iter()
                .find(|m| m["platform"]["architecture"] == "amd64" && m["platform"]["os"] == "linux");
            desc =
                amd64.or(nested.first()).cloned().ok_or_else(|| PullError("an empty image index".into()))?;
            continue;
        }
        let mut layers = Vec::new();
        for l in body["layers"].as_array().cloned().unwrap_or_default() {
            let kind = l["mediaType"].as_str().unwrap_or_default();
            let gz = kind.ends_with("gzip");
            if !gz && !kind.ends_with(".tar") && !kind.ends_with("tar") {
                return fail(format!("layer type {kind} is not supported (tar and tar+gzip are)"));
            }
            layers.push((l["digest"].as_str().unwrap_or_default().to_string(), gz));
        }
        let config = body["config"]["digest"].as_str().unwrap_or_default().to_string();
        return Ok((digest, config, layers));
    }
    fail("image indexes nested too deep")
}

/// Reads through to a sha256 of what was read.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Applies `layers` in order into `rootfs`; the bytes of file data written.
fn unpack(layers: Vec<(String, bool, std::fs::File)>, rootfs: &Path) -> Result<u64, PullError> {
    std::fs::create_dir_all(rootfs).map_err(|e| PullError(format!("{}: {e}", rootfs.display())))?;
    let mut size = 0;
    for (digest, gz, file) in layers {
        let mut hashing = Hashing { inner: std::io::BufReader::new(file), hash: Sha256::new() };
        size += if gz {
            apply(&mut flate2::read::GzDecoder::new(&mut hashing), rootfs)
        } else {
            apply(&mut hashing, rootfs)
        }
        .map_err(|e| PullError(format!("layer {digest}: {e}")))?;
        // The rest of the blob (tar padding) counts for the digest.
        std::io::copy(&mut hashing, &mut std::io::sink())
            .map_err(|e| PullError(format!("layer {digest}: {e}")))?;
        let got = format!("sha256:{}", hex(&hashing.hash.finalize()));
        if got != digest {
            return fail(format!("layer {digest} is corrupt (its content is {got})"));
        }
    }
    Ok(size)
}

/// One layer's tar stream into `rootfs`: whiteouts (`.wh.NAME`, `.wh..wh..opq`) remove what
/// lower layers put there; nothing lands outside `rootfs`.
fn apply(stream: &mut dyn Read, rootfs: &Path) -> std::io::Result<u64> {
    let root = rootfs.canonicalize();
    let mut archive = tar::Archive::new(stream);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_overwrite(true);
    let mut size = 0;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if let Some(hidden) = name.strip_prefix(".wh.") {
            // The directory as it really is (links followed): a link of a lower layer may lead
            // out of the image, and nothing outside it is ever removed.
            let parent = rootfs.join(path.parent().unwrap_or(Path::new("")));
            let inside = match (parent.canonicalize(), &root) {
                (Ok(real), Ok(root)) if real.starts_with(root) => real,
                _ => continue,
            };
            let parent = inside;
            if hidden.contains('/') || hidden == ".." || hidden == "." {
                continue;
            }
            if hidden == ".wh..opq" {
                for child in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
                    remove(&child.path());
                }
            } else {
                remove(&parent.join(hidden));
            }
            continue;
        }
        size += entry.header().size().unwrap_or(0);
        entry.unpack_in(rootfs).map_err(|e| {
            // tar names the file but keeps the cause in the source.
            let cause = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
            std::io::Error::new(e.kind(), format!("{e}{cause}"))
        })?;
    }
    Ok(size)
}

fn remove(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;
