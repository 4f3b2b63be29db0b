//! The model APIs the proxy serves: which paths it forwards (nothing else is), where a caller's
//! key travels, and how each provider words an error, so an agent reads the proxy's refusals as
//! it reads its provider's.

use http::{Method, StatusCode, Uri};
use serde_json::json;

/// A provider: its key's header and its errors' shape. Each has a path prefix of its own on the
/// proxy (`/anthropic`, `/openai`), so one box may call both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Provider {
    Anthropic,
    OpenAi,
}

/// How an answer states its usage (`usage::UsageReader`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Messages (`POST /v1/messages`).
    Anthropic,
    /// Responses (`POST /v1/responses`).
    OpenAiResponses,
    /// Chat Completions (`POST /v1/chat/completions`).
    OpenAiChat,
}

/// What the proxy does with a request it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// A model call: forwarded, checked against the budget first, its usage read.
    ModelCall(Api),
    /// Forwarded as it is (model lists, token counts): no model runs, nothing is charged.
    Free,
}

impl Provider {
    pub const ALL: [Provider; 2] = [Provider::Anthropic, Provider::OpenAi];

    /// Its name in config and metrics, and its prefix on the proxy.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::OpenAi => "openai",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The variable its SDKs (and the agents on them) read their base URL from.
    pub fn base_var(self) -> &'static str {
        match self {
            Provider::Anthropic => "ANTHROPIC_BASE_URL",
            Provider::OpenAi => "OPENAI_BASE_URL",
        }
    }

    /// Where its calls go unless a profile names another upstream.
    pub fn default_upstream(self) -> &'static str {
        match self {
            Provider::Anthropic => "https://api.anthropic.com",
            Provider::OpenAi => "https://api.openai.com",
        }
    }

    /// The variable its agents read their key from, when a preset sends them through the proxy.
    pub fn key_var(self) -> &'static str {
        match self {
            Provider::Anthropic => "ANTHROPIC_API_KEY",
            Provider::OpenAi => "OPENAI_API_KEY",
        }
    }

    /// The upstream a base URL as its SDKs take it names: Anthropic's SDK adds `/v1/...` to its
    /// base, OpenAI's only what follows `/v1`, so an OpenAI base must end in `/v1`.
    pub fn upstream_of(self, base_url: &str) -> Result<Uri, String> {
        let trimmed = base_url.trim().trim_end_matches('/');
        let base = match self {
            Provider::Anthropic => trimmed,
            Provider::OpenAi => trimmed.strip_suffix("/v1").ok_or_else(|| {
                "an OpenAI base URL ends in /v1 (e.g. \"https://api.openai.com/v1\"); name \
                 another upstream in the profile's model_proxy.openai.upstream"
                    .to_owned()
            })?,
        };
        super::ModelRoute::parse_upstream(base)
    }

    /// The base URL its SDKs take, for an agent in a box that reaches the proxy at `origin`
    /// (`http://127.0.0.1:PORT`): Anthropic's SDK adds `/v1/...` itself, OpenAI's expects it.
    pub fn base_url(self, origin: &str) -> String {
        match self {
            Provider::Anthropic => format!("{origin}/anthropic"),
            Provider::OpenAi => format!("{origin}/openai/v1"),
        }
    }

    /// The provider whose prefix `path` starts with, and the rest of the path (`/v1/...`).
    pub fn of_path(path: &str) -> Option<(Self, &str)> {
        Self::ALL.into_iter().find_map(|provider| {
            let rest = path.strip_prefix('/')?.strip_prefix(provider.name())?;
            (rest.is_empty() || rest.starts_with('/')).then_some((provider, rest))
        })
    }

    /// Whether the proxy forwards `method rest`, and how: only what agents call.
    pub fn serves(self, method: &Method, rest: &str) -> Option<Served> {
        let models = rest == "/v1/models"
            || rest
                .strip_prefix("/v1/models/")
                .is_some_and(|id| !id.is_empty() && !id.contains('/'));
        match (self, method, rest) {
            (_, &Method::GET, _) if models => Some(Served::Free),
            (Provider::Anthropic, &Method::POST, "/v1/messages") => {
                Some(Served::ModelCall(Api::Anthropic))
            }
            (Provider::Anthropic, &Method::POST, "/v1/messages/count_tokens") => Some(Served::Free),
            (Provider::OpenAi, &Method::POST, "/v1/responses") => {
                Some(Served::ModelCall(Api::OpenAiResponses))
            }
            (Provider::OpenAi, &Method::POST, "/v1/chat/completions") => {
                Some(Served::ModelCall(Api::OpenAiChat))
            }
            _ => None,
        }
    }

    /// The caller's key in a request's headers: Anthropic's `x-api-key` (or a bearer token, as
    /// its SDK sends an auth token), OpenAI's bearer token.
    pub fn key_of(self, headers: &http::HeaderMap) -> Option<&str> {
        let bearer = || {
            headers
                .get(http::header::AUTHORIZATION)?
                .to_str()
                .ok()?
                .strip_prefix("Bearer ")
        };
        match self {
            Provider::Anthropic => headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .or_else(bearer),
            Provider::OpenAi => bearer(),
        }
    }

    /// Puts the real key where the provider reads it, and removes every other credential.
    pub fn set_key(self, headers: &mut http::HeaderMap, key: &str) -> Result<(), String> {
        headers.remove(http::header::AUTHORIZATION);
        headers.remove("x-api-key");
        let (name, value) = match self {
            Provider::Anthropic => (http::HeaderName::from_static("x-api-key"), key.to_owned()),
            Provider::OpenAi => (http::header::AUTHORIZATION, format!("Bearer {key}")),
        };
        let mut value = http::HeaderValue::from_str(&value)
            .map_err(|_| "the upstream key is not a valid header value".to_owned())?;
        value.set_sensitive(true);
        headers.insert(name, value);
        Ok(())
    }

    /// An error as this provider words it.
    pub fn error_body(self, status: StatusCode, message: &str) -> String {
        match self {
            Provider::Anthropic => {
                let kind = match status.as_u16() {
                    400 | 413 => "invalid_request_error",
                    401 => "authentication_error",
                    402 | 403 => "permission_error",
                    404 => "not_found_error",
                    429 => "rate_limit_error",
                    529 => "overloaded_error",
                    _ => "api_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
            }
            Provider::OpenAi => {
                let (kind, code) = match status.as_u16() {
                    401 => ("invalid_request_error", "invalid_api_key"),
                    403 => ("insufficient_quota", "insufficient_quota"),
                    404 => ("invalid_request_error", "unknown_url"),
                    413 => ("invalid_request_error", "request_too_large"),
                    400 => ("invalid_request_error", "invalid_request"),
                    _ => ("server_error", "upstream_error"),
                };
                json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
                    .to_string()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_calls_agents_make_are_served_each_under_its_providers_prefix() {
        let (provider, rest) = Provider::of_path("/anthropic/v1/messages").unwrap();
        assert_eq!(provider, Provider::Anthropic);
        assert_eq!(
            provider.serves(&Method::POST, rest),
            Some(Served::ModelCall(Api::Anthropic))
        );
        let (provider, rest) = Provider::of_path("/openai/v1/responses").unwrap();
        assert_eq!(
            provider.serves(&Method::POST, rest),
            Some(Served::ModelCall(Api::OpenAiResponses))
        );
        assert_eq!(
            provider.serves(&Method::GET, "/v1/models/gpt-5"),
            Some(Served::Free)
        );
        for (method, path) in [
            (Method::GET, "/anthropic/v1/messages"),
            (Method::POST, "/anthropic/v1/files"),
            (Method::POST, "/openai/v1/responses/../../admin"),
            (Method::GET, "/openai/v1/models/a/b"),
            (Method::POST, "/anthropic/v1/messages/batches"),
        ] {
            let (provider, rest) = Provider::of_path(path).unwrap();
            assert_eq!(provider.serves(&method, rest), None, "{method} {path}");
        }
        assert_eq!(Provider::of_path("/anthropicx/v1/messages"), None);
        assert_eq!(Provider::of_path("/v1/messages"), None);
    }

    #[test]
    fn the_key_is_read_where_each_sdk_sends_it_and_replaced_by_the_real_one_alone() {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-api-key", "cap".parse().unwrap());
        assert_eq!(Provider::Anthropic.key_of(&headers), Some("cap"));
        assert_eq!(Provider::OpenAi.key_of(&headers), None);
        headers.insert(http::header::AUTHORIZATION, "Bearer other".parse().unwrap());
        Provider::Anthropic.set_key(&mut headers, "real").unwrap();
        assert_eq!(headers["x-api-key"], "real");
        assert!(headers.get(http::header::AUTHORIZATION).is_none());
        Provider::OpenAi.set_key(&mut headers, "real").unwrap();
        assert_eq!(headers[http::header::AUTHORIZATION], "Bearer real");
        assert!(headers.get("x-api-key").is_none());
    }

    #[test]
    fn errors_come_in_the_providers_own_shape() {
        let body: serde_json::Value = serde_json::from_str(
            &Provider::Anthropic.error_body(StatusCode::FORBIDDEN, "budget spent"),
        )
        .unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "permission_error");
        let body: serde_json::Value =
            serde_json::from_str(&Provider::OpenAi.error_body(StatusCode::UNAUTHORIZED, "no"))
                .unwrap();
        assert_eq!(body["error"]["code"], "invalid_api_key");
    }
}
