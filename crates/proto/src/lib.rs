//! Generated protobuf and gRPC types of the `kairos.v1` API.
//!
//! These types stay at the transport edge: the scheduling core never sees them. Conversions to and
//! from domain types live in the server and agent crates, except the policy's and the burst
//! configuration's (`policy`, `burst`, feature `core`), which the controller and the CLI's
//! simulator share.

#![allow(missing_docs)]

#[cfg(feature = "core")]
pub mod burst;
#[cfg(feature = "core")]
pub mod policy;
pub mod units;
pub mod wire;

#[allow(clippy::all)]
pub mod v1 {
    tonic::include_proto!("kairos.v1");

    /// Encoded file descriptor set, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("kairos_descriptor");
}
