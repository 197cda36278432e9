//! The kairos scheduling core: cluster state, the commands that change it, and the planner.
//!
//! Architecture invariant: this crate is pure. It never reads the clock, draws random numbers,
//! awaits, spawns or does IO. Time arrives inside each `Command`; the same commands in the same
//! order give a byte-identical `ClusterState` on every replica. Iteration order that can reach a
//! command, a plan or output is always `BTreeMap` order or an explicit sort.
//!
//! - `model`: nodes, GPUs, jobs, events (plain domain types)
//! - `state`: `ClusterState::apply(&Command) -> Outcome`, the replicated state machine
//! - `planner`: `plan(&ClusterState) -> PlanOutput`, placements and pending reasons
//! - `fit`: the one fit check (a node's free GPUs, CPUs and memory vs a task's ask), used by the
//!   planner, apply (`check_grant`) and submit
//! - `policy`: QoS classes and submit rules (replicated, with the shipped defaults)
//! - `priority`: multifactor priority and fairshare (fixed point)
//! - `limits`: QoS usage limits, checked by the planner and again on apply
//! - `validate`: size limits and validity checks shared by the API edge and apply
//! - `topology`: levels above the node (racks, blocks) and what a job asks of them
//! - `burst`: cloud burst configuration, launch intents and instances (applied in `state::burst_apply`)

pub mod burst;
pub mod clock;
pub mod fit;
pub mod guarantee;
pub mod limits;
pub mod liveness;
pub mod model;
pub mod orders;
pub mod planner;
pub mod policy;
pub mod priority;
pub mod propose;
pub mod queue;
pub mod reasons;
pub mod reservation;
pub mod seeded;
pub mod state;
pub mod topology;
pub use state::{brief, burst_apply, events, grant, history, quota, tokens};
pub mod validate;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use model::{
    Allocation, Gpu, GpuIndex, Job, JobEvent, JobId, JobSpec, JobState, Node, NodeInfo, NodeState, Profile,
    StopReason,
};
pub use planner::{
    never_placeable, plan, plan_with, GrowPlan, PendingReason, PlanConfig, PlanOutput, PreemptPlan,
    Reservation,
};
pub use state::{ClusterState, Command, Op, Outcome, Placement, Plan, Rejection, RunExit};
pub use validate::{validate_node, validate_spec, ValidationError};

#[cfg(test)]
mod state_tests;

#[cfg(test)]
mod backfill_tests;
