//! `ChannelTranslatorService` over a real connection.

use agent_harness::pb::v1::{
    ChannelAttachment, ChannelMessage, PromptAttachment, SkipReason, TranslateChannelMessageRequest,
};
use tonic::Code;

use crate::harness::{Harness, assert_error, bounded, error_info, expect_err};

fn attachment(entity_type: &str, entity_id: &str) -> ChannelAttachment {
    ChannelAttachment {
        entity_type: entity_type.into(),
        entity_id: entity_id.into(),
    }
}

fn request(content: &str, attachments: Vec<ChannelAttachment>) -> TranslateChannelMessageRequest {
    TranslateChannelMessageRequest {
        message: Some(ChannelMessage {
            message_id: "m-1".into(),
            channel_id: "c-1".into(),
            content: content.into(),
            attachments,
            ..Default::default()
        }),
    }
}

#[tokio::test]
async fn two_images_and_a_document_become_two_image_links_and_one_unsupported_skip() {
    bounded(async {
        let h = Harness::start_with(|config| {
            config.static_files_base_url = Some("https://static.example///".into());
        })
        .await;
        let reply = h
            .translator()
            .translate_channel_message(request(
                "what is wrong here?",
                vec![
                    attachment("static/image", "img-1"),
                    attachment("document", "doc-1"),
                    attachment("static/image", "img-2"),
                ],
            ))
            .await
            .expect("the translation")
            .into_inner();

        let prompt = reply.prompt.expect("a prompt");
        assert_eq!(prompt.prompt, "what is wrong here?");
        let image = |id: &str| PromptAttachment {
            uri: format!("https://static.example/file/{id}"),
            name: "image".into(),
            mime_type: Some("image/*".into()),
            size: None,
        };
        assert_eq!(prompt.attachments, vec![image("img-1"), image("img-2")]);
        assert_eq!(reply.skipped.len(), 1, "{:?}", reply.skipped);
        let skipped = &reply.skipped[0];
        assert_eq!(skipped.index, 1);
        assert_eq!(skipped.entity_type, "document");
        assert_eq!(skipped.reason(), SkipReason::UnsupportedType);
        h.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn a_video_becomes_a_video_link_and_a_bad_entity_id_is_skipped_as_invalid() {
    bounded(async {
        let h = Harness::start().await;
        let reply = h
            .translator()
            .translate_channel_message(request(
                "",
                vec![
                    attachment("static/image", "../etc/passwd"),
                    attachment("static/video", "clip.mp4"),
                ],
            ))
            .await
            .expect("the translation")
            .into_inner();
        let prompt = reply.prompt.expect("a prompt");
        assert_eq!(prompt.prompt, "");
        assert_eq!(
            prompt.attachments,
            vec![PromptAttachment {
                uri: "https://static.example/file/clip.mp4".into(),
                name: "video".into(),
                mime_type: Some("video/*".into()),
                size: None,
            }]
        );
        assert_eq!(reply.skipped.len(), 1);
        assert_eq!(reply.skipped[0].index, 0);
        assert_eq!(reply.skipped[0].reason(), SkipReason::InvalidEntityId);
    })
    .await
}

#[tokio::test]
async fn without_a_static_files_base_url_the_translator_answers_not_configured() {
    bounded(async {
        let h = Harness::start_with(|config| config.static_files_base_url = None).await;
        let status = expect_err(
            h.translator()
                .translate_channel_message(request("hi", vec![]))
                .await,
        );
        assert_error(&status, Code::FailedPrecondition, "NOT_CONFIGURED");
    })
    .await
}

#[tokio::test]
async fn a_content_over_256_kib_is_refused_as_a_limit_exceeded() {
    bounded(async {
        let h = Harness::start().await;
        let content = "x".repeat(256 * 1024 + 1);
        let status = expect_err(
            h.translator()
                .translate_channel_message(request(&content, vec![]))
                .await,
        );
        assert_error(&status, Code::InvalidArgument, "LIMIT_EXCEEDED");
        let info = error_info(&status);
        assert_eq!(
            info.metadata.get("limit").map(String::as_str),
            Some("prompt_bytes"),
            "{info:?}"
        );

        let at_the_limit = "x".repeat(256 * 1024);
        h.translator()
            .translate_channel_message(request(&at_the_limit, vec![]))
            .await
            .expect("a content of exactly 256 KiB is accepted");
    })
    .await
}

#[tokio::test]
async fn a_request_without_a_message_is_an_invalid_argument() {
    bounded(async {
        let h = Harness::start().await;
        let status = expect_err(
            h.translator()
                .translate_channel_message(TranslateChannelMessageRequest { message: None })
                .await,
        );
        assert_error(&status, Code::InvalidArgument, "INVALID_ARGUMENT");
    })
    .await
}
