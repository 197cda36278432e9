//! Generated protobuf and gRPC types of the `kairos.v1` API.
//!
//! These types stay at the transport edge: the scheduling core never sees them. Conversions to and
//! from domain types live in the server and agent crates.

#![allow(missing_docs)]

pub mod wire;

#[allow(clippy::all)]
pub mod v1 {
    tonic::include_proto!("kairos.v1");

    /// Encoded file descriptor set, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("kairos_descriptor");
}
