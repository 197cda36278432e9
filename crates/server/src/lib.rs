//! kairosd as a library: the controller's services, its leader and burst loops, and the API
//! edge (validation, authentication, rate limits, forwarding), so that tests and the
//! deterministic simulation can use what the daemon runs. `main.rs` parses the flags and wires
//! these together.

pub mod admin;
pub mod agents;
pub mod assignments;
pub mod auth;
pub mod batch;
pub mod burst;
pub mod connlimit;
pub mod context;
/// pb ⇄ domain conversions: their one home is the `kairos-convert` crate.
pub use kairos_convert::{burst_state as convert_burst, job as convert};
pub mod daemon;
pub mod forward;
pub mod gateway;
pub mod health;
pub mod jobs;
pub mod leader;
pub mod memory;
pub mod metrics;
pub mod ratelimit;
pub mod reservations;
pub mod sessions;
pub mod status;
