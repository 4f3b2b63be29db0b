//! Text that a runtime controls and the harness stores or shows is bounded (docs/security.md,
//! "Third round", bounded hellos and foreign text): an agent cannot make a session's record larger than a client accepts.
//! The bridge's texts (start failures, exit tails) are covered in `bridge`.

use agent_harness::pb::v1 as pb;
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    support::{Session, create_request, mock_profile, session_count},
};

#[tokio::test]
async fn an_agents_session_id_over_four_kib_fails_the_create_and_stores_nothing() {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile(config, "huge-id", &["--session-id-bytes", "5000"]);
            mock_profile(config, "fitting-id", &["--session-id-bytes", "4096"]);
        })
        .await;
        let status = expect_err(
            h.sessions()
                .create_session(create_request(&h, "huge-id"))
                .await,
        );
        assert_error(&status, Code::Unavailable, "RUNTIME_START_FAILED");
        assert!(
            status.message().contains("sessionId of 5000 bytes"),
            "the reason names the size: {}",
            status.message()
        );
        assert_eq!(session_count(&h).await, 0, "nothing is left behind");

        // At the cap the id is taken as it is: it names the agent's session on resume.
        let mut session = Session::create(&h, "fitting-id").await;
        assert_eq!(session.get().await.status, pb::SessionStatus::Idle as i32);
    })
    .await
}

#[tokio::test]
async fn a_current_model_id_over_four_kib_is_not_taken_as_the_sessions_model() {
    bounded(async {
        let huge = "m".repeat(5000);
        let models = format!("{huge},mock-small");
        let h = Harness::start_with(|config| {
            mock_profile(config, "huge-model", &["--models", &models]);
        })
        .await;
        let mut session = Session::create(&h, "huge-model").await;
        let record = session.get().await;
        assert_eq!(
            record.model, "",
            "the over-long id is not the session's model"
        );
        let listed = h
            .sessions()
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("ListSessions keeps working")
            .into_inner();
        assert_eq!(listed.sessions.len(), 1);
        assert!(listed.sessions[0].model.len() <= 4096);
    })
    .await
}
