//! Scripted fake model servers: stand-ins on loopback for the model APIs that real coding agents
//! call, so that the agents run complete turns in tests with no internet and no API key.
//!
//! ```ignore
//! let fake = FakeServer::start(Api::Anthropic).await?;
//! // give the agent ANTHROPIC_BASE_URL=fake.base_url(), then prompt it with
//! // "please [write hello.txt]"; afterwards:
//! let request = fake.recorder().wait_for(|r| r.is_model_call()).await;
//! assert_eq!(request.last_user_text.as_deref(), Some("please [write hello.txt]"));
//! ```
//!
//! What a turn does is scripted by directives in the text of the last user prompt (see
//! [`directive`]): `[write NAME]` makes the model call the agent's file-writing tool and answer
//! briefly once the tool's result comes back, `[stall N]` stalls the stream for N seconds,
//! `[error 401|429|500]` answers with that HTTP error, `[think]` streams a thinking block first,
//! and plain text gets a reply quoting the prompt's marker (its text without directives).
//!
//! The layout keeps one module per API next to what they share:
//!
//! - [`directive`]: the directives in a prompt's text, and its marker;
//! - [`script`]: what the model does in one request ([`script::Turn`]), decided from an
//!   API-neutral view of the conversation ([`script::Conversation`]);
//! - [`record`]: every request the server received, for assertions (also `GET /_requests`);
//! - [`server`]: the HTTP/1.1 server, its shared routes (`HEAD /`, `GET /_requests`) and the
//!   streaming body;
//! - [`anthropic`]: the Anthropic Messages API (`POST /v1/messages`, SSE), as Claude Code calls it;
//! - [`openai_responses`]: the OpenAI Responses API (`POST /v1/responses`, SSE), as Codex calls it;
//! - [`openai_chat`]: the OpenAI Chat Completions API (`POST /v1/chat/completions`, SSE), as
//!   opencode calls it.
//!
//! Another API (e.g. Gemini) is one more module beside
//! `anthropic`: it reads its request into a [`script::Conversation`], records it, and renders the
//! [`script::Turn`] in its own wire format; plus a variant of [`Api`] and a line in
//! `server::dispatch`.

pub mod anthropic;
pub mod directive;
pub mod openai_chat;
pub mod openai_responses;
pub mod record;
pub mod script;
pub mod server;

pub use record::{RecordedRequest, Recorder};
pub use server::{Api, FakeServer};
