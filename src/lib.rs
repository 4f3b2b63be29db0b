//! agent-harness: a gRPC service that bridges callers to coding agents speaking ACP.
//!
//! The layout follows the data flow of SPEC §2:
//! - [`domain`]: actions, ids, attachments, ACP frames, queue rules, limits — pure, no I/O;
//! - [`translate`]: channel messages → prompt attachments;
//! - [`config`]: flags, env, config file, runtime profiles;
//! - [`grpc`]: thin tonic services, conversions, the error table, authentication;
//! - [`auth`]: the tokens file (reload, revocation) and TLS settings;
//! - [`app`]: the composition root that wires them and serves;
//! - [`mock_agent`]: `agent-harness mock-agent`, the scripted ACP agent of the `mock` profile;
//! - [`bench`]: `agent-harness bench`, the performance figures of SPEC §14.

pub mod acp;
pub mod app;
pub(crate) mod auth;
pub mod bench;
pub mod config;
pub mod domain;
pub mod fuzzing;
pub(crate) mod grpc;
pub mod mock_agent;
pub mod pb;
pub(crate) mod session;
pub mod store;
pub mod telemetry;
pub(crate) mod translate;
