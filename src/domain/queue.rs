//! The per-session queue of turn-occupying actions: FIFO, capped, interrupts go to the
//! front, queued prompts are editable and removable until dispatched. Pure: the session actor
//! owns one and persists every change through the store.

use std::{collections::VecDeque, time::SystemTime};

use serde_json::{Map, Value};

use super::{
    action::{Action, PromptAction},
    action_id::ActionId,
    error::{Error, ErrorCode, Result},
};

/// The work a queue entry carries: only turn-occupying actions are queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueuedWork {
    Prompt(PromptAction),
    Compact,
}

impl QueuedWork {
    pub fn from_action(action: &Action) -> Option<Self> {
        match action {
            Action::Prompt(prompt) => Some(Self::Prompt(prompt.clone())),
            Action::Compact => Some(Self::Compact),
            _ => None,
        }
    }

    pub fn to_action(&self) -> Action {
        match self {
            Self::Prompt(prompt) => Action::Prompt(prompt.clone()),
            Self::Compact => Action::Compact,
        }
    }
}

/// One waiting action.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedEntry {
    pub action_id: ActionId,
    pub work: QueuedWork,
    /// The trigger a service attached; dropped by a user's edit.
    pub context: Option<Map<String, Value>>,
    /// Who queued it, or who edited it last.
    pub actor: String,
    pub created_at: SystemTime,
    /// The caller's trace context, forwarded when the entry is dispatched.
    pub traceparent: Option<String>,
}

impl QueuedEntry {
    /// About how many bytes the entry takes (its texts; not the exact encoding).
    pub fn approx_bytes(&self) -> usize {
        let work = match &self.work {
            QueuedWork::Prompt(prompt) => {
                prompt.prompt.len()
                    + prompt
                        .attachments
                        .iter()
                        .map(|a| a.uri.len() + a.name.len() + 16)
                        .sum::<usize>()
            }
            QueuedWork::Compact => 0,
        };
        let context = self
            .context
            .as_ref()
            .map_or(0, |c| serde_json::to_string(c).map_or(0, |text| text.len()));
        64 + work + context + self.actor.len()
    }
}

/// A session's queue, next first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Queue {
    entries: VecDeque<QueuedEntry>,
}

