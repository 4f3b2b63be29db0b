//! `ChannelTranslatorService`: decode, translate, encode.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::auth;
use crate::{
    domain::{Error, limits::Limits},
    pb::v1::{
        TranslateChannelMessageRequest, TranslateChannelMessageResponse,
        channel_translator_service_server::ChannelTranslatorService,
    },
    translate::Translator,
};

pub(crate) struct TranslatorService {
    translator: Arc<Translator>,
    limits: Arc<Limits>,
}

impl TranslatorService {
    pub(crate) fn new(translator: Arc<Translator>, limits: Arc<Limits>) -> Self {
        Self { translator, limits }
    }
}

#[tonic::async_trait]
impl ChannelTranslatorService for TranslatorService {
    async fn translate_channel_message(
        &self,
        request: Request<TranslateChannelMessageRequest>,
    ) -> Result<Response<TranslateChannelMessageResponse>, Status> {
        auth::principal(&request)?;
        let message = request
            .into_inner()
            .message
            .ok_or_else(|| Error::invalid("message is required"))?;
        let translation = self.translator.translate(&message.into())?;
        let prompt = &translation.prompt;
        if prompt.prompt.len() > self.limits.prompt_bytes {
            return Err(Error::limit(
                "prompt_bytes",
                self.limits.prompt_bytes,
                format_args!("content of {} bytes", prompt.prompt.len()),
            )
            .into());
        }
        if prompt.attachments.len() > self.limits.attachments {
            return Err(Error::limit(
                "attachments",
                self.limits.attachments,
                format_args!("{} translated attachments", prompt.attachments.len()),
            )
            .into());
        }
        Ok(Response::new(TranslateChannelMessageResponse::from(
            &translation,
        )))
    }
}
