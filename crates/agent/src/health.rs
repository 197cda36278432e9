//! GPU health: which NVML events make a GPU unhealthy, and the fault file through which the
//! fake backend is given faults at run time (CI exercises health end to end with it).
//!
//! As NVIDIA's Kubernetes device plugin does, every critical XID is fatal except the ones that
//! name an application's error (13 graphics engine exception, 31 GPU memory page fault, 43 GPU
//! stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch
//! timeout); the list is configurable (`kairos-agent --gpu-ignored-xids`).

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

/// XIDs that are the application's error, not the GPU's.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// A GPU the agent judged unhealthy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuFault {
    pub index: u32,
    pub uuid: String,
    /// What was seen, e.g. "XID 79" or "NVML: GPU is lost".
    pub reason: String,
}

/// What a GPU reported (from NVML's events or queries, or the fault file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Symptom {
    Xid(u64),
    DoubleBitEcc,
    /// Retired or remapped memory waits for a GPU reset.
    PendingRetirement,
    /// NVML can no longer query the GPU.
    Lost(String),
}

/// Which XIDs are ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidPolicy {
    ignored: BTreeSet<u64>,
}

impl Default for XidPolicy {
    fn default() -> Self {
        XidPolicy { ignored: DEFAULT_IGNORED_XIDS.into_iter().collect() }
    }
}

impl XidPolicy {
    /// A comma-separated list of XIDs to ignore ("" ignores none).
    pub fn parse(list: &str) -> Result<XidPolicy, String> {
        let ignored = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u64>().map_err(|_| format!("\"{s}\" is not an XID number")))
            .collect::<Result<_, _>>()?;
        Ok(XidPolicy { ignored })
    }

    /// Why `symptom` makes a GPU unhealthy, or None when it does not.
    pub fn judge(&self, symptom: &Symptom) -> Option<String> {
        match symptom {
            Symptom::Xid(x) if self.ignored.contains(x) => None,
            Symptom::Xid(x) => Some(format!("XID {x}")),
            Symptom::DoubleBitEcc => Some("double-bit ECC error".to_string()),
            Symptom::PendingRetirement => Some("retired memory pages wait for a GPU reset".to_string()),
            Symptom::Lost(why) => Some(format!("NVML: {why}")),
        }
    }
}

/// One line of the fault file: `GPU XID` (e.g. `3 79`), `GPU ecc`, `GPU pending` or `GPU lost`.
pub fn parse_injection(line: &str) -> Result<(u32, Symptom), String> {
    let mut words = line.split_whitespace();
    let (Some(gpu), Some(what), None) = (words.next(), words.next(), words.next()) else {
        return Err(format!("\"{line}\": expected GPU and XID (or ecc, pending, lost)"));
    };
    let gpu: u32 = gpu.parse().map_err(|_| format!("\"{gpu}\" is not a GPU index"))?;
    let symptom = match what {
        "ecc" => Symptom::DoubleBitEcc,
        "pending" => Symptom::PendingRetirement,
        "lost" => Symptom::Lost("GPU is lost".to_string()),
        xid => Symptom::Xid(xid.parse().map_err(|_| format!("\"{xid}\" is not an XID number"))?),
    };
    Ok((gpu, symptom))
}

/// Longest fault file read per poll (the rest waits for the next).
const INJECTION_READ_MAX: u64 = 64 * 1024;

/// The fake backend's fault file: each line appended to it is one fault, read once.
pub struct FaultFile {
    path: PathBuf,
    offset: u64,
}

impl FaultFile {
    /// Starts at the file's end: faults written before the agent started are history.
    pub fn open(path: PathBuf) -> FaultFile {
        let offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        FaultFile { path, offset }
    }

    /// The complete lines appended since the last poll (a bad line is logged and skipped).
    pub fn poll(&mut self) -> Vec<(u32, Symptom)> {
        let Ok(mut f) = std::fs::File::open(&self.path) else { return Vec::new() };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            self.offset = 0; // truncated: start over
        }
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err()
            || f.take(INJECTION_READ_MAX).read_to_end(&mut buf).is_err()
        {
            return Vec::new();
        }
        let Some(end) = buf.iter().rposition(|b| *b == b'\n') else { return Vec::new() };
        self.offset += end as u64 + 1;
        String::from_utf8_lossy(&buf[..end])
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter_map(|l| match parse_injection(l) {
                Ok(x) => Some(x),
                Err(e) => {
                    tracing::warn!(file = %self.path.display(), error = %e, "fault file: line skipped");
                    None
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_xids_are_ignored_and_the_rest_are_fatal() {
        let p = XidPolicy::default();
        for xid in DEFAULT_IGNORED_XIDS {
            assert_eq!(p.judge(&Symptom::Xid(xid)), None, "XID {xid}");
        }
        for xid in [48, 63, 64, 74, 79, 92, 94, 95] {
            assert_eq!(p.judge(&Symptom::Xid(xid)), Some(format!("XID {xid}")));
        }
        assert!(p.judge(&Symptom::DoubleBitEcc).is_some());
        assert_eq!(p.judge(&Symptom::Lost("GPU is lost".into())).as_deref(), Some("NVML: GPU is lost"));
        let custom = XidPolicy::parse("13, 79").unwrap();
        assert_eq!(custom.judge(&Symptom::Xid(79)), None);
        assert!(custom.judge(&Symptom::Xid(31)).is_some(), "only the listed XIDs are ignored");
        assert!(XidPolicy::parse("").unwrap().judge(&Symptom::Xid(13)).is_some());
        assert!(XidPolicy::parse("13,x").is_err());
    }

    #[test]
    fn the_fault_file_yields_each_appended_line_once() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        std::fs::write(&path, "0 79\n").unwrap();
        let mut f = FaultFile::open(path.clone());
        assert!(f.poll().is_empty(), "what was there before is history");
        let mut w = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        write!(w, "3 79\n1 ecc\nbad line here\n2 lo").unwrap();
        assert_eq!(f.poll(), vec![(3, Symptom::Xid(79)), (1, Symptom::DoubleBitEcc)]);
        writeln!(w, "st").unwrap();
        assert_eq!(f.poll(), vec![(2, Symptom::Lost("GPU is lost".into()))], "a line completes later");
        assert!(f.poll().is_empty());
        assert!(parse_injection("x 79").is_err() && parse_injection("1").is_err());
    }
}
