//! The actor's runtime as a state machine: down, starting (its handshake under way), or ready.
//! A connection exists only in the last two, and a start purpose only while starting, so a
//! half-started or half-stopped runtime cannot be represented.

use std::{
    collections::HashMap,
    io,
    process::ExitStatus,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, oneshot, watch};

use super::StartPurpose;
use crate::{
    acp::{
        connection::LineWriter,
        frames::ReopenMethod,
        process::{KillSwitch, RuntimeKiller, StderrTail},
    },
    domain::ActionId,
};

/// Where the session's runtime is.
pub(super) enum RuntimeState {
    /// No runtime: not started yet, suspended, disconnected or closed (the session record says
    /// which, and why).
    Down,
    /// A runtime is connected and its handshake is under way.
    Starting {
        conn: Conn,
        purpose: StartPurpose,
        /// It came from the warm pool: if it fails before the handshake ends, a cold runtime
        /// replaces it instead of failing CreateSession.
        warm: bool,
    },
    /// The handshake ended: the runtime takes turns and setting changes.
    Ready { conn: Conn },
}

impl RuntimeState {
    /// The connection, when a runtime is up (starting or ready).
    pub(super) fn conn(&self) -> Option<&Conn> {
        match self {
            Self::Down => None,
            Self::Starting { conn, .. } | Self::Ready { conn } => Some(conn),
        }
    }

    pub(super) fn conn_mut(&mut self) -> Option<&mut Conn> {
        match self {
            Self::Down => None,
            Self::Starting { conn, .. } | Self::Ready { conn } => Some(conn),
        }
    }

    /// A runtime process (or remote runtime) is up, whether or not its handshake ended.
    pub(super) fn is_up(&self) -> bool {
        !matches!(self, Self::Down)
    }

    pub(super) fn is_starting(&self) -> bool {
        matches!(self, Self::Starting { .. })
    }

    pub(super) fn is_ready(&self) -> bool {
        matches!(self, Self::Ready { .. })
    }

    /// Why the runtime is starting, while it is.
    pub(super) fn purpose(&self) -> Option<&StartPurpose> {
        match self {
            Self::Starting { purpose, .. } => Some(purpose),
            _ => None,
        }
    }

    pub(super) fn purpose_mut(&mut self) -> Option<&mut StartPurpose> {
        match self {
            Self::Starting { purpose, .. } => Some(purpose),
            _ => None,
        }
    }

    /// The runtime is starting for a new session (its failure fails CreateSession).
    pub(super) fn is_creating(&self) -> bool {
        matches!(self.purpose(), Some(StartPurpose::Create { .. }))
    }

    /// The runtime is starting to reopen an existing session.
    pub(super) fn is_reopening(&self) -> bool {
        matches!(self.purpose(), Some(StartPurpose::Reopen))
    }

    /// A new session's runtime taken from the warm pool, still in its handshake.
    pub(super) fn is_warm_create(&self) -> bool {
        matches!(
            self,
            Self::Starting {
                purpose: StartPurpose::Create { .. },
                warm: true,
                ..
            }
        )
    }

    /// Down → Starting: a runtime was connected for `purpose`.
    pub(super) fn start(&mut self, conn: Conn, purpose: StartPurpose, warm: bool) {
        debug_assert!(!self.is_up(), "a runtime is started only when none is up");
        *self = Self::Starting {
            conn,
            purpose,
            warm,
        };
    }

    /// Starting → Ready: the handshake ended; what it was for. Anything else stays as it is.
    pub(super) fn finish_start(&mut self) -> Option<StartPurpose> {
        match std::mem::replace(self, Self::Down) {
            Self::Starting { conn, purpose, .. } => {
                *self = Self::Ready { conn };
                Some(purpose)
            }
            other => {
                *self = other;
                None
            }
        }
    }

    /// → Down: the connection to kill and, when a start was under way, what it was for.
    pub(super) fn stop(&mut self) -> (Option<Conn>, Option<StartPurpose>) {
        match std::mem::replace(self, Self::Down) {
            Self::Down => (None, None),
            Self::Starting { conn, purpose, .. } => (Some(conn), Some(purpose)),
            Self::Ready { conn } => (Some(conn), None),
        }
    }
}

/// A request the harness sent to the runtime, awaiting its answer.
pub(super) enum PendingKind {
    Initialize,
    /// `authenticate` with the profile's `auth_method`, between `initialize` and opening the
    /// session.
    Authenticate,
    NewSession,
    Reopen(ReopenMethod),
    /// `session/new` in place of a session the agent could not reopen (`on_reopen_failure =
    /// "fresh"`), and why it could not.
    FreshSession {
        why: String,
    },
    SetConfig {
        action_id: ActionId,
    },
}

pub(super) struct Pending {
    pub kind: PendingKind,
    pub method: &'static str,
    pub deadline: Instant,
}

