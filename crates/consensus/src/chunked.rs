//! Raft log entries stored as small sled values.
//!
//! sled 0.34 writes any page larger than a quarter of a log segment (~128 KiB) to a blob file of
//! its own, and writes the log record that points at it without syncing the blob first: after a
//! power cut the record can be on disk and the blob torn, and sled then panics while opening
//! (`tried to serialize Uninitialized`), which the power cut tests reproduced. So no log entry
//! is ever a large sled value: each is split into chunks of at most `CHUNK_BYTES`, keyed by
//! (index, chunk number), so that even a full leaf (sled splits leaves above 16 items) stays
//! far below the blob threshold. The chunks of an append go in one sled batch, which sled
//! applies atomically, also across a crash.
//!
//! Chunk 0 starts with the number of chunks (u32, big-endian); a reader checks that every chunk
//! is there, so a damaged log is an error, never a silently shortened entry.

use std::ops::Bound;

/// Most bytes in one sled value of the log.
pub const CHUNK_BYTES: usize = 4 * 1024;
const COUNT_BYTES: usize = 4;

/// The key of chunk `chunk` of entry `index`: big-endian, so sled's order is the log's order.
pub fn key(index: u64, chunk: u32) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&index.to_be_bytes());
    k[8..].copy_from_slice(&chunk.to_be_bytes());
    k
}

/// The first key of entry `index` (and the end of the entries before it).
pub fn first_key(index: u64) -> [u8; 12] {
    key(index, 0)
}

