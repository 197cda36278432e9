//! How runs are isolated on this node: whom they run as, their cgroups and limits, how they
//! see their GPUs, their containers — the node's side of a launch, set once at start.

use std::path::PathBuf;
use std::sync::Arc;

use crate::account::{RunAs, UnixAccounts};
use crate::cgroup::Cgroups;
use crate::cgroup_limits::Limiter;
use crate::gpu::DeviceMap;
use crate::image::ImageCache;

/// Default cap on one run's log file.
pub const LOG_MAX_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// How runs are isolated on this node.
#[derive(Clone, Debug)]
pub struct Isolation {
    pub accounts: UnixAccounts,
    /// None: process groups only (no cgroup could be created).
    pub cgroups: Option<Cgroups>,
    pub log_max_bytes: u64,
    /// The per-run limits this host enforces (cpuset, memory, pids, GPU devices).
    pub limiter: Limiter,
    /// Most processes and threads per run.
    pub pids_max: Option<u64>,
    /// How runs see their GPUs (MIG instances by UUID through their parent's device).
    pub devices: DeviceMap,
    /// Container images (None: this node runs no containers).
    pub images: Option<Arc<ImageCache>>,
    /// Where CDI specs are read from (what a container's GPUs need in it).
    pub cdi_dirs: Vec<PathBuf>,
}

impl Default for Isolation {
    fn default() -> Self {
        Isolation {
            accounts: UnixAccounts::new(RunAs::Agent),
            cgroups: None,
            log_max_bytes: LOG_MAX_BYTES_DEFAULT,
            limiter: Limiter::none(),
            pids_max: None,
            devices: DeviceMap::default(),
            images: None,
            cdi_dirs: Vec::new(),
        }
    }
}

impl Isolation {
    /// What `kairos nodes` shows: "cgroup2,submitter,limits=cpuset+memory+pids+devices",
    /// "pgroup,agent,limits=none", …
    pub fn describe(&self) -> String {
        format!(
            "{},{},limits={}",
            if self.cgroups.is_some() { "cgroup2" } else { "pgroup" },
            self.accounts.run_as.as_str(),
            self.limiter.enforced()
        )
    }
}
