//! The pure domain: actions, ids, attachments, ACP frames, the hidden invocation block, the queue,
//! limits, principals. No tonic types and no I/O, so every rule here is unit-tested alone.

pub mod acp_frames;
pub mod action;
pub mod action_id;
pub mod error;
pub mod fold;
pub mod invocation;
pub mod limits;
pub mod log;
pub mod origin;
pub mod principal;
pub mod queue;
pub mod session;

pub use action::{
    Action, ActionKind, ElicitationAnswer, ElicitationValue, JsonRpcId, PermissionAnswer,
    PromptAction, PromptAttachment,
};
pub use action_id::ActionId;
pub use error::{Error, ErrorCode, Result};
pub use principal::{Principal, PrincipalKind};