/// One epoch's connection to a runtime.
pub(super) struct Conn {
    pub epoch: u32,
    pub writer: LineWriter,
    pub killer: RuntimeKiller,
    pub stderr: Arc<StderrTail>,
    pub exited: Option<oneshot::Receiver<io::Result<ExitStatus>>>,
    pub exit_status: Option<String>,
    /// The reader saw the end of the runtime's output.
    pub output_closed: bool,
    /// When to stop waiting for the other half of an ending (exit, or end of output).
    pub exit_deadline: Option<Instant>,
    pub next_id: u64,
    /// The harness's own requests on this connection awaiting answers, by JSON-RPC id: they
    /// end with it.
    pub pending: HashMap<String, Pending>,
    /// Set when a limit of the runtime's box ended it: the reason its end is given.
    pub limit: Arc<std::sync::OnceLock<String>>,
    _permit: OwnedSemaphorePermit,
    _fence: FenceGuard,
}

/// Kills the connection's runtime the moment the session's lease is lost, whatever the actor is
/// doing then: an actor waiting on a database that does not answer must not keep an agent running
/// past the lease's self-fencing deadline. Ends with the connection, or once a runtime being
/// stopped gracefully is gone.
struct FenceGuard(tokio::task::AbortHandle);

impl FenceGuard {
    fn new(runtime: KillSwitch, mut lost: watch::Receiver<bool>) -> Self {
        let task = tokio::spawn(async move {
            // The guard `wait_for` returns is dropped at once: marking the session lost needs
            // the lock it holds.
            let lost = lost.wait_for(|lost| *lost).await.is_ok();
            if lost {
                runtime.kill();
            }
        });
        Self(task.abort_handle())
    }
}

impl Drop for FenceGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A runtime being stopped gracefully: done once nothing of it is left.
pub(super) struct Stopping {
    done: oneshot::Receiver<()>,
    /// When to stop waiting for it regardless (its grace, and a margin for a bridge to report).
    until: Instant,
}

/// How long past its grace a stopping runtime is waited for (a bridge reports its exit late).
const STOPPED_MARGIN: Duration = Duration::from_secs(6);

impl Stopping {
    /// Waits until the runtime is gone, or its time is up.
    pub(super) async fn wait(self) {
        let _ = tokio::time::timeout_at(self.until.into(), self.done).await;
    }
}

impl Conn {
    /// Ends the connection and stops its runtime gracefully: its stdin closes as the writer
    /// goes, its tree gets SIGTERM, and SIGKILL after `grace`. Its runtime slot is given back at
    /// once, as for any runtime the session no longer has.
    pub(super) fn stop_gracefully(self, grace: Duration) -> Stopping {
        let Conn {
            mut killer,
            exited,
            writer,
            _fence: fence,
            ..
        } = self;
        drop(writer);
        killer.stop(grace);
        let (done_tx, done) = oneshot::channel();
        tokio::spawn(async move {
            // A lease lost while the runtime stops still kills it at once.
            let _fence = fence;
            if let Some(exited) = exited {
                let _ = exited.await;
            }
            let _ = done_tx.send(());
        });
        Stopping {
            done,
            until: Instant::now() + grace + STOPPED_MARGIN,
        }
    }

    /// The slot where the runtime's box says which limit ended it.
    pub(super) fn with_limit(mut self, limit: Arc<std::sync::OnceLock<String>>) -> Self {
        self.limit = limit;
        self
    }

