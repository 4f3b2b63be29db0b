//! The pure domain: actions, ids, attachments, the hidden invocation block, the queue, limits,
//! principals, the error table. No tonic types, no ACP wire format and no I/O, and nothing else of
//! the crate, so every rule here is unit-tested alone.

pub mod action;
pub mod action_id;
pub mod error;
pub mod invocation;
pub mod limits;
pub mod log;
pub mod origin;
pub mod principal;
pub mod queue;
pub mod session;
pub mod text;
pub mod usage;

pub use action::{
    Action, ActionKind, ElicitationAnswer, ElicitationValue, JsonRpcId, PermissionAnswer,
    PromptAction, PromptAttachment,
};
pub use action_id::ActionId;
pub use error::{Error, ErrorCode, Result};
pub use principal::{Principal, PrincipalKind};

/// The current time at the microsecond precision the store keeps, so a time held in memory and
/// the same time read back from the store are equal.
pub fn now() -> std::time::SystemTime {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    std::time::UNIX_EPOCH + std::time::Duration::from_micros(since.as_micros() as u64)
}
