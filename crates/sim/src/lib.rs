//! kairos sim: replays a job trace through the production scheduling core — the same
//! `ClusterState::apply` and `propose`/`plan` the controllers run — in virtual time, with no IO,
//! deterministic for a seed. Answers "what would this policy do to my workload?" before a
//! policy reaches a real cluster.
//!
//! - `trace`: the Alibaba GPU trace (v2023 CSVs) and a generic JSONL form.
//! - `engine`: the discrete-event replay (arrivals, the leader's passes, modelled agents; with
//!   `engine::burst`, the leader's burst rounds; `engine::estimates`, the start estimates).
//! - `history`: a cluster's own history as a trace (`kairos history --export-trace`), and
//!   `fidelity`: how closely its replay under the policy that ran reproduces what happened.
//! - `cloud`: the simulated cloud burst meets (boot times, spot reclaims, capacity errors).
//! - `report`: the figures, as JSON and as a side-by-side table (with the start estimates'
//!   error against the actual starts).
//! - `plot`: the wait CDFs and GPU allocation over time, as SVG.

pub mod cloud;
pub mod engine;
pub mod fidelity;
pub mod history;
pub mod plot;
pub mod report;
pub mod trace;

pub use engine::{history_jobs, simulate_history, HistoryReplay};
pub use engine::{
    inflate, load_for, offered_load, replay_policy, simulate, simulate_with_series, SimConfig,
    TIME_LIMIT_FACTOR,
};
pub use report::Report;
pub use trace::{TraceJob, TraceNode};
