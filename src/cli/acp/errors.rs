//! JSON-RPC errors: the protocol's own (bad lines, unknown methods, bad params) and the
//! harness's refusals, whose stable reason code travels in `data.reason` so an ACP client can
//! branch on it as a gRPC caller branches on `ErrorInfo.reason`.

use serde_json::{Value, json};
use tonic::{Code, Status};
use tonic_types::StatusExt;

/// JSON-RPC 2.0 and ACP error codes.
pub(crate) mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// ACP: the agent needs the client to authenticate.
    pub const AUTH_REQUIRED: i64 = -32000;
    /// ACP: the named resource (here, a session) does not exist.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
}

#[derive(Debug, Clone)]
pub(crate) struct RpcError {
    pub(crate) code: i64,
    pub(crate) message: String,
    pub(crate) data: Option<Value>,
}

impl RpcError {
    pub(crate) fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub(crate) fn parse(message: impl Into<String>) -> Self {
        Self::new(code::PARSE_ERROR, message)
    }

    pub(crate) fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_REQUEST, message)
    }

    pub(crate) fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }

    pub(crate) fn method_not_found(method: &str) -> Self {
        Self::new(
            code::METHOD_NOT_FOUND,
            format!("method not found: {method}"),
        )
    }

    /// An error with a harness reason code of our own making (not from the server).
    pub(crate) fn harness(code: i64, reason: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            code,
            data: Some(json!({"reason": reason, "message": message})),
            message: format!("{reason}: {message}"),
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        error
    }
}

impl From<Status> for RpcError {
    fn from(status: Status) -> Self {
        let info = status.get_details_error_info();
        let reason = info.as_ref().map_or_else(
            || format!("{:?}", status.code()).to_ascii_uppercase(),
            |info| info.reason.clone(),
        );
        let code = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => code::INVALID_PARAMS,
            Code::NotFound if reason == "SESSION_NOT_FOUND" => code::RESOURCE_NOT_FOUND,
            Code::Unauthenticated => code::AUTH_REQUIRED,
            _ => code::INTERNAL_ERROR,
        };
        let metadata: serde_json::Map<String, Value> = info
            .map(|info| {
                info.metadata
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            code,
            message: format!("{reason}: {}", status.message()),
            data: Some(json!({
                "reason": reason,
                "grpcCode": format!("{:?}", status.code()),
                "message": status.message(),
                "metadata": metadata,
            })),
        }
    }
}

impl From<super::super::Failure> for RpcError {
    fn from(failure: super::super::Failure) -> Self {
        let reason = match failure.code {
            super::super::exit::UNAVAILABLE => "UNAVAILABLE",
            super::super::exit::TLS => "TLS_FAILED",
            super::super::exit::AUTH => "UNAUTHENTICATED",
            super::super::exit::USAGE => "INVALID_ARGUMENT",
            _ => "FAILED",
        };
        Self::harness(code::INTERNAL_ERROR, reason, failure.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

    #[test]
    fn a_harness_refusal_carries_its_reason_in_data() {
        let status = Status::with_error_details(
            Code::NotFound,
            "no such session",
            ErrorDetails::with_error_info("SESSION_NOT_FOUND", "agent-harness", []),
        );
        let error = RpcError::from(status).to_json();
        assert_eq!(error["code"], code::RESOURCE_NOT_FOUND);
        assert_eq!(error["data"]["reason"], "SESSION_NOT_FOUND");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("no such session")
        );
    }
}
