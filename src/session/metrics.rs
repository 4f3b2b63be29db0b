//! What the engine reports to the metrics recorder: counters pushed where things
//! happen, and a snapshot of the registry's gauges taken when someone scrapes. The `metrics`
//! facade is the only dependency, so the engine knows nothing of how metrics are exported.

use crate::domain::{log::Direction, session::SessionStatus};

pub(crate) const FRAMES_APPENDED: &str = "agent_harness_frames_appended_total";
pub(crate) const TURNS: &str = "agent_harness_turns_total";
pub(crate) const LOG_COMMITS: &str = "agent_harness_log_commits_total";
pub(crate) const RETENTION_DELETED: &str = "agent_harness_retention_deleted_sessions_total";
pub(crate) const RETENTION_PASSES: &str = "agent_harness_retention_passes_total";
pub(crate) const RETENTION_RECLAIMED: &str = "agent_harness_retention_reclaimed_pages_total";
pub(crate) const FIRST_OUTPUT: &str = "agent_harness_turn_first_output_seconds";
pub(crate) const PERMISSION_WAIT: &str = "agent_harness_permission_wait_seconds";
pub(crate) const REOPENS: &str = "agent_harness_runtime_reopens_total";

/// From dispatch to the agent's first `session/update` of the turn.
pub(crate) fn first_output(elapsed: std::time::Duration) {
    metrics::histogram!(FIRST_OUTPUT).record(elapsed.as_secs_f64());
}

/// From a permission request being held to its answer (by a person, or the timeout).
pub(crate) fn permission_waited(elapsed: std::time::Duration) {
    metrics::histogram!(PERMISSION_WAIT).record(elapsed.as_secs_f64());
}

/// Why a session's runtime was started again for an existing session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReopenReason {
    /// The harness restarted (or took the session over from another replica).
    Restart,
    /// The runtime failed (exited, closed its output, wrote garbage).
    Fault,
    /// The runtime was stopped on purpose (idle, or suspended) and work came.
    Resume,
    /// The runtime was restarted after a cancelled or failed turn (`restart_after_*`).
    AfterTurn,
}

pub(crate) fn reopened(reason: ReopenReason) {
    let reason = match reason {
        ReopenReason::Restart => "restart",
        ReopenReason::Fault => "fault",
        ReopenReason::Resume => "resume",
        ReopenReason::AfterTurn => "after_turn",
    };
    metrics::counter!(REOPENS, "reason" => reason).increment(1);
}

pub(crate) fn frames_appended(direction: Direction, count: u64) {
    let direction = match direction {
        Direction::ToRuntime => "to_runtime",
        Direction::FromRuntime => "from_runtime",
        Direction::Event => "event",
    };
    metrics::counter!(FRAMES_APPENDED, "direction" => direction).increment(count);
}

/// A session's step stored (one transaction of its log, record, queue and actions): against
/// `agent_harness_turns_total`, what a turn costs the store.
pub(crate) fn log_committed() {
    metrics::counter!(LOG_COMMITS).increment(1);
}

pub(crate) fn turn_ended(stop_reason: &str) {
    metrics::counter!(TURNS, "stop_reason" => stop_reason_label(stop_reason)).increment(1);
}

pub(crate) fn retention_deleted(sessions: u64) {
    metrics::counter!(RETENTION_DELETED).increment(sessions);
}

pub(crate) fn retention_reclaimed(pages: u64) {
    metrics::counter!(RETENTION_RECLAIMED).increment(pages);
}

/// A background pass ended: `ok` or `failed`.
pub(crate) fn retention_pass(result: &'static str) {
    metrics::counter!(RETENTION_PASSES, "result" => result).increment(1);
}

/// The label for a turn's stop reason: one of ACP's stop reasons, `failed` (the harness ended
/// it), or `other`. The text comes from the agent; passing it through would let an agent grow
/// the label set, and so the metrics memory, without bound.
fn stop_reason_label(stop_reason: &str) -> &'static str {
    match stop_reason {
        "end_turn" => "end_turn",
        "max_tokens" => "max_tokens",
        "max_turn_requests" => "max_turn_requests",
        "refusal" => "refusal",
        "cancelled" => "cancelled",
        "failed" => "failed",
        _ => "other",
    }
}

/// The registry's gauges at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Gauges {
    /// Sessions per status, in the order of [`SessionStatus::ALL`].
    pub by_status: Vec<(SessionStatus, u64)>,
    /// Actions waiting in every queue.
    pub queued: u64,
    /// Open Subscribe streams.
    pub subscribers: u64,
    /// Runtime processes alive now (warm ones included).
    pub live_runtimes: u64,
    /// Per warm pool: profile, the size it is kept at, runtimes ready now.
    pub warm_pools: Vec<(String, u64, u64)>,
}
