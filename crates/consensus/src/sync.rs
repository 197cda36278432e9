//! What sled 0.34 leaves unsynced. Its `flush` writes the log buffers to the main `db` file and
//! calls `sync_file_range` on them — which syncs neither the file's size nor its metadata and
//! never reaches FUSE or network filesystems; a real `fsync` of `db` happens only in sled's
//! background flusher, up to 500 ms later. Values too large for a log segment (a group-commit
//! entry of several large submits) go to files of their own under `blobs/`, written and never
//! synced, and the `conf` file written at creation is never synced either.
//!
//! `SledSync::after_flush` fdatasyncs `db`, then every blob file it has not synced yet and the
//! directory that names them; the log store calls it after each flush and before it reports a
//! write done, so an acknowledged entry is on disk whichever file holds it. (Proved by the power
//! cut tests on `kairos-lazyfs`, which lose whatever was not fsync'd: with sled's flush alone,
//! acknowledged submits were missing after a power cut under all three replicas.)

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// fsync of a file or directory.
pub fn sync_path(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

#[derive(Debug)]
pub struct SledSync {
    sled_dir: PathBuf,
    /// sled's main file (a second handle: fsync of any handle syncs the file).
    db: std::fs::File,
    synced: Mutex<BTreeSet<OsString>>,
}

impl SledSync {
    /// For the sled database in `sled_dir`; syncs its `conf`, its `blobs/` directory and the
    /// database directory once now (they were written before this process could sync them).
    pub fn open(sled_dir: &Path) -> std::io::Result<SledSync> {
        for p in [sled_dir.join("conf"), sled_dir.join("blobs"), sled_dir.to_path_buf()] {
            if p.exists() {
                sync_path(&p)?;
            }
        }
        if let Some(parent) = sled_dir.parent() {
            sync_path(parent)?;
        }
        let db = std::fs::File::open(sled_dir.join("db"))?;
        let sync = SledSync { sled_dir: sled_dir.to_path_buf(), db, synced: Mutex::default() };
        sync.after_flush()?;
        Ok(sync)
    }

    /// fdatasyncs `db`, then every blob file not synced yet and (if there was one) the blobs
    /// directory. Returns how many blob files it synced.
    pub fn after_flush(&self) -> std::io::Result<usize> {
        self.db.sync_data()?;
        self.sync_new_blobs()
    }

    fn sync_new_blobs(&self) -> std::io::Result<usize> {
        let dir = self.sled_dir.join("blobs");
        let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(0) };
        let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        let mut present = BTreeSet::new();
        let mut count = 0;
        for e in entries {
            let e = e?;
            let name = e.file_name();
            if !synced.contains(&name) {
                match std::fs::File::open(e.path()) {
                    Ok(f) => f.sync_all()?,
                    // sled removed it meanwhile (a blob no longer referenced).
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(err) => return Err(err),
                }
                count += 1;
            }
            present.insert(name);
        }
        if count > 0 {
            sync_path(&dir)?;
        }
        *synced = present;
        Ok(count)
    }

    /// The blob files synced so far (for tests).
    #[cfg(test)]
    pub fn synced(&self) -> BTreeSet<OsString> {
        self.synced.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_new_blob_file_is_synced_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("blobs")).unwrap();
        std::fs::write(dir.path().join("conf"), "x").unwrap();
        std::fs::write(dir.path().join("db"), "x").unwrap();
        let sync = SledSync::open(dir.path()).unwrap();
        assert_eq!(sync.after_flush().unwrap(), 0);
        std::fs::write(dir.path().join("blobs/100"), vec![1u8; 4096]).unwrap();
        std::fs::write(dir.path().join("blobs/200"), vec![2u8; 4096]).unwrap();
        assert_eq!(sync.after_flush().unwrap(), 2);
        assert_eq!(sync.after_flush().unwrap(), 0, "synced twice");
        std::fs::remove_file(dir.path().join("blobs/100")).unwrap();
        std::fs::write(dir.path().join("blobs/300"), vec![3u8; 4096]).unwrap();
        assert_eq!(sync.after_flush().unwrap(), 1);
        assert_eq!(sync.synced().len(), 2);
    }
}
