//! GPU inventory: NVML through nvml-wrapper on machines with NVIDIA's library, or a fake
//! backend with the same interface for laptops and CI.
//!
//! The link group of a GPU approximates its NVLink/PCIe domain: GPUs whose common ancestor is
//! at most a PCIe switch tree (NVML's Internal/Single/Multiple levels) share a group.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kairos_proto::v1 as pb;
use thiserror::Error;
use tokio::sync::mpsc::UnboundedSender;

use crate::health::{FaultFile, GpuFault, Symptom, XidPolicy};

#[derive(Debug, Error)]
pub enum InventoryError {
    #[error("NVML is not available: {0}")]
    NvmlUnavailable(String),
    #[error("querying GPU {index} through NVML: {source}")]
    Nvml { index: u32, source: nvml_wrapper::error::NvmlError },
    #[error("invalid --fake-gpus \"{0}\": expected COUNT or COUNTxMODEL, e.g. 8 or 8xH100")]
    BadFakeSpec(String),
}

/// What one GPU is doing now (for the agent's metrics).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuUsage {
    pub index: u32,
    pub uuid: String,
    /// Share of the last sample period a kernel ran, 0..=1.
    pub utilization: f64,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
}

/// Where a node's GPUs come from.
pub trait GpuInventory: Send + Sync {
    /// The backend's name, reported to the controller ("nvml" or "fake").
    fn backend(&self) -> &'static str;
    fn discover(&self) -> Result<Vec<pb::Gpu>, InventoryError>;
    /// Per-GPU utilisation and memory, where the backend measures them (fake GPUs do not).
    fn usage(&self) -> Vec<GpuUsage> {
        Vec::new()
    }
    /// Starts watching the GPUs' health: every fault `policy` judges fatal is sent on `tx`
    /// (a GPU that keeps failing its queries is sent again at each check).
    fn watch_health(&self, gpus: Vec<pb::Gpu>, policy: XidPolicy, tx: UnboundedSender<GpuFault>);
}

/// How often the health watcher queries every GPU (NVML) or reads the fault file (fake).
const HEALTH_QUERY_EVERY: Duration = Duration::from_secs(10);
const FAULT_FILE_POLL: Duration = Duration::from_millis(200);

/// Sends the fault of GPU `index` (by its discovered UUID) when `policy` judges `symptom` fatal;
/// false when no one listens any more.
fn send_fault(
    gpus: &[pb::Gpu],
    index: u32,
    symptom: &Symptom,
    policy: &XidPolicy,
    tx: &UnboundedSender<GpuFault>,
) -> bool {
    let Some(reason) = policy.judge(symptom) else {
        tracing::info!(gpu = index, ?symptom, "GPU event ignored (an application's error)");
        return true;
    };
    let Some(gpu) = gpus.iter().find(|g| g.index == index) else {
        tracing::warn!(gpu = index, %reason, "fault of a GPU this node does not have; ignored");
        return true;
    };
    tracing::error!(gpu = index, uuid = %gpu.uuid, %reason, "GPU unhealthy");
    tx.send(GpuFault { index, uuid: gpu.uuid.clone(), reason }).is_ok()
}

/// Real GPUs through NVML.
pub struct NvmlInventory {
    nvml: Arc<nvml_wrapper::Nvml>,
}

impl NvmlInventory {
    /// Loads NVML; fails where the NVIDIA library is absent.
    pub fn open() -> Result<Self, InventoryError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| InventoryError::NvmlUnavailable(e.to_string()))?;
        Ok(NvmlInventory { nvml: Arc::new(nvml) })
    }

    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }
}

impl GpuInventory for NvmlInventory {
    fn backend(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Vec<pb::Gpu>, InventoryError> {
        use nvml_wrapper::enum_wrappers::device::TopologyLevel;
        let count = self.nvml.device_count().map_err(|e| InventoryError::Nvml { index: 0, source: e })?;
        let mut gpus: Vec<pb::Gpu> = Vec::new();
        for index in 0..count {
            let err = |source| InventoryError::Nvml { index, source };
            let dev = self.nvml.device_by_index(index).map_err(err)?;
            let mut link_group = index;
            for earlier in &gpus {
                let Ok(other) = self.nvml.device_by_index(earlier.index) else { continue };
                let close = matches!(
                    dev.topology_common_ancestor(other),
                    Ok(TopologyLevel::Internal | TopologyLevel::Single | TopologyLevel::Multiple)
                );
                if close {
                    link_group = earlier.link_group;
                    break;
                }
            }
            gpus.push(pb::Gpu {
                index,
                uuid: dev.uuid().map_err(err)?,
                model: dev.name().map_err(err)?,
                memory_mib: dev.memory_info().map_err(err)?.total / (1024 * 1024),
                link_group,
            });
        }
        Ok(gpus)
    }

    fn usage(&self) -> Vec<GpuUsage> {
        let count = self.nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|index| {
                let dev = self.nvml.device_by_index(index).ok()?;
                let memory = dev.memory_info().ok()?;
                Some(GpuUsage {
                    index,
                    uuid: dev.uuid().ok()?,
                    utilization: f64::from(dev.utilization_rates().ok()?.gpu) / 100.0,
                    memory_used_bytes: memory.used,
                    memory_total_bytes: memory.total,
                })
            })
            .collect()
    }

    fn watch_health(&self, gpus: Vec<pb::Gpu>, policy: XidPolicy, tx: UnboundedSender<GpuFault>) {
        let nvml = Arc::clone(&self.nvml);
        let spawned = std::thread::Builder::new()
            .name("gpu-health".into())
            .spawn(move || nvml_health_loop(&nvml, &gpus, &policy, &tx));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "GPU health watcher not started");
        }
    }
}

