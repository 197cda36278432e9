//! Generated protobuf and gRPC types of the `kairos.v1` API.
//!
//! These types stay at the transport edge: the scheduling core never sees them, and this crate
//! knows nothing of the core. Conversions to and from the core's types live in `kairos-convert`;
//! the agent converts an assignment into its own run spec (`kairos_agent::launch`).

#![allow(missing_docs)]

pub mod grant;
pub mod units;
pub mod wire;

#[allow(clippy::all)]
pub mod v1 {
    tonic::include_proto!("kairos.v1");

    /// Encoded file descriptor set, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("kairos_descriptor");
}
