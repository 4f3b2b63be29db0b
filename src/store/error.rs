//! The store's own errors: typed, with their sources, turned into the domain [`Error`] in one
//! place (the `From` impl below), so the gRPC layer keeps its single table.

use uuid::Uuid;

use crate::domain::{Error, ErrorCode};

/// Any underlying cause, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A storage failure. Every variant's message says what the store was doing; the cause is kept
/// as the source (and travels on as the domain error's source, for logs).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached now: a refused, lost or timed-out connection, or no free
    /// connection in time. Nothing was stored; the caller may retry.
    #[error("{message}")]
    Unavailable {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    /// Stored data that cannot be read back as what it should be.
    #[error("{message}")]
    Corrupt {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    /// A batch or record the store refuses because it breaks the store's rules (offsets not
    /// dense, a record for another session): a fault of the writer, nothing stored.
    #[error("{message}")]
    Refused { message: String },
    /// The stored schema is one this build cannot use, or migrating it failed.
    #[error("{message}")]
    Schema {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    /// The store is closed, or its writer has stopped.
    #[error("{message}")]
    Closed { message: String },
    /// Bad settings: a database URL, a TLS option, a schema name.
    #[error("{message}")]
    Config {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    /// SQLite failed.
    #[error("{message}")]
    Sqlite {
        message: String,
        #[source]
        source: rusqlite::Error,
    },
    /// PostgreSQL answered with an error (the connection is fine).
    #[error("{message}")]
    Postgres {
        message: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A thread or task of the store failed.
    #[error("{message}")]
    Task {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
}

/// Why [`super::Store::commit`] stored nothing. Fencing is its own variant, not a flag on an
/// error: the writer must react to it (stop its actor, never write for the session again),
/// while every other failure is reported and retried like any store error.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The batch's fence is no longer the session's current one: another replica has claimed
    /// the session (docs/design.md, fencing).
    #[error("session {session_id}: write fenced off (fence {fence}, current {})", current.map_or_else(|| "none".to_owned(), |c| c.to_string()))]
    Fenced {
        session_id: Uuid,
        fence: u64,
        /// The session's current fence (`None`: never leased).
        current: Option<u64>,
    },
    /// The batch was sent to be committed and the answer was lost — the connection dropped, or
    /// no answer came in time, after `COMMIT` was sent: it may or may not be stored. The writer
    /// reads back before it assumes either (see [`super::landed`]). As an [`Error`] it is
    /// OUTCOME_UNKNOWN.
    #[error("{message}")]
    Ambiguous {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    /// Anything else, and nothing of the batch was stored (unreachable database, a batch the
    /// store refuses, an unknown session...).
    #[error(transparent)]
    Failed(#[from] Error),
}

impl From<StoreError> for CommitError {
    fn from(error: StoreError) -> Self {
        Self::Failed(error.into())
    }
}

/// What callers of a fenced write see: an internal error (the transport never sees a fenced
/// write as anything else), with no marker in its metadata.
impl From<CommitError> for Error {
    fn from(error: CommitError) -> Self {
        match error {
            CommitError::Failed(error) => error,
            fenced @ CommitError::Fenced { .. } => {
                Error::new(ErrorCode::Internal, fenced.to_string()).with_source(fenced)
            }
            ambiguous @ CommitError::Ambiguous { .. } => {
                Error::new(ErrorCode::OutcomeUnknown, ambiguous.to_string()).with_source(ambiguous)
            }
        }
    }
}

impl CommitError {
    pub fn ambiguous(message: impl Into<String>, source: Option<BoxError>) -> Self {
        Self::Ambiguous {
            message: message.into(),
            source,
        }
    }
}

impl StoreError {
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    pub fn corrupt(message: impl Into<String>) -> Self {
        Self::Corrupt {
            message: message.into(),
            source: None,
        }
    }

    pub fn refused(message: impl Into<String>) -> Self {
        Self::Refused {
            message: message.into(),
        }
    }

    pub fn schema(message: impl Into<String>) -> Self {
        Self::Schema {
            message: message.into(),
            source: None,
        }
    }

    pub fn closed(message: impl Into<String>) -> Self {
        Self::Closed {
            message: message.into(),
        }
    }

    pub fn config(message: impl Into<String>) -> Self {
        Self::Config {
            message: message.into(),
            source: None,
        }
    }

    pub fn task(message: impl Into<String>) -> Self {
        Self::Task {
            message: message.into(),
            source: None,
        }
    }

    /// The reason code callers see: STORE_UNAVAILABLE (retry) when the database could not be
    /// reached or refused for a reason of its own — full, read-only, shutting down, a lock or
    /// serialization conflict, a trigger that raised — none of which is the caller's fault or a
    /// fault of the harness; INTERNAL for the rest.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Unavailable { .. } => ErrorCode::StoreUnavailable,
            Self::Postgres { source, .. } if super::postgres::is_operational(source) => {
                ErrorCode::StoreUnavailable
            }
            Self::Sqlite { source, .. } if super::sqlite::is_operational(source) => {
                ErrorCode::StoreUnavailable
            }
            _ => ErrorCode::Internal,
        }
    }
}

impl From<StoreError> for Error {
    fn from(error: StoreError) -> Self {
        Error::new(error.code(), error.to_string()).with_source(error)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn an_unreachable_database_becomes_store_unavailable_and_keeps_its_cause() {
        let cause = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error: Error = StoreError::unavailable("postgres store: no connection", cause).into();
        assert_eq!(error.code, ErrorCode::StoreUnavailable);
        assert_eq!(error.message, "postgres store: no connection");
        let store = error.source().expect("the store error");
        let io = store.source().expect("the io error");
        assert_eq!(io.to_string(), "refused");
    }

    #[test]
    fn a_fenced_write_becomes_an_internal_error_without_metadata() {
        let id = Uuid::nil();
        let error: Error = CommitError::Fenced {
            session_id: id,
            fence: 3,
            current: Some(4),
        }
        .into();
        assert_eq!(error.code, ErrorCode::Internal);
        assert!(error.metadata.is_empty(), "{:?}", error.metadata);
        assert!(
            error.message.contains("fence 3, current 4"),
            "{}",
            error.message
        );
    }

    #[test]
    fn a_commit_whose_answer_was_lost_becomes_outcome_unknown() {
        let error: Error = CommitError::ambiguous("the answer to COMMIT was lost", None).into();
        assert_eq!(error.code, ErrorCode::OutcomeUnknown);
        assert_eq!(error.message, "the answer to COMMIT was lost");
    }

    #[test]
    fn sqlite_failing_for_its_disk_is_store_unavailable_and_for_what_was_asked_internal() {
        let failure = |code| StoreError::Sqlite {
            message: "sqlite store: committing".to_owned(),
            source: rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None),
        };
        for code in [
            rusqlite::ffi::SQLITE_FULL,
            rusqlite::ffi::SQLITE_READONLY,
            rusqlite::ffi::SQLITE_IOERR,
            rusqlite::ffi::SQLITE_BUSY,
        ] {
            assert_eq!(failure(code).code(), ErrorCode::StoreUnavailable, "{code}");
        }
        assert_eq!(
            failure(rusqlite::ffi::SQLITE_CONSTRAINT).code(),
            ErrorCode::Internal
        );
    }

    #[test]
    fn any_other_commit_failure_is_the_stores_error_as_it_was() {
        let error: Error = CommitError::from(StoreError::closed("closed")).into();
        assert_eq!(error.code, ErrorCode::Internal);
        assert_eq!(error.message, "closed");
    }
}
