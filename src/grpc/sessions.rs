//! `AgentSessionService`: each handler authenticates, decodes (so a bad request is refused
//! before anything is located or claimed), locates the session, and either calls the session
//! registry here or hands the decoded request to the replica that runs the session
//! ([`Forwarder`]); then encodes. No behaviour lives here.

use std::{pin::Pin, sync::Arc};

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::{
    auth, convert,
    forward::{self, CREATE_FORWARD_TIMEOUT, Caller, FORWARD_TIMEOUT, Forwarder},
    frame::SubscribeFrame,
    framed::agent_session_service_server::AgentSessionService,
};
use crate::{
    domain::ActionId,
    pb::v1 as pb,
    session::{
        ControlInput, ControlStatus, SessionHandle, Sessions,
        manager::{CreateInput, Creation, ListInput, Located, parse_queued_id},
    },
};

pub(crate) struct SessionsService {
    sessions: Arc<Sessions>,
    forward: Forwarder,
}

impl SessionsService {
    pub(crate) fn new(sessions: Arc<Sessions>, forward: Forwarder) -> Self {
        Self { sessions, forward }
    }
}

/// Where a call about one session goes on: here, with the session's actor, or nowhere (the
/// replica that runs the session answered it, and that answer is the reply).
enum Routed<Req, Resp> {
    Here(SessionHandle, Req),
    Answered(Reply<Resp>),
}

impl SessionsService {
    /// Locates the session `message` is about; when another replica runs it, sends `message`
    /// there with `call` and hands back that replica's answer. Call once the request decoded.
    async fn route<Req, Resp, Call, CallFut>(
        &self,
        caller: &Caller,
        message: Req,
        session_id: fn(&Req) -> &str,
        call: Call,
    ) -> Routed<Req, Resp>
    where
        Call: FnOnce(forward::Client, Request<Req>) -> CallFut,
        CallFut: Future<Output = Reply<Resp>>,
    {
        let located = self
            .sessions
            .locate(&caller.principal, session_id(&message))
            .await;
        match located {
            Ok(Located::Here(handle)) => Routed::Here(handle, message),
            Ok(Located::Owner(address)) => Routed::Answered(
                self.forward
                    .call(
                        caller,
                        &address,
                        FORWARD_TIMEOUT,
                        message,
                        call,
                        owner_did_not_answer,
                    )
                    .await,
            ),
            Err(error) => Routed::Answered(Err(error.into())),
        }
    }
}

