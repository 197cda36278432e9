use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use sha2::{Digest, Sha256};

use std::time::{Duration, Instant};

use super::source::hex;
use super::*;

/// Writes blob `bytes` into `layout`; its digest.
fn put_blob(layout: &Path, bytes: &[u8]) -> String {
    let hex = hex(&Sha256::digest(bytes));
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::write(layout.join("blobs/sha256").join(&hex), bytes).unwrap();
    format!("sha256:{hex}")
}

/// A gzip'd tar layer of `(path, content)` files; `None` content: a whiteout-style empty file.
fn layer(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, content) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        tar.append_data(&mut h, path, *content).unwrap();
    }
    let raw = tar.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    gz.finish().unwrap()
}

/// An image manifest of `layers` written into the layout `dir`: its digest and size.
fn put_manifest(dir: &Path, layers: &[Vec<u8>]) -> (String, usize) {
    let config =
        put_blob(dir, br#"{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/opt/conda/bin:/usr/bin","LANG=C.UTF-8"]},"rootfs":{"type":"layers","diff_ids":[]}}"#);
    let layers: Vec<serde_json::Value> = layers
        .iter()
        .map(|l| {
            serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                               "digest": put_blob(dir, l), "size": l.len()})
        })
        .collect();
    let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 0},
        "layers": layers});
    let bytes = serde_json::to_vec(&manifest).unwrap();
    (put_blob(dir, &bytes), bytes.len())
}

/// An OCI layout at `dir` with one image tagged `tag` made of `layers`.
fn layout(dir: &Path, tag: &str, layers: &[Vec<u8>]) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let (digest, size) = put_manifest(dir, layers);
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest, "size": size, "annotations": {"org.opencontainers.image.ref.name": tag}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    digest
}

#[test]
fn layers_apply_in_order_with_whiteouts_and_the_image_is_cached_by_digest() {
    let dir = tempfile::tempdir().unwrap();
    let base = layer(&[("etc/marker", b"base"), ("etc/gone", b"x"), ("opt/old/a", b"a")]);
    let top = layer(&[
        ("etc/marker", b"top"),
        ("etc/.wh.gone", b""),
        ("opt/old/.wh..wh..opq", b""),
        ("opt/old/b", b"b"),
    ]);
    let digest = layout(&dir.path().join("img"), "v1", &[base, top]);
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let reference = format!("oci:{}:v1", dir.path().join("img").display());
    let image = cache.prepare(&reference, None).unwrap();
    assert_eq!(image.digest, digest);
    assert_eq!(
        image.env,
        [("PATH".to_string(), "/opt/conda/bin:/usr/bin".to_string()), ("LANG".into(), "C.UTF-8".into())]
    );
    let root = &image.rootfs;
    assert_eq!(std::fs::read_to_string(root.join("etc/marker")).unwrap(), "top");
    assert!(!root.join("etc/gone").exists() && !root.join("etc/.wh.gone").exists());
    assert!(!root.join("opt/old/a").exists() && root.join("opt/old/b").exists());
    // Prepared again: the same unpacked root, not a second copy.
    let again = cache.prepare(&reference, None).unwrap();
    assert_eq!((&again.rootfs, &again.env), (&image.rootfs, &image.env));
    assert_eq!(std::fs::read_dir(dir.path().join("cache/images")).unwrap().count(), 1);
}

#[test]
fn missing_images_tags_and_corrupt_blobs_fail_the_pull_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let e = cache.prepare("oci:/nonexistent/image", None).unwrap_err().to_string();
    assert!(e.starts_with("image pull failed: ") && e.contains("no OCI image layout"), "{e}");
    let img = dir.path().join("img");
    layout(&img, "v1", &[layer(&[("a", b"a")])]);
    let e = cache.prepare(&format!("oci:{}:v2", img.display()), None).unwrap_err().to_string();
    assert!(e.contains("no image tagged \"v2\"") && e.contains("v1"), "{e}");
    // A layer whose bytes do not match its digest.
    for f in std::fs::read_dir(img.join("blobs/sha256")).unwrap().flatten() {
        let bytes = std::fs::read(f.path()).unwrap();
        if bytes.starts_with(&[0x1f, 0x8b]) {
            let mut bad = bytes.clone();
            let last = bad.len() - 1;
            bad[last] ^= 0xff;
            std::fs::write(f.path(), bad).unwrap();
        }
    }
    let e = cache.prepare(&format!("oci:{}:v1", img.display()), None).unwrap_err().to_string();
    assert!(e.contains("corrupt") || e.contains("layer"), "{e}");
    let e = cache.prepare("oci-archive:/nonexistent.tar", None).unwrap_err().to_string();
    assert!(e.starts_with("image pull failed: oci-archive:/nonexistent.tar"), "{e}");
}

