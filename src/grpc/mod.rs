//! The transport: thin tonic services (decode → application call → encode), the conversions
//! module, the error table, authentication, and the assembly of the router.

pub(crate) mod auth;
pub(crate) mod browser;
pub(crate) mod console;
pub(crate) mod convert;
pub(crate) mod forward;
pub(crate) mod frame;
pub(crate) mod gateway;
pub(crate) mod loopback_only;
pub(crate) mod relay;
pub(crate) mod sessions;
pub(crate) mod status;
pub(crate) mod translator;

/// The servers generated a second time with Subscribe streaming [`frame::SubscribeFrame`]
/// (see `build.rs`): `AgentSessionService` is served from here.
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all, dead_code)]
pub(crate) mod framed {
    include!(concat!(env!("OUT_DIR"), "/framed/agent_harness.v1.rs"));
}