impl Queue {
    pub fn from_entries(entries: impl IntoIterator<Item = QueuedEntry>) -> Self {
        Self {
            entries: entries.into_iter().collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> impl ExactSizeIterator<Item = &QueuedEntry> {
        self.entries.iter()
    }

    /// 1-based position of an entry (1 = next).
    pub fn position(&self, action_id: &ActionId) -> Option<u32> {
        self.entries
            .iter()
            .position(|entry| entry.action_id == *action_id)
            .map(|index| index as u32 + 1)
    }

    pub fn get(&self, action_id: &ActionId) -> Option<&QueuedEntry> {
        self.entries
            .iter()
            .find(|entry| entry.action_id == *action_id)
    }

    fn check_room(&self, cap: usize) -> Result<()> {
        if self.entries.len() >= cap {
            return Err(Error::new(
                ErrorCode::QueueFull,
                format!("the queue holds its maximum of {cap} actions"),
            )
            .with("max", cap));
        }
        Ok(())
    }

    /// Appends at the back (FIFO); returns the position.
    pub fn push_back(&mut self, entry: QueuedEntry, cap: usize) -> Result<u32> {
        self.check_room(cap)?;
        self.entries.push_back(entry);
        Ok(self.entries.len() as u32)
    }

    /// Puts an interrupt at the front: the newest interrupt goes first.
    pub fn push_front(&mut self, entry: QueuedEntry, cap: usize) -> Result<u32> {
        self.check_room(cap)?;
        self.entries.push_front(entry);
        Ok(1)
    }

    pub fn pop_front(&mut self) -> Option<QueuedEntry> {
        self.entries.pop_front()
    }

    pub fn front(&self) -> Option<&QueuedEntry> {
        self.entries.front()
    }

    /// Replaces a queued prompt's text; keeps id, position and attachments; records the editor.
    /// A user's edit drops the entry's `context`, so a user cannot speak under a service's trigger.
    pub fn edit(
        &mut self,
        action_id: &ActionId,
        text: String,
        editor: &str,
        drop_context: bool,
    ) -> Result<&QueuedEntry> {
        if text.trim().is_empty() {
            return Err(Error::new(
                ErrorCode::EmptyPrompt,
                "a queued prompt cannot be edited to blank text",
            ));
        }
        let entry = self
            .entries
            .iter_mut()
            .find(|entry| entry.action_id == *action_id)
            .ok_or_else(|| not_queued(action_id))?;
        let QueuedWork::Prompt(prompt) = &mut entry.work else {
            return Err(Error::new(
                ErrorCode::NotEditable,
                format!("queued action {action_id} is a compact; only prompts can be edited"),
            ));
        };
        prompt.prompt = text;
        entry.actor = editor.to_owned();
        if drop_context {
            entry.context = None;
        }
        Ok(entry)
    }

    /// Removes an entry before it is dispatched.
    pub fn remove(&mut self, action_id: &ActionId) -> Result<QueuedEntry> {
        let index = self
            .entries
            .iter()
            .position(|entry| entry.action_id == *action_id)
            .ok_or_else(|| not_queued(action_id))?;
        Ok(self.entries.remove(index).expect("index is in range"))
    }

    /// Empties the queue (a stop with `clear_queue`); returns what was removed.
    pub fn clear(&mut self) -> Vec<QueuedEntry> {
        self.entries.drain(..).collect()
    }
}

fn not_queued(action_id: &ActionId) -> Error {
    Error::new(
        ErrorCode::QueuedActionNotFound,
        format!("action {action_id} is not queued: it was dispatched, removed, or never queued"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::action::PromptAttachment;

    fn entry(text: &str) -> QueuedEntry {
        QueuedEntry {
            action_id: ActionId::mint(),
            work: QueuedWork::Prompt(PromptAction::with_attachments(
                text,
                vec![PromptAttachment::new("https://x/1", "a.png")],
            )),
            context: serde_json::json!({"from": "service"}).as_object().cloned(),
            actor: "ada".into(),
            created_at: SystemTime::now(),
            traceparent: None,
        }
    }

    #[test]
    fn entries_are_served_first_in_first_out_with_positions_from_one() {
        let mut queue = Queue::default();
        let (a, b) = (entry("a"), entry("b"));
        assert_eq!(queue.push_back(a.clone(), 50).unwrap(), 1);
        assert_eq!(queue.push_back(b.clone(), 50).unwrap(), 2);
        assert_eq!(queue.position(&b.action_id), Some(2));
        assert_eq!(queue.pop_front().unwrap().action_id, a.action_id);
        assert_eq!(queue.position(&b.action_id), Some(1));
    }

    #[test]
    fn the_newest_interrupt_goes_first() {
        let mut queue = Queue::default();
        queue.push_back(entry("queued"), 50).unwrap();
        let (first, second) = (entry("i1"), entry("i2"));
        queue.push_front(first.clone(), 50).unwrap();
        queue.push_front(second.clone(), 50).unwrap();
        let order: Vec<_> = queue.entries().map(|e| e.action_id).collect();
        assert_eq!(order[0], second.action_id);
        assert_eq!(order[1], first.action_id);
    }

    #[test]
    fn a_full_queue_refuses_both_back_and_front() {
        let mut queue = Queue::default();
        for i in 0..3 {
            queue.push_back(entry(&i.to_string()), 3).unwrap();
        }
        assert_eq!(
            queue.push_back(entry("x"), 3).unwrap_err().code,
            ErrorCode::QueueFull
        );
        assert_eq!(
            queue.push_front(entry("x"), 3).unwrap_err().code,
            ErrorCode::QueueFull
        );
    }

    #[test]
    fn an_edit_keeps_id_position_and_attachments_and_a_users_edit_drops_context() {
        let mut queue = Queue::default();
        queue.push_back(entry("first"), 50).unwrap();
        let target = entry("second");
        queue.push_back(target.clone(), 50).unwrap();
        let edited = queue
            .edit(&target.action_id, "changed".into(), "eve", true)
            .unwrap();
        assert_eq!(edited.actor, "eve");
        assert_eq!(edited.context, None);
        let QueuedWork::Prompt(prompt) = &edited.work else {
            panic!()
        };
        assert_eq!(prompt.prompt, "changed");
        assert_eq!(prompt.attachments.len(), 1);
        assert_eq!(queue.position(&target.action_id), Some(2));
    }

    #[test]
    fn blank_edits_compacts_and_unknown_ids_are_refused() {
        let mut queue = Queue::default();
        let prompt = entry("p");
        queue.push_back(prompt.clone(), 50).unwrap();
        let compact = QueuedEntry {
            work: QueuedWork::Compact,
            ..entry("c")
        };
        queue.push_back(compact.clone(), 50).unwrap();
        assert_eq!(
            queue
                .edit(&prompt.action_id, " \n".into(), "a", false)
                .unwrap_err()
                .code,
            ErrorCode::EmptyPrompt
        );
        assert_eq!(
            queue
                .edit(&compact.action_id, "x".into(), "a", false)
                .unwrap_err()
                .code,
            ErrorCode::NotEditable
        );
        assert_eq!(
            queue
                .edit(&ActionId::mint(), "x".into(), "a", false)
                .unwrap_err()
                .code,
            ErrorCode::QueuedActionNotFound
        );
        queue.remove(&prompt.action_id).unwrap();
        assert_eq!(
            queue.remove(&prompt.action_id).unwrap_err().code,
            ErrorCode::QueuedActionNotFound
        );
    }
}
