//! Input limits and the validation of caller-supplied actions against them. Every
//! violation is a clear error and nothing is stored.

use serde::{Deserialize, Serialize};

use super::{
    action::{PromptAction, PromptAttachment},
    error::{Error, ErrorCode, Result},
};

/// Limits with their defaults; each is a config knob (`[limits]` in the config file).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Bytes of prompt text.
    pub prompt_bytes: usize,
    /// Attachments per prompt.
    pub attachments: usize,
    /// Bytes of one attachment URI.
    pub uri_bytes: usize,
    /// Bytes of one attachment name.
    pub attachment_name_bytes: usize,
    /// Characters of a session name.
    pub session_name_chars: usize,
    /// Actions waiting in one session's queue.
    pub queued_actions: usize,
    /// Live (not closed) sessions one principal owns.
    pub sessions_per_principal: usize,
    /// Open Subscribe streams on one session.
    pub subscribers_per_session: usize,
    /// Open Subscribe streams of one principal (the acting user, for a service), on all its
    /// sessions together: what one tenant's streams may hold is bounded by this times a stream's
    /// budget. Per replica, as the per-session cap.
    pub subscribers_per_principal: usize,
    /// Bytes of one gRPC message, either way.
    pub grpc_message_bytes: usize,
    /// Bytes of one line from a runtime.
    pub runtime_line_bytes: usize,
    /// Runtime processes alive at once in this harness.
    pub live_runtimes: usize,
    /// Labels on one session.
    pub labels: usize,
    /// Bytes of one label key or value.
    pub label_bytes: usize,
    /// Editors of one session.
    pub editors: usize,
    /// Bytes of a control `context`, as compact JSON.
    pub context_bytes: usize,
    /// Bytes of a model, config id, config value, option id or principal id.
    pub identifier_bytes: usize,
    /// Label filters in one ListSessions request: each is a condition the store evaluates, so
    /// the cost of one list must stay bounded.
    pub list_label_filters: usize,
    /// Status filters in one ListSessions request.
    pub list_status_filters: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            prompt_bytes: 256 * 1024,
            attachments: 32,
            uri_bytes: 2 * 1024,
            attachment_name_bytes: 256,
            session_name_chars: 100,
            queued_actions: 50,
            sessions_per_principal: 100,
            subscribers_per_session: 256,
            subscribers_per_principal: 128,
            grpc_message_bytes: 4 * 1024 * 1024,
            runtime_line_bytes: 8 * 1024 * 1024,
            live_runtimes: 256,
            labels: 64,
            label_bytes: 256,
            editors: 64,
            context_bytes: 64 * 1024,
            identifier_bytes: 1024,
            list_label_filters: 64,
            list_status_filters: 16,
        }
    }
}

/// URI schemes an attachment may use: never `file:`, `javascript:` or `data:`.
pub const ALLOWED_URI_SCHEMES: [&str; 2] = ["https", "http"];

impl Limits {
    /// Validates a prompt's text and attachments.
    pub fn check_prompt(&self, prompt: &PromptAction) -> Result<()> {
        if prompt.prompt.len() > self.prompt_bytes {
            return Err(Error::limit(
                "prompt_bytes",
                self.prompt_bytes,
                format_args!("a prompt of {} bytes", prompt.prompt.len()),
            ));
        }
        if prompt.attachments.len() > self.attachments {
            return Err(Error::limit(
                "attachments",
                self.attachments,
                format_args!("{} attachments", prompt.attachments.len()),
            ));
        }
        for (index, attachment) in prompt.attachments.iter().enumerate() {
            self.check_attachment(attachment).map_err(|e| Error {
                message: format!("attachments[{index}]: {}", e.message),
                ..e
            })?;
        }
        if prompt.prompt.trim().is_empty() && prompt.attachments.is_empty() {
            return Err(Error::new(
                ErrorCode::EmptyPrompt,
                "a prompt needs text or at least one attachment",
            ));
        }
        Ok(())
    }

