//! The page cache of one file: writes and truncations not yet synced, in the order they were
//! made, over the file's synced contents. Reads see the synced bytes with the unsynced
//! operations laid over them; `fsync` writes them through; a power cut drops them, or writes
//! back only a prefix of them (a torn write-back).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// One unsynced change to a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Write { offset: u64, data: Vec<u8> },
    Truncate { len: u64 },
}

impl Change {
    /// The file's length after this change, from its length before.
    fn len_after(&self, before: u64) -> u64 {
        match self {
            Change::Write { offset, data } => before.max(offset + data.len() as u64),
            Change::Truncate { len } => *len,
        }
    }

    /// Lays this change over `buf`, which holds the file's bytes from `start`.
    fn lay_over(&self, start: u64, buf: &mut [u8]) {
        let end = start + buf.len() as u64;
        match self {
            Change::Write { offset, data } => {
                let (from, to) = ((*offset).max(start), (offset + data.len() as u64).min(end));
                if from < to {
                    buf[(from - start) as usize..(to - start) as usize]
                        .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                }
            }
            // Bytes past a truncation read as zeros if the file grows again.
            Change::Truncate { len } => {
                if *len < end {
                    buf[(*len).saturating_sub(start) as usize..].fill(0);
                }
            }
        }
    }

    /// Writes this change through to `file`.
    pub fn apply(&self, file: &File) -> std::io::Result<()> {
        match self {
            Change::Write { offset, data } => file.write_all_at(data, *offset),
            Change::Truncate { len } => file.set_len(*len),
        }
    }

    /// The first half of this change, as a torn write-back leaves it (a truncation is whole or
    /// nothing).
    pub fn torn(&self) -> Option<Change> {
        match self {
            Change::Write { offset, data } if data.len() > 1 => {
                Some(Change::Write { offset: *offset, data: data[..data.len() / 2].to_vec() })
            }
            _ => None,
        }
    }
}

/// The unsynced changes of one file, each with its place in the order of all changes.
#[derive(Debug, Default)]
pub struct Pending {
    changes: Vec<(u64, Change)>,
    /// The length of the synced file when the first change was made.
    synced_len: u64,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Records `change` (number `seq` of all changes); `synced_len` is the synced file's
    /// length now.
    pub fn push(&mut self, seq: u64, change: Change, synced_len: u64) {
        if self.changes.is_empty() {
            self.synced_len = synced_len;
        }
        self.changes.push((seq, change));
    }

    /// The file's length as its users see it.
    pub fn len(&self, synced_len: u64) -> u64 {
        let base = if self.changes.is_empty() { synced_len } else { self.synced_len };
        self.changes.iter().fold(base, |len, (_, c)| c.len_after(len))
    }

    /// `size` bytes from `offset` as users see them: the synced bytes of `file` with the
    /// changes laid over them.
    pub fn read(&self, file: &File, offset: u64, size: u32) -> std::io::Result<Vec<u8>> {
        let synced_len = file.metadata()?.len();
        let len = self.len(synced_len);
        if offset >= len {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (len - offset).min(u64::from(size)) as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], offset + filled as u64)? {
                0 => break,
                n => filled += n,
            }
        }
        for (_, c) in &self.changes {
            c.lay_over(offset, &mut buf);
        }
        Ok(buf)
    }

    /// Writes every change through to `file` and syncs it (an `fsync`).
    pub fn sync(&mut self, file: &File) -> std::io::Result<()> {
        for (_, c) in self.changes.drain(..) {
            c.apply(file)?;
        }
        file.sync_all()
    }

    /// Takes the changes out, with their order numbers.
    pub fn take(&mut self) -> Vec<(u64, Change)> {
        std::mem::take(&mut self.changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, bytes).unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        (dir, f)
    }

    #[test]
    fn reads_see_unsynced_writes_and_the_disk_does_not_until_sync() {
        let (dir, f) = file_with(b"0123456789");
        let mut p = Pending::default();
        p.push(1, Change::Write { offset: 8, data: b"abcd".to_vec() }, 10);
        p.push(2, Change::Write { offset: 2, data: b"XY".to_vec() }, 10);
        assert_eq!(p.len(10), 12);
        assert_eq!(p.read(&f, 0, 100).unwrap(), b"01XY4567abcd");
        assert_eq!(p.read(&f, 9, 2).unwrap(), b"bc");
        assert_eq!(
            std::fs::read(dir.path().join("f")).unwrap(),
            b"0123456789",
            "written through before sync"
        );
        p.sync(&f).unwrap();
        assert!(p.is_empty());
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"01XY4567abcd");
    }

    #[test]
    fn a_truncation_then_growth_reads_zeros_where_old_bytes_were() {
        let (_dir, f) = file_with(b"0123456789");
        let mut p = Pending::default();
        p.push(1, Change::Truncate { len: 4 }, 10);
        assert_eq!(p.read(&f, 0, 100).unwrap(), b"0123");
        p.push(2, Change::Write { offset: 6, data: b"ab".to_vec() }, 10);
        assert_eq!(p.len(10), 8);
        assert_eq!(p.read(&f, 0, 100).unwrap(), b"0123\0\0ab");
        p.sync(&f).unwrap();
        let mut back = vec![0; 8];
        f.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, b"0123\0\0ab");
        assert_eq!(f.metadata().unwrap().len(), 8);
    }

    #[test]
    fn a_torn_write_keeps_its_first_half() {
        let w = Change::Write { offset: 3, data: b"abcdef".to_vec() };
        assert_eq!(w.torn(), Some(Change::Write { offset: 3, data: b"abc".to_vec() }));
        assert_eq!(Change::Truncate { len: 1 }.torn(), None);
    }
}
