//! The one table from domain errors to gRPC statuses. Every status carries a
//! `google.rpc.ErrorInfo` (domain `agent-harness`, reason = the stable code) so clients branch
//! on codes, never on text.

use std::time::Duration;

use tonic::{Code, Status, codegen::http};
use tonic_types::{ErrorDetails, StatusExt};

use crate::domain::error::{Error, ErrorCode};

/// `ErrorInfo.domain` of every error.
pub(crate) const ERROR_DOMAIN: &str = "agent-harness";

/// How long a client should wait before retrying a DRAINING refusal.
pub(crate) const DRAINING_RETRY_DELAY: Duration = Duration::from_secs(1);
/// How long a client should wait before retrying a STORE_UNAVAILABLE refusal: about how often
/// readiness rechecks the database.
pub(crate) const STORE_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The gRPC code for each reason.
pub(crate) fn grpc_code(code: ErrorCode) -> Code {
    use ErrorCode::*;
    match code {
        InvalidArgument
        | LimitExceeded
        | ModelNotAdvertised
        | ConfigOptionUnknown
        | PermissionOptionUnknown
        | EmptyPrompt
        | MalformedRequest => Code::InvalidArgument,
        SessionNotFound | QueuedActionNotFound | ProfileNotFound => Code::NotFound,
        SessionExists | ActionIdConflict => Code::AlreadyExists,
        RuntimeDisconnected
        | SessionClosed
        | PermissionNotPending
        | ElicitationNotPending
        | NotEditable
        | RuntimeAuthRequired
        | NotConfigured
        | SessionBusy
        | NotSupported => Code::FailedPrecondition,
        QueueFull | TooManySessions | TooManySubscribers | TooManyRuntimes | BudgetExhausted => {
            Code::ResourceExhausted
        }
        RuntimeStartFailed | Draining | StoreUnavailable | ReplicaUnavailable | OutcomeUnknown => {
            Code::Unavailable
        }
        Unauthenticated => Code::Unauthenticated,
        ContextNotAllowed | Forbidden => Code::PermissionDenied,
        OffsetOutOfRange => Code::OutOfRange,
        Unimplemented => Code::Unimplemented,
        Internal => Code::Internal,
    }
}

/// Longest status message sent, in bytes. Messages may quote what the caller sent; unbounded,
/// a hostile value would make a `grpc-message` header larger than clients accept (they then
/// see a bare protocol error instead of the table's status).
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;

fn bounded_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE_BYTES - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// Builds the status for an error.
pub(crate) fn to_status(error: &Error) -> Status {
    let metadata: std::collections::HashMap<String, String> = error
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut details = ErrorDetails::with_error_info(error.code.reason(), ERROR_DOMAIN, metadata);
    match error.code {
        ErrorCode::Draining => {
            details.set_retry_info(Some(DRAINING_RETRY_DELAY));
        }
        ErrorCode::StoreUnavailable | ErrorCode::ReplicaUnavailable | ErrorCode::OutcomeUnknown => {
            details.set_retry_info(Some(STORE_RETRY_DELAY));
        }
        _ => {}
    }
    let mut status = Status::with_error_details(
        grpc_code(error.code),
        bounded_message(&error.message),
        details,
    );
    // The cause stays with the status in process, for logs; tonic never encodes a source.
    if let Some(source) = &error.source {
        status.set_source(source.clone());
    }
    status
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        to_status(&error)
    }
}

/// The start of the message tonic gives a request message over the size limit.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";
/// The start of the message of a request that prost could not decode, as tonic answers it.
const PROST_UNDECODABLE: &str = "failed to decode Protobuf message: ";

