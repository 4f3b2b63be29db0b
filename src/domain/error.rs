//! The one error type of the harness. Every failure a caller can see is an [`Error`] with a stable
//! [`ErrorCode`]; the gRPC layer maps codes to statuses in a single table (`grpc::status`).

use std::{collections::BTreeMap, fmt, sync::Arc};

/// Stable reason codes. Each one travels to clients as `google.rpc.ErrorInfo.reason`, spelled as
/// [`ErrorCode::reason`] returns it; the proto enum `ErrorReason` documents the same list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidArgument,
    LimitExceeded,
    SessionNotFound,
    QueuedActionNotFound,
    ProfileNotFound,
    ModelNotAdvertised,
    ConfigOptionUnknown,
    SessionExists,
    ActionIdConflict,
    RuntimeDisconnected,
    SessionClosed,
    PermissionNotPending,
    ElicitationNotPending,
    PermissionOptionUnknown,
    NotEditable,
    EmptyPrompt,
    QueueFull,
    TooManySessions,
    TooManySubscribers,
    TooManyRuntimes,
    RuntimeStartFailed,
    RuntimeAuthRequired,
    Unauthenticated,
    ContextNotAllowed,
    Forbidden,
    Draining,
    OffsetOutOfRange,
    NotConfigured,
    Unimplemented,
    Internal,
    /// `expect = EXPECT_IDLE` on a session that is not idle with an empty queue.
    SessionBusy,
    /// The agent does not support what was asked, e.g. forking.
    NotSupported,
    /// The store's database cannot be reached right now; nothing was stored, and the
    /// same request may be retried.
    StoreUnavailable,
    /// A request that does not decode: bad protobuf, a string that is not UTF-8, messages
    /// nested too deep. Refused before any handler runs.
    MalformedRequest,
    /// The replica that runs the session cannot be reached or did not answer in time, or the
    /// session is moving between replicas; retryable (a Control with the same action id).
    ReplicaUnavailable,
    /// A write whose outcome is unknown: the answer to its commit (or to a forwarded Control) was
    /// lost and could not be read back. Metadata `action_id`; retry with that action id.
    OutcomeUnknown,
    /// The principal's budget (tokens file) is spent for the current period; nothing was stored.
    BudgetExhausted,
}

impl ErrorCode {
    /// Every code, for tables and tests.
    pub const ALL: [ErrorCode; 37] = [
        Self::InvalidArgument,
        Self::LimitExceeded,
        Self::SessionNotFound,
        Self::QueuedActionNotFound,
        Self::ProfileNotFound,
        Self::ModelNotAdvertised,
        Self::ConfigOptionUnknown,
        Self::SessionExists,
        Self::ActionIdConflict,
        Self::RuntimeDisconnected,
        Self::SessionClosed,
        Self::PermissionNotPending,
        Self::ElicitationNotPending,
        Self::PermissionOptionUnknown,
        Self::NotEditable,
        Self::EmptyPrompt,
        Self::QueueFull,
        Self::TooManySessions,
        Self::TooManySubscribers,
        Self::TooManyRuntimes,
        Self::RuntimeStartFailed,
        Self::RuntimeAuthRequired,
        Self::Unauthenticated,
        Self::ContextNotAllowed,
        Self::Forbidden,
        Self::Draining,
        Self::OffsetOutOfRange,
        Self::NotConfigured,
        Self::Unimplemented,
        Self::Internal,
        Self::SessionBusy,
        Self::NotSupported,
        Self::StoreUnavailable,
        Self::MalformedRequest,
        Self::ReplicaUnavailable,
        Self::OutcomeUnknown,
        Self::BudgetExhausted,
    ];

    /// The `ErrorInfo.reason` string.
    pub fn reason(self) -> &'static str {
        match self {
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::LimitExceeded => "LIMIT_EXCEEDED",
            Self::SessionNotFound => "SESSION_NOT_FOUND",
            Self::QueuedActionNotFound => "QUEUED_ACTION_NOT_FOUND",
            Self::ProfileNotFound => "PROFILE_NOT_FOUND",
            Self::ModelNotAdvertised => "MODEL_NOT_ADVERTISED",
            Self::ConfigOptionUnknown => "CONFIG_OPTION_UNKNOWN",
            Self::SessionExists => "SESSION_EXISTS",
            Self::ActionIdConflict => "ACTION_ID_CONFLICT",
            Self::RuntimeDisconnected => "RUNTIME_DISCONNECTED",
            Self::SessionClosed => "SESSION_CLOSED",
            Self::PermissionNotPending => "PERMISSION_NOT_PENDING",
            Self::ElicitationNotPending => "ELICITATION_NOT_PENDING",
            Self::PermissionOptionUnknown => "PERMISSION_OPTION_UNKNOWN",
            Self::NotEditable => "NOT_EDITABLE",
            Self::EmptyPrompt => "EMPTY_PROMPT",
            Self::QueueFull => "QUEUE_FULL",
            Self::TooManySessions => "TOO_MANY_SESSIONS",
            Self::TooManySubscribers => "TOO_MANY_SUBSCRIBERS",
            Self::TooManyRuntimes => "TOO_MANY_RUNTIMES",
            Self::RuntimeStartFailed => "RUNTIME_START_FAILED",
            Self::RuntimeAuthRequired => "RUNTIME_AUTH_REQUIRED",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::ContextNotAllowed => "CONTEXT_NOT_ALLOWED",
            Self::Forbidden => "FORBIDDEN",
            Self::Draining => "DRAINING",
            Self::OffsetOutOfRange => "OFFSET_OUT_OF_RANGE",
            Self::NotConfigured => "NOT_CONFIGURED",
            Self::Unimplemented => "UNIMPLEMENTED",
            Self::Internal => "INTERNAL",
            Self::SessionBusy => "SESSION_BUSY",
            Self::NotSupported => "NOT_SUPPORTED",
            Self::StoreUnavailable => "STORE_UNAVAILABLE",
            Self::MalformedRequest => "MALFORMED_REQUEST",
            Self::ReplicaUnavailable => "REPLICA_UNAVAILABLE",
            Self::OutcomeUnknown => "OUTCOME_UNKNOWN",
            Self::BudgetExhausted => "BUDGET_EXHAUSTED",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// The underlying cause of an [`Error`], shared so errors stay cheap to clone.
pub type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A failure with its stable code, a message for people, and optional machine-readable metadata
/// (it travels as `ErrorInfo.metadata`). A subsystem's typed error (say `store::StoreError`) is
/// kept as the [`source`](std::error::Error::source), for logs; it never reaches clients.
#[derive(Debug, Clone)]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
    pub metadata: BTreeMap<String, String>,
    pub source: Option<Source>,
}

/// Equal by what a caller sees (code, message, metadata); the source is for diagnosis only.
impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code && self.message == other.message && self.metadata == other.metadata
    }
}

impl Eq for Error {}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            metadata: BTreeMap::new(),
            source: None,
        }
    }

    /// Keeps the error this one stands for, as its source.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Adds one `ErrorInfo.metadata` pair.
    pub fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.metadata.insert(key.to_owned(), value.to_string());
        self
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// A limit of the `[limits]` table was exceeded; names the limit and its maximum.
    pub fn limit(limit: &str, max: impl fmt::Display, what: impl fmt::Display) -> Self {
        Self::new(
            ErrorCode::LimitExceeded,
            format!("{what} exceeds the limit {limit} = {max}"),
        )
        .with("limit", limit)
        .with("max", max)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    pub fn session_not_found(session_id: &str) -> Self {
        Self::new(
            ErrorCode::SessionNotFound,
            format!("session {session_id} not found"),
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