    /// A connection to a started runtime; `lost` tells when the session's lease is lost (the
    /// runtime is then killed at once).
    pub(super) fn new(
        epoch: u32,
        writer: LineWriter,
        killer: RuntimeKiller,
        stderr: Arc<StderrTail>,
        exited: oneshot::Receiver<io::Result<ExitStatus>>,
        permit: OwnedSemaphorePermit,
        lost: watch::Receiver<bool>,
    ) -> Self {
        Self {
            _fence: FenceGuard::new(killer.switch(), lost),
            epoch,
            writer,
            killer,
            stderr,
            exited: Some(exited),
            exit_status: None,
            output_closed: false,
            exit_deadline: None,
            next_id: 0,
            pending: HashMap::new(),
            limit: Arc::default(),
            _permit: permit,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::{Semaphore, mpsc};

    use super::*;
    use crate::{acp::process::StopRequest, domain::Result};

    /// A connection to nothing: enough to move through the states without a process.
    fn connection(epoch: u32) -> Conn {
        let (events, _) = mpsc::channel(1);
        let writer = LineWriter::start(tokio::io::sink(), epoch, events);
        let (kill, _) = oneshot::channel();
        let (_, exited) = oneshot::channel();
        let permit = Arc::new(Semaphore::new(1))
            .try_acquire_owned()
            .expect("a slot");
        Conn::new(
            epoch,
            writer,
            RuntimeKiller::remote(kill),
            Arc::default(),
            exited,
            permit,
            watch::channel(false).1,
        )
    }

    /// A connection to nothing whose runtime's stop requests arrive on the returned receiver,
    /// and whose session's lease is lost through the returned sender.
    fn watched_connection() -> (Conn, oneshot::Receiver<StopRequest>, watch::Sender<bool>) {
        let (events, _) = mpsc::channel(1);
        let writer = LineWriter::start(tokio::io::sink(), 1, events);
        let (kill, stop_requests) = oneshot::channel();
        let (_, exited) = oneshot::channel();
        let permit = Arc::new(Semaphore::new(1))
            .try_acquire_owned()
            .expect("a slot");
        let (lost, lost_rx) = watch::channel(false);
        let conn = Conn::new(
            1,
            writer,
            RuntimeKiller::remote(kill),
            Arc::default(),
            exited,
            permit,
            lost_rx,
        );
        (conn, stop_requests, lost)
    }

    #[tokio::test]
    async fn a_lost_lease_kills_the_runtime_at_once_whatever_the_actor_is_doing() {
        // The actor holds the connection and does nothing with it (it waits on the database).
        let (_conn, stop_requests, lost) = watched_connection();
        lost.send_replace(true);
        let request = tokio::time::timeout(Duration::from_secs(5), stop_requests)
            .await
            .expect("the runtime is stopped without the actor")
            .expect("a stop request");
        assert_eq!(request, StopRequest::Now);
    }

    fn create() -> (StartPurpose, oneshot::Receiver<Result<Option<ActionId>>>) {
        let (ready, answer) = oneshot::channel();
        let purpose = StartPurpose::Create {
            ready,
            model: None,
            model_request: None,
            first_prompt: None,
            fork_of: None,
        };
        (purpose, answer)
    }

    #[tokio::test]
    async fn a_down_runtime_has_no_connection_and_is_neither_starting_nor_ready() {
        let mut state = RuntimeState::Down;
        assert!(!state.is_up() && !state.is_starting() && !state.is_ready());
        assert!(state.conn().is_none() && state.purpose().is_none());
        assert!(state.finish_start().is_none(), "no start to finish");
        assert!(matches!(state.stop(), (None, None)));
    }

    #[tokio::test]
    async fn a_started_runtime_is_starting_for_its_purpose_until_its_handshake_ends() {
        let mut state = RuntimeState::Down;
        state.start(connection(3), StartPurpose::Reopen, false);
        assert!(state.is_up() && state.is_starting() && !state.is_ready());
        assert!(state.is_reopening() && !state.is_creating() && !state.is_warm_create());
        assert_eq!(state.conn().map(|c| c.epoch), Some(3));

        assert!(matches!(state.finish_start(), Some(StartPurpose::Reopen)));
        assert!(state.is_up() && state.is_ready() && !state.is_starting());
        assert!(
            state.purpose().is_none(),
            "a ready runtime has no start purpose"
        );
        assert_eq!(
            state.conn().map(|c| c.epoch),
            Some(3),
            "the same connection"
        );
        assert!(
            state.finish_start().is_none(),
            "finishing twice changes nothing"
        );
        assert!(state.is_ready());
    }

    #[tokio::test]
    async fn only_a_new_sessions_runtime_from_the_warm_pool_counts_as_a_warm_creation() {
        let mut state = RuntimeState::Down;
        let (purpose, _answer) = create();
        state.start(connection(1), purpose, true);
        assert!(state.is_creating() && state.is_warm_create());

        let mut cold = RuntimeState::Down;
        let (purpose, _answer) = create();
        cold.start(connection(1), purpose, false);
        assert!(cold.is_creating() && !cold.is_warm_create());

        // Once ready, a warm runtime is like any other.
        state.finish_start();
        assert!(!state.is_warm_create() && !state.is_creating());
    }

    #[tokio::test]
    async fn stopping_hands_back_the_connection_and_an_unfinished_starts_purpose() {
        let mut state = RuntimeState::Down;
        let (purpose, mut answer) = create();
        state.start(connection(1), purpose, false);
        state.conn_mut().expect("up").pending.insert(
            "\"h-1-0\"".into(),
            Pending {
                kind: PendingKind::Initialize,
                method: "initialize",
                deadline: Instant::now(),
            },
        );
        let (conn, purpose) = state.stop();
        assert!(!state.is_up());
        assert_eq!(
            conn.map(|c| c.pending.len()),
            Some(1),
            "its requests go with it"
        );
        let Some(StartPurpose::Create { ready, .. }) = purpose else {
            panic!("the creation is handed back, so its caller can be answered");
        };
        assert!(answer.try_recv().is_err(), "not answered yet");
        drop(ready);

        let mut ready = RuntimeState::Down;
        ready.start(connection(2), StartPurpose::Reopen, false);
        ready.finish_start();
        let (conn, purpose) = ready.stop();
        assert!(conn.is_some() && purpose.is_none());
        assert!(!ready.is_up());
    }
}
