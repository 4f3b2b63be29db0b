//! Commits whose answer was lost (the connection dropped during `COMMIT`): the store may or may
//! not hold the batch. The actor never assumes either. It reads back at once, on a fresh
//! connection (`store::landed`, which first waits out any transaction still writing the
//! session): stored, the step goes on as committed and its frames are sent; not stored, it
//! fails as any failed commit (STORE_UNAVAILABLE, nothing sent).
//!
//! When even the read-back fails (the database is still unreachable), the caller is answered
//! OUTCOME_UNKNOWN with the action id, and the actor is *in doubt*: it commits, sends and takes
//! in nothing — no command, no frame from the runtime, which waits — until a read-back
//! succeeds, tried again every [`RETRY_EVERY`] and on every command. Then:
//! - not stored: the step had failed, as its caller was told it might have; the actor goes on;
//! - stored: the actor reads the session back from the store (record, head, queue). If the step
//!   only dispatched a prompt to a runtime still waiting for it, the prompt is sent now, once.
//!   Otherwise the runtime is stopped and the session recovers as after a restart: a turn in
//!   flight is closed as FAILED and never re-sent, queued work reopens the agent.
//!
//! A retry of the action converges either way: stored, it reports the action's status; not
//! stored, it is taken now.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{Actor, Turn, lifecycle::Interruption, no_longer_held};
use crate::{
    domain::{ActionId, Error, ErrorCode, Result, queue::Queue},
    session::Command,
    store::{Probe, landed},
};

/// How long a lost commit is read back before its caller is answered OUTCOME_UNKNOWN.
const READ_BACK_WITHIN: Duration = Duration::from_secs(5);
/// How often a session in doubt reads back again.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// A step whose commit's outcome is not known yet.
pub(super) struct Doubt {
    probe: Probe,
    /// The frames the step was to send, which no runtime has seen.
    send: Vec<Arc<str>>,
    /// When to read back again.
    pub(super) retry_at: Instant,
}

/// What a read-back found.
enum ReadBack {
    Stored,
    NotStored,
    /// Another replica holds the session now: it is that replica's to tell.
    Moved,
    /// The store could not be read.
    Unknown(Error),
}

impl Actor {
    /// After a commit whose answer was lost: `Ok(None)` if the batch is stored (the step goes on
    /// as committed), `Ok(Some(error))` if it is not (the step failed), and OUTCOME_UNKNOWN if
    /// that cannot be told now — the actor is then in doubt.
    pub(super) async fn read_back_lost_commit(
        &mut self,
        probe: Probe,
        send: &[Arc<str>],
    ) -> Result<Option<Error>> {
        tracing::warn!(session = %self.record.id, "the answer to a commit was lost; reading back");
        match self.read_back(&probe).await {
            ReadBack::Stored => Ok(None),
            ReadBack::NotStored => Ok(Some(Error::new(
                ErrorCode::StoreUnavailable,
                format!(
                    "session {}: the database's answer to a write was lost, and reading back \
                     showed nothing was stored; retry",
                    self.record.id
                ),
            ))),
            ReadBack::Moved => Err(self.moved(&probe)),
            ReadBack::Unknown(error) => {
                tracing::error!(session = %self.record.id, %error, "could not read back a commit whose answer was lost; the session waits until it can");
                // The fold may hold entries the log does not.
                self.fold = None;
                let unknown = outcome_unknown(self.record.id, probe.action_id());
                self.doubt = Some(Doubt {
                    probe,
                    send: send.to_vec(),
                    retry_at: Instant::now() + RETRY_EVERY,
                });
                Err(unknown)
            }
        }
    }

    /// Settles a doubt, if the actor is in one; STORE_UNAVAILABLE while it cannot.
    pub(super) async fn resolve_doubt(&mut self) -> Result<()> {
        let Some(doubt) = self.doubt.take() else {
            return Ok(());
        };
        match self.read_back(&doubt.probe).await {
            ReadBack::NotStored => {
                tracing::info!(session = %self.record.id, "a commit whose answer was lost was not stored");
                Ok(())
            }
            ReadBack::Stored => {
                tracing::info!(session = %self.record.id, "a commit whose answer was lost was stored; reading the session back");
                Box::pin(self.adopt_stored(doubt)).await
            }
            ReadBack::Moved => Err(self.moved(&doubt.probe)),
            ReadBack::Unknown(error) => {
                self.doubt = Some(Doubt {
                    retry_at: Instant::now() + RETRY_EVERY,
                    ..doubt
                });
                Err(Error::new(
                    ErrorCode::StoreUnavailable,
                    format!(
                        "session {}: the outcome of an earlier write is not known yet (the \
                         database cannot be read: {}); nothing was done, retry",
                        self.record.id, error.message
                    ),
                ))
            }
        }
    }

    /// The answer to `command` while the doubt lasts, when it is not STORE_UNAVAILABLE: a
    /// Control retrying the action in doubt learns again that its outcome is unknown.
    pub(super) fn refusal_in_doubt(&self, command: &Command) -> Option<Error> {
        let doubtful = self.doubt.as_ref()?.probe.action_id()?;
        match command {
            Command::Control { input, .. } if input.action_id == Some(doubtful) => {
                Some(outcome_unknown(self.record.id, Some(doubtful)))
            }
            _ => None,
        }
    }