#[test]
fn the_cache_evicts_the_least_recently_used_image_no_run_holds() {
    let dir = tempfile::tempdir().unwrap();
    let big = vec![7u8; 64 * 1024];
    let refs: Vec<String> = (0..3)
        .map(|i| {
            let img = dir.path().join(format!("img{i}"));
            layout(&img, "latest", &[layer(&[("data", &big), ("id", format!("{i}").as_bytes())])]);
            format!("oci:{}", img.display())
        })
        .collect();
    // Room for two images.
    let cache = ImageCache::new(&dir.path().join("cache"), 2 * 64 * 1024 + 100).unwrap();
    let held = cache.prepare(&refs[0], None).unwrap();
    drop(cache.prepare(&refs[1], None).unwrap());
    std::thread::sleep(std::time::Duration::from_millis(20));
    drop(cache.prepare(&refs[2], None).unwrap());
    // Image 0 is the oldest but held by a run; image 1 goes.
    let cached = |i: usize| {
        std::fs::read_dir(dir.path().join("cache/images/0")).unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path().join("rootfs/id")).ok().as_deref() == Some(&i.to_string())
        })
    };
    assert!(cached(0) && !cached(1) && cached(2));
    assert!(held.rootfs.join("data").exists());
    drop(held);
    std::thread::sleep(std::time::Duration::from_millis(20));
    drop(cache.prepare(&refs[1], None).unwrap());
    assert!(!cached(0) && cached(1) && cached(2), "image 0, no longer held and oldest, goes");
}

/// A gzip'd tar layer with one symlink `path` -> `target`.
fn link_layer(path: &str, target: &Path) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    tar.append_link(&mut h, path, target).unwrap();
    let raw = tar.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    gz.finish().unwrap()
}

#[test]
fn whiteouts_through_a_link_out_of_the_image_remove_nothing_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("victim"), "keep").unwrap();
    std::fs::write(host.join("other"), "keep").unwrap();
    // Layer 1 links `a` to the host directory; layer 2 whites out a file through it, and
    // layer 3 makes it opaque.
    let layers = [
        link_layer("a", &host),
        layer(&[("a/.wh.victim", b"")]),
        layer(&[("a/.wh..wh..opq", b""), ("b", b"b")]),
    ];
    layout(&dir.path().join("img"), "v1", &layers);
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let _ = cache.prepare(&format!("oci:{}:v1", dir.path().join("img").display()), None);
    assert!(host.join("victim").exists() && host.join("other").exists(), "a whiteout reached the host");
    // A file written through the link: refused, nothing written on the host.
    layout(&dir.path().join("img2"), "v1", &[link_layer("a", &host), layer(&[("a/planted", b"x")])]);
    let e = cache.prepare(&format!("oci:{}:v1", dir.path().join("img2").display()), None).unwrap_err();
    assert!(!host.join("planted").exists(), "{e}");
}