    fn check_attachment(&self, attachment: &PromptAttachment) -> Result<()> {
        if attachment.uri.len() > self.uri_bytes {
            return Err(Error::limit(
                "uri_bytes",
                self.uri_bytes,
                format_args!("a URI of {} bytes", attachment.uri.len()),
            ));
        }
        if attachment.name.len() > self.attachment_name_bytes {
            return Err(Error::limit(
                "attachment_name_bytes",
                self.attachment_name_bytes,
                format_args!("a name of {} bytes", attachment.name.len()),
            ));
        }
        if attachment.name.trim().is_empty() {
            return Err(Error::invalid("the attachment name is blank"));
        }
        check_uri(&attachment.uri)?;
        if attachment.size.is_some_and(|size| size < 0) {
            return Err(Error::invalid("the attachment size is negative"));
        }
        if let Some(mime_type) = &attachment.mime_type
            && (mime_type.len() > self.identifier_bytes || !is_media_type(mime_type))
        {
            return Err(Error::invalid(format!(
                "mime_type {mime_type:?} is not a media type such as image/png"
            )));
        }
        Ok(())
    }

    /// Validates an identifier-like string (model, config id, value, option id).
    pub fn check_identifier(&self, field: &str, value: &str) -> Result<()> {
        if value.len() > self.identifier_bytes {
            return Err(Error::limit(
                "identifier_bytes",
                self.identifier_bytes,
                format_args!("{field} of {} bytes", value.len()),
            ));
        }
        if value.is_empty() {
            return Err(Error::invalid(format!("{field} is empty")));
        }
        Ok(())
    }

