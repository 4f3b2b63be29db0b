//! agent-harness: a gRPC service that bridges callers to coding agents speaking ACP.
//!
//! The layout follows the data flow of SPEC §2:
//! - [`domain`]: actions, ids, attachments, ACP frames, queue rules, limits — pure, no I/O;
//! - [`translate`]: channel messages → prompt attachments;
//! - [`config`]: flags, env, config file, runtime profiles;
//! - [`grpc`]: thin tonic services, conversions, the error table, authentication;
//! - [`auth`]: the tokens file (reload, revocation) and TLS settings;
//! - [`app`]: the composition root that wires them and serves.
//!
//! The scripted mock agent (`agent-harness mock-agent`), the benchmark and the test kit (the
//! shared integration-test harness and the fuzz invariants) are crates of their own under
//! `crates/`, outside this library.

pub mod acp;
pub mod app;
pub mod auth;
pub mod config;
pub mod domain;
pub mod grpc;
pub mod pb;
pub mod session;
pub mod store;
pub mod telemetry;
pub mod translate;
