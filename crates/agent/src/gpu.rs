//! GPU inventory: NVML through nvml-wrapper on machines with NVIDIA's library, or a fake
//! backend with the same interface for laptops and CI.
//!
//! The link group of a GPU approximates its NVLink/PCIe domain: GPUs whose common ancestor is
//! at most a PCIe switch tree (NVML's Internal/Single/Multiple levels) share a group.
//!
//! MIG: a GPU in MIG mode is offered only as its instances (never whole). A whole GPU keeps its
//! NVML index; instances are numbered after the last physical GPU (8 GPUs: 8, 9, …), carry their
//! parent's index, and a run sees them by their MIG-… UUIDs (`DeviceMap`). Changing MIG mode or
//! the layout is the operator's job; the agent reads what is there when it starts.

use std::collections::BTreeMap;
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
    #[error("invalid --fake-mig \"{0}\": expected COUNTxPROFILE, e.g. 7x1g.18gb (at most 7)")]
    BadFakeMig(String),
    #[error(
        "invalid --fake-gpu-topology \"{0}\": expected NVLink islands as ranges of GPU indices, e.g. 0-3,4-7, each GPU in exactly one"
    )]
    BadFakeTopology(String),
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

/// Sends the fault of physical GPU `physical` (every MIG instance of it, when it is in MIG mode)
/// when `policy` judges `symptom` fatal.
fn send_fault(
    gpus: &[pb::Gpu],
    physical: u32,
    symptom: &Symptom,
    policy: &XidPolicy,
    tx: &UnboundedSender<GpuFault>,
) {
    let Some(reason) = policy.judge(symptom) else {
        tracing::info!(gpu = physical, ?symptom, "GPU event ignored (an application's error)");
        return;
    };
    let hit: Vec<&pb::Gpu> = gpus.iter().filter(|g| physical_index(g) == physical).collect();
    if hit.is_empty() {
        tracing::warn!(gpu = physical, %reason, "fault of a GPU this node does not have; ignored");
    }
    for gpu in hit {
        tracing::error!(gpu = gpu.index, uuid = %gpu.uuid, %reason, "GPU unhealthy");
        // Closed only when the agent is shutting down: the fault has no one left to tell.
        let _ = tx.send(GpuFault { index: gpu.index, uuid: gpu.uuid.clone(), reason: reason.clone() });
    }
}

/// The NVML index of the GPU `g` is (or is carved from).
fn physical_index(g: &pb::Gpu) -> u32 {
    g.mig_parent.unwrap_or(g.index)
}

/// The physical GPUs behind `gpus`, each once.
fn physical_indices(gpus: &[pb::Gpu]) -> Vec<u32> {
    let mut p: Vec<u32> = gpus.iter().map(physical_index).collect();
    p.sort_unstable();
    p.dedup();
    p
}

/// How a run sees the GPUs it was granted: whole GPUs by index (and their `/dev/nvidiaN`), MIG
/// instances by UUID (and their parent's device).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceMap {
    /// Instance index -> (its MIG UUID, its parent's index).
    mig: BTreeMap<u32, (String, u32)>,
    /// Index -> its memory in MiB (as discovered).
    memory_mib: BTreeMap<u32, u64>,
}

impl DeviceMap {
    pub fn of(gpus: &[pb::Gpu]) -> DeviceMap {
        let mig = gpus.iter().filter_map(|g| Some((g.index, (g.uuid.clone(), g.mig_parent?)))).collect();
        let memory_mib = gpus.iter().map(|g| (g.index, g.memory_mib)).collect();
        DeviceMap { mig, memory_mib }
    }

    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for a run holding `milli` thousandths of the one GPU
    /// `ids` names: its share of that GPU's memory, for the only device the run sees (ordinal
    /// 0). None for whole GPUs, or where the share would be under a MiB.
    pub fn fraction_memory_limit(&self, ids: &[u32], milli: u32) -> Option<String> {
        let [id] = ids else { return None };
        let share = self.memory_mib.get(id)?.saturating_mul(u64::from(milli)) / 1000;
        (milli < 1000 && share > 0).then(|| format!("0={share}M"))
    }