/// The owner did not answer a forwarded call in time: it may or may not have acted.
fn owner_did_not_answer() -> Status {
    forward::unavailable("the replica that runs this session did not answer; retry shortly")
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl AgentSessionService for SessionsService {
    type SubscribeStream = Pin<Box<dyn Stream<Item = Result<SubscribeFrame, Status>> + Send>>;

    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::CreateSessionResponse> {
        let caller = Caller::of(&request)?;
        let input = CreateInput::from(request.into_inner());
        let created = match self
            .sessions
            .create(&caller.principal, input, caller.traceparent.clone())
            .await?
        {
            Creation::Here(created) => created,
            // A remote profile's session is created on the replica holding a matching bridge's
            // stream, which also starts its runtime.
            Creation::Elsewhere { address, input } => {
                return self
                    .forward
                    .call(
                        &caller,
                        &address,
                        CREATE_FORWARD_TIMEOUT,
                        pb::CreateSessionRequest::from(input),
                        |mut c, r| async move { c.create_session(r).await },
                        owner_did_not_answer,
                    )
                    .await;
            }
        };
        Ok(Response::new(pb::CreateSessionResponse {
            session: Some(convert::session_to_pb(&created.record, created.head)),
            first_action_id: created.first_action_id.map(|id| id.to_string()),
        }))
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Reply<pb::GetSessionResponse> {
        let principal = auth::principal(&request)?;
        let (record, head, reported) = self
            .sessions
            .get_reported(&principal, &request.get_ref().session_id)
            .await?;
        Ok(Response::new(pb::GetSessionResponse {
            session: Some(convert::session_with_reported_to_pb(
                &record, head, &reported,
            )),
        }))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Reply<pb::ListSessionsResponse> {
        let principal = auth::principal(&request)?;
        let input = ListInput::try_from(request.into_inner())?;
        let (page, next_page_token) = self.sessions.list(&principal, input).await?;
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: page
                .iter()
                .map(|(record, head)| convert::session_to_pb(record, *head))
                .collect(),
            next_page_token,
        }))
    }

    async fn fork_session(
        &self,
        request: Request<pb::ForkSessionRequest>,
    ) -> Reply<pb::ForkSessionResponse> {
        // Forked where the parent runs: the new session's runtime forks the parent's context.
        let caller = Caller::of(&request)?;
        self.sessions
            .check_fork_name(request.get_ref().name.as_deref())?;
        let message = request.into_inner();
        let (handle, message) = match self
            .route(
                &caller,
                message,
                |m| &m.session_id,
                |mut c, r| async move { c.fork_session(r).await },
            )
            .await
        {
            Routed::Here(handle, message) => (handle, message),
            Routed::Answered(reply) => return reply,
        };
        let name = message.name;
        let (record, head) = self
            .sessions
            .fork(&handle, &caller.principal, name, caller.traceparent)
            .await?;
        Ok(Response::new(pb::ForkSessionResponse {
            session: Some(convert::session_to_pb(&record, head)),
        }))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let handle = match self
            .route(
                &caller,
                message,
                |m| &m.session_id,
                |mut c, r| async move { c.close_session(r).await },
            )
            .await
        {
            Routed::Here(handle, _) => handle,
            Routed::Answered(reply) => return reply,
        };
        let (record, head) = self.sessions.close(&handle).await?;
        Ok(Response::new(pb::CloseSessionResponse {
            session: Some(convert::session_to_pb(&record, head)),
        }))
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Reply<pb::DeleteSessionResponse> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let handle = match self
            .route(
                &caller,
                message,
                |m| &m.session_id,
                |mut c, r| async move { c.delete_session(r).await },
            )
            .await
        {
            Routed::Here(handle, _) => handle,
            Routed::Answered(reply) => return reply,
        };
        self.sessions.delete(&handle).await?;
        Ok(Response::new(pb::DeleteSessionResponse {}))
    }

    async fn control(&self, request: Request<pb::ControlRequest>) -> Reply<pb::ControlResponse> {
        let caller = Caller::of(&request)?;
        let mut input = ControlInput::try_from(request.into_inner())?;
        let handle = match self
            .sessions
            .locate(&caller.principal, &input.session_id)
            .await?
        {
            Located::Here(handle) => handle,
            Located::Owner(address) => {
                // Named before the hop, so a caller that never hears back can retry with the
                // same id without risking a second action.
                let action_id = *input.action_id.get_or_insert_with(ActionId::mint);
                return self
                    .forward
                    .call(
                        &caller,
                        &address,
                        FORWARD_TIMEOUT,
                        pb::ControlRequest::from(input),
                        |mut c, r| async move { c.control(r).await },
                        || forward::outcome_unknown(action_id),
                    )
                    .await;
            }
        };
        let outcome = self
            .sessions
            .control(&handle, &caller.principal, input, caller.traceparent)
            .await?;
        let (status, queue_position) = match outcome.status {
            ControlStatus::Sent => (pb::ControlStatus::Sent, 0),
            ControlStatus::Queued(position) => (pb::ControlStatus::Queued, position),
        };
        Ok(Response::new(pb::ControlResponse {
            action_id: outcome.action_id.to_string(),
            status: status as i32,
            queue_position,
        }))
    }

    async fn get_usage(
        &self,
        request: Request<pb::GetUsageRequest>,
    ) -> Reply<pb::GetUsageResponse> {
        let principal = auth::principal(&request)?;
        let request = request.into_inner();
        let since = convert::since_from_pb(request.since)?;
        let answer = self
            .sessions
            .usage(&principal, &request.principal, since)
            .await?;
        Ok(Response::new(convert::usage_report_to_pb(&answer)))
    }

    async fn get_queue(
        &self,
        request: Request<pb::GetQueueRequest>,
    ) -> Reply<pb::GetQueueResponse> {
        let principal = auth::principal(&request)?;
        let entries = self
            .sessions
            .get_queue(&principal, &request.get_ref().session_id)
            .await?;
        Ok(Response::new(convert::queue_to_pb(&entries)))
    }

    async fn edit_queued_prompt(
        &self,
        request: Request<pb::EditQueuedPromptRequest>,
    ) -> Reply<pb::EditQueuedPromptResponse> {
        let caller = Caller::of(&request)?;
        let action_id = parse_queued_id(&request.get_ref().action_id)?;
        let message = request.into_inner();
        let (handle, message) = match self
            .route(
                &caller,
                message,
                |m| &m.session_id,
                |mut c, r| async move { c.edit_queued_prompt(r).await },
            )
            .await
        {
            Routed::Here(handle, message) => (handle, message),
            Routed::Answered(reply) => return reply,
        };
        let text = message.prompt;
        let entry = self
            .sessions
            .edit_queued(&handle, &caller.principal, action_id, text)
            .await?;
        Ok(Response::new(pb::EditQueuedPromptResponse {
            entry: Some(pb::QueuedAction::from(&entry)),
        }))
    }

    async fn remove_queued_action(
        &self,
        request: Request<pb::RemoveQueuedActionRequest>,
    ) -> Reply<pb::RemoveQueuedActionResponse> {
        let caller = Caller::of(&request)?;
        let action_id = parse_queued_id(&request.get_ref().action_id)?;
        let message = request.into_inner();
        let handle = match self
            .route(
                &caller,
                message,
                |m| &m.session_id,
                |mut c, r| async move { c.remove_queued_action(r).await },
            )
            .await
        {
            Routed::Here(handle, _) => handle,
            Routed::Answered(reply) => return reply,
        };
        self.sessions.remove_queued(&handle, action_id).await?;
        Ok(Response::new(pb::RemoveQueuedActionResponse {}))
    }

    async fn read_log(&self, request: Request<pb::ReadLogRequest>) -> Reply<pb::ReadLogResponse> {
        let principal = auth::principal(&request)?;
        let request = request.get_ref();
        let (entries, head_offset) = self
            .sessions
            .read_log(
                &principal,
                &request.session_id,
                request.after_offset,
                request.limit,
            )
            .await?;
        Ok(Response::new(pb::ReadLogResponse {
            entries: entries.iter().map(pb::LogEntry::from).collect(),
            head_offset,
        }))
    }

    async fn get_transcript(
        &self,
        request: Request<pb::GetTranscriptRequest>,
    ) -> Reply<pb::GetTranscriptResponse> {
        let principal = auth::principal(&request)?;
        let request = request.get_ref();
        let transcript = self
            .sessions
            .transcript(
                &principal,
                &request.session_id,
                request.page_size,
                &request.page_token,
            )
            .await?;
        Ok(Response::new(pb::GetTranscriptResponse {
            messages: transcript
                .messages
                .iter()
                .map(pb::TranscriptMessage::from)
                .collect(),
            metadata: Some(convert::metadata_to_pb(
                &transcript.metadata,
                transcript.status,
            )),
            head_offset: transcript.head,
            next_page_token: transcript.next_page_token,
        }))
    }

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Reply<Self::SubscribeStream> {
        let principal = auth::principal(&request)?;
        let credential = auth::credential(&request);
        let request = request.get_ref();
        let view = convert::view_from_pb(request.view)?;
        let events = self
            .sessions
            .subscribe(&principal, &request.session_id, request.after_offset, view)
            .await?;
        let stream = events.map(|item| match item {
            Ok((offset, event)) => Ok(SubscribeFrame::of(offset, &event)),
            Err(error) => Err(Status::from(error)),
        });
        Ok(Response::new(auth::end_when_revoked(
            Box::pin(stream),
            credential,
        )))
    }
}
