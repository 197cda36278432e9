//! A tar stream watched as it goes by: the tar crate reads an extension entry (a GNU long name
//! or long link, a pax header) whole into memory, so one that claims more than
//! `EXTENSION_MAX` is refused before it is read — a layer or an archive cannot make the agent
//! hold gigabytes for a "file name".

use std::io::{Read, Seek, SeekFrom};

/// The most an extension entry (long name, long link, pax header) may weigh.
pub(super) const EXTENSION_MAX: u64 = 1 << 20;

#[derive(Debug, PartialEq)]
enum Phase {
    /// Gathering a header block.
    Header,
    /// Gathering the extension blocks of an old GNU sparse header; then `skip` bytes of data.
    SparseBlocks,
    /// `skip` bytes of data (with padding) before the next header.
    Data,
}

/// Passes a tar stream through, following its headers.
pub(super) struct TarGuard<R> {
    inner: R,
    phase: Phase,
    block: Vec<u8>,
    skip: u64,
    /// The data of the pax header being read (to find a `size` it sets for the next entry).
    pax: Option<Vec<u8>>,
    pax_left: u64,
    /// The size the last pax header gave the next entry.
    pax_size: Option<u64>,
}

fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string())
}

/// A header's size field: octal, or base-256 when its first byte's high bit is set.
fn size_field(field: &[u8]) -> std::io::Result<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        return Ok(field[4..].iter().fold(0u64, |a, b| (a << 8) | u64::from(*b)));
    }
    let text = std::str::from_utf8(field).map_err(|_| refused("a tar header's size is not a number"))?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).map_err(|_| refused("a tar header's size is not a number"))
}

/// The `size` a pax header's records (`LEN key=value\n`) set, if any.
fn pax_size(data: &[u8]) -> Option<u64> {
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest.iter().position(|b| *b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
        let record = rest.get(space + 1..len)?;
        if let Some(value) = record.strip_prefix(b"size=") {
            let value = value.strip_suffix(b"\n").unwrap_or(value);
            return std::str::from_utf8(value).ok()?.parse().ok();
        }
        rest = rest.get(len..)?;
    }
    None
}

impl<R> TarGuard<R> {
    pub fn new(inner: R) -> TarGuard<R> {
        TarGuard {
            inner,
            phase: Phase::Header,
            block: Vec::with_capacity(512),
            skip: 0,
            pax: None,
            pax_left: 0,
            pax_size: None,
        }
    }

    /// A header block, complete.
    fn header(&mut self) -> std::io::Result<()> {
        let h = std::mem::take(&mut self.block);
        if h.iter().all(|b| *b == 0) {
            return Ok(());
        }
        let kind = h[156];
        let mut size = size_field(&h[124..136])?;
        let extension = matches!(kind, b'L' | b'K' | b'x' | b'g');
        if extension && size > EXTENSION_MAX {
            return Err(refused(&format!(
                "a tar extension header (long name or pax) of {size} bytes (at most {EXTENSION_MAX}); refused"
            )));
        }
        if kind == b'x' {
            self.pax = Some(Vec::new());
            self.pax_left = size;
        } else if !extension {
            if let Some(s) = self.pax_size.take() {
                size = s;
            }
        }
        self.skip = size.div_ceil(512) * 512;
        self.phase = if kind == b'S' && h[482] != 0 { Phase::SparseBlocks } else { Phase::Data };
        self.done_with_data();
        Ok(())
    }

    /// After data: the next header, once every byte (and the pax data) went by.
    fn done_with_data(&mut self) {
        if self.phase == Phase::Data && self.skip == 0 {
            if let Some(pax) = self.pax.take() {
                self.pax_size = pax_size(&pax);
            }
            self.phase = Phase::Header;
        }
    }

    /// Follows the bytes `seen` of the stream.
    fn observe(&mut self, mut seen: &[u8]) -> std::io::Result<()> {
        while !seen.is_empty() {
            match self.phase {
                Phase::Header | Phase::SparseBlocks => {
                    let k = (512 - self.block.len()).min(seen.len());
                    self.block.extend_from_slice(&seen[..k]);
                    seen = &seen[k..];
                    if self.block.len() == 512 {
                        if self.phase == Phase::Header {
                            self.header()?;
                        } else {
                            let more = self.block[504] != 0;
                            self.block.clear();
                            if !more {
                                self.phase = Phase::Data;
                                self.done_with_data();
                            }
                        }
                    }
                }
                Phase::Data => {
                    let k = usize::try_from(self.skip).unwrap_or(usize::MAX).min(seen.len());
                    if let Some(pax) = self.pax.as_mut() {
                        let take = usize::try_from(self.pax_left).unwrap_or(usize::MAX).min(k);
                        pax.extend_from_slice(&seen[..take]);
                        self.pax_left -= take as u64;
                    }
                    self.skip -= k as u64;
                    seen = &seen[k..];
                    self.done_with_data();
                }
            }
        }
        Ok(())
    }
}

impl<R: Read> Read for TarGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.observe(&buf[..n])?;
        Ok(n)
    }
}

/// Only forward skips over data (what the tar crate does over an entry it does not read).
impl<R: Seek> Seek for TarGuard<R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        let SeekFrom::Current(n) = pos else { return Err(refused("a tar stream is only skipped forward")) };
        let n = u64::try_from(n).map_err(|_| refused("a tar stream is only skipped forward"))?;
        if n > 0 && (self.phase != Phase::Data || n > self.skip || self.pax.is_some()) {
            return Err(refused("a skip past an entry's data in a tar stream"));
        }
        let at = self.inner.seek(pos)?;
        self.skip -= n;
        self.done_with_data();
        Ok(at)
    }
}
