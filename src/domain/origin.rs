//! What opened a session: a chat mention or a task assignment.

/// A chat-channel message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChannelMessage {
    pub message_id: String,
    pub channel_id: String,
    pub thread_id: String,
    pub sender_id: String,
    pub content: String,
    pub attachments: Vec<ChannelAttachment>,
}

/// An entity attached to a channel message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelAttachment {
    pub entity_type: String,
    pub entity_id: String,
}

impl ChannelAttachment {
    pub fn new(entity_type: impl Into<String>, entity_id: impl Into<String>) -> Self {
        Self {
            entity_type: entity_type.into(),
            entity_id: entity_id.into(),
        }
    }
}

/// A task assigned to an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskAssignment {
    pub prompt: String,
    pub assigned_by: String,
}

/// What opened a session; its first prompt is sent at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Mention(ChannelMessage),
    TaskAssignment(TaskAssignment),
}