/// A response mapper for the whole server, for the refusals tonic makes itself before any
/// handler runs, which carry no `ErrorInfo`:
/// - a request message over the gRPC message limit (OUT_OF_RANGE) becomes the table's
///   LIMIT_EXCEEDED (limit `grpc_message_bytes`), like every other limit;
/// - a request that does not decode (INTERNAL: bad protobuf, a string that is not UTF-8,
///   messages nested deeper than prost's recursion limit) becomes INVALID_ARGUMENT
///   MALFORMED_REQUEST: the caller's fault, not the server's.
///
/// Everything else passes through untouched.
pub(crate) fn message_limit_mapper(
    max: usize,
) -> impl Fn(http::Response<tonic::body::Body>) -> http::Response<tonic::body::Body> + Clone {
    move |response| match response
        .extensions()
        .get::<Status>()
        .and_then(tonic_refusal)
    {
        Some(Refusal::TooLarge) => to_status(&Error::limit(
            "grpc_message_bytes",
            max,
            "a request message of more bytes than allowed",
        ))
        .into_http(),
        Some(Refusal::Undecodable(why)) => to_status(&malformed(&why)).into_http(),
        None => response,
    }
}

/// A refusal tonic made on its own.
enum Refusal {
    TooLarge,
    /// prost's description of what did not decode (a field path and the problem).
    Undecodable(String),
}

fn tonic_refusal(status: &Status) -> Option<Refusal> {
    if !status.details().is_empty() {
        return None;
    }
    match status.code() {
        Code::OutOfRange if status.message().starts_with(TONIC_TOO_LARGE) => {
            Some(Refusal::TooLarge)
        }
        Code::Internal => status
            .message()
            .strip_prefix(PROST_UNDECODABLE)
            .map(|why| Refusal::Undecodable(why.to_owned())),
        _ => None,
    }
}

