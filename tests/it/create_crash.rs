//! A runtime that crashes while CreateSession waits for it leaves no session behind:
//! nothing listed, nothing counted toward the principal's cap.

use std::time::Duration;

use agent_harness::pb::v1 as pb;
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    support::{Session, create_request, mock_profile, processes_with, session_count},
};

#[tokio::test]
async fn a_runtime_crashing_during_create_session_leaves_no_session_counting_toward_the_cap() {
    bounded(async {
        let hung = uuid::Uuid::now_v7().to_string();
        let exits = uuid::Uuid::now_v7().to_string();
        let h = Harness::start_with(|config| {
            config.limits.sessions_per_principal = 1;
            mock_profile(
                config,
                "hangs",
                &["--stderr-at-start", &hung, "--hang-initialize"],
            );
            mock_profile(
                config,
                "exits",
                &["--stderr-at-start", &exits, "--exit-at-start", "3"],
            );
        })
        .await;

        // Killed while the handshake waits.
        let mut client = h.sessions();
        let request = create_request(&h, "hangs");
        let create = tokio::spawn(async move { client.create_session(request).await });
        let pids = loop {
            let pids = processes_with(&hung);
            if !pids.is_empty() {
                break pids;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        for pid in pids {
            // SAFETY: only sends a signal to the runtime this test started.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        let status = expect_err(create.await.unwrap());
        assert_error(&status, Code::Unavailable, "RUNTIME_START_FAILED");

        // Exits on its own before the handshake.
        let status = expect_err(
            h.sessions()
                .create_session(create_request(&h, "exits"))
                .await,
        );
        assert_error(&status, Code::Unavailable, "RUNTIME_START_FAILED");

        assert_eq!(session_count(&h).await, 0, "no session is left behind");
        let mut session = Session::create(&h, "mock").await;
        assert_eq!(
            session.get().await.status,
            pb::SessionStatus::Idle as i32,
            "the cap still has room"
        );
    })
    .await
}

#[tokio::test]
async fn a_create_session_its_caller_gave_up_on_leaves_no_session_when_the_runtime_then_crashes() {
    bounded(async {
        let hung = uuid::Uuid::now_v7().to_string();
        let h = Harness::start_with(|config| {
            config.limits.sessions_per_principal = 1;
            mock_profile(
                config,
                "hangs",
                &["--stderr-at-start", &hung, "--hang-initialize"],
            );
        })
        .await;
        // The caller stops waiting while the handshake hangs (its deadline passes).
        let mut request = tonic::Request::new(create_request(&h, "hangs"));
        request.set_timeout(Duration::from_millis(300));
        expect_err(h.sessions().create_session(request).await);
        // Then the runtime crashes.
        let pids = processes_with(&hung);
        assert!(!pids.is_empty(), "the runtime is still starting");
        for pid in pids {
            // SAFETY: only sends a signal to the runtime this test started.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        // The failed creation is cleaned up: the cap has room again (it may take a moment for
        // the crash to be noticed, so retry only on TOO_MANY_SESSIONS).
        loop {
            match h
                .sessions()
                .create_session(create_request(&h, "mock"))
                .await
            {
                Ok(_) => break,
                Err(status) if status.code() == Code::ResourceExhausted => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(status) => panic!("{status:?}"),
            }
        }
        assert_eq!(session_count(&h).await, 1, "only the new session is left");
    })
    .await
}
