//! What sled 0.34 leaves unsynced. Its `flush` fsyncs the main `db` file, but values too large
//! for a log segment (a group-commit entry of several large submits) go to files of their own
//! under `blobs/`, written and never synced, and the `conf` file written at creation is never
//! synced either. `BlobSync::sync_new` fsyncs every blob file it has not synced yet, and the
//! directory that names them; the log store calls it after each flush and before it reports a
//! write done, so an acknowledged entry is on disk whichever file holds it.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// fsync of a file or directory.
pub fn sync_path(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

#[derive(Debug)]
pub struct BlobSync {
    sled_dir: PathBuf,
    synced: Mutex<BTreeSet<OsString>>,
}

impl BlobSync {
    /// For the sled database in `sled_dir`; syncs its `conf`, its `blobs/` directory and the
    /// database directory once now (they were written before this process could sync them).
    pub fn open(sled_dir: &Path) -> std::io::Result<BlobSync> {
        for p in [sled_dir.join("conf"), sled_dir.join("blobs"), sled_dir.to_path_buf()] {
            if p.exists() {
                sync_path(&p)?;
            }
        }
        if let Some(parent) = sled_dir.parent() {
            sync_path(parent)?;
        }
        let sync = BlobSync { sled_dir: sled_dir.to_path_buf(), synced: Mutex::default() };
        sync.sync_new()?;
        Ok(sync)
    }

    /// fsyncs every blob file not synced yet, then (if there was one) the blobs directory.
    /// Returns how many files it synced.
    pub fn sync_new(&self) -> std::io::Result<usize> {
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
        let sync = BlobSync::open(dir.path()).unwrap();
        assert_eq!(sync.sync_new().unwrap(), 0);
        std::fs::write(dir.path().join("blobs/100"), vec![1u8; 4096]).unwrap();
        std::fs::write(dir.path().join("blobs/200"), vec![2u8; 4096]).unwrap();
        assert_eq!(sync.sync_new().unwrap(), 2);
        assert_eq!(sync.sync_new().unwrap(), 0, "synced twice");
        std::fs::remove_file(dir.path().join("blobs/100")).unwrap();
        std::fs::write(dir.path().join("blobs/300"), vec![3u8; 4096]).unwrap();
        assert_eq!(sync.sync_new().unwrap(), 1);
        assert_eq!(sync.synced().len(), 2);
    }
}
