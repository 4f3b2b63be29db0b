//! `AgentSessionService`.

use std::pin::Pin;

use futures::Stream;
use tonic::{Request, Response, Status};

use super::auth;
use crate::{
    domain::{Error, ErrorCode},
    pb::v1::{self as pb, agent_session_service_server::AgentSessionService},
};

#[derive(Debug, Default)]
pub struct SessionsService;

fn unimplemented<T>(rpc: &str) -> Result<T, Status> {
    Err(Error::new(
        ErrorCode::Unimplemented,
        format!("AgentSessionService.{rpc} is not built yet"),
    )
    .into())
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl AgentSessionService for SessionsService {
    type SubscribeStream =
        Pin<Box<dyn Stream<Item = Result<pb::SubscribeResponse, Status>> + Send>>;

    async fn create_session(
        &self,
        r: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::CreateSessionResponse> {
        auth::principal(&r)?;
        unimplemented("CreateSession")
    }
    async fn get_session(
        &self,
        r: Request<pb::GetSessionRequest>,
    ) -> Reply<pb::GetSessionResponse> {
        auth::principal(&r)?;
        unimplemented("GetSession")
    }
    async fn list_sessions(
        &self,
        r: Request<pb::ListSessionsRequest>,
    ) -> Reply<pb::ListSessionsResponse> {
        auth::principal(&r)?;
        unimplemented("ListSessions")
    }
    async fn close_session(
        &self,
        r: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        auth::principal(&r)?;
        unimplemented("CloseSession")
    }
    async fn delete_session(
        &self,
        r: Request<pb::DeleteSessionRequest>,
    ) -> Reply<pb::DeleteSessionResponse> {
        auth::principal(&r)?;
        unimplemented("DeleteSession")
    }
    async fn control(&self, r: Request<pb::ControlRequest>) -> Reply<pb::ControlResponse> {
        auth::principal(&r)?;
        unimplemented("Control")
    }
    async fn get_queue(&self, r: Request<pb::GetQueueRequest>) -> Reply<pb::GetQueueResponse> {
        auth::principal(&r)?;
        unimplemented("GetQueue")
    }
    async fn edit_queued_prompt(
        &self,
        r: Request<pb::EditQueuedPromptRequest>,
    ) -> Reply<pb::EditQueuedPromptResponse> {
        auth::principal(&r)?;
        unimplemented("EditQueuedPrompt")
    }
    async fn remove_queued_action(
        &self,
        r: Request<pb::RemoveQueuedActionRequest>,
    ) -> Reply<pb::RemoveQueuedActionResponse> {
        auth::principal(&r)?;
        unimplemented("RemoveQueuedAction")
    }
    async fn read_log(&self, r: Request<pb::ReadLogRequest>) -> Reply<pb::ReadLogResponse> {
        auth::principal(&r)?;
        unimplemented("ReadLog")
    }
    async fn get_transcript(
        &self,
        r: Request<pb::GetTranscriptRequest>,
    ) -> Reply<pb::GetTranscriptResponse> {
        auth::principal(&r)?;
        unimplemented("GetTranscript")
    }
    async fn subscribe(&self, r: Request<pb::SubscribeRequest>) -> Reply<Self::SubscribeStream> {
        auth::principal(&r)?;
        unimplemented("Subscribe")
    }
}