/// The table's answer to a request that does not decode.
pub(crate) fn malformed(why: &str) -> Error {
    Error::new(
        ErrorCode::MalformedRequest,
        format!("the request does not decode: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `ErrorInfo.metadata` keys a client may be sent: the limits a request ran into, where
    /// a log ends, and the action whose outcome is unknown. Control signals between this
    /// server's parts (which replica owns a session, a fenced write) travel as typed values,
    /// never as metadata.
    const CLIENT_METADATA_KEYS: &[&str] = &[
        "action_id",
        "advertised",
        "head_offset",
        "limit",
        "max",
        "principal",
        "period",
    ];

    /// Every key given to `Error::with` in the server's code (test code aside), or the text of
    /// a key that is not a string literal.
    fn metadata_keys_in(dir: &std::path::Path, keys: &mut Vec<(String, String)>) {
        let call = regex::Regex::new(r#"\.with\(\s*("([^"]*)"|[^,)]*)"#).expect("a regex");
        for entry in std::fs::read_dir(dir).expect("a source directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                metadata_keys_in(&path, keys);
                continue;
            }
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if !name.ends_with(".rs") || name == "tests.rs" || name == "conformance.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for found in call.captures_iter(code) {
                let key = found
                    .get(2)
                    .or_else(|| found.get(1))
                    .map_or("", |m| m.as_str());
                keys.push((path.display().to_string(), key.to_owned()));
            }
        }
    }

    #[test]
    fn no_error_info_sent_to_a_client_carries_an_internal_key() {
        let mut keys = Vec::new();
        metadata_keys_in(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut keys,
        );
        assert!(!keys.is_empty(), "the scan finds the table's metadata");
        for (file, key) in keys {
            assert!(
                CLIENT_METADATA_KEYS.contains(&key.as_str()),
                "{file}: ErrorInfo metadata key {key:?} is not one clients may see"
            );
        }
    }

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let status = to_status(&Error::invalid(long));
        assert!(status.message().len() <= MAX_MESSAGE_BYTES);
        assert!(status.message().ends_with('…'));
        assert_eq!(to_status(&Error::invalid("short")).message(), "short");
    }

    /// The table of docs/errors.md, row by row: (code, gRPC code, reason).
    const TABLE: &[(ErrorCode, Code, &str)] = &[
        (
            ErrorCode::InvalidArgument,
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
        ),
        (
            ErrorCode::LimitExceeded,
            Code::InvalidArgument,
            "LIMIT_EXCEEDED",
        ),
        (
            ErrorCode::SessionNotFound,
            Code::NotFound,
            "SESSION_NOT_FOUND",
        ),
        (
            ErrorCode::QueuedActionNotFound,
            Code::NotFound,
            "QUEUED_ACTION_NOT_FOUND",
        ),
        (
            ErrorCode::ProfileNotFound,
            Code::NotFound,
            "PROFILE_NOT_FOUND",
        ),
        (
            ErrorCode::ModelNotAdvertised,
            Code::InvalidArgument,
            "MODEL_NOT_ADVERTISED",
        ),
        (
            ErrorCode::ConfigOptionUnknown,
            Code::InvalidArgument,
            "CONFIG_OPTION_UNKNOWN",
        ),
        (
            ErrorCode::SessionExists,
            Code::AlreadyExists,
            "SESSION_EXISTS",
        ),
        (
            ErrorCode::ActionIdConflict,
            Code::AlreadyExists,
            "ACTION_ID_CONFLICT",
        ),
        (
            ErrorCode::RuntimeDisconnected,
            Code::FailedPrecondition,
            "RUNTIME_DISCONNECTED",
        ),
        (
            ErrorCode::SessionClosed,
            Code::FailedPrecondition,
            "SESSION_CLOSED",
        ),
        (
            ErrorCode::PermissionNotPending,
            Code::FailedPrecondition,
            "PERMISSION_NOT_PENDING",
        ),
        (
            ErrorCode::ElicitationNotPending,
            Code::FailedPrecondition,
            "ELICITATION_NOT_PENDING",
        ),
        (
            ErrorCode::PermissionOptionUnknown,
            Code::InvalidArgument,
            "PERMISSION_OPTION_UNKNOWN",
        ),
        (
            ErrorCode::NotEditable,
            Code::FailedPrecondition,
            "NOT_EDITABLE",
        ),
        (
            ErrorCode::EmptyPrompt,
            Code::InvalidArgument,
            "EMPTY_PROMPT",
        ),
        (ErrorCode::QueueFull, Code::ResourceExhausted, "QUEUE_FULL"),
        (
            ErrorCode::TooManySessions,
            Code::ResourceExhausted,
            "TOO_MANY_SESSIONS",
        ),
        (
            ErrorCode::TooManySubscribers,
            Code::ResourceExhausted,
            "TOO_MANY_SUBSCRIBERS",
        ),
        (
            ErrorCode::TooManyRuntimes,
            Code::ResourceExhausted,
            "TOO_MANY_RUNTIMES",
        ),
        (
            ErrorCode::RuntimeStartFailed,
            Code::Unavailable,
            "RUNTIME_START_FAILED",
        ),
        (
            ErrorCode::RuntimeAuthRequired,
            Code::FailedPrecondition,
            "RUNTIME_AUTH_REQUIRED",
        ),
        (
            ErrorCode::Unauthenticated,
            Code::Unauthenticated,
            "UNAUTHENTICATED",
        ),
        (
            ErrorCode::ContextNotAllowed,
            Code::PermissionDenied,
            "CONTEXT_NOT_ALLOWED",
        ),
        (ErrorCode::Forbidden, Code::PermissionDenied, "FORBIDDEN"),
        (ErrorCode::Draining, Code::Unavailable, "DRAINING"),
        (
            ErrorCode::OffsetOutOfRange,
            Code::OutOfRange,
            "OFFSET_OUT_OF_RANGE",
        ),
        (
            ErrorCode::NotConfigured,
            Code::FailedPrecondition,
            "NOT_CONFIGURED",
        ),
        (
            ErrorCode::Unimplemented,
            Code::Unimplemented,
            "UNIMPLEMENTED",
        ),
        (ErrorCode::Internal, Code::Internal, "INTERNAL"),
        (
            ErrorCode::SessionBusy,
            Code::FailedPrecondition,
            "SESSION_BUSY",
        ),
        (
            ErrorCode::NotSupported,
            Code::FailedPrecondition,
            "NOT_SUPPORTED",
        ),
        (
            ErrorCode::StoreUnavailable,
            Code::Unavailable,
            "STORE_UNAVAILABLE",
        ),
        (
            ErrorCode::MalformedRequest,
            Code::InvalidArgument,
            "MALFORMED_REQUEST",
        ),
        (
            ErrorCode::ReplicaUnavailable,
            Code::Unavailable,
            "REPLICA_UNAVAILABLE",
        ),
        (
            ErrorCode::OutcomeUnknown,
            Code::Unavailable,
            "OUTCOME_UNKNOWN",
        ),
        (
            ErrorCode::BudgetExhausted,
            Code::ResourceExhausted,
            "BUDGET_EXHAUSTED",
        ),
    ];

    #[test]
    fn every_row_of_the_error_table_maps_to_its_code_and_reason_with_error_info() {
        assert_eq!(TABLE.len(), ErrorCode::ALL.len(), "every code has a row");
        for &(code, grpc, reason) in TABLE {
            let status = to_status(&Error::new(code, "why").with("k", "v"));
            assert_eq!(status.code(), grpc, "{reason}");
            assert_eq!(status.message(), "why");
            let info = status.get_details_error_info().expect("ErrorInfo detail");
            assert_eq!(info.reason, reason);
            assert_eq!(info.domain, "agent-harness");
            assert_eq!(info.metadata.get("k").map(String::as_str), Some("v"));
        }
    }

    #[test]
    fn tonics_own_decode_failure_becomes_malformed_request_and_other_statuses_pass() {
        let mapper = message_limit_mapper(4);
        let undecodable = Status::internal(
            "failed to decode Protobuf message: GetSessionRequest.session_id: invalid string \
             value: data is not UTF-8 encoded",
        );
        let mapped = mapper(undecodable.into_http());
        let status = mapped.extensions().get::<Status>().expect("a status");
        assert_eq!(status.code(), Code::InvalidArgument);
        let info = status.get_details_error_info().expect("ErrorInfo detail");
        assert_eq!(info.reason, "MALFORMED_REQUEST");
        assert!(
            status.message().contains("not UTF-8"),
            "{}",
            status.message()
        );

        // An internal error of the harness itself keeps its table status.
        let ours = to_status(&Error::internal("failed to decode Protobuf message: x"));
        let mapped = mapper(ours.into_http());
        let status = mapped.extensions().get::<Status>().expect("a status");
        assert_eq!(status.code(), Code::Internal);
        let other = mapper(Status::internal("boom").into_http());
        assert_eq!(
            other.extensions().get::<Status>().unwrap().code(),
            Code::Internal
        );
    }

    #[test]
    fn draining_tells_the_client_to_retry_after_one_second() {
        let status = to_status(&Error::new(ErrorCode::Draining, "draining"));
        let retry = status.get_details_retry_info().expect("RetryInfo detail");
        assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
        let other = to_status(&Error::new(ErrorCode::QueueFull, "full"));
        assert!(other.get_details_retry_info().is_none());
    }

    #[test]
    fn an_unreachable_store_or_an_unknown_outcome_tells_the_client_to_retry_after_one_second() {
        for code in [ErrorCode::StoreUnavailable, ErrorCode::OutcomeUnknown] {
            let status = to_status(&Error::new(code, "down"));
            assert_eq!(status.code(), Code::Unavailable);
            let retry = status.get_details_retry_info().expect("RetryInfo detail");
            assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)), "{code}");
        }
    }

    #[test]
    fn reasons_match_the_proto_error_reason_enum() {
        use crate::pb::v1::ErrorReason;
        for code in ErrorCode::ALL {
            let name = format!("ERROR_REASON_{}", code.reason());
            assert!(
                ErrorReason::from_str_name(&name).is_some(),
                "{name} is missing from errors.proto"
            );
        }
        // And the other way: every documented reason is one the harness can send.
        let documented = (1..)
            .map_while(|n| ErrorReason::try_from(n).ok())
            .map(|r| {
                r.as_str_name()
                    .trim_start_matches("ERROR_REASON_")
                    .to_owned()
            })
            .collect::<Vec<_>>();
        let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.reason()).collect();
        assert_eq!(
            documented, codes,
            "errors.proto and ErrorCode::ALL list the same reasons in order"
        );
    }
}
