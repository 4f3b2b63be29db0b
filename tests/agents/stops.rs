//! Stopping the harness right after a short first turn loses no session of a real agent.
//!
//! Claude Code writes its session file lazily (it flushes every 100 ms): an agent killed with
//! SIGKILL right after a turn may lose the file, and with it the session (`session/resume`
//! then fails "Resource not found"). The harness stops runtimes gracefully — SIGTERM to the
//! process tree, a grace (`stop_grace`), then SIGKILL — on a drain, and its watchdog does the same
//! when the harness itself is killed with `kill -9`. These tests stop the harness either way
//! [`ROUNDS`] times, each time right after a short first turn, and check that every session
//! reopens by `session/resume` (or `session/load`) and runs its next prompt with the earlier
//! conversation.

use std::time::Instant;

use agent_harness_testkit::support::Session;

use crate::{
    kit::{Agent, Outcome, Rig, note, turn_end},
    scenarios::{plain_turn, reopened_by, reply_to, runtime_pids},
};

/// How many times each way of stopping is tried.
pub const ROUNDS: usize = 10;

/// How the harness is stopped.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// SIGTERM: a graceful drain, which stops each runtime gracefully.
    Drain,
    /// `kill -9` of the harness: its watchdog stops the runtimes gracefully.
    Kill9,
}

/// [`ROUNDS`] stops of the harness (`stop`), each right after a short first turn of a new
/// session; every session must reopen and answer its next prompt.
pub async fn stopped_right_after_a_turn(agent: Agent, stop: Stop) -> Outcome {
    let mut rig = Rig::start(&agent).await;
    let mut lost = Vec::new();
    let started = Instant::now();
    for round in 0..ROUNDS {
        if let Some(evidence) = one_round(&agent, &mut rig, stop, round).await {
            lost.push(evidence);
        }
    }
    let summary = format!(
        "{ROUNDS} {stop:?} stops right after a first turn: {} of {ROUNDS} sessions lost, in \
         {:.0} s",
        lost.len(),
        started.elapsed().as_secs_f64()
    );
    note(&summary);
    if lost.is_empty() {
        Outcome::Pass(format!("0 of {ROUNDS} lost"))
    } else {
        Outcome::Deviates(format!("{summary}: {}", lost.join("; ")))
    }
}

/// One session: a short turn, the harness stopped at once, restarted, the next prompt. `Some`
/// with the evidence when the session did not come back with its conversation.
async fn one_round(agent: &Agent, rig: &mut Rig, stop: Stop, round: usize) -> Option<String> {
    let first = format!("{stop:?}-round-{round}-first");
    let second = format!("{stop:?}-round-{round}-second");
    let mut session = rig.session(agent).await;
    let runtimes = runtime_pids(&rig.server);
    let mut watch = session.watch().await;
    let turn = session.prompt(&first).await;
    // Stopped the moment the turn's answer is logged: the agent's lazy write has had no time.
    let reason = turn_end(&mut watch, &turn.action_id).await;
    match stop {
        Stop::Drain => {
            rig.server.signal(libc::SIGTERM);
            let status = rig.server.wait().await;
            assert!(
                status.success(),
                "the drain ends the harness cleanly: {status}"
            );
        }
        Stop::Kill9 => rig.server.kill_9(),
    }
    assert_eq!(reason, "end_turn", "the first turn of {first}");
    // No process of the runtime outlives the stop (the grace included).
    agent_harness_testkit::support::exited(&runtimes).await;
    rig.server.restart();
    let mut session = Session::attach(rig.server.client().await, &session.id);
    let mark = rig.fake.recorder().len();
    let (reason, reply) = plain_turn(&mut session, &second).await;
    let how = reopened_by(&mut session).await;
    let request = rig
        .fake
        .recorder()
        .wait_after(mark, |r| r.is_turn_step() && r.carries(&second))
        .await;
    let kept = request.carries(&first);
    note(&format!(
        "{stop:?} round {round}: next turn {reason}, reopened by {how:?}, earlier conversation \
         kept: {kept}"
    ));
    let fine = reason == "end_turn" && reply.contains(&reply_to(&second)) && how.is_some() && kept;
    (!fine).then(|| {
        format!(
            "{stop:?} round {round}: the next turn ended {reason} with {reply:?}, reopened by \
             {how:?}, the model request carried the first prompt: {kept}"
        )
    })
}
