//! The mock agent's mini-language, pure: how a prompt's blocks split into user text, links and
//! hidden blocks, and how `@verb args` lines of the user text become [`Directive`]s.

use agent_client_protocol_schema::v1::{ErrorCode, StopReason};
use serde_json::Value;

/// A stop reason by its ACP wire name (`end_turn`, `max_tokens`, …), read through the schema
/// crate's own type so the mock agent and the harness share one vocabulary.
fn parse_stop_reason(text: &str) -> Option<StopReason> {
    serde_json::from_value(Value::String(text.to_owned())).ok()
}

/// Which elicitation `@elicit` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElicitKind {
    /// Session-scoped form mode.
    Form,
    /// Session-scoped url mode.
    Url,
    /// Request-scoped (the prompt's request id) form mode.
    Request,
    /// Two session-scoped form elicitations outstanding at once.
    Twice,
}

/// The default chunk size of `@chunks`.
pub const DEFAULT_CHUNK_SIZE: usize = 100;
/// The default exit code of `@crash`.
pub const DEFAULT_CRASH_CODE: i32 = 3;
/// The default title of `@permission`.
pub const DEFAULT_PERMISSION_TITLE: &str = "Run mock command";
/// The default message of `@error`.
pub const DEFAULT_ERROR_MESSAGE: &str = "mock error";

/// One `@verb args` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Directive {
    Chunks {
        count: u64,
        size: usize,
    },
    Thought(String),
    Tool(String),
    Plan(Vec<String>),
    Commands,
    ConfigUpdate,
    Image,
    Permission {
        title: String,
    },
    /// A permission request whose tool call has a `kind` (for the harness's permission rules).
    PermissionKind {
        kind: String,
        title: String,
    },
    /// A `usage_update`: tokens used, context size, and a cost (amount as written, currency).
    Usage {
        used: u64,
        size: u64,
        cost: Option<(String, String)>,
    },
    /// The prompt's reply carries `usage` with these input and output tokens.
    TurnUsage {
        input: u64,
        output: u64,
    },
    /// Reports the `_meta.traceparent` the prompt came with (`traceparent: <value>` or
    /// `traceparent: none`).
    Traceparent,
    PermissionTwice,
    /// A permission request the turn does not wait for: the turn ends with it outstanding.
    PermissionNoWait,
    CancelPermission,
    Elicit(ElicitKind),
    UnknownRequest,
    Sleep {
        millis: u64,
    },
    WaitCancel,
    IgnoreCancel,
    Stop(StopReason),
    Error {
        code: ErrorCode,
        message: String,
    },
    Stderr(String),
    Crash {
        code: i32,
    },
    Garbage,
    Long {
        bytes: usize,
    },
    Silent,
    CloseStdout,
    EchoAll,
    /// Report the agent's environment (for tests of what reaches a runtime).
    Env,
    /// Report whether one variable is set, its length and SHA-256, never its value (for tests
    /// that a secret reaches the runtime and nothing else).
    EnvDigest(String),
    /// Report the agent's working directory.
    Cwd,
    /// Report the agent's open file descriptors.
    Fds,
    /// Anything else starting with `@`, or a known verb with bad arguments: the whole line.
    Unknown(String),
}

/// Reads one line; `None` unless it starts with `@` (after trimming whitespace).
pub fn parse_directive(line: &str) -> Option<Directive> {
    let line = line.trim();
    let body = line.strip_prefix('@')?;
    let (verb, rest) = match body.split_once(char::is_whitespace) {
        Some((verb, rest)) => (verb, rest.trim()),
        None => (body, ""),
    };
    Some(known(verb, rest).unwrap_or_else(|| Directive::Unknown(line.to_owned())))
}