#[test]
fn a_jobs_image_is_read_as_its_user() {
    let dir = tempfile::tempdir().unwrap();
    // A layout only root can reach (behind a 0700 directory).
    let vault = dir.path().join("vault");
    std::fs::create_dir(&vault).unwrap();
    std::fs::set_permissions(&vault, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    layout(&vault.join("img"), "v1", &[layer(&[("secret", b"root only")])]);
    let reference = format!("oci:{}:v1", vault.join("img").display());
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let nobody = Reader { uid: 65534, gid: 65534, groups: vec![] };
    let e = cache.prepare(&reference, Some(&nobody)).unwrap_err().to_string();
    assert!(e.contains("no index.json the job's user can read"), "{e}");
    let archive = format!("oci-archive:{}", vault.join("img.tar").display());
    std::fs::write(vault.join("img.tar"), b"").unwrap();
    let e = cache.prepare(&archive, Some(&nobody)).unwrap_err().to_string();
    assert!(e.contains("Permission denied"), "{e}");
    // The agent's own user reads it, and the thread's identity change left the agent's alone.
    assert!(cache.prepare(&reference, None).is_ok());
    assert!(std::fs::read_dir(&vault).is_ok());
}

/// A user that need not exist: its ids are all an identity change needs.
fn user(uid: u32) -> Reader {
    Reader { uid, gid: uid, groups: vec![] }
}

/// A temporary directory anyone may pass through (a job's image is read as its user).
fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

/// The digests (hex) of the blobs in `layout` that are not layers (manifest, config).
fn metadata_blobs(layout: &Path) -> Vec<String> {
    std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .flatten()
        .filter(|f| !std::fs::read(f.path()).unwrap().starts_with(&[0x1f, 0x8b]))
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_fifo_or_a_link_in_a_layout_is_refused_at_once_and_never_followed() {
    let dir = open_tempdir();
    let img = dir.path().join("img");
    layout(&img, "v1", &[layer(&[("a", b"a")])]);
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let reference = format!("oci:{}:v1", img.display());
    let index = std::fs::read(img.join("index.json")).unwrap();
    // index.json a FIFO nobody writes to: refused by its type, nothing waits.
    std::fs::remove_file(img.join("index.json")).unwrap();
    nix::unistd::mkfifo(&img.join("index.json"), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let started = Instant::now();
    for reader in [None, Some(user(60001))] {
        let e = cache.prepare(&reference, reader.as_ref()).unwrap_err().to_string();
        assert!(e.contains("index.json is a FIFO, not a regular file"), "{e}");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "a FIFO held the pull {:?}", started.elapsed());
    // index.json a link (to a good index elsewhere): not followed.
    std::fs::remove_file(img.join("index.json")).unwrap();
    std::fs::write(dir.path().join("elsewhere.json"), &index).unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere.json"), img.join("index.json")).unwrap();
    let e = cache.prepare(&reference, None).unwrap_err().to_string();
    assert!(e.contains("index.json is a symbolic link"), "{e}");
    std::fs::remove_file(img.join("index.json")).unwrap();
    std::fs::write(img.join("index.json"), &index).unwrap();
    assert!(cache.prepare(&reference, None).is_ok());
    // A blob a FIFO, then `blobs/` a link to a copy of itself: each refused.
    let manifest = metadata_blobs(&img).into_iter().next().unwrap();
    let cache = ImageCache::new(&dir.path().join("cache2"), 1 << 30).unwrap();
    let blobs = img.join("blobs/sha256");
    for hex in metadata_blobs(&img) {
        std::fs::rename(blobs.join(&hex), dir.path().join(&hex)).unwrap();
        nix::unistd::mkfifo(&blobs.join(&hex), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    }
    let e = cache.prepare(&reference, None).unwrap_err().to_string();
    assert!(e.contains("is a FIFO, not a regular file") && e.contains(&manifest[..12]), "{e}");
    std::fs::rename(img.join("blobs"), dir.path().join("realblobs")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("realblobs"), img.join("blobs")).unwrap();
    let e = cache.prepare(&reference, None).unwrap_err().to_string();
    assert!(e.contains("blobs/ is not a directory (it may be a symbolic link"), "{e}");
}

#[test]
fn an_oversized_index_or_manifest_is_refused_before_it_is_read() {
    let dir = open_tempdir();
    let img = dir.path().join("img");
    let digest = layout(&img, "v1", &[layer(&[("a", b"a")])]);
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let reference = format!("oci:{}:v1", img.display());
    let index = std::fs::read(img.join("index.json")).unwrap();
    // A 4 GB sparse index.json: refused by its size, in no time, holding no memory.
    let sparse = std::fs::File::create(img.join("index.json")).unwrap();
    sparse.set_len(4 << 30).unwrap();
    let started = Instant::now();
    let e = cache.prepare(&reference, Some(&user(60001))).unwrap_err().to_string();
    assert!(e.contains("index.json is larger than 4 MiB"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    std::fs::write(img.join("index.json"), &index).unwrap();
    // The manifest blob made huge (its digest no longer matters: the size is checked first).
    let manifest = img.join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
    std::fs::File::options().write(true).open(&manifest).unwrap().set_len(5 << 20).unwrap();
    let e = cache.prepare(&reference, None).unwrap_err().to_string();
    assert!(e.contains(&format!("manifest {digest} is larger than 4 MiB")), "{e}");
}

#[test]
fn a_corrupt_blob_is_named_without_the_hash_of_what_was_read() {
    let dir = open_tempdir();
    let img = dir.path().join("img");
    let digest = layout(&img, "v1", &[layer(&[("a", b"a")])]);
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let reference = format!("oci:{}:v1", img.display());
    // The manifest's blob replaced by other content (as if linked to a secret).
    let manifest = img.join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
    let secret = b"root:$6$secret-hash:19000:0:99999:7:::\n";
    std::fs::write(&manifest, secret).unwrap();
    let e = cache.prepare(&reference, None).unwrap_err().to_string();
    assert!(e.contains(&format!("blob {digest} is corrupt")), "{e}");
    assert!(!e.contains(&hex(&Sha256::digest(secret))), "the message carries the content's hash: {e}");
    // A layer the same.
    let img = dir.path().join("img2");
    layout(&img, "v1", &[layer(&[("a", b"a")])]);
    let mut replaced = Vec::new();
    for f in std::fs::read_dir(img.join("blobs/sha256")).unwrap().flatten() {
        if std::fs::read(f.path()).unwrap().starts_with(&[0x1f, 0x8b]) {
            let other = layer(&[("b", b"something else")]);
            std::fs::write(f.path(), &other).unwrap();
            replaced.push((f.file_name().to_string_lossy().into_owned(), hex(&Sha256::digest(&other))));
        }
    }
    let e = cache.prepare(&format!("oci:{}:v1", img.display()), None).unwrap_err().to_string();
    let (named, content) = &replaced[0];
    assert!(e.contains(&format!("layer sha256:{named} is corrupt")), "{e}");
    assert!(!e.contains(content.as_str()), "the message carries the content's hash: {e}");
}

/// A gzip'd tar layer with one file of `size` zero bytes (compresses about a thousandfold).
fn bomb(size: u64) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    {
        let mut tar = tar::Builder::new(&mut gz);
        let mut h = tar::Header::new_gnu();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        tar.append_data(&mut h, "zeros", std::io::repeat(0).take(size)).unwrap();
        tar.finish().unwrap();
    }
    gz.finish().unwrap()
}

#[test]
fn a_gzip_bomb_stops_at_the_caches_bound_as_it_expands() {
    let dir = open_tempdir();
    let img = dir.path().join("img");
    let bomb = bomb(64 << 20);
    assert!(bomb.len() < 1 << 20, "{}", bomb.len());
    layout(&img, "v1", &[bomb]);
    let cache = ImageCache::new(&dir.path().join("cache"), 4 << 20).unwrap();
    let e = cache.prepare(&format!("oci:{}:v1", img.display()), Some(&user(60001))).unwrap_err().to_string();
    assert!(e.contains("the image expands to more than 4 MiB (the image cache's bound)"), "{e}");
    // Nothing of it stays.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("cache/images/60001")).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
    // A layer whose entry claims more than the bound is stopped the same way, and an image
    // within the bound is had.
    let small = dir.path().join("small");
    layout(&small, "v1", &[layer(&[("a", &[1u8; 1 << 20])])]);
    assert!(cache.prepare(&format!("oci:{}:v1", small.display()), Some(&user(60001))).is_ok());
}

/// A tar of every file under `dir` (named `./index.json`, `./blobs/sha256/…`) at `out`.
fn tar_of(dir: &Path, out: &Path) {
    let mut tar = tar::Builder::new(std::fs::File::create(out).unwrap());
    tar.append_dir_all(".", dir).unwrap();
    tar.finish().unwrap();
}

/// A tar at `out` of `links`: (name, target, hard).
fn tar_of_links(out: &Path, regular: &[(&str, &[u8])], links: &[(String, PathBuf, bool)]) {
    let mut tar = tar::Builder::new(std::fs::File::create(out).unwrap());
    for (name, content) in regular {
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, name, *content).unwrap();
    }
    for (name, target, hard) in links {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(if *hard { tar::EntryType::Link } else { tar::EntryType::Symlink });
        h.set_size(0);
        h.set_mode(0o777);
        tar.append_link(&mut h, name, target).unwrap();
    }
    tar.finish().unwrap();
}

#[test]
fn an_archive_is_read_in_place_and_its_links_lead_nowhere() {
    let dir = open_tempdir();
    // The victim: a private image behind a 0700 directory, and a root-only file.
    let vault = dir.path().join("vault");
    std::fs::create_dir(&vault).unwrap();
    std::fs::set_permissions(&vault, std::fs::Permissions::from_mode(0o700)).unwrap();
    let private = vault.join("img");
    let digest = layout(&private, "v1", &[layer(&[("secret", b"private")])]);
    let shadow = vault.join("shadow");
    let secret = b"root:$6$hash:19000:0:99999:7:::\n";
    std::fs::write(&shadow, secret).unwrap();
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    // A good archive: read in place (nothing unpacked), as the user.
    let good = dir.path().join("good");
    let good_digest = layout(&good, "v1", &[layer(&[("etc/marker", b"archived")])]);
    tar_of(&good, &dir.path().join("good.tar"));
    let image = cache
        .prepare(&format!("oci-archive:{}:v1", dir.path().join("good.tar").display()), Some(&user(60001)))
        .unwrap();
    assert_eq!(image.digest, good_digest);
    assert_eq!(std::fs::read_to_string(image.rootfs.join("etc/marker")).unwrap(), "archived");
    // Links into the private image (index and every blob), hard or symbolic: missing.
    let blobs: Vec<String> = std::fs::read_dir(private.join("blobs/sha256"))
        .unwrap()
        .flatten()
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .collect();
    for hard in [false, true] {
        let mut links = vec![("index.json".to_string(), private.join("index.json"), hard)];
        links.extend(
            blobs.iter().map(|b| (format!("blobs/sha256/{b}"), private.join("blobs/sha256").join(b), hard)),
        );
        let evil = dir.path().join("evil.tar");
        tar_of_links(&evil, &[], &links);
        for reader in [Some(user(60001)), None] {
            let e = cache
                .prepare(&format!("oci-archive:{}:v1", evil.display()), reader.as_ref())
                .unwrap_err()
                .to_string();
            assert!(e.contains("index.json: no such regular file in oci-archive:"), "{e}");
        }
    }
    // index.json known to the attacker and written out, the blobs links (one to the root-only
    // file): refused, and nothing in the message is a hash of what was linked to.
    let index = std::fs::read(private.join("index.json")).unwrap();
    let hex = digest.trim_start_matches("sha256:");
    let links: Vec<_> = blobs
        .iter()
        .map(|b| {
            let target = if b == hex { shadow.clone() } else { private.join("blobs/sha256").join(b) };
            (format!("blobs/sha256/{b}"), target, false)
        })
        .collect();
    let evil = dir.path().join("evil2.tar");
    tar_of_links(&evil, &[("index.json", &index)], &links);
    for reader in [Some(user(60001)), None] {
        let e = cache
            .prepare(&format!("oci-archive:{}:v1", evil.display()), reader.as_ref())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("blob {digest}: no such regular file")), "{e}");
        assert!(!e.contains(&super::source::hex(&Sha256::digest(secret))), "{e}");
    }
    // A root-only archive is not read for the user.
    std::fs::copy(dir.path().join("good.tar"), vault.join("good.tar")).unwrap();
    let e = cache
        .prepare(&format!("oci-archive:{}:v1", vault.join("good.tar").display()), Some(&user(60001)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Permission denied"), "{e}");
}

/// Sets every file under `path` to `uid`'s.
fn chown_all(path: &Path, uid: u32) {
    let status = std::process::Command::new("chown").arg("-R").arg(format!("{uid}:{uid}")).arg(path).status();
    assert!(status.unwrap().success());
}

/// A gzip'd tar layer of special entries: a setuid root binary, a device, a FIFO, a read-only
/// directory with a file in it.
fn special_layer() -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, mode: u32, content: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(content.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1);
        if kind == tar::EntryType::Char {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        tar.append_data(&mut h, path, content).unwrap();
    };
    add("bin/", tar::EntryType::Directory, 0o755, b"");
    add("bin/su", tar::EntryType::Regular, 0o4755, b"#!/bin/sh\n");
    add("bin/sg", tar::EntryType::Regular, 0o2755, b"#!/bin/sh\n");
    add("secret", tar::EntryType::Regular, 0o000, b"mine");
    add("dev/", tar::EntryType::Directory, 0o755, b"");
    add("dev/null", tar::EntryType::Char, 0o666, b"");
    add("fifo", tar::EntryType::Fifo, 0o666, b"");
    add("ro/", tar::EntryType::Directory, 0o555, b"");
    add("ro/f", tar::EntryType::Regular, 0o444, b"f");
    add("tmp/", tar::EntryType::Directory, 0o1777, b"");
    let raw = tar.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    gz.finish().unwrap()
}

#[test]
fn an_image_is_unpacked_as_its_user_and_cached_for_that_user_alone() {
    let dir = open_tempdir();
    let (alice, bob) = (user(60001), user(60002));
    // Alice's private image.
    let mine = dir.path().join("alice");
    std::fs::create_dir(&mine).unwrap();
    let digest = layout(&mine.join("img"), "v1", &[special_layer(), layer(&[("ro/g", b"g")])]);
    chown_all(&mine, 60001);
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let theirs = format!("oci:{}:v1", mine.join("img").display());
    let image = cache.prepare(&theirs, Some(&alice)).unwrap();
    let root = &image.rootfs;
    assert_eq!(
        *root,
        dir.path().join("cache/images/60001").join(digest.trim_start_matches("sha256:")).join("rootfs")
    );
    let meta = |p: &Path| std::fs::symlink_metadata(p).unwrap();
    // The agent's directories: root's, passable (0711); the root file system: alice's.
    for p in ["cache", "cache/images", "cache/images/60001"]
        .map(|p| dir.path().join(p))
        .iter()
        .chain([&root.parent().unwrap().to_path_buf()])
    {
        assert_eq!((meta(p).uid(), meta(p).mode() & 0o7777), (0, 0o711), "{}", p.display());
    }
    assert_eq!(meta(root).uid(), 60001);
    // Everything hers, no setuid or setgid, no device, no FIFO; modes kept otherwise.
    assert_eq!(
        (meta(&root.join("bin/su")).uid(), meta(&root.join("bin/su")).mode() & 0o7777),
        (60001, 0o755)
    );
    assert_eq!(meta(&root.join("bin/sg")).mode() & 0o7777, 0o755);
    assert_eq!(meta(&root.join("secret")).mode() & 0o777, 0o400);
    assert!(!root.join("dev/null").exists() && std::fs::symlink_metadata(root.join("fifo")).is_err());
    assert_eq!(meta(&root.join("ro")).mode() & 0o7777, 0o555);
    assert_eq!(meta(&root.join("tmp")).mode() & 0o7777, 0o1777);
    assert!(root.join("ro/g").exists(), "a later layer writes into a read-only directory");
    // She can reach and read every file through the cache's directories.
    let su = root.join("bin/su");
    let read = as_reader(Some(&alice), || std::fs::read(&su).map_err(|e| PullError(e.to_string()))).unwrap();
    assert_eq!(read, b"#!/bin/sh\n");
    // Bob cannot name her layout, and a layout forged with her index, manifest and config (and
    // no layers) does not get him her cached image.
    let e = cache.prepare(&theirs, Some(&bob)).unwrap_err().to_string();
    assert!(e.contains("no index.json the job's user can read"), "{e}");
    let forged = dir.path().join("forged");
    std::fs::create_dir_all(forged.join("blobs/sha256")).unwrap();
    std::fs::copy(mine.join("img/index.json"), forged.join("index.json")).unwrap();
    for hex in metadata_blobs(&mine.join("img")) {
        std::fs::copy(mine.join("img/blobs/sha256").join(&hex), forged.join("blobs/sha256").join(&hex))
            .unwrap();
    }
    chown_all(&forged, 60002);
    let e = cache.prepare(&format!("oci:{}:v1", forged.display()), Some(&bob)).unwrap_err().to_string();
    assert!(e.contains("blob sha256:") && e.contains("No such file"), "{e}");
    // A copy of his own is his own, unpacked again.
    let copy = dir.path().join("copy");
    layout(&copy, "v1", &[special_layer(), layer(&[("ro/g", b"g")])]);
    let his = cache.prepare(&format!("oci:{}:v1", copy.display()), Some(&bob)).unwrap();
    assert_eq!(his.digest, image.digest);
    assert_ne!(his.rootfs, image.rootfs);
    assert_eq!(meta(&his.rootfs.join("bin/su")).uid(), 60002);
}

/// A stand-in for skopeo at `dir/skopeo`: `docker://good/…` copies `layout` (tagged "pulled"),
/// `docker://fail/…` prints who it runs as, `docker://slow/…` sleeps.
fn fake_skopeo(dir: &Path, layout: &Path) -> PathBuf {
    let script = dir.join("skopeo");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ndest=${{4#oci:}}; dest=${{dest%:pulled}}\ncase \"$3\" in\n\
             docker://good/*) cp -r {} \"$dest\";;\n\
             docker://fail/*) echo \"uid=$(id -u) groups=$(id -G) home=$HOME cargo=$CARGO_PKG_NAME\" >&2; exit 3;;\n\
             docker://slow/*) sleep 30;;\nesac\n",
            layout.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn registry_images_are_pulled_as_the_user_within_a_deadline_and_hold_no_one_else() {
    let dir = open_tempdir();
    let pulled = dir.path().join("registry");
    let digest = layout(&pulled, "pulled", &[special_layer()]);
    let skopeo = fake_skopeo(dir.path(), &pulled);
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30)
        .unwrap()
        .with_skopeo(&skopeo)
        .with_pull_timeout(Duration::from_secs(3));
    let image = cache.prepare("docker://good/image:1", Some(&user(60001))).unwrap();
    assert_eq!(image.digest, digest);
    assert_eq!(std::fs::symlink_metadata(image.rootfs.join("bin/su")).unwrap().uid(), 60001);
    // As the user, with nothing of the agent's environment.
    let e = cache.prepare("docker://fail/image:1", Some(&user(60001))).unwrap_err().to_string();
    assert!(e.contains("uid=60001 groups=60001 home=") && e.contains("cargo= (exit status: 3)"), "{e}");
    assert!(std::env::var("CARGO_PKG_NAME").is_ok(), "the test's own environment has it");
    // A pull that hangs is killed at the deadline, and another user's pull goes on meanwhile.
    let started = Instant::now();
    let cache = Arc::new(cache);
    let slow = std::thread::spawn({
        let cache = cache.clone();
        move || (cache.prepare("docker://slow/image:1", Some(&user(60001))).map(|_| ()), started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let other = dir.path().join("other");
    layout(&other, "v1", &[layer(&[("a", b"a")])]);
    cache.prepare(&format!("oci:{}:v1", other.display()), Some(&user(60002))).unwrap();
    let theirs = started.elapsed();
    let (slow, took) = slow.join().unwrap();
    let e = slow.unwrap_err().to_string();
    assert!(e.contains("skopeo did not finish within the pull's deadline (3 s)"), "{e}");
    assert!(theirs < Duration::from_secs(2) && took < Duration::from_secs(10), "{theirs:?} {took:?}");
}

/// A gzip'd tar whose first entry is a GNU long name claiming `size` bytes (zeros follow).
fn long_name_bomb(size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNULongName);
    h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(h.as_bytes()).unwrap();
    std::io::copy(&mut std::io::repeat(b'a').take(size.min(8 << 20)), &mut gz).unwrap();
    gz.finish().unwrap()
}

#[test]
fn a_long_name_or_pax_header_claiming_megabytes_is_refused_before_it_is_read() {
    let dir = open_tempdir();
    let img = dir.path().join("img");
    layout(&img, "v1", &[long_name_bomb(8 << 20)]);
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let e = cache.prepare(&format!("oci:{}:v1", img.display()), None).unwrap_err().to_string();
    assert!(e.contains("a tar extension header (long name or pax) of 8388608 bytes"), "{e}");
    // In an archive the same.
    let raw = {
        let gz = long_name_bomb(8 << 20);
        let mut d = flate2::read::GzDecoder::new(&gz[..]);
        let mut v = Vec::new();
        d.read_to_end(&mut v).unwrap();
        v
    };
    std::fs::write(dir.path().join("bomb.tar"), raw).unwrap();
    let e = cache
        .prepare(&format!("oci-archive:{}:v1", dir.path().join("bomb.tar").display()), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("a tar extension header (long name or pax)"), "{e}");
    // Long names and pax headers of ordinary size (and big files) unpack as they did.
    let long = format!("{}/file", "d".repeat(200));
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(3);
    h.set_mode(0o644);
    tar.append_data(&mut h, &long, &b"abc"[..]).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(2);
    h.set_mode(0o644);
    tar.append_data(&mut h, format!("{}/gnu", "g".repeat(150)), &b"xy"[..]).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar.into_inner().unwrap()).unwrap();
    let ok = dir.path().join("ok");
    layout(&ok, "v1", &[gz.finish().unwrap(), layer(&[("after", b"after")])]);
    let image = cache.prepare(&format!("oci:{}:v1", ok.display()), None).unwrap();
    assert_eq!(std::fs::read(image.rootfs.join(&long)).unwrap(), b"abc");
    assert!(image.rootfs.join("after").exists());
}

#[test]
fn an_image_index_gives_the_manifest_for_the_nodes_own_platform() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    std::fs::create_dir_all(&img).unwrap();
    std::fs::write(img.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let node = platform::node();
    let (os, arch) = (node.os().to_string(), node.architecture().to_string());
    let other = if arch == "arm64" { "amd64" } else { "arm64" };
    // The other architecture's manifest first: the order of the index does not decide.
    let mut entries = Vec::new();
    let mut mine = String::new();
    for a in [other, arch.as_str()] {
        let (digest, size) = put_manifest(&img, &[layer(&[("arch", a.as_bytes())])]);
        if a == arch {
            mine = digest.clone();
        }
        entries.push(serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest, "size": size, "platform": {"architecture": a, "os": os}}));
    }
    let nested = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}))
    .unwrap();
    let nested_digest = put_blob(&img, &nested);
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json",
        "digest": nested_digest, "size": nested.len(), "annotations": {"org.opencontainers.image.ref.name": "multi"}}]});
    std::fs::write(img.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    let cache = ImageCache::new(&dir.path().join("cache"), 1 << 30).unwrap();
    let image = cache.prepare(&format!("oci:{}:multi", img.display()), None).unwrap();
    assert_eq!(image.digest, mine);
    assert_eq!(std::fs::read_to_string(image.rootfs.join("arch")).unwrap(), arch);
    // An index for another platform only: refused, naming this node's and the index's.
    let only =
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [entries[0].clone()]}))
            .unwrap();
    let only_digest = put_blob(&img, &only);
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json",
        "digest": only_digest, "size": only.len(), "annotations": {"org.opencontainers.image.ref.name": "foreign"}}]});
    std::fs::write(img.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    let e = cache.prepare(&format!("oci:{}:foreign", img.display()), None).unwrap_err().to_string();
    assert!(e.contains(&format!("no manifest for this node's platform {}", platform::name(&node))), "{e}");
    assert!(e.contains(&format!("it has: {os}/{other})")), "{e}");
}
