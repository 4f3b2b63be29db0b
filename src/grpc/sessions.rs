//! `AgentSessionService`: each handler authenticates, decodes, calls the session registry, and
//! encodes. No behaviour lives here.

use std::{pin::Pin, sync::Arc};

use futures::{Stream, StreamExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{
    auth, convert, frame::SubscribeFrame, framed::agent_session_service_server::AgentSessionService,
};
use crate::{
    pb::v1 as pb,
    session::{
        ControlInput, ControlStatus, Sessions,
        manager::{CreateInput, ListInput},
    },
};

pub(crate) struct SessionsService {
    sessions: Arc<Sessions>,
}

impl SessionsService {
    pub(crate) fn new(sessions: Arc<Sessions>) -> Self {
        Self { sessions }
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl AgentSessionService for SessionsService {
    type SubscribeStream = Pin<Box<dyn Stream<Item = Result<SubscribeFrame, Status>> + Send>>;

    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::CreateSessionResponse> {
        let principal = auth::principal(&request)?;
        let traceparent = auth::traceparent(&request);
        let input = CreateInput::from(request.into_inner());
        let created = self.sessions.create(&principal, input, traceparent).await?;
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
        let principal = auth::principal(&request)?;
        let traceparent = auth::traceparent(&request);
        let request = request.into_inner();
        let (record, head) = self
            .sessions
            .fork(&principal, &request.session_id, request.name, traceparent)
            .await?;
        Ok(Response::new(pb::ForkSessionResponse {
            session: Some(convert::session_to_pb(&record, head)),
        }))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        let principal = auth::principal(&request)?;
        let (record, head) = self
            .sessions
            .close(&principal, &request.get_ref().session_id)
            .await?;
        Ok(Response::new(pb::CloseSessionResponse {
            session: Some(convert::session_to_pb(&record, head)),
        }))
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Reply<pb::DeleteSessionResponse> {
        let principal = auth::principal(&request)?;
        self.sessions
            .delete(&principal, &request.get_ref().session_id)
            .await?;
        Ok(Response::new(pb::DeleteSessionResponse {}))
    }

    async fn control(&self, request: Request<pb::ControlRequest>) -> Reply<pb::ControlResponse> {
        let principal = auth::principal(&request)?;
        let traceparent = auth::traceparent(&request);
        let input = ControlInput::try_from(request.into_inner())?;
        let outcome = self
            .sessions
            .control(&principal, input, traceparent)
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
        let principal = auth::principal(&request)?;
        let request = request.into_inner();
        let entry = self
            .sessions
            .edit_queued(
                &principal,
                &request.session_id,
                &request.action_id,
                request.prompt,
            )
            .await?;
        Ok(Response::new(pb::EditQueuedPromptResponse {
            entry: Some(pb::QueuedAction::from(&entry)),
        }))
    }

    async fn remove_queued_action(
        &self,
        request: Request<pb::RemoveQueuedActionRequest>,
    ) -> Reply<pb::RemoveQueuedActionResponse> {
        let principal = auth::principal(&request)?;
        let request = request.get_ref();
        self.sessions
            .remove_queued(&principal, &request.session_id, &request.action_id)
            .await?;
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
        let stream = ReceiverStream::new(events).map(|item| match item {
            Ok((offset, event)) => Ok(SubscribeFrame::of(offset, &event)),
            Err(error) => Err(Status::from(error)),
        });
        Ok(Response::new(auth::end_when_revoked(
            Box::pin(stream),
            credential,
        )))
    }
}