    /// Validates the filters of a ListSessions request, before the store sees any of them.
    pub fn check_list_filters(
        &self,
        statuses: usize,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<()> {
        if labels.len() > self.list_label_filters {
            return Err(Error::limit(
                "list_label_filters",
                self.list_label_filters,
                format_args!("{} label filters", labels.len()),
            ));
        }
        if statuses > self.list_status_filters {
            return Err(Error::limit(
                "list_status_filters",
                self.list_status_filters,
                format_args!("{statuses} status filters"),
            ));
        }
        // A label longer than any stored one cannot match; refusing it keeps megabytes of
        // filter text away from the database.
        for (key, value) in labels {
            if key.len() > self.label_bytes || value.len() > self.label_bytes {
                return Err(Error::limit(
                    "label_bytes",
                    self.label_bytes,
                    format_args!("a label filter of {} bytes", key.len().max(value.len())),
                ));
            }
        }
        Ok(())
    }

    /// Validates a session name given at creation.
    pub fn check_session_name(&self, name: &str) -> Result<()> {
        if name.trim().is_empty() {
            return Err(Error::invalid("the session name is blank"));
        }
        let chars = name.chars().count();
        if chars > self.session_name_chars {
            return Err(Error::limit(
                "session_name_chars",
                self.session_name_chars,
                format_args!("a name of {chars} characters"),
            ));
        }
        if name.contains(['\n', '\r']) {
            return Err(Error::invalid("the session name must be one line"));
        }
        Ok(())
    }

    /// A session name from the first prompt's text: trimmed, first line, at most the limit.
    pub fn session_name_from_prompt(&self, text: &str) -> Option<String> {
        let line = text.trim().lines().next()?.trim();
        (!line.is_empty()).then(|| line.chars().take(self.session_name_chars).collect())
    }
}

/// An attachment URI: absolute, `https` or `http`, with a host, and only characters a URI may hold.
pub fn check_uri(uri: &str) -> Result<()> {
    if uri.chars().any(|c| {
        c.is_whitespace()
            || c.is_control()
            || matches!(c, '<' | '>' | '"' | '{' | '}' | '|' | '\\' | '^' | '`')
    }) {
        return Err(Error::invalid(format!(
            "uri {uri:?} holds characters a URI may not contain"
        )));
    }
    let parsed = url::Url::parse(uri)
        .map_err(|e| Error::invalid(format!("uri {uri:?} is not an absolute URL: {e}")))?;
    if !ALLOWED_URI_SCHEMES.contains(&parsed.scheme()) {
        return Err(Error::invalid(format!(
            "uri scheme {:?} is not allowed; use https or http",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(Error::invalid(format!("uri {uri:?} has no host")));
    }
    Ok(())
}

fn is_media_type(value: &str) -> bool {
    let Some((kind, sub)) = value.split_once('/') else {
        return false;
    };
    let token = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$&^_.+-*".contains(c))
    };
    let sub = sub.split(';').next().unwrap_or_default().trim();
    token(kind) && token(sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    #[test]
    fn only_https_and_http_uris_are_accepted() {
        for ok in [
            "https://x.example/file/1",
            "http://10.0.0.1:8080/a?b=c#d",
            "HTTPS://X/a",
        ] {
            check_uri(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "file:///etc/passwd",
            "javascript:alert(1)",
            "data:text/plain,hi",
            "ftp://x/a",
            "/relative/path",
            "https://x/<m-agent-context",
            "https://x/a b",
            "",
        ] {
            assert_eq!(
                check_uri(bad).unwrap_err().code,
                ErrorCode::InvalidArgument,
                "{bad}"
            );
        }
    }

    #[test]
    fn an_oversized_prompt_or_too_many_attachments_is_limit_exceeded() {
        let big = PromptAction::text("x".repeat(limits().prompt_bytes + 1));
        let err = limits().check_prompt(&big).unwrap_err();
        assert_eq!(err.code, ErrorCode::LimitExceeded);
        assert_eq!(err.metadata["limit"], "prompt_bytes");

        let many = PromptAction::with_attachments(
            "x",
            (0..33)
                .map(|i| PromptAttachment::new(format!("https://x/{i}"), "a"))
                .collect(),
        );
        assert_eq!(
            limits().check_prompt(&many).unwrap_err().code,
            ErrorCode::LimitExceeded
        );
    }

    #[test]
    fn a_long_uri_or_name_is_limit_exceeded() {
        let long_uri = format!("https://x/{}", "a".repeat(2048));
        let p = PromptAction::with_attachments("x", vec![PromptAttachment::new(long_uri, "a")]);
        assert_eq!(
            limits().check_prompt(&p).unwrap_err().metadata["limit"],
            "uri_bytes"
        );
        let p = PromptAction::with_attachments(
            "x",
            vec![PromptAttachment::new("https://x/1", "n".repeat(257))],
        );
        assert_eq!(
            limits().check_prompt(&p).unwrap_err().metadata["limit"],
            "attachment_name_bytes"
        );
    }

    #[test]
    fn an_empty_prompt_without_attachments_is_refused_but_a_file_only_prompt_is_fine() {
        assert_eq!(
            limits()
                .check_prompt(&PromptAction::text("  "))
                .unwrap_err()
                .code,
            ErrorCode::EmptyPrompt
        );
        let files =
            PromptAction::with_attachments("", vec![PromptAttachment::new("https://x/1", "a")]);
        limits().check_prompt(&files).unwrap();
    }

    #[test]
    fn a_session_name_comes_from_the_first_line_of_the_prompt_trimmed_to_100_characters() {
        assert_eq!(
            limits().session_name_from_prompt("  fix the test \nmore"),
            Some("fix the test".into())
        );
        let long = "é".repeat(150);
        assert_eq!(
            limits()
                .session_name_from_prompt(&long)
                .unwrap()
                .chars()
                .count(),
            100
        );
        assert_eq!(limits().session_name_from_prompt("   "), None);
    }

    #[test]
    fn a_blank_or_multi_line_name_is_invalid_and_a_long_one_exceeds_the_limit() {
        assert_eq!(
            limits().check_session_name(" ").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            limits().check_session_name("a\nb").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            limits()
                .check_session_name(&"n".repeat(101))
                .unwrap_err()
                .code,
            ErrorCode::LimitExceeded
        );
        limits().check_session_name("my session").unwrap();
    }

    #[test]
    fn list_filters_are_bounded_in_number_and_size() {
        let labels = |n: usize| {
            (0..n)
                .map(|i| (format!("k{i}"), "v".to_owned()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        limits().check_list_filters(16, &labels(64)).unwrap();
        let err = limits().check_list_filters(0, &labels(65)).unwrap_err();
        assert_eq!(err.code, ErrorCode::LimitExceeded);
        assert_eq!(err.metadata["limit"], "list_label_filters");
        let err = limits().check_list_filters(17, &labels(0)).unwrap_err();
        assert_eq!(err.metadata["limit"], "list_status_filters");
        let long = [("k".to_owned(), "v".repeat(257))].into_iter().collect();
        let err = limits().check_list_filters(0, &long).unwrap_err();
        assert_eq!(err.metadata["limit"], "label_bytes");
    }

    #[test]
    fn a_media_type_must_look_like_one() {
        let with = |m: &str| {
            PromptAction::with_attachments(
                "x",
                vec![PromptAttachment::new("https://x/1", "a").mime_type(m)],
            )
        };
        limits().check_prompt(&with("image/*")).unwrap();
        limits()
            .check_prompt(&with("text/plain; charset=utf-8"))
            .unwrap();
        assert!(limits().check_prompt(&with("nonsense")).is_err());
    }
}
