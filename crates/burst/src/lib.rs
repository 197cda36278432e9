//! kairos cloud burst: when on-prem GPUs are saturated, run burstable (inference) jobs on
//! cloud GPU instances, within the operator's limits.
//!
//! - `decision`: pure and deterministic — from the cluster state and "now", which instances to
//!   launch and which to terminate, with the reason for each decision; `forecast`, its
//!   look-ahead (burstable work expected beyond free on-prem GPUs).
//! - `provider`: the cloud API (`Cloud`), implemented for EC2 with aws-sdk-ec2 (endpoint
//!   override for tests against moto).
//! - `reconcile`: one round of the leader's reconciler: commits intents before API calls,
//!   adopts instances found by their intent tag, terminates leaks, confirms terminations.
//!
//! The replicated half (configuration, intents, instances, spend) lives in
//! `kairos_scheduler::burst`, so that apply can re-check every limit.

pub mod decision;
pub mod forecast;
pub mod provider;
pub mod reconcile;

pub use decision::{decide, Decision};
pub use provider::{check_instance_types, Cloud, CloudError, CloudInstance, Ec2Cloud, LaunchSpec, TypeInfo};

#[cfg(test)]
mod forecast_tests;
#[cfg(test)]
mod tests;
