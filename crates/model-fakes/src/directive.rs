//! Directives in a prompt's text: bracketed words that script what the fake model does.
//!
//! | directive | the model |
//! |---|---|
//! | `[write NAME]` | calls the agent's file-writing tool for `NAME` (relative to the agent's working directory unless absolute), then answers briefly once the tool's result comes back |
//! | `[stall N]` | streams a first text chunk, then nothing for `N` seconds, then the reply |
//! | `[error 401]`, `[error 429]`, `[error 500]` | answers with that HTTP status and the API's error body, saying not to retry it (`x-should-retry: false`) |
//! | `[flaky 429]`, `[flaky 500]` | the same status and body without that header: the agent retries as its own defaults say, and every retry fails alike |
//! | `[think]` | streams a thinking block before anything else |
//!
//! Anything else in brackets is ordinary text. The prompt's **marker** is its text with the
//! directives taken out and whitespace collapsed (at most [`MARKER_MAX_CHARS`] characters): the
//! reply quotes it, so a test can tell which prompt a reply answers.

use std::time::Duration;

/// The longest marker a reply quotes, in characters.
pub const MARKER_MAX_CHARS: usize = 120;

/// The HTTP statuses `[error N]` accepts.
pub const ERROR_STATUSES: [u16; 3] = [401, 429, 500];

/// One directive of a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Directive {
    /// `[write NAME]`: write a file through the agent's tool.
    Write(String),
    /// `[stall N]`: stall the stream after its first chunk.
    Stall(Duration),
    /// `[error N]`: answer with this HTTP status, not to be retried.
    Error(u16),
    /// `[flaky N]`: answer with this HTTP status, leaving retries to the agent's defaults.
    Flaky(u16),
    /// `[think]`: stream a thinking block first.
    Think,
}

/// A prompt's directives, in order, and its marker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prompt {
    pub directives: Vec<Directive>,
    pub marker: String,
}

impl Prompt {
    /// The first `[write …]` target, if any.
    pub fn write_target(&self) -> Option<&str> {
        self.directives.iter().find_map(|d| match d {
            Directive::Write(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// The first `[error …]` status, if any.
    pub fn error(&self) -> Option<u16> {
        self.directives.iter().find_map(|d| match d {
            Directive::Error(status) => Some(*status),
            _ => None,
        })
    }

    /// The first `[flaky …]` status, if any.
    pub fn flaky(&self) -> Option<u16> {
        self.directives.iter().find_map(|d| match d {
            Directive::Flaky(status) => Some(*status),
            _ => None,
        })
    }

    /// The total of the `[stall …]` durations.
    pub fn stall(&self) -> Duration {
        self.directives
            .iter()
            .map(|d| match d {
                Directive::Stall(d) => *d,
                _ => Duration::ZERO,
            })
            .sum()
    }

    pub fn thinks(&self) -> bool {
        self.directives.contains(&Directive::Think)
    }
}

/// Reads the directives and the marker of a prompt's text.
pub fn parse(text: &str) -> Prompt {
    let mut directives = Vec::new();
    let mut rest_text = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else {
            break;
        };
        match directive(&after[..close]) {
            Some(found) => {
                directives.push(found);
                rest_text.push_str(&rest[..open]);
                rest_text.push(' ');
            }
            None => rest_text.push_str(&rest[..open + 1 + close + 1]),
        }
        rest = &after[close + 1..];
    }
    rest_text.push_str(rest);
    let marker: String = rest_text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(MARKER_MAX_CHARS)
        .collect();
    Prompt { directives, marker }
}

/// One bracketed word, if it is a directive.
fn directive(inside: &str) -> Option<Directive> {
    let mut words = inside.split_whitespace();
    let name = words.next()?;
    let argument = words.next();
    if words.next().is_some() {
        return None;
    }
    match (name, argument) {
        ("write", Some(target)) => Some(Directive::Write(target.to_owned())),
        ("stall", Some(seconds)) => seconds
            .parse::<u64>()
            .ok()
            .map(|s| Directive::Stall(Duration::from_secs(s))),
        ("error", Some(status)) => status
            .parse::<u16>()
            .ok()
            .filter(|s| ERROR_STATUSES.contains(s))
            .map(Directive::Error),
        ("flaky", Some(status)) => status
            .parse::<u16>()
            .ok()
            .filter(|s| [429, 500].contains(s))
            .map(Directive::Flaky),
        ("think", None) => Some(Directive::Think),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_has_no_directives_and_is_its_own_marker() {
        let prompt = parse("  hello\n  there ");
        assert!(prompt.directives.is_empty());
        assert_eq!(prompt.marker, "hello there");
    }

    #[test]
    fn directives_are_read_in_order_and_left_out_of_the_marker() {
        let prompt = parse("please [think] [write hello.txt] now [stall 8]");
        assert_eq!(
            prompt.directives,
            [
                Directive::Think,
                Directive::Write("hello.txt".into()),
                Directive::Stall(Duration::from_secs(8)),
            ]
        );
        assert_eq!(prompt.marker, "please now");
        assert_eq!(prompt.write_target(), Some("hello.txt"));
        assert_eq!(prompt.stall(), Duration::from_secs(8));
        assert!(prompt.thinks());
    }

    #[test]
    fn only_the_known_error_statuses_are_directives() {
        assert_eq!(parse("[error 429]").error(), Some(429));
        assert_eq!(parse("[flaky 500]").flaky(), Some(500));
        assert_eq!(parse("[flaky 401]").flaky(), None);
        let other = parse("[error 404] [stall soon] [write] [a b c]");
        assert!(other.directives.is_empty(), "{other:?}");
        assert_eq!(other.marker, "[error 404] [stall soon] [write] [a b c]");
    }

    #[test]
    fn an_unclosed_bracket_is_text() {
        let prompt = parse("see [write x.txt");
        assert!(prompt.directives.is_empty());
        assert_eq!(prompt.marker, "see [write x.txt");
    }

    #[test]
    fn the_marker_is_capped() {
        let long = "x".repeat(MARKER_MAX_CHARS * 2);
        assert_eq!(parse(&long).marker.chars().count(), MARKER_MAX_CHARS);
    }
}
