//! What a bridge and the harness say to each other on the bridge's `Connect` stream, as the
//! transport decodes it: the hello and its bounds, the messages each way, and a refused stream.
//! Types only, and the checks of a hello; what is done with them is the gateway's.

use std::collections::BTreeMap;

use crate::domain::{Error, ErrorCode};

/// Messages waiting to go out on one bridge stream.
pub const OUTBOUND_MESSAGES: usize = 256;

/// Bounds of a bridge's hello: it is kept in memory for as long as the bridge is connected,
/// logged, and published to the other replicas, so a bigger one is refused whole.
pub const MAX_HELLO_LABELS: usize = 64;
pub const MAX_HELLO_PROFILES: usize = 256;
/// Runtimes a hello may list as still running (four replicas' worth at the default
/// `limits.live_runtimes`); each listed session may cost a store read to find its owner.
pub const MAX_HELLO_RUNNING: usize = 1024;
/// Bytes of each hello text: bridge id, version, label key or value, profile name, runtime key.
pub const MAX_HELLO_TEXT: usize = 256;

/// What a bridge sends, decoded from the wire by the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromBridge {
    Spawned {
        key: String,
    },
    SpawnFailed {
        key: String,
        error: String,
        stderr_tail: String,
    },
    Stdout {
        key: String,
        seq: u64,
        line: Vec<u8>,
    },
    Exited {
        key: String,
        code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
    },
    Ack {
        key: String,
        seq: u64,
    },
}

impl FromBridge {
    pub(super) fn key(&self) -> &str {
        match self {
            Self::Spawned { key }
            | Self::SpawnFailed { key, .. }
            | Self::Stdout { key, .. }
            | Self::Exited { key, .. }
            | Self::Ack { key, .. } => key,
        }
    }
}

/// What the harness sends to a bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToBridge {
    Spawn {
        key: String,
        profile: String,
        cwd: String,
        session_id: String,
        owner: String,
    },
    Stdin {
        key: String,
        seq: u64,
        line: Vec<u8>,
    },
    /// Stop the runtime: gracefully with a grace (stdin closed, SIGTERM, SIGKILL after the
    /// grace), else at once.
    Kill {
        key: String,
        grace: Option<std::time::Duration>,
    },
    Ack {
        key: String,
        seq: u64,
    },
}

/// A bridge's hello: who it is and what it still runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hello {
    pub bridge_id: String,
    pub labels: BTreeMap<String, String>,
    pub profiles: Vec<String>,
    pub version: String,
    pub running: Vec<StillRunning>,
}

/// A runtime a bridge kept through a broken stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StillRunning {
    pub key: String,
    pub last_stdin_seq: u64,
    pub last_stdout_seq: u64,
}

/// Checks a hello against the bounds above (LIMIT_EXCEEDED naming the field, never quoting it)
/// and that it names itself.
pub fn check_hello(hello: &Hello) -> Result<(), Error> {
    fn count(limit: &str, max: usize, n: usize, what: &str) -> Result<(), Error> {
        match n > max {
            true => Err(Error::limit(limit, max, format!("the hello's {n} {what}"))),
            false => Ok(()),
        }
    }
    fn bytes<'a>(
        limit: &str,
        texts: impl IntoIterator<Item = &'a str>,
        what: &str,
    ) -> Result<(), Error> {
        match texts.into_iter().any(|t| t.len() > MAX_HELLO_TEXT) {
            true => Err(Error::limit(
                limit,
                MAX_HELLO_TEXT,
                format!("a {what} of the hello (bytes)"),
            )),
            false => Ok(()),
        }
    }
    bytes("hello.bridge_id", [hello.bridge_id.as_str()], "bridge_id")?;
    bytes("hello.version", [hello.version.as_str()], "version")?;
    count(
        "hello.labels",
        MAX_HELLO_LABELS,
        hello.labels.len(),
        "labels",
    )?;
    let label_texts = hello
        .labels
        .iter()
        .flat_map(|(k, v)| [k.as_str(), v.as_str()]);
    bytes("hello.label", label_texts, "label key or value")?;
    count(
        "hello.profiles",
        MAX_HELLO_PROFILES,
        hello.profiles.len(),
        "profiles",
    )?;
    bytes(
        "hello.profile",
        hello.profiles.iter().map(String::as_str),
        "profile name",
    )?;
    count(
        "hello.running",
        MAX_HELLO_RUNNING,
        hello.running.len(),
        "running runtimes",
    )?;
    bytes(
        "hello.runtime_key",
        hello.running.iter().map(|r| r.key.as_str()),
        "runtime key",
    )?;
    // Compared exactly, logged, and shown in metrics: printable and not blank.
    if hello.bridge_id.trim().is_empty() || hello.bridge_id.chars().any(char::is_control) {
        return Err(Error::invalid(
            "the hello needs a bridge_id that is not blank and holds no control characters",
        ));
    }
    Ok(())
}

/// The refusal of a hello naming a bridge id another principal holds.
pub fn held_by_another(bridge_id: &str) -> Error {
    Error::new(
        ErrorCode::Forbidden,
        format!("bridge id {bridge_id:?} is held by another principal's bridge"),
    )
}

/// Why a bridge stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(id: &str) -> Hello {
        Hello {
            bridge_id: id.into(),
            profiles: vec!["mock".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_hello_over_its_bounds_is_refused_limit_exceeded_without_quoting_it() {
        let many: Vec<(String, String)> = (0..=MAX_HELLO_LABELS)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        let mut big = hello("b1");
        big.labels = many.into_iter().collect();
        let long = "x".repeat(MAX_HELLO_TEXT + 1);
        let cases = [
            big,
            Hello {
                labels: [(long.clone(), "v".into())].into(),
                ..hello("b1")
            },
            Hello {
                labels: [("k".into(), long.clone())].into(),
                ..hello("b1")
            },
            Hello {
                profiles: vec!["p".into(); MAX_HELLO_PROFILES + 1],
                ..hello("b1")
            },
            Hello {
                profiles: vec![long.clone()],
                ..hello("b1")
            },
            Hello {
                version: long.clone(),
                ..hello("b1")
            },
            hello(&long),
            Hello {
                running: vec![StillRunning::default(); MAX_HELLO_RUNNING + 1],
                ..hello("b1")
            },
        ];
        for case in cases {
            let error = check_hello(&case).unwrap_err();
            assert_eq!(error.code, ErrorCode::LimitExceeded, "{error:?}");
            assert!(!error.message.contains("xxxx"), "{}", error.message);
        }
        let mut at_bounds = hello("b1");
        at_bounds.labels = (0..MAX_HELLO_LABELS)
            .map(|i| (format!("{i:0>256}"), "v".repeat(MAX_HELLO_TEXT)))
            .collect();
        check_hello(&at_bounds).unwrap();
        assert_eq!(
            check_hello(&hello(" ")).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }
}
