//! What the fake model does in answer to one request, whatever the API: each API module reads its
//! request into a [`Conversation`], asks [`plan`] for the [`Turn`], and renders the turn in its own
//! wire format (SSE events, JSON).

use std::{path::Path, time::Duration};

use crate::directive::{self, Prompt};

/// What the `[write NAME]` tool call writes into the file.
pub const WRITTEN_CONTENT: &str = "hello from the fake model\n";

/// The API-neutral view of a request that the script needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conversation {
    /// The text of the last prompt a person wrote (texts the agent inserts left out).
    pub last_user_text: Option<String>,
    /// The result of the model's own tool call, when the request answers one.
    pub tool_result: Option<ToolResult>,
    /// The agent's working directory, when the request tells it (relative `[write]` targets are
    /// resolved against it).
    pub cwd: Option<String>,
    /// Whether the agent offered tools. A request without any is a side request of the agent
    /// (a title, a summary): it gets a plain reply, never a stall, an error or a tool call.
    pub offers_tools: bool,
}

/// The outcome of the model's tool call, as the agent reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    pub is_error: bool,
}

/// One step of a streamed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Thinking(String),
    Text(String),
    /// Nothing is sent for this long (the stream stays open).
    Stall(Duration),
    /// A call of the agent's file-writing tool (each API names and shapes it its agent's way).
    WriteFile {
        path: String,
        content: String,
    },
}

/// Why a streamed answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    EndTurn,
    /// The answer ends with a tool call the agent is to run.
    ToolUse,
}

/// The model's whole answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// An HTTP error status with a message.
    Error {
        status: u16,
        message: String,
        /// Whether the answer leaves retrying to the agent (`[flaky N]`) or says not to.
        retryable: bool,
    },
    Answer {
        steps: Vec<Step>,
        stop: Stop,
    },
}

/// The reply that quotes a prompt's marker.
pub fn reply_text(marker: &str) -> String {
    format!("Fake reply to \"{marker}\".")
}

/// What the model does for this conversation.
pub fn plan(conversation: &Conversation) -> Turn {
    let prompt = conversation
        .last_user_text
        .as_deref()
        .map(directive::parse)
        .unwrap_or_default();
    if !conversation.offers_tools {
        return answer(vec![Step::Text(reply_text(&prompt.marker))]);
    }
    if let Some(result) = &conversation.tool_result {
        return after_tool(&prompt, result);
    }
    if let Some(status) = prompt.error() {
        return Turn::Error {
            status,
            message: format!("fake model error {status} (scripted by [error {status}])"),
            retryable: false,
        };
    }
    if let Some(status) = prompt.flaky() {
        return Turn::Error {
            status,
            message: format!("fake model error {status} (scripted by [flaky {status}])"),
            retryable: true,
        };
    }
    let mut steps = Vec::new();
    if prompt.thinks() {
        steps.push(Step::Thinking(format!(
            "Thinking about \"{}\".",
            prompt.marker
        )));
    }
    let stall = prompt.stall();
    if !stall.is_zero() {
        steps.push(Step::Text(format!("Stalling for {} s. ", stall.as_secs())));
        steps.push(Step::Stall(stall));
    }
    if let Some(target) = prompt.write_target() {
        steps.push(Step::Text(format!("I will write {target}.")));
        steps.push(Step::WriteFile {
            path: resolve(target, conversation.cwd.as_deref()),
            content: WRITTEN_CONTENT.to_owned(),
        });
        return Turn::Answer {
            steps,
            stop: Stop::ToolUse,
        };
    }
    steps.push(Step::Text(reply_text(&prompt.marker)));
    answer(steps)
}

/// The short answer once the tool's result came back.
fn after_tool(prompt: &Prompt, result: &ToolResult) -> Turn {
    let target = prompt.write_target().unwrap_or("the file");
    let outcome = if result.is_error {
        format!("The tool could not write {target}.")
    } else {
        format!("Wrote {target}.")
    };
    answer(vec![Step::Text(format!(
        "{outcome} {}",
        reply_text(&prompt.marker)
    ))])
}

fn answer(steps: Vec<Step>) -> Turn {
    Turn::Answer {
        steps,
        stop: Stop::EndTurn,
    }
}

fn resolve(target: &str, cwd: Option<&str>) -> String {
    match cwd {
        Some(cwd) if !Path::new(target).is_absolute() => {
            Path::new(cwd).join(target).to_string_lossy().into_owned()
        }
        _ => target.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(text: &str) -> Conversation {
        Conversation {
            last_user_text: Some(text.to_owned()),
            cwd: Some("/work/dir".to_owned()),
            offers_tools: true,
            ..Default::default()
        }
    }

    #[test]
    fn plain_text_gets_a_reply_quoting_its_marker() {
        assert_eq!(
            plan(&asked("hello there")),
            Turn::Answer {
                steps: vec![Step::Text("Fake reply to \"hello there\".".into())],
                stop: Stop::EndTurn
            }
        );
    }

    #[test]
    fn a_write_is_a_tool_call_in_the_working_directory_then_a_short_answer() {
        let Turn::Answer { steps, stop } = plan(&asked("go [write hello.txt]")) else {
            panic!("an answer")
        };
        assert_eq!(stop, Stop::ToolUse);
        assert_eq!(
            steps.last(),
            Some(&Step::WriteFile {
                path: "/work/dir/hello.txt".into(),
                content: WRITTEN_CONTENT.into()
            })
        );
        let mut after = asked("go [write hello.txt]");
        after.tool_result = Some(ToolResult { is_error: false });
        assert_eq!(
            plan(&after),
            Turn::Answer {
                steps: vec![Step::Text("Wrote hello.txt. Fake reply to \"go\".".into())],
                stop: Stop::EndTurn
            }
        );
    }

    #[test]
    fn an_absolute_write_target_stays_as_it_is() {
        let Turn::Answer { steps, .. } = plan(&asked("[write /tmp/x.txt]")) else {
            panic!("an answer")
        };
        assert!(steps.contains(&Step::WriteFile {
            path: "/tmp/x.txt".into(),
            content: WRITTEN_CONTENT.into()
        }));
    }

    #[test]
    fn a_stall_streams_a_first_chunk_then_waits() {
        let Turn::Answer { steps, .. } = plan(&asked("slow [stall 8]")) else {
            panic!("an answer")
        };
        assert_eq!(steps[1], Step::Stall(Duration::from_secs(8)));
        assert_eq!(steps[2], Step::Text("Fake reply to \"slow\".".into()));
    }

    #[test]
    fn an_error_directive_is_an_http_error() {
        assert!(matches!(
            plan(&asked("[error 429]")),
            Turn::Error { status: 429, .. }
        ));
    }

    #[test]
    fn a_side_request_without_tools_never_stalls_or_fails() {
        let mut side = asked("x [stall 30] [error 500]");
        side.offers_tools = false;
        assert_eq!(
            plan(&side),
            Turn::Answer {
                steps: vec![Step::Text("Fake reply to \"x\".".into())],
                stop: Stop::EndTurn
            }
        );
    }
}