    /// `CUDA_VISIBLE_DEVICES` for `ids`.
    pub fn visible(&self, ids: &[u32]) -> String {
        let one = |i: &u32| self.mig.get(i).map_or_else(|| i.to_string(), |(uuid, _)| uuid.clone());
        ids.iter().map(one).collect::<Vec<_>>().join(",")
    }

    /// The GPU device minors `ids` need opened (sorted, each once).
    pub fn minors(&self, ids: &[u32]) -> Vec<u32> {
        let mut m: Vec<u32> = ids.iter().map(|i| self.mig.get(i).map_or(*i, |(_, p)| *p)).collect();
        m.sort_unstable();
        m.dedup();
        m
    }
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
        let mut next_instance = count;
        for index in 0..count {
            let err = |source| InventoryError::Nvml { index, source };
            let dev = self.nvml.device_by_index(index).map_err(err)?;
            let mut link_group = index;
            for earlier in &gpus {
                let Ok(other) = self.nvml.device_by_index(physical_index(earlier)) else { continue };
                let close = matches!(
                    dev.topology_common_ancestor(other),
                    Ok(TopologyLevel::Internal | TopologyLevel::Single | TopologyLevel::Multiple)
                );
                if close {
                    link_group = earlier.link_group;
                    break;
                }
            }
            // MIG mode on (1): the instances there are, by slot (absent slots skipped).
            if dev.mig_mode().is_ok_and(|m| m.current == 1) {
                for slot in 0..dev.mig_device_count().unwrap_or(0) {
                    let Ok(mig) = dev.mig_device_by_index(slot) else { continue };
                    gpus.push(pb::Gpu {
                        index: next_instance,
                        uuid: mig.uuid().map_err(err)?,
                        model: mig.name().map_err(err)?,
                        memory_mib: mig.memory_info().map_err(err)?.total / (1024 * 1024),
                        link_group,
                        mig_parent: Some(index),
                    });
                    next_instance += 1;
                }
                continue;
            }
            gpus.push(pb::Gpu {
                index,
                uuid: dev.uuid().map_err(err)?,
                model: dev.name().map_err(err)?,
                memory_mib: dev.memory_info().map_err(err)?.total / (1024 * 1024),
                link_group,
                mig_parent: None,
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
    for index in physical_indices(gpus) {
        let (Some(s), Ok(dev)) = (set.take(), nvml.device_by_index(index)) else { continue };
        let types = dev.supported_event_types().map(|t| t & wanted).unwrap_or(wanted);
        match dev.register_events(types, s) {
            Ok(s) => {
                tracing::info!(gpu = index, events = ?types, "GPU health events registered");
                set = Some(s);
            }
            Err(e) => {
                // The set is released on failure: a fresh one for the other GPUs.
                tracing::warn!(gpu = index, error = %e, "GPU health events not available; queries only");
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
            for index in physical_indices(gpus) {
                let symptom = match nvml.device_by_index(index).and_then(|d| d.uuid().map(|_| d)) {
                    Err(e) => Some(Symptom::Lost(e.to_string())),
                    Ok(d) => {
                        d.are_pages_pending_retired().ok().filter(|p| *p).map(|_| Symptom::PendingRetirement)
                    }
                };
                if let Some(s) = symptom {
                    send_fault(gpus, index, &s, policy, tx);
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
    /// appended is one (`crate::health::parse_injection`), naming a physical GPU.
    pub faults: Option<PathBuf>,
    /// Every GPU in MIG mode with this layout (`--fake-mig`).
    pub mig: Option<FakeMig>,
    /// What the GPUs are doing, set by an operator's file (`--fake-gpu-usage`).
    pub usage: Option<crate::fake_usage::FakeUsageFile>,
    /// Each GPU's NVLink island (`--fake-gpu-topology`); none: groups of four.
    pub link_groups: Option<Vec<u32>>,
}

/// Parses `--fake-gpu-topology`: islands as ranges or single indices, separated by commas
/// (`0-3,4-7`; `0-1,2-3,4-7`), covering GPUs 0..count each exactly once. Island k is link
/// group k.
pub fn parse_fake_topology(spec: &str, count: u32) -> Result<Vec<u32>, InventoryError> {
    let bad = || InventoryError::BadFakeTopology(spec.chars().take(64).collect());
    let mut groups: Vec<Option<u32>> = vec![None; count as usize];
    for (island, part) in spec.split(',').enumerate() {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
        if a > b || b >= count {
            return Err(bad());
        }
        for g in a..=b {
            if groups[g as usize].replace(island as u32).is_some() {
                return Err(bad());
            }
        }
    }
    groups.into_iter().collect::<Option<Vec<u32>>>().ok_or_else(bad)
}

/// A MIG layout of the fake backend: `count` instances of one profile per GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeMig {
    pub count: u32,
    /// E.g. "1g.18gb".
    pub profile: String,
    pub memory_mib: u64,
}

impl FakeMig {
    /// Parses `COUNTxPROFILE`, e.g. `7x1g.18gb` (a GPU has at most 7 instances; the memory is
    /// the number before "gb").
    pub fn parse(spec: &str) -> Result<FakeMig, InventoryError> {
        let bad = || InventoryError::BadFakeMig(spec.chars().take(64).collect());
        let (count, profile) = spec.split_once('x').ok_or_else(bad)?;
        let count: u32 = count.parse().map_err(|_| bad())?;
        let (slices, mem) = profile.split_once('.').ok_or_else(bad)?;
        let slices_ok =
            slices.strip_suffix('g').is_some_and(|n| n.parse::<u32>().is_ok_and(|n| (1..=7).contains(&n)));
        let gb: u64 = mem.strip_suffix("gb").and_then(|g| g.parse().ok()).ok_or_else(bad)?;
        if !(1..=7).contains(&count) || !slices_ok {
            return Err(bad());
        }
        Ok(FakeMig { count, profile: profile.to_string(), memory_mib: gb * 1024 })
    }
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
        Ok(FakeInventory {
            node: node.to_string(),
            count,
            model,
            memory_mib,
            faults: None,
            mig: None,
            usage: None,
            link_groups: None,
        })
    }
}

impl FakeInventory {
    /// The NVLink island of physical GPU `index`.
    fn link_group(&self, index: u32) -> u32 {
        self.link_groups.as_ref().and_then(|g| g.get(index as usize).copied()).unwrap_or(index / 4)
    }
}

impl GpuInventory for FakeInventory {
    fn backend(&self) -> &'static str {
        "fake"
    }

    /// What the control file says of each GPU the node offers (none without a file).
    fn usage(&self) -> Vec<GpuUsage> {
        let Some(file) = &self.usage else { return Vec::new() };
        let levels = file.levels();
        let gpus = self.discover().unwrap_or_default();
        gpus.iter()
            .map(|g| {
                let (util, mem) = levels.get(&g.index).copied().unwrap_or((0, 0));
                GpuUsage {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    utilization: f64::from(util) / 100.0,
                    memory_used_bytes: mem << 20,
                    memory_total_bytes: g.memory_mib << 20,
                }
            })
            .collect()
    }

    fn discover(&self) -> Result<Vec<pb::Gpu>, InventoryError> {
        let whole = |index| pb::Gpu {
            index,
            uuid: format!("GPU-fake-{}-{index}", self.node),
            model: self.model.clone(),
            memory_mib: self.memory_mib,
            link_group: self.link_group(index),
            mig_parent: None,
        };
        let Some(mig) = &self.mig else { return Ok((0..self.count).map(whole).collect()) };
        // Instances are numbered after the physical GPUs, as the NVML backend numbers them.
        let instances = (0..self.count).flat_map(|parent| (0..mig.count).map(move |slot| (parent, slot)));
        Ok(instances
            .enumerate()
            .map(|(k, (parent, slot))| pb::Gpu {
                index: self.count + k as u32,
                uuid: format!("MIG-fake-{}-{parent}-{slot}", self.node),
                model: format!("{} MIG {}", self.model, mig.profile),
                memory_mib: mig.memory_mib,
                link_group: self.link_group(parent),
                mig_parent: Some(parent),
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
    fn fake_topology_names_islands_and_a_gpu_in_two_or_none_is_refused() {
        let mut f = FakeInventory::parse("n", "8", "H100", 1).unwrap();
        f.link_groups = Some(parse_fake_topology("0-1,2-3,4-7", 8).unwrap());
        let groups: Vec<u32> = f.discover().unwrap().iter().map(|g| g.link_group).collect();
        assert_eq!(groups, [0, 0, 1, 1, 2, 2, 2, 2]);
        for bad in ["0-3,3-7", "0-3", "0-8", "3-0", "a-b", ""] {
            assert!(parse_fake_topology(bad, 8).is_err(), "{bad} accepted");
        }
    }

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

    #[test]
    fn a_fake_mig_layout_offers_instances_only_seen_by_uuid_through_their_parent_device() {
        let mut f = FakeInventory::parse("n", "2xH200", "H100", 1).unwrap();
        f.mig = Some(FakeMig::parse("3x2g.35gb").unwrap());
        let gpus = f.discover().unwrap();
        assert_eq!(gpus.iter().map(|g| g.index).collect::<Vec<_>>(), vec![2, 3, 4, 5, 6, 7]);
        assert!(gpus.iter().all(|g| g.model == "H200 MIG 2g.35gb" && g.memory_mib == 35 * 1024));
        assert_eq!(gpus[4].mig_parent, Some(1));
        let map = DeviceMap::of(&gpus);
        assert_eq!(map.visible(&[3, 5]), "MIG-fake-n-0-1,MIG-fake-n-1-0");
        assert_eq!(map.minors(&[2, 3, 5]), vec![0, 1]);
        // Whole GPUs are seen by index, as before.
        let whole = DeviceMap::of(&FakeInventory::parse("n", "2", "H100", 1).unwrap().discover().unwrap());
        assert_eq!((whole.visible(&[1, 0]).as_str(), whole.minors(&[1, 0])), ("1,0", vec![0, 1]));
        // A fraction's memory share, of the one GPU (or instance) it is on.
        assert_eq!(map.fraction_memory_limit(&[3], 250).as_deref(), Some("0=8960M"));
        assert_eq!(map.fraction_memory_limit(&[3], 0), None, "a whole GPU is not limited");
        assert_eq!(map.fraction_memory_limit(&[2, 3], 250), None);
        assert_eq!(whole.fraction_memory_limit(&[1], 500), None, "1 MiB GPUs: no share");
        for bad in ["7", "8x1g.18gb", "0x1g.18gb", "7x1g", "7xbig.18gb", "x1g.5gb", "7x9g.5gb"] {
            assert!(FakeMig::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn a_fault_of_a_gpu_in_mig_mode_takes_out_every_instance_of_it() {
        let mut f = FakeInventory::parse("n", "2", "H100", 1).unwrap();
        f.mig = Some(FakeMig::parse("2x3g.40gb").unwrap());
        let gpus = f.discover().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        send_fault(&gpus, 1, &Symptom::Xid(79), &XidPolicy::default(), &tx);
        send_fault(&gpus, 0, &Symptom::Xid(13), &XidPolicy::default(), &tx);
        let mut got = Vec::new();
        while let Ok(f) = rx.try_recv() {
            got.push((f.index, f.uuid, f.reason));
        }
        assert_eq!(
            got,
            vec![
                (4, "MIG-fake-n-1-0".into(), "XID 79".into()),
                (5, "MIG-fake-n-1-1".into(), "XID 79".into())
            ]
        );
    }
}
