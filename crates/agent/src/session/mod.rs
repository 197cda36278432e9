//! The agent's session with the controllers: register (join token or node credential,
//! `credentials`), heartbeat, renew the lease (`step`: one sequence for the agent and the
//! deterministic simulation), follow the assignment stream, deliver run reports (`grpc`), and
//! the controller to try next (`controllers`). `node` takes the node over from a previous
//! agent and keeps it up (fencing, sweeps).

pub mod controllers;
pub mod credentials;
pub mod grpc;
pub mod node;
pub mod step;

pub use controllers::{Controllers, Dial};
pub use credentials::Credentials;
pub use grpc::{deliver_reports, follow_controllers, until_taken, Client, ClientRx, Runs, Session, REFUSED};
pub use node::{keep_up, take_over, KeptUp, Node, TakeOver};