/// NVML's event set (critical XIDs, double-bit ECC errors) on every GPU that supports it, and a
/// query of every GPU each `HEALTH_QUERY_EVERY` (lost, retired pages pending).
fn nvml_health_loop(
    nvml: &nvml_wrapper::Nvml,
    gpus: &[pb::Gpu],
    policy: &XidPolicy,
    tx: &UnboundedSender<GpuFault>,
) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mut set = nvml.create_event_set().ok();
    for g in gpus {
        let (Some(s), Ok(dev)) = (set.take(), nvml.device_by_index(g.index)) else { continue };
        let types = dev.supported_event_types().map(|t| t & wanted).unwrap_or(wanted);
        match dev.register_events(types, s) {
            Ok(s) => {
                tracing::info!(gpu = g.index, events = ?types, "GPU health events registered");
                set = Some(s);
            }
            Err(e) => {
                // The set is released on failure: a fresh one for the other GPUs.
                tracing::warn!(gpu = g.index, error = %e, "GPU health events not available; queries only");
                set = nvml.create_event_set().ok();
            }
        }
    }
    let mut last_query = std::time::Instant::now() - HEALTH_QUERY_EVERY;
    loop {
        if tx.is_closed() {
            return;
        }
        if last_query.elapsed() >= HEALTH_QUERY_EVERY {
            last_query = std::time::Instant::now();
            for g in gpus {
                let symptom = match nvml.device_by_index(g.index).and_then(|d| d.uuid().map(|_| d)) {
                    Err(e) => Some(Symptom::Lost(e.to_string())),
                    Ok(d) => {
                        d.are_pages_pending_retired().ok().filter(|p| *p).map(|_| Symptom::PendingRetirement)
                    }
                };
                if let Some(s) = symptom {
                    send_fault(gpus, g.index, &s, policy, tx);
                }
            }
        }
        let Some(s) = set.as_ref() else {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        };
        match s.wait(1000) {
            Ok(ev) => {
                let Ok(index) = ev.device.index() else { continue };
                let symptom = if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    Symptom::DoubleBitEcc
                } else {
                    match ev.event_data {
                        Some(XidError::Value(x)) => Symptom::Xid(x),
                        // An XID NVML could not name: treated as fatal, as the device plugin does.
                        _ => Symptom::Xid(u64::MAX),
                    }
                };
                send_fault(gpus, index, &symptom, policy, tx);
            }
            Err(nvml_wrapper::error::NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!(error = %e, "waiting for GPU events failed");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// Made-up GPUs: `count` devices of one model, in link groups of four.
pub struct FakeInventory {
    pub node: String,
    pub count: u32,
    pub model: String,
    pub memory_mib: u64,
    /// Where faults are injected at run time (`kairos-agent --fake-gpu-faults`): each line
    /// appended is one (`crate::health::parse_injection`).
    pub faults: Option<PathBuf>,
}

impl FakeInventory {
    /// Parses `COUNT` or `COUNTxMODEL` (e.g. `8xH100`).
    pub fn parse(
        node: &str,
        spec: &str,
        default_model: &str,
        memory_mib: u64,
    ) -> Result<Self, InventoryError> {
        let bad = || InventoryError::BadFakeSpec(spec.chars().take(64).collect());
        let (count, model) = match spec.split_once(['x', 'X']) {
            Some((c, m)) if !m.is_empty() => (c, m.to_string()),
            Some(_) => return Err(bad()),
            None => (spec, default_model.to_string()),
        };
        let count: u32 = count.parse().map_err(|_| bad())?;
        if count > 64 {
            return Err(bad());
        }
        Ok(FakeInventory { node: node.to_string(), count, model, memory_mib, faults: None })
    }
}

impl GpuInventory for FakeInventory {
    fn backend(&self) -> &'static str {
        "fake"
    }

    fn discover(&self) -> Result<Vec<pb::Gpu>, InventoryError> {
        Ok((0..self.count)
            .map(|index| pb::Gpu {
                index,
                uuid: format!("GPU-fake-{}-{index}", self.node),
                model: self.model.clone(),
                memory_mib: self.memory_mib,
                link_group: index / 4,
            })
            .collect())
    }

    fn watch_health(&self, gpus: Vec<pb::Gpu>, policy: XidPolicy, tx: UnboundedSender<GpuFault>) {
        let Some(path) = self.faults.clone() else { return };
        tracing::info!(file = %path.display(), "fake GPU faults are read from this file");
        let mut file = FaultFile::open(path);
        tokio::spawn(async move {
            while !tx.is_closed() {
                for (index, symptom) in file.poll() {
                    send_fault(&gpus, index, &symptom, &policy, &tx);
                }
                tokio::time::sleep(FAULT_FILE_POLL).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_spec_parses_count_and_model() {
        let f = FakeInventory::parse("n", "8xA100", "H100", 1).unwrap();
        assert_eq!((f.count, f.model.as_str()), (8, "A100"));
        let gpus = f.discover().unwrap();
        assert_eq!(gpus.iter().map(|g| g.link_group).collect::<Vec<_>>(), vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(FakeInventory::parse("n", "2", "H100", 1).unwrap().model, "H100");
        for bad in ["", "x", "eight", "8x", "65", "-1"] {
            assert!(FakeInventory::parse("n", bad, "H100", 1).is_err(), "{bad} accepted");
        }
    }
}
