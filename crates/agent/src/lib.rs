//! The kairos node agent: GPU inventory, job processes, and the log service.
//!
//! Owns everything that touches the node: NVML (behind `GpuInventory`), child processes and
//! signals, cgroups and accounts (`Runner`, `cgroup`, `cgroup_limits`, `account`), container
//! images and roots (`image`, `container`), fencing (`fence`), per-run log files (`Logs`), the
//! process log (`audit`), spot interruption notices (`spot`), the session with the controllers
//! (`session`: register, heartbeat, lease), interactive sessions into runs (`interactive`:
//! exec, attach, port forwards, behind grants the controllers seal). Two pure steps: what to
//! do with its runs (`decide`) and what one run is (`launch`: assignment → `RunSpec`). Must
//! not: decide placement or state; it does what the controller's assignment set says and
//! reports what happened.

pub mod account;
pub mod audit;
pub mod cdi;
pub mod cgroup;
pub mod cgroup_limits;
pub mod container;
mod container_child;
pub mod decide;
pub mod fake_usage;
pub mod fence;
pub mod gpu;
pub mod health;
pub mod image;
pub mod interactive;
pub mod isolation;
pub mod jobfs;
pub mod jobmap;
pub mod journal;
pub mod launch;
pub mod logs;
pub mod metrics;
pub mod reaper;
pub mod runner;
pub mod session;
pub mod spot;
pub mod usage;