/// Adds the chunks of entry `index` (encoded as `bytes`) to `batch`.
pub fn insert(batch: &mut sled::Batch, index: u64, bytes: &[u8]) {
    let head = CHUNK_BYTES - COUNT_BYTES;
    let rest = bytes.len().saturating_sub(head);
    let count = 1 + rest.div_ceil(CHUNK_BYTES);
    let mut first = Vec::with_capacity(CHUNK_BYTES.min(bytes.len() + COUNT_BYTES));
    first.extend_from_slice(&(count as u32).to_be_bytes());
    first.extend_from_slice(&bytes[..bytes.len().min(head)]);
    batch.insert(&key(index, 0), first);
    for (i, piece) in bytes[bytes.len().min(head)..].chunks(CHUNK_BYTES).enumerate() {
        batch.insert(&key(index, i as u32 + 1), piece);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("log key of {0} bytes (not 12): not a kairos log")]
    Key(usize),
    #[error("log entry {index} is incomplete: chunk {found} where chunk {expected} belongs")]
    Incomplete { index: u64, expected: u32, found: u32 },
    #[error("log entry {0}: its first chunk has no chunk count")]
    Head(u64),
    #[error(transparent)]
    Sled(#[from] sled::Error),
}

fn split_key(k: &[u8]) -> Result<(u64, u32), ChunkError> {
    let k: [u8; 12] = k.try_into().map_err(|_| ChunkError::Key(k.len()))?;
    let (i, c) = k.split_at(8);
    Ok((
        u64::from_be_bytes(i.try_into().unwrap_or_default()),
        u32::from_be_bytes(c.try_into().unwrap_or_default()),
    ))
}

/// Reassembles whole entries from chunks in key order.
struct Assembler {
    current: Option<(u64, u32, u32, Vec<u8>)>,
}

impl Assembler {
    /// Feeds one chunk; returns an entry when its last chunk arrived.
    fn feed(&mut self, k: &[u8], v: &[u8]) -> Result<Option<(u64, Vec<u8>)>, ChunkError> {
        let (index, chunk) = split_key(k)?;
        match self.current.take() {
            None => {
                if chunk != 0 {
                    return Err(ChunkError::Incomplete { index, expected: 0, found: chunk });
                }
                let count = v.get(..COUNT_BYTES).ok_or(ChunkError::Head(index))?;
                let count = u32::from_be_bytes(count.try_into().unwrap_or_default());
                if count == 0 {
                    return Err(ChunkError::Head(index));
                }
                self.current = Some((index, 1, count, v[COUNT_BYTES..].to_vec()));
            }
            Some((at, next, count, mut bytes)) => {
                if at != index || next != chunk {
                    return Err(ChunkError::Incomplete { index: at, expected: next, found: chunk });
                }
                bytes.extend_from_slice(v);
                self.current = Some((at, next + 1, count, bytes));
            }
        }
        match self.current.take() {
            Some((index, next, count, bytes)) if next == count => Ok(Some((index, bytes))),
            other => {
                self.current = other;
                Ok(None)
            }
        }
    }

    fn finish(self) -> Result<(), ChunkError> {
        match self.current {
            Some((index, next, _, _)) => Err(ChunkError::Incomplete { index, expected: next, found: next }),
            None => Ok(()),
        }
    }
}

/// The entries with indices in `from..`, in order, while `keep(index)` holds.
pub fn read_from(
    tree: &sled::Tree,
    from: u64,
    mut keep: impl FnMut(u64) -> bool,
) -> Result<Vec<(u64, Vec<u8>)>, ChunkError> {
    let mut out = Vec::new();
    let mut asm = Assembler { current: None };
    for item in tree.range(first_key(from)..) {
        let (k, v) = item?;
        if !keep(split_key(&k)?.0) {
            return Ok(out);
        }
        if let Some(entry) = asm.feed(&k, &v)? {
            out.push(entry);
        }
    }
    asm.finish()?;
    Ok(out)
}

/// The last entry, if any.
pub fn last(tree: &sled::Tree) -> Result<Option<(u64, Vec<u8>)>, ChunkError> {
    let Some((k, _)) = tree.last()? else { return Ok(None) };
    let index = split_key(&k)?.0;
    Ok(read_from(tree, index, |i| i == index)?.pop())
}

/// Adds the removal of every chunk in `range` of keys to `batch`.
pub fn remove_range(
    tree: &sled::Tree,
    batch: &mut sled::Batch,
    range: (Bound<[u8; 12]>, Bound<[u8; 12]>),
) -> Result<(), ChunkError> {
    for item in tree.range::<[u8; 12], _>(range) {
        batch.remove(item?.0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (tempfile::TempDir, sled::Db, sled::Tree) {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path().join("db")).open().unwrap();
        let t = db.open_tree("log").unwrap();
        (dir, db, t)
    }

    #[test]
    fn entries_of_any_size_come_back_whole_and_in_order() {
        let (_d, _db, t) = tree();
        let sizes =
            [0usize, 1, CHUNK_BYTES - COUNT_BYTES, CHUNK_BYTES - COUNT_BYTES + 1, 3 * CHUNK_BYTES + 7];
        let mut batch = sled::Batch::default();
        for (i, n) in sizes.iter().enumerate() {
            insert(&mut batch, i as u64 + 1, &vec![i as u8 + 1; *n]);
        }
        t.apply_batch(batch).unwrap();
        let all = read_from(&t, 0, |_| true).unwrap();
        assert_eq!(all.len(), sizes.len());
        for (i, (index, bytes)) in all.iter().enumerate() {
            assert_eq!(*index, i as u64 + 1);
            assert_eq!(bytes, &vec![i as u8 + 1; sizes[i]]);
        }
        assert_eq!(read_from(&t, 3, |i| i < 5).unwrap().iter().map(|e| e.0).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(last(&t).unwrap().map(|e| (e.0, e.1.len())), Some((5, 3 * CHUNK_BYTES + 7)));
        assert!(t.iter().all(|kv| kv.unwrap().1.len() <= CHUNK_BYTES), "a value above the chunk size");
    }

    #[test]
    fn a_missing_chunk_is_an_error_not_a_shorter_entry() {
        let (_d, _db, t) = tree();
        let mut batch = sled::Batch::default();
        insert(&mut batch, 1, &vec![7u8; 3 * CHUNK_BYTES]);
        insert(&mut batch, 2, b"next");
        t.apply_batch(batch).unwrap();
        t.remove(key(1, 2)).unwrap();
        assert!(matches!(
            read_from(&t, 0, |_| true),
            Err(ChunkError::Incomplete { index: 1, expected: 2, .. })
        ));
        // The last chunk missing, at the end of the log.
        t.remove(key(2, 0)).unwrap();
        t.remove(key(1, 3)).unwrap();
        assert!(matches!(last(&t), Err(ChunkError::Incomplete { index: 1, .. })));
        t.insert(key(9, 0), &[0u8, 0][..]).unwrap();
        assert!(matches!(last(&t), Err(ChunkError::Head(9))));
        let (_d, _db, t) = tree();
        t.insert(b"short", &b"x"[..]).unwrap();
        assert!(matches!(read_from(&t, 0, |_| true), Err(ChunkError::Key(5))));
    }

    #[test]
    fn a_two_mebibyte_entry_writes_no_blob_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path().join("db")).open().unwrap();
        let t = db.open_tree("log").unwrap();
        let mut batch = sled::Batch::default();
        insert(&mut batch, 1, &vec![b'x'; 2 * 1024 * 1024]);
        t.apply_batch(batch).unwrap();
        db.flush().unwrap();
        let blobs = std::fs::read_dir(dir.path().join("db/blobs")).map(|d| d.count()).unwrap_or(0);
        assert_eq!(blobs, 0, "sled wrote blob files");
        // The same bytes as one value do go to a blob file (what this module avoids).
        t.insert(key(2, 0), vec![b'x'; 2 * 1024 * 1024]).unwrap();
        db.flush().unwrap();
        assert!(std::fs::read_dir(dir.path().join("db/blobs")).unwrap().count() > 0);
    }
}
