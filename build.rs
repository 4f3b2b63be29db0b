//! Compiles the gRPC contract in `proto/` with `protox` (pure Rust, so no `protoc` is needed) and
//! embeds the encoded descriptor set for server reflection.

use std::{env, fs, io, path::PathBuf};

use prost::Message;

fn main() -> io::Result<()> {
    let proto_root = PathBuf::from("proto");
    let package_dir = proto_root.join("agent_harness/v1");
    println!("cargo:rerun-if-changed={}", proto_root.display());

    let mut files: Vec<PathBuf> = fs::read_dir(&package_dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<io::Result<_>>()?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "proto"));
    files.sort();

    let descriptors = protox::Compiler::new([&proto_root])
        .map_err(io::Error::other)?
        .include_source_info(true)
        .include_imports(true)
        .open_files(&files)
        .map_err(io::Error::other)?
        .file_descriptor_set();

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    fs::write(
        out_dir.join("agent_harness_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // No `Client::connect(dst)` constructors: the gateway RPC is itself named `Connect`, so
        // clients are built with `Client::new(channel)`.
        .build_transport(false)
        .compile_fds(descriptors.clone())?;

    // The servers once more, into `OUT_DIR/framed`, with one type swapped: Subscribe streams
    // `SubscribeFrame`, which writes a log entry's encoding shared by every subscriber (docs/benchmarks.md:
    // encode each event once for all of them). Every other type is the one generated above.
    let framed = out_dir.join("framed");
    fs::create_dir_all(&framed)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .build_transport(false)
        .out_dir(&framed)
        .extern_path(".agent_harness.v1", "crate::pb::v1")
        .extern_path(
            ".agent_harness.v1.SubscribeResponse",
            "crate::grpc::frame::SubscribeFrame",
        )
        .compile_fds(descriptors)
}
