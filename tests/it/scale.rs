//! Many sessions at once (issue: the session engine, acceptance 4). Timing is never asserted; the
//! harness's resident memory is printed for the record.

use std::time::Duration;

use agent_harness::pb::v1 as pb;
use futures::future::join_all;

use crate::{
    harness::{Harness, within},
    support::Session,
};

fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_sessions_each_complete_ten_turns() {
    const SESSIONS: usize = 100;
    const TURNS: usize = 10;
    within(Duration::from_secs(240), async {
        let h = Harness::start().await;
        let before = resident_kib();
        let runs = (0..SESSIONS).map(|i| {
            let h = &h;
            async move {
                let mut session = Session::create(h, "mock").await;
                let mut watch = session.watch().await;
                for turn in 0..TURNS {
                    let reply = session.prompt(&format!("session {i} turn {turn}\n@chunks 3")).await;
                    assert_eq!(reply.status, pb::ControlStatus::Sent as i32, "session {i} turn {turn}");
                    let response = watch.response_to(&reply.action_id).await;
                    assert_eq!(response["result"]["stopReason"], "end_turn", "session {i} turn {turn}");
                }
                // The harness reacts to the last reply after logging it.
                watch.status(pb::SessionStatus::Idle).await;
                session.get().await
            }
        });
        let sessions = join_all(runs).await;
        assert_eq!(sessions.len(), SESSIONS);
        for session in &sessions {
            assert_eq!(session.status, pb::SessionStatus::Idle as i32);
        }
        let after = resident_kib();
        println!(
            "{SESSIONS} sessions x {TURNS} turns: test process RSS {before} KiB before, {after} KiB after \
             (harness and test client in one process; runtimes are separate processes)"
        );
    })
    .await;
}
