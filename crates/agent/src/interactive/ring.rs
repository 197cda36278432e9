//! A session's output as its streams read it: chunks numbered by absolute byte offset, the
//! newest `cap` bytes kept (a resumed stream replays from the offset it has, or learns how many
//! bytes it lost), and a watch that wakes readers when output grows or ends.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::watch;

/// Output is appended to the last chunk while it holds fewer bytes than this.
const CHUNK_FILL: usize = 64 * 1024;

/// One chunk of output: where it starts, its bytes, whether it is the command's stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub offset: u64,
    pub data: Vec<u8>,
    pub stderr: bool,
}

#[derive(Default)]
struct Held {
    chunks: VecDeque<Chunk>,
    /// The bytes the chunks hold.
    bytes: usize,
    /// The offset one past the last byte ever written.
    end: u64,
}

/// The bounded output of one session.
pub struct Ring {
    cap: usize,
    held: Mutex<Held>,
    /// The end offset, and whether output has ended (no more is written).
    grown: watch::Sender<(u64, bool)>,
}

/// What a reader gets from an offset.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Chunks from the offset asked for (or the oldest held, see `lost`).
    Chunks { chunks: Vec<Chunk>, lost: u64 },
    /// Nothing past the offset yet (or ever, when `ended`).
    Nothing { ended: bool },
}

impl Ring {
    pub fn new(cap: usize) -> Ring {
        Ring { cap, held: Mutex::default(), grown: watch::channel((0, false)).0 }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends output; the oldest chunks leave once more than `cap` bytes are held.
    pub fn push(&self, data: &[u8], stderr: bool) {
        if data.is_empty() {
            return;
        }
        let end = {
            let mut held = self.lock();
            let offset = held.end;
            held.end += data.len() as u64;
            held.bytes += data.len();
            // Small writes fill the last chunk: the bound counts payload bytes, and many tiny
            // chunks would cost far more than they hold.
            match held.chunks.back_mut() {
                Some(last) if last.stderr == stderr && last.data.len() < CHUNK_FILL => {
                    last.data.extend_from_slice(data)
                }
                _ => held.chunks.push_back(Chunk { offset, data: data.to_vec(), stderr }),
            }
            while held.bytes > self.cap && held.chunks.len() > 1 {
                if let Some(old) = held.chunks.pop_front() {
                    held.bytes -= old.data.len();
                }
            }
            held.end
        };
        self.grown.send_modify(|g| g.0 = end);
    }

    /// No more output comes (readers that have everything see the end).
    pub fn close(&self) {
        self.grown.send_modify(|g| g.1 = true);
    }

    /// The offset one past the last byte written.
    pub fn end(&self) -> u64 {
        self.lock().end
    }

    /// The oldest offset held and the end.
    pub fn span(&self) -> (u64, u64) {
        let held = self.lock();
        (held.chunks.front().map_or(held.end, |c| c.offset), held.end)
    }

    /// The output from `offset` on (up to `max` bytes), and how many bytes before the oldest
    /// held were lost to a reader at `offset`.
    pub fn read(&self, offset: u64, max: usize) -> Read {
        let held = self.lock();
        let ended = self.grown.borrow().1;
        if offset >= held.end {
            return Read::Nothing { ended };
        }
        let oldest = held.chunks.front().map_or(held.end, |c| c.offset);
        let (from, lost) = if offset < oldest { (oldest, oldest - offset) } else { (offset, 0) };
        let mut chunks = Vec::new();
        let mut taken = 0usize;
        for c in held.chunks.iter().filter(|c| c.offset + c.data.len() as u64 > from) {
            if taken >= max {
                break;
            }
            let skip = from.saturating_sub(c.offset) as usize;
            let take = (c.data.len() - skip).min(max - taken);
            chunks.push(Chunk {
                offset: c.offset + skip as u64,
                data: c.data[skip..skip + take].to_vec(),
                stderr: c.stderr,
            });
            taken += take;
        }
        Read::Chunks { chunks, lost }
    }

    /// Wakes on every growth and at the end.
    pub fn watch(&self) -> watch::Receiver<(u64, bool)> {
        self.grown.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_resume_at_any_offset_and_an_evicted_prefix_is_counted_lost() {
        let ring = Ring::new(8);
        ring.push(b"abcd", false);
        ring.push(b"ef", true);
        match ring.read(2, 100) {
            Read::Chunks { chunks, lost } => {
                assert_eq!(lost, 0);
                assert_eq!(chunks[0], Chunk { offset: 2, data: b"cd".to_vec(), stderr: false });
                assert_eq!(chunks[1], Chunk { offset: 4, data: b"ef".to_vec(), stderr: true });
            }
            other => panic!("{other:?}"),
        }
        ring.push(b"ghijk", false);
        // 11 bytes written, at most 8 held: "abcd" left.
        match ring.read(1, 3) {
            Read::Chunks { chunks, lost } => {
                assert_eq!(lost, 3);
                assert_eq!(
                    chunks,
                    vec![
                        Chunk { offset: 4, data: b"ef".to_vec(), stderr: true },
                        Chunk { offset: 6, data: b"g".to_vec(), stderr: false }
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(ring.read(11, 10), Read::Nothing { ended: false });
        ring.close();
        assert_eq!(ring.read(11, 10), Read::Nothing { ended: true });
        assert_eq!(ring.end(), 11);
    }

    #[test]
    fn one_byte_writes_fill_few_chunks() {
        let ring = Ring::new(256 * 1024);
        for i in 0..1_000_000u32 {
            ring.push(&[b'a' + (i % 26) as u8], i % 100_000 == 0);
        }
        let held = ring.lock();
        // Four full chunks, one filling, a stderr byte among the last 256 KiB and its neighbours.
        assert!(held.chunks.len() <= 8, "{} chunks", held.chunks.len());
        assert!(held.bytes <= 256 * 1024 + CHUNK_FILL, "{} bytes held", held.bytes);
        let data: usize = held.chunks.iter().map(|c| c.data.capacity()).sum();
        assert!(data <= 4 * 256 * 1024, "{data} bytes allocated");
        let last = held.chunks.back().map(|c| (c.offset + c.data.len() as u64, c.data[c.data.len() - 1]));
        assert_eq!(last, Some((1_000_000, b'a' + (999_999 % 26) as u8)));
    }
}
