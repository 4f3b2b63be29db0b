//! agent-harness: a gRPC service that bridges callers to coding agents speaking ACP.
//!
//! The layout follows the data flow (docs/design.md), in layers that point one way (`tests/layers.rs`
//! enforces it): transport → engine → runtime transport and storage → domain.
//! - transport: `grpc` (thin tonic services, proto ↔ engine conversions, the error table,
//!   authentication) and `auth` (the tokens file, TLS settings);
//! - engine: `session` — one actor per session, the registry, Subscribe streams; it defines its
//!   own inputs, profiles, options and metrics, and never sees proto types;
//! - runtime transport: [`acp`] — runtime processes, the JSON-RPC line connection, the ACP wire
//!   format ([`acp::frames`]) and the fold of a logged session into a transcript ([`acp::fold`]);
//! - storage: [`store`] — the `Store` trait and its implementations;
//! - [`domain`]: actions, ids, queue rules, limits, principals, the error type — pure, no I/O,
//!   importing nothing else of the crate;
//! - [`cli`]: the people's subcommands (`sessions`, `prompt`, `follow`, …), a gRPC client of
//!   the service that uses only [`pb`];
//! - beside them: `translate` (channel messages → prompt attachments), [`config`] (flags, env,
//!   config file: it only assembles each subsystem's options), [`telemetry`] (metrics endpoint,
//!   logging), and [`app`], the composition root that wires everything and serves.
//!
//! The public surface is what the binary, the integration tests, the fuzz targets and the
//! benchmark need: [`app`] (start, drain, stop a server), [`config`] (`ServeConfig`, the config
//! file, profiles), [`pb`] (the generated gRPC types), [`domain`], [`acp`] (frames, fold,
//! connection reading), [`store`] and [`telemetry::init_logging`]. `auth`, `grpc`, `session` and
//! `translate` are private to the crate, so the dead-code lint sees everything in them.
//!
//! The scripted mock agent (`agent-harness mock-agent`), the benchmark and the test kit (the
//! shared integration-test harness and the fuzz invariants) are crates of their own under
//! `crates/`, outside this library.

pub mod acp;
pub mod app;
pub(crate) mod auth;
pub mod backup;
pub mod bridge;
pub mod cli;
pub mod config;
pub mod domain;
pub(crate) mod grpc;
pub mod model_proxy;
pub(crate) mod net;
pub mod pb;
pub(crate) mod session;
pub mod store;
pub mod telemetry;
pub(crate) mod translate;
