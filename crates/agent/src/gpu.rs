//! GPU inventory: NVML through nvml-wrapper on machines with NVIDIA's library, or a fake
//! backend with the same interface for laptops and CI.
//!
//! The link group of a GPU approximates its NVLink/PCIe domain: GPUs whose common ancestor is
//! at most a PCIe switch tree (NVML's Internal/Single/Multiple levels) share a group.

use kairos_proto::v1 as pb;
use thiserror::Error;

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
}

/// Real GPUs through NVML.
pub struct NvmlInventory {
    nvml: nvml_wrapper::Nvml,
}

impl NvmlInventory {
    /// Loads NVML; fails where the NVIDIA library is absent.
    pub fn open() -> Result<Self, InventoryError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| InventoryError::NvmlUnavailable(e.to_string()))?;
        Ok(NvmlInventory { nvml })
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
}

/// Made-up GPUs: `count` devices of one model, in link groups of four.
pub struct FakeInventory {
    pub node: String,
    pub count: u32,
    pub model: String,
    pub memory_mib: u64,
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
        Ok(FakeInventory { node: node.to_string(), count, model, memory_mib })
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
