//! The fake GPUs' usage, set by an operator's control file (`kairos-agent --fake-gpu-usage
//! FILE`): lines `GPU UTIL MEM_MIB` (GPU: the index the node offers, a MIG instance's own;
//! UTIL: percent), `#` comments. Re-read when it changes; a bad file keeps the last good values
//! (one warning); a missing one means every GPU idle and empty.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Mutex;

/// The most of the file read.
pub const MAX_BYTES: u64 = 64 * 1024;

/// GPU index → (utilisation percent, memory in use MiB).
pub type Levels = BTreeMap<u32, (u32, u64)>;

/// A version of the file: (mtime ns, size, inode).
type Version = (i64, u64, u64);

/// The control file and what it said last.
#[derive(Debug)]
pub struct FakeUsageFile {
    path: PathBuf,
    /// The version read, and its levels.
    seen: Mutex<(Option<Version>, Levels)>,
}

impl FakeUsageFile {
    pub fn new(path: PathBuf) -> FakeUsageFile {
        FakeUsageFile { path, seen: Mutex::new((None, Levels::new())) }
    }

    /// The levels now (the file is read again only when it changed).
    pub fn levels(&self) -> Levels {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOFOLLOW)
            .open(&self.path);
        let mut file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                *seen = (None, Levels::new());
                return Levels::new();
            }
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "cannot open the fake GPU usage file");
                return seen.1.clone();
            }
        };
        let Ok(meta) = file.metadata() else { return seen.1.clone() };
        let version = (meta.mtime() * 1_000_000_000 + meta.mtime_nsec(), meta.size(), meta.ino());
        if seen.0 == Some(version) {
            return seen.1.clone();
        }
        seen.0 = Some(version);
        if !meta.is_file() || meta.size() > MAX_BYTES {
            tracing::warn!(file = %self.path.display(), "the fake GPU usage file is not a file of at most 64 KiB");
            return seen.1.clone();
        }
        let mut text = String::new();
        if let Err(e) = (&mut file).take(MAX_BYTES).read_to_string(&mut text) {
            tracing::warn!(file = %self.path.display(), error = %e, "reading the fake GPU usage file");
            return seen.1.clone();
        }
        match parse(&text) {
            Ok(levels) => seen.1 = levels,
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "bad fake GPU usage file; keeping the last values")
            }
        }
        seen.1.clone()
    }
}

/// Parses the file's text.
pub fn parse(text: &str) -> Result<Levels, String> {
    let mut levels = Levels::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("line {}: expected \"GPU UTIL MEM_MIB\" (UTIL 0..=100), got {line:?}", n + 1);
        let [gpu, util, mem] = fields[..] else { return Err(bad()) };
        let gpu: u32 = gpu.parse().map_err(|_| bad())?;
        let util: u32 = util.parse().ok().filter(|u| *u <= 100).ok_or_else(bad)?;
        let mem: u64 = mem.parse().map_err(|_| bad())?;
        levels.insert(gpu, (util, mem));
    }
    Ok(levels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_comments_and_bad_lines() {
        let levels = parse("# GPU UTIL MEM_MIB\n0 80 30000\n\n3 5 100 # idle-ish\n").unwrap();
        assert_eq!(levels, Levels::from([(0, (80, 30_000)), (3, (5, 100))]));
        assert!(parse("0 101 5").unwrap_err().contains("line 1"));
        assert!(parse("0 50").is_err());
        assert!(parse("x 50 1").is_err());
    }

    #[test]
    fn the_file_is_read_again_when_it_changes_and_a_bad_one_keeps_the_last_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage");
        let file = FakeUsageFile::new(path.clone());
        assert!(file.levels().is_empty(), "missing: idle");
        std::fs::write(&path, "0 80 100\n").unwrap();
        assert_eq!(file.levels()[&0], (80, 100));
        // A new version (renamed into place, as operators' tools write).
        std::fs::write(dir.path().join("tmp"), "0 10 200\n1 20 300\n").unwrap();
        std::fs::rename(dir.path().join("tmp"), &path).unwrap();
        assert_eq!(file.levels(), Levels::from([(0, (10, 200)), (1, (20, 300))]));
        std::fs::write(dir.path().join("tmp"), "0 ten 200\n").unwrap();
        std::fs::rename(dir.path().join("tmp"), &path).unwrap();
        assert_eq!(file.levels()[&1], (20, 300));
        // Too large: not read.
        std::fs::write(dir.path().join("tmp"), "0 1 1\n".repeat(20_000)).unwrap();
        std::fs::rename(dir.path().join("tmp"), &path).unwrap();
        assert_eq!(file.levels()[&1], (20, 300));
    }
}