/// A known verb with valid arguments; `None` otherwise.
fn known(verb: &str, rest: &str) -> Option<Directive> {
    let args: Vec<&str> = rest.split_whitespace().collect();
    let bare = |directive: Directive| args.is_empty().then_some(directive);
    match (verb, args.as_slice()) {
        ("chunks", [count]) => Some(Directive::Chunks {
            count: count.parse().ok()?,
            size: DEFAULT_CHUNK_SIZE,
        }),
        ("chunks", [count, size]) => Some(Directive::Chunks {
            count: count.parse().ok()?,
            size: size.parse().ok()?,
        }),
        ("thought", _) => Some(Directive::Thought(rest.to_owned())),
        ("tool", [id]) => Some(Directive::Tool((*id).to_owned())),
        ("plan", _) => {
            let entries: Vec<String> = rest
                .split('|')
                .map(str::trim)
                .filter(|entry| !entry.is_empty())
                .map(str::to_owned)
                .collect();
            (!entries.is_empty()).then_some(Directive::Plan(entries))
        }
        ("commands", _) => bare(Directive::Commands),
        ("config-update", _) => bare(Directive::ConfigUpdate),
        ("image", _) => bare(Directive::Image),
        ("permission", _) => Some(Directive::Permission {
            title: if rest.is_empty() {
                DEFAULT_PERMISSION_TITLE.to_owned()
            } else {
                rest.to_owned()
            },
        }),
        ("permission-kind", [kind, ..]) => Some(Directive::PermissionKind {
            kind: (*kind).to_owned(),
            title: match rest[kind.len()..].trim() {
                "" => DEFAULT_PERMISSION_TITLE.to_owned(),
                title => title.to_owned(),
            },
        }),
        ("usage", [used, size]) => Some(Directive::Usage {
            used: used.parse().ok()?,
            size: size.parse().ok()?,
            cost: None,
        }),
        ("usage", [used, size, amount, currency]) => {
            amount.parse::<f64>().ok()?;
            Some(Directive::Usage {
                used: used.parse().ok()?,
                size: size.parse().ok()?,
                cost: Some(((*amount).to_owned(), (*currency).to_owned())),
            })
        }
        ("turn-usage", [input, output]) => Some(Directive::TurnUsage {
            input: input.parse().ok()?,
            output: output.parse().ok()?,
        }),
        ("traceparent", _) => bare(Directive::Traceparent),
        ("permission-twice", _) => bare(Directive::PermissionTwice),
        ("permission-nowait", _) => bare(Directive::PermissionNoWait),
        ("cancel-permission", _) => bare(Directive::CancelPermission),
        ("elicit", [] | ["form"]) => Some(Directive::Elicit(ElicitKind::Form)),
        ("elicit", ["url"]) => Some(Directive::Elicit(ElicitKind::Url)),
        ("elicit", ["request"]) => Some(Directive::Elicit(ElicitKind::Request)),
        ("elicit", ["twice"]) => Some(Directive::Elicit(ElicitKind::Twice)),
        ("unknown-request", _) => bare(Directive::UnknownRequest),
        ("sleep", [millis]) => Some(Directive::Sleep {
            millis: millis.parse().ok()?,
        }),
        ("wait-cancel", _) => bare(Directive::WaitCancel),
        ("ignore-cancel", _) => bare(Directive::IgnoreCancel),
        ("stop", [reason]) => parse_stop_reason(reason).map(Directive::Stop),
        ("error", [code, ..]) => {
            let message = rest[code.len()..].trim();
            Some(Directive::Error {
                code: ErrorCode::from(code.parse::<i32>().ok()?),
                message: if message.is_empty() {
                    DEFAULT_ERROR_MESSAGE.to_owned()
                } else {
                    message.to_owned()
                },
            })
        }
        ("stderr", _) => Some(Directive::Stderr(rest.to_owned())),
        ("crash", []) => Some(Directive::Crash {
            code: DEFAULT_CRASH_CODE,
        }),
        ("crash", [code]) => Some(Directive::Crash {
            code: code.parse().ok()?,
        }),
        ("garbage", _) => bare(Directive::Garbage),
        ("long", [bytes]) => Some(Directive::Long {
            bytes: bytes.parse().ok()?,
        }),
        ("silent", _) => bare(Directive::Silent),
        ("close-stdout", _) => bare(Directive::CloseStdout),
        ("echo-all", _) => bare(Directive::EchoAll),
        ("env", _) => bare(Directive::Env),
        ("env-digest", [name]) => Some(Directive::EnvDigest((*name).to_owned())),
        ("cwd", _) => bare(Directive::Cwd),
        ("fds", _) => bare(Directive::Fds),
        _ => None,
    }
}

