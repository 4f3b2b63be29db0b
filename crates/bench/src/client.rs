//! The benchmark's gRPC client side of the harness: creating sessions, prompting, and following a
//! session's LOG stream to the runtime's response to a prompt.

use std::{path::Path, time::Duration};

use anyhow::{Context, bail};
use tonic::{Streaming, transport::Channel};

use agent_harness::pb::v1::{
    self as pb, agent_session_service_client::AgentSessionServiceClient, control_request::Action,
    subscribe_response::Event,
};

/// How long any single wait on the harness may take before the run fails.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(60);

pub fn sessions(channel: &Channel) -> AgentSessionServiceClient<Channel> {
    AgentSessionServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20)
}

/// Creates a session of the built-in `mock` profile; returns its id and head offset.
pub async fn create_session(channel: &Channel, cwd: &Path) -> anyhow::Result<(String, u64)> {
    create_session_of(channel, cwd, "mock").await
}

/// Creates a session of `profile`; returns its id and head offset.
pub async fn create_session_of(
    channel: &Channel,
    cwd: &Path,
    profile: &str,
) -> anyhow::Result<(String, u64)> {
    let created = tokio::time::timeout(
        WAIT_TIMEOUT,
        sessions(channel).create_session(pb::CreateSessionRequest {
            profile: profile.to_owned(),
            cwd: cwd.to_string_lossy().into_owned(),
            ..Default::default()
        }),
    )
    .await
    .context("CreateSession timed out")?
    .context("CreateSession")?
    .into_inner();
    let session = created
        .session
        .context("CreateSession answered no session")?;
    Ok((session.id, session.head_offset))
}

/// Sends a prompt; returns its action id (whether it was SENT or QUEUED).
pub async fn prompt(
    client: &mut AgentSessionServiceClient<Channel>,
    session_id: &str,
    text: &str,
) -> anyhow::Result<String> {
    let reply = client
        .control(pb::ControlRequest {
            session_id: session_id.to_owned(),
            action: Some(Action::Prompt(pb::PromptAction {
                prompt: text.to_owned(),
                attachments: Vec::new(),
            })),
            ..Default::default()
        })
        .await
        .context("Control")?
        .into_inner();
    Ok(reply.action_id)
}

/// A session's stream (the LOG view unless opened with another).
pub struct LogStream {
    stream: Streaming<pb::SubscribeResponse>,
}

/// Whether a log entry is the runtime's response to a prompt: the prompt's id, a result (or an
/// error), no method. Parsed the way the direct driver parses the agent's lines.
pub fn is_response_to(entry: &pb::LogEntry, action_id: &str) -> bool {
    if entry.direction != pb::LogDirection::FromRuntime as i32
        || entry.action_id.as_deref() != Some(action_id)
    {
        return false;
    }
    let Ok(frame) = serde_json::from_str::<serde_json::Value>(&entry.json) else {
        return false;
    };
    frame.get("method").is_none() && frame.get("id").and_then(|id| id.as_str()) == Some(action_id)
}

impl LogStream {
    /// Subscribes to the LOG view after `after` and waits for `caught_up`.
    pub async fn open(channel: &Channel, session_id: &str, after: u64) -> anyhow::Result<Self> {
        Self::open_view(channel, session_id, after, pb::SubscribeView::Log).await
    }

    /// Subscribes to a view after `after` and waits for `caught_up`.
    pub async fn open_view(
        channel: &Channel,
        session_id: &str,
        after: u64,
        view: pb::SubscribeView,
    ) -> anyhow::Result<Self> {
        let stream = sessions(channel)
            .subscribe(pb::SubscribeRequest {
                session_id: session_id.to_owned(),
                after_offset: after,
                view: view as i32,
            })
            .await
            .context("Subscribe")?
            .into_inner();
        let mut this = Self { stream };
        this.until(|event| matches!(event, Event::CaughtUp(_)))
            .await
            .context("waiting for caught_up")?;
        Ok(this)
    }

    /// The next event.
    pub async fn next(&mut self) -> anyhow::Result<Event> {
        match self.stream.message().await.context("the stream failed")? {
            Some(pb::SubscribeResponse {
                event: Some(event), ..
            }) => Ok(event),
            Some(_) => bail!("a stream message without an event"),
            None => bail!("the stream ended"),
        }
    }

    /// Reads until an event matches (bounded by [`WAIT_TIMEOUT`]).
    pub async fn until(&mut self, matches: impl Fn(&Event) -> bool) -> anyhow::Result<Event> {
        tokio::time::timeout(WAIT_TIMEOUT, async {
            loop {
                let event = self.next().await?;
                if matches(&event) {
                    return Ok(event);
                }
            }
        })
        .await
        .context("timed out waiting on a session stream")?
    }

    /// Reads until the runtime's response to `action_id`; returns it.
    pub async fn response_to(&mut self, action_id: &str) -> anyhow::Result<pb::LogEntry> {
        match self
            .until(|event| matches!(event, Event::Entry(entry) if is_response_to(entry, action_id)))
            .await?
        {
            Event::Entry(entry) => Ok(entry),
            _ => unreachable!("matched an entry"),
        }
    }

    /// Reads until the turn opened by `action_id` has ended (its TurnEnded event, sent in every
    /// view after the turn's final snapshot or response entry).
    pub async fn turn_ended(&mut self, action_id: &str) -> anyhow::Result<pb::TurnEnded> {
        match self
            .until(|event| matches!(event, Event::TurnEnded(end) if end.request_id == action_id))
            .await?
        {
            Event::TurnEnded(end) => Ok(end),
            _ => unreachable!("matched a turn end"),
        }
    }

    /// Reads until a status event announces `status`.
    pub async fn status(&mut self, status: pb::SessionStatus) -> anyhow::Result<()> {
        let want = status as i32;
        self.until(|event| matches!(event, Event::Status(change) if change.status == want))
            .await
            .map(drop)
    }
}
