//! The one home of the conversions between the `kairos.v1` wire types (`kairos-proto`) and the
//! scheduling core's domain types (`kairos-scheduler`): the wire crate knows nothing of the
//! core, the core nothing of the wire. The controller converts every request and answer here;
//! the CLI's simulator converts the policy and burst files it shares with the controller here.
//!
//! Request conversions validate at the API edge: a field the server cannot honour yet is
//! rejected with `UNIMPLEMENTED` naming the field, never silently dropped.

/// Burst configuration: `kairos burst config apply` and `kairos sim --burst`.
pub mod burst;
/// The burst controller's state as `BurstStatus` answers.
pub mod burst_state;
/// The cluster's event log: node changes and policy audit.
pub mod events;
/// Jobs, nodes, specs and states.
pub mod job;
/// QoS, accounts, partitions, priority weights: `kairos policy apply` and `kairos sim --policy`.
pub mod policy;
/// Reservations.
pub mod reservation;
/// The topology above the nodes and a job's ask of it.
pub mod topology;