/// The directives of a prompt's user text, in order, and the turn-wide flags they set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    pub directives: Vec<Directive>,
    /// `@ignore-cancel` anywhere in the prompt: this turn never honours `session/cancel`.
    pub ignore_cancel: bool,
    /// `@echo-all` anywhere in the prompt: every block is echoed back.
    pub echo_all: bool,
}

impl Script {
    pub fn parse(user_text: &str) -> Self {
        let mut script = Self::default();
        for directive in user_text.lines().filter_map(parse_directive) {
            match directive {
                Directive::IgnoreCancel => script.ignore_cancel = true,
                Directive::EchoAll => script.echo_all = true,
                other => script.directives.push(other),
            }
        }
        script
    }
}

/// A prompt read from `session/prompt`'s blocks.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptView<'a> {
    /// Exactly one text block whose trimmed text is `/compact`.
    Compact,
    Ordinary {
        /// The user's text blocks (those without `_meta`) joined by `\n`.
        user_text: String,
        /// Whether any user text block was present.
        has_user_text: bool,
        /// The `resource_link` blocks, as received, in order.
        links: Vec<&'a Value>,
    },
}

/// The command a compact sends.
pub const COMPACT: &str = "/compact";

fn block_type(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

/// A text block carrying a (non-null) `_meta` is hidden: the harness's invocation block.
pub fn is_hidden(block: &Value) -> bool {
    block.get("_meta").is_some_and(|meta| !meta.is_null())
}

impl<'a> PromptView<'a> {
    pub fn read(blocks: &'a [Value]) -> Self {
        if let [only] = blocks
            && block_type(only) == Some("text")
            && only.get("text").and_then(Value::as_str).map(str::trim) == Some(COMPACT)
        {
            return Self::Compact;
        }
        let mut user_text = String::new();
        let mut has_user_text = false;
        let mut links = Vec::new();
        for block in blocks {
            match block_type(block) {
                Some("text") if !is_hidden(block) => {
                    if has_user_text {
                        user_text.push('\n');
                    }
                    has_user_text = true;
                    user_text.push_str(block.get("text").and_then(Value::as_str).unwrap_or(""));
                }
                Some("resource_link") => links.push(block),
                _ => {}
            }
        }
        Self::Ordinary {
            user_text,
            has_user_text,
            links,
        }
    }
}

/// The deterministic text of chunk `index` (0-based) of `@chunks`, exactly `size` bytes (ASCII),
/// appended to `out`.
pub fn chunk_text(index: u64, size: usize, out: &mut String) {
    const FILL: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let start = out.len();
    use std::fmt::Write as _;
    let _ = write!(out, "#{index}:");
    out.truncate(start + size.min(out.len() - start));
    let mut i = 0;
    while out.len() - start < size {
        out.push(FILL[i % FILL.len()] as char);
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn one(line: &str) -> Directive {
        parse_directive(line).expect("a directive")
    }

    #[test]
    fn lines_not_starting_with_an_at_sign_are_not_directives() {
        assert_eq!(parse_directive("hello @chunks 3"), None);
        assert_eq!(parse_directive(""), None);
        assert_eq!(parse_directive("   "), None);
    }

    #[test]
    fn every_documented_directive_parses_with_its_arguments() {
        assert_eq!(
            one("@chunks 3"),
            Directive::Chunks {
                count: 3,
                size: 100
            }
        );
        assert_eq!(
            one("  @chunks 5 7  "),
            Directive::Chunks { count: 5, size: 7 }
        );
        assert_eq!(
            one("@thought thinking hard"),
            Directive::Thought("thinking hard".into())
        );
        assert_eq!(one("@tool t1"), Directive::Tool("t1".into()));
        assert_eq!(
            one("@plan A | B|C"),
            Directive::Plan(vec!["A".into(), "B".into(), "C".into()])
        );
        assert_eq!(one("@commands"), Directive::Commands);
        assert_eq!(one("@config-update"), Directive::ConfigUpdate);
        assert_eq!(one("@image"), Directive::Image);
        assert_eq!(
            one("@permission"),
            Directive::Permission {
                title: DEFAULT_PERMISSION_TITLE.into()
            }
        );
        assert_eq!(
            one("@permission Delete everything"),
            Directive::Permission {
                title: "Delete everything".into()
            }
        );
        assert_eq!(one("@permission-twice"), Directive::PermissionTwice);
        assert_eq!(
            one("@permission-kind read Read the notes"),
            Directive::PermissionKind {
                kind: "read".into(),
                title: "Read the notes".into()
            }
        );
        assert_eq!(
            one("@usage 53000 200000 0.045 USD"),
            Directive::Usage {
                used: 53000,
                size: 200000,
                cost: Some(("0.045".into(), "USD".into()))
            }
        );
        assert!(matches!(one("@usage 1"), Directive::Unknown(_)));
        assert_eq!(one("@cancel-permission"), Directive::CancelPermission);
        assert_eq!(one("@permission-nowait"), Directive::PermissionNoWait);
        assert_eq!(one("@elicit"), Directive::Elicit(ElicitKind::Form));
        assert_eq!(one("@elicit form"), Directive::Elicit(ElicitKind::Form));
        assert_eq!(one("@elicit url"), Directive::Elicit(ElicitKind::Url));
        assert_eq!(
            one("@elicit request"),
            Directive::Elicit(ElicitKind::Request)
        );
        assert_eq!(one("@elicit twice"), Directive::Elicit(ElicitKind::Twice));
        assert_eq!(one("@unknown-request"), Directive::UnknownRequest);
        assert_eq!(one("@sleep 250"), Directive::Sleep { millis: 250 });
        assert_eq!(one("@wait-cancel"), Directive::WaitCancel);
        assert_eq!(one("@ignore-cancel"), Directive::IgnoreCancel);
        assert_eq!(
            one("@stop max_tokens"),
            Directive::Stop(StopReason::MaxTokens)
        );
        assert_eq!(
            one("@error -32603 it broke badly"),
            Directive::Error {
                code: ErrorCode::InternalError,
                message: "it broke badly".into()
            }
        );
        assert_eq!(
            one("@error 5"),
            Directive::Error {
                code: ErrorCode::Other(5),
                message: DEFAULT_ERROR_MESSAGE.into()
            }
        );
        assert_eq!(one("@stderr oh no"), Directive::Stderr("oh no".into()));
        assert_eq!(one("@crash"), Directive::Crash { code: 3 });
        assert_eq!(one("@crash 42"), Directive::Crash { code: 42 });
        assert_eq!(one("@garbage"), Directive::Garbage);
        assert_eq!(one("@long 9000"), Directive::Long { bytes: 9000 });
        assert_eq!(one("@silent"), Directive::Silent);
        assert_eq!(one("@close-stdout"), Directive::CloseStdout);
        assert_eq!(one("@echo-all"), Directive::EchoAll);
        assert_eq!(one("@env"), Directive::Env);
        assert_eq!(one("@cwd"), Directive::Cwd);
        assert_eq!(one("@fds"), Directive::Fds);
        assert_eq!(one("@env x"), Directive::Unknown("@env x".into()));
    }

    #[test]
    fn every_stop_reason_round_trips_and_others_are_unknown() {
        for reason in [
            "end_turn",
            "max_tokens",
            "max_turn_requests",
            "refusal",
            "cancelled",
        ] {
            let Directive::Stop(parsed) = one(&format!("@stop {reason}")) else {
                panic!("@stop {reason} is a stop directive");
            };
            assert_eq!(serde_json::to_value(parsed).unwrap(), reason);
        }
        assert_eq!(one("@stop tired"), Directive::Unknown("@stop tired".into()));
    }

    #[test]
    fn an_unknown_verb_or_bad_arguments_give_an_unknown_directive_with_the_whole_line() {
        for line in [
            "@frobnicate",
            "@",
            "@chunks",
            "@chunks x",
            "@chunks 1 2 3",
            "@tool",
            "@tool a b",
            "@plan | |",
            "@sleep soon",
            "@crash x",
            "@long",
            "@error",
            "@error x boom",
            "@elicit sideways",
            "@commands now",
            "@someone please review",
        ] {
            assert_eq!(one(line), Directive::Unknown(line.into()), "{line}");
        }
    }

    #[test]
    fn a_script_takes_directive_lines_in_order_and_lifts_turn_wide_flags() {
        let script =
            Script::parse("hello\n@chunks 2\nnot one\n@ignore-cancel\n@sleep 5\n@echo-all");
        assert_eq!(
            script.directives,
            [
                Directive::Chunks {
                    count: 2,
                    size: 100
                },
                Directive::Sleep { millis: 5 }
            ]
        );
        assert!(script.ignore_cancel && script.echo_all);
        assert_eq!(Script::parse("plain text"), Script::default());
    }

    #[test]
    fn only_a_lone_compact_text_block_is_a_compact() {
        let compact = [json!({"type": "text", "text": "  /compact \n"})];
        assert_eq!(PromptView::read(&compact), PromptView::Compact);
        let with_hidden = [
            json!({"type": "text", "text": "/compact"}),
            json!({"type": "text", "text": "x", "_meta": {"k": true}}),
        ];
        assert!(matches!(
            PromptView::read(&with_hidden),
            PromptView::Ordinary { .. }
        ));
        let with_link = [
            json!({"type": "text", "text": "/compact"}),
            json!({"type": "resource_link", "name": "a", "uri": "https://a"}),
        ];
        assert!(matches!(
            PromptView::read(&with_link),
            PromptView::Ordinary { .. }
        ));
    }

    #[test]
    fn hidden_blocks_are_left_out_of_the_user_text_and_links_keep_their_order() {
        let blocks = [
            json!({"type": "text", "text": "first"}),
            json!({"type": "resource_link", "name": "a", "uri": "https://a"}),
            json!({"type": "text", "text": "second"}),
            json!({"type": "resource_link", "name": "b", "uri": "https://b", "size": 3}),
            json!({"type": "text", "text": "secret", "_meta": {"macro/invocation-context": true}}),
        ];
        let PromptView::Ordinary {
            user_text,
            has_user_text,
            links,
        } = PromptView::read(&blocks)
        else {
            panic!("not a compact");
        };
        assert_eq!(user_text, "first\nsecond");
        assert!(has_user_text);
        assert_eq!(links, [&blocks[1], &blocks[3]]);
    }

    #[test]
    fn a_prompt_of_only_links_and_hidden_text_has_no_user_text() {
        let blocks = [
            json!({"type": "resource_link", "name": "a", "uri": "https://a"}),
            json!({"type": "text", "text": "secret", "_meta": {"x": 1}}),
        ];
        let PromptView::Ordinary { has_user_text, .. } = PromptView::read(&blocks) else {
            panic!("not a compact");
        };
        assert!(!has_user_text);
    }

    #[test]
    fn chunk_text_is_exactly_the_requested_size_and_deterministic() {
        for size in [0, 1, 3, 100, 4096] {
            for index in [0, 7, 12345] {
                let mut a = String::new();
                chunk_text(index, size, &mut a);
                assert_eq!(a.len(), size);
                let mut b = String::from("prefix");
                chunk_text(index, size, &mut b);
                assert_eq!(&b[6..], a);
            }
        }
        let mut text = String::new();
        chunk_text(2, 10, &mut text);
        assert_eq!(text, "#2:abcdefg");
    }
}
