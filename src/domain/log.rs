//! A session's log entries: frames exchanged with the runtime, exactly as sent or
//! received, and harness events. Plain data; the store persists them.

use std::time::SystemTime;

use super::ActionId;

/// Which way a logged frame travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    ToRuntime,
    FromRuntime,
    Event,
}

impl Direction {
    pub fn as_i64(self) -> i64 {
        match self {
            Self::ToRuntime => 1,
            Self::FromRuntime => 2,
            Self::Event => 3,
        }
    }

    pub fn from_i64(value: i64) -> Option<Self> {
        match value {
            1 => Some(Self::ToRuntime),
            2 => Some(Self::FromRuntime),
            3 => Some(Self::Event),
            _ => None,
        }
    }
}

/// One log entry: a frame exchanged with the runtime (its exact JSON text) or a harness event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub offset: u64,
    pub direction: Direction,
    pub json: String,
    pub actor: String,
    pub action_id: Option<ActionId>,
    pub epoch: u32,
    pub created_at: SystemTime,
}
