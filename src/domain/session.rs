//! The agent session record and its status.

use std::{collections::BTreeMap, time::SystemTime};

use uuid::Uuid;

/// Where a session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionStatus {
    Starting,
    Idle,
    Running,
    AwaitingInput,
    Suspended,
    Disconnected,
    Closed,
}

impl SessionStatus {
    pub const ALL: [SessionStatus; 7] = [
        Self::Starting,
        Self::Idle,
        Self::Running,
        Self::AwaitingInput,
        Self::Suspended,
        Self::Disconnected,
        Self::Closed,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Idle => "idle",
            Self::Running => "running",
            Self::AwaitingInput => "awaiting_input",
            Self::Suspended => "suspended",
            Self::Disconnected => "disconnected",
            Self::Closed => "closed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }

    /// Whether a runtime process belongs to the session in this status.
    pub fn has_runtime(self) -> bool {
        matches!(
            self,
            Self::Starting | Self::Idle | Self::Running | Self::AwaitingInput
        )
    }
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub id: Uuid,
    pub name: String,
    pub owner: String,
    pub profile: String,
    pub cwd: String,
    pub model: String,
    pub acp_session_id: String,
    pub status: SessionStatus,
    pub status_reason: String,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
    pub labels: BTreeMap<String, String>,
    pub profile_fingerprint: String,
    pub editors: Vec<String>,
    /// A digest of the creating request, so an idempotent retry is recognised.
    pub request_fingerprint: String,
    /// Whether the runtime advertised `session/resume` / `session/load` (how to reopen).
    pub can_resume: bool,
    pub can_load: bool,
    /// The action id of the prompt given at creation, if any: an idempotent CreateSession retry
    /// answers with it. Set once, when the session is stored.
    pub first_action_id: Option<crate::domain::ActionId>,
    /// The agent's HOME of a sandboxed session, chosen when it was created and kept for its
    /// life (a changed `sandbox.homes_dir` leaves it where its agent's files are). Set once,
    /// when the session is stored; `None` for unboxed sessions and those stored before HOMEs
    /// were per owner.
    pub home: Option<String>,
}

impl SessionRecord {
    pub fn id_string(&self) -> String {
        self.id.hyphenated().to_string()
    }
}
