//! Code generated from `proto/agent_harness/v1` by `build.rs`, and the encoded descriptor set
//! served by reflection.

#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod v1 {
    tonic::include_proto!("agent_harness.v1");
}

/// The encoded `FileDescriptorSet` of the contract (with imports and comments).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/agent_harness_descriptor.bin"));
