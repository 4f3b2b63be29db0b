//! The transport: thin tonic services (decode → application call → encode), the conversions
//! module, the error table, authentication, and the assembly of the router.

pub mod auth;
pub mod convert;
pub mod gateway;
pub mod sessions;
pub mod status;
pub mod translator;
