//! Channel messages → prompt attachments. Pure translation: the base URL is injected
//! once at startup (trailing slashes stripped), nothing here reads the environment.

use crate::domain::{
    PromptAction, PromptAttachment,
    error::{Error, ErrorCode, Result},
    origin::ChannelMessage,
};

/// The entity type of images.
pub(crate) const STATIC_IMAGE: &str = "static/image";
/// The entity type of videos.
pub(crate) const STATIC_VIDEO: &str = "static/video";
/// Longest accepted entity id, in bytes.
pub(crate) const MAX_ENTITY_ID_BYTES: usize = 256;

/// Why an attachment was not translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SkipReason {
    /// Not an image or a video: documents reach agents through mentions, never as anonymously
    /// fetchable links.
    UnsupportedType,
    /// The entity id would not make a safe path segment.
    InvalidEntityId,
}

/// An attachment left out, by its index in the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Skipped {
    pub index: u32,
    pub entity_type: String,
    pub reason: SkipReason,
}

/// The translated prompt and what was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Translation {
    pub prompt: PromptAction,
    pub skipped: Vec<Skipped>,
}

/// Builds `{base}/file/{entity_id}` links to the static file service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StaticFileLinks {
    base_url: String,
}

impl StaticFileLinks {
    /// Strips every trailing `/` so links never carry `//file/`.
    pub(crate) fn new(base_url: &str) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
        }
    }

    /// Translates a channel message: its content becomes the prompt text, images and videos
    /// become attachments in the message's order, everything else is reported as skipped.
    pub(crate) fn translate(&self, message: &ChannelMessage) -> Translation {
        let mut attachments = Vec::new();
        let mut skipped = Vec::new();
        for (index, attachment) in message.attachments.iter().enumerate() {
            let skip = |reason| Skipped {
                index: index as u32,
                entity_type: attachment.entity_type.clone(),
                reason,
            };
            let (name, mime_type) = match attachment.entity_type.as_str() {
                STATIC_IMAGE => ("image", "image/*"),
                STATIC_VIDEO => ("video", "video/*"),
                _ => {
                    skipped.push(skip(SkipReason::UnsupportedType));
                    continue;
                }
            };
            if !is_valid_entity_id(&attachment.entity_id) {
                skipped.push(skip(SkipReason::InvalidEntityId));
                continue;
            }
            attachments.push(
                PromptAttachment::new(
                    format!("{}/file/{}", self.base_url, attachment.entity_id),
                    name,
                )
                .mime_type(mime_type),
            );
        }
        Translation {
            prompt: PromptAction::with_attachments(message.content.clone(), attachments),
            skipped,
        }
    }
}

/// `[A-Za-z0-9._~-]{1,256}` and not `.` or `..`: a single, unreserved path segment.
pub(crate) fn is_valid_entity_id(entity_id: &str) -> bool {
    (1..=MAX_ENTITY_ID_BYTES).contains(&entity_id.len())
        && entity_id != "."
        && entity_id != ".."
        && entity_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'))
}

/// The translator as configured: with no base URL it refuses with NOT_CONFIGURED.
#[derive(Debug, Clone, Default)]
pub(crate) struct Translator {
    links: Option<StaticFileLinks>,
}

impl Translator {
    pub(crate) fn new(base_url: Option<&str>) -> Self {
        Self {
            links: base_url.map(StaticFileLinks::new),
        }
    }

    pub(crate) fn links(&self) -> Result<&StaticFileLinks> {
        self.links.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::NotConfigured,
                "no static files base URL is configured (--static-files-base-url)",
            )
        })
    }

    pub(crate) fn translate(&self, message: &ChannelMessage) -> Result<Translation> {
        Ok(self.links()?.translate(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::origin::ChannelAttachment;

    fn message(attachments: Vec<ChannelAttachment>) -> ChannelMessage {
        ChannelMessage {
            message_id: "m1".into(),
            channel_id: "c1".into(),
            content: "what is wrong here?".into(),
            attachments,
            ..Default::default()
        }
    }

    #[test]
    fn two_images_and_one_document_become_two_attachments_in_order_and_one_unsupported_skip() {
        let links = StaticFileLinks::new("https://static.example");
        let translation = links.translate(&message(vec![
            ChannelAttachment::new("static/image", "img-1"),
            ChannelAttachment::new("document", "doc-1"),
            ChannelAttachment::new("static/image", "img-2"),
        ]));
        assert_eq!(translation.prompt.prompt, "what is wrong here?");
        assert_eq!(
            translation.prompt.attachments,
            vec![
                PromptAttachment::new("https://static.example/file/img-1", "image")
                    .mime_type("image/*"),
                PromptAttachment::new("https://static.example/file/img-2", "image")
                    .mime_type("image/*"),
            ]
        );
        assert_eq!(
            translation.skipped,
            vec![Skipped {
                index: 1,
                entity_type: "document".into(),
                reason: SkipReason::UnsupportedType
            }]
        );
    }

    #[test]
    fn a_video_becomes_a_video_attachment_without_a_size() {
        let t = StaticFileLinks::new("https://s")
            .translate(&message(vec![ChannelAttachment::new("static/video", "v1")]));
        assert_eq!(
            t.prompt.attachments,
            vec![PromptAttachment::new("https://s/file/v1", "video").mime_type("video/*")]
        );
        assert_eq!(t.prompt.attachments[0].size, None);
    }

    #[test]
    fn a_base_url_with_several_trailing_slashes_is_stripped_of_all_of_them() {
        let links = StaticFileLinks::new("https://static.example/base///");
        assert_eq!(links.base_url, "https://static.example/base");
        let t = links.translate(&message(vec![ChannelAttachment::new("static/image", "a")]));
        assert_eq!(
            t.prompt.attachments[0].uri,
            "https://static.example/base/file/a"
        );
    }

    #[test]
    fn each_kind_of_invalid_entity_id_is_skipped_as_invalid() {
        let too_long = "a".repeat(257);
        let cases = [
            "..",
            ".",
            "a/b",
            "%2F",
            "",
            too_long.as_str(),
            "ünï",
            "a b",
            "a\\b",
            "a?b",
        ];
        let links = StaticFileLinks::new("https://s");
        for id in cases {
            let t = links.translate(&message(vec![ChannelAttachment::new("static/image", id)]));
            assert!(t.prompt.attachments.is_empty(), "{id:?} was kept");
            assert_eq!(t.skipped[0].reason, SkipReason::InvalidEntityId, "{id:?}");
            assert_eq!(t.skipped[0].index, 0);
        }
    }

    #[test]
    fn the_longest_and_the_oddest_valid_entity_ids_are_kept() {
        let longest = "a".repeat(256);
        let links = StaticFileLinks::new("https://s");
        for id in [longest.as_str(), "A-z_0.9~", "...", ".a", "~"] {
            let t = links.translate(&message(vec![ChannelAttachment::new("static/image", id)]));
            assert_eq!(t.prompt.attachments.len(), 1, "{id:?} was skipped");
        }
    }

    #[test]
    fn an_unsupported_type_is_reported_before_its_entity_id_is_looked_at() {
        let t = StaticFileLinks::new("https://s")
            .translate(&message(vec![ChannelAttachment::new("document", "..")]));
        assert_eq!(t.skipped[0].reason, SkipReason::UnsupportedType);
    }

    #[test]
    fn without_a_base_url_the_translator_is_not_configured() {
        let err = Translator::new(None)
            .translate(&message(vec![]))
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotConfigured);
    }
}
