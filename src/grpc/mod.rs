//! The transport: thin tonic services (decode → application call → encode), the conversions
//! module, the error table, authentication, and the assembly of the router.

pub(crate) mod auth;
pub(crate) mod browser;
pub(crate) mod console;
pub(crate) mod convert;
pub(crate) mod forward;
pub(crate) mod gateway;
pub(crate) mod relay;
pub(crate) mod sessions;
pub(crate) mod status;
pub(crate) mod translator;