    async fn read_back(&self, probe: &Probe) -> ReadBack {
        let store = self.ctx.store.clone();
        let id = self.record.id;
        let fence = self.shared.fence;
        let look = async {
            let stored = landed(store.as_ref(), id, probe).await?;
            if let Some(fence) = fence
                && store.get_lease(id).await?.is_some_and(|l| l.fence != fence)
            {
                return Ok(ReadBack::Moved);
            }
            Ok::<_, Error>(if stored {
                ReadBack::Stored
            } else {
                ReadBack::NotStored
            })
        };
        match tokio::time::timeout(READ_BACK_WITHIN, look).await {
            Ok(Ok(found)) => found,
            Ok(Err(error)) => ReadBack::Unknown(error),
            Err(_) => ReadBack::Unknown(Error::new(
                ErrorCode::StoreUnavailable,
                format!("no answer within {READ_BACK_WITHIN:?}"),
            )),
        }
    }

    /// The session moved to another replica while a write's outcome was unknown: this actor
    /// stops; a retry reaches the new owner, which knows.
    fn moved(&mut self, probe: &Probe) -> Error {
        self.stop_lost("lease lost while a write's outcome was unknown");
        match probe.action_id() {
            Some(action_id) => outcome_unknown(self.record.id, Some(action_id)),
            None => no_longer_held(self.record.id),
        }
    }

    /// The step in doubt is stored: the actor's view is read back from the store, and the
    /// step's frames, which no runtime has seen, are sent if they only dispatch a prompt to the
    /// runtime that was waiting for it; otherwise the runtime stops and the session recovers.
    async fn adopt_stored(&mut self, doubt: Doubt) -> Result<()> {
        let store = self.ctx.store.clone();
        let id = self.record.id;
        let reread = async {
            let record = store
                .get_session(id)
                .await?
                .ok_or_else(|| Error::session_not_found(&id.to_string()))?;
            Ok::<_, Error>((
                record,
                store.head_offset(id).await?,
                store.load_queue(id).await?,
            ))
        };
        let (record, head, queue) = match reread.await {
            Ok(read) => read,
            Err(error) => {
                // Stored, but the session could not be read: the same read-back again later.
                self.doubt = Some(Doubt {
                    retry_at: Instant::now() + RETRY_EVERY,
                    ..doubt
                });
                return Err(error);
            }
        };
        let appended = head.saturating_sub(self.head);
        self.record = record;
        self.head = head;
        self.work.queue = Queue::from_entries(queue);
        self.fold = None;
        self.shared.set_head(head);
        self.shared.set_record(&self.record);
        self.publish_entries(None, appended).await;
        self.publish_queue();
        self.publish_status();
        if doubt.send.is_empty() && self.runtime.state.is_up() {
            // Nothing unsent, and the runtime was left waiting: it goes on.
            self.arm_idle_timer();
            return Ok(());
        }
        if let Some((action_id, line)) = self.waiting_prompt(&doubt) {
            // The prompt's line was made before the doubt, with the trace context it carries;
            // this turn is not traced again.
            let untraced = crate::session::traces::Traces::default();
            self.work.turn = Some(Turn::new(
                id,
                action_id,
                &self.record.profile,
                &untraced,
                None,
                &self.turn_slot,
                self.profile.turn_timeout,
            ));
            if let Some(conn) = self.runtime.state.conn() {
                let _ = conn.writer.send(line);
            }
            self.arm_idle_timer();
            return Ok(());
        }
        self.stop_runtime();
        let _ = self.fail_running_turn();
        self.recover(Interruption::WriteInDoubt).await;
        Ok(())
    }

    /// The prompt the step dispatched, when that is all it sent and the runtime it was for is
    /// ready and runs no turn.
    fn waiting_prompt(&self, doubt: &Doubt) -> Option<(ActionId, Arc<str>)> {
        let Probe::Entry(first) = &doubt.probe else {
            return None;
        };
        let [line] = doubt.send.as_slice() else {
            return None;
        };
        let ready = self.runtime.state.is_ready()
            && self.work.turn.is_none()
            && self.runtime.state.conn().map(|c| c.epoch) == Some(first.epoch);
        let frame: serde_json::Value = serde_json::from_str(line).ok()?;
        let action_id = ActionId::from_jsonrpc_id(&frame["id"])?;
        (ready && frame["method"] == "session/prompt").then(|| (action_id, line.clone()))
    }
}

/// OUTCOME_UNKNOWN, naming the action when there is one.
fn outcome_unknown(session_id: uuid::Uuid, action_id: Option<ActionId>) -> Error {
    unknown_because(
        session_id,
        action_id,
        "the database's answer to the write was lost and could not be read back; it is not sent \
         to the agent before that is known",
    )
}

/// OUTCOME_UNKNOWN for a write in flight when this replica lost the session: it may land (only
/// while the lease is still this replica's), and the replica that holds the session now knows.
pub(super) fn lost_in_flight(session_id: uuid::Uuid, action_id: Option<ActionId>) -> Error {
    unknown_because(
        session_id,
        action_id,
        "this replica lost the session while the write was in flight",
    )
}

fn unknown_because(session_id: uuid::Uuid, action_id: Option<ActionId>, why: &str) -> Error {
    match action_id {
        Some(action_id) => Error::new(
            ErrorCode::OutcomeUnknown,
            format!(
                "session {session_id}: action {action_id} may or may not be stored ({why}); \
                 retry with action_id {action_id}"
            ),
        )
        .with("action_id", action_id),
        None => Error::new(
            ErrorCode::OutcomeUnknown,
            format!("session {session_id}: a write may or may not be stored ({why})"),
        ),
    }
}
