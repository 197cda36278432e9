use std::io::Write;
use std::os::unix::fs::MetadataExt;

use sha2::{Digest, Sha256};

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

/// An OCI layout at `dir` with one image tagged `tag` made of `layers`.
fn layout(dir: &Path, tag: &str, layers: &[Vec<u8>]) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
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
    let digest = put_blob(dir, &bytes);
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest, "size": bytes.len(), "annotations": {"org.opencontainers.image.ref.name": tag}}]});
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
