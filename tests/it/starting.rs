//! Model and config option changes while the runtime is starting: the runtime is not
//! dead, only not ready, so the change waits for the handshake and is then sent — never
//! RUNTIME_DISCONNECTED.

use std::time::Duration;

use agent_harness::pb::v1 as pb;

use crate::{
    harness::{Harness, bounded},
    support::{Session, mock_profile_with, set_model},
};

#[tokio::test]
async fn a_model_change_during_a_reopen_waits_for_the_handshake_and_is_sent() {
    bounded(async {
        let h = Harness::start_with(|config| {
            // A slow handshake keeps the reopen in progress while the change arrives.
            mock_profile_with(
                config,
                "slow",
                &["--resume", "--delay-initialize", "1500"],
                |p| p.idle_timeout = Some(Duration::from_millis(100)),
            )
        })
        .await;
        let mut session = Session::create(&h, "slow").await;
        let mut watch = session.watch().await;
        watch.status(pb::SessionStatus::Suspended).await;
        let wake = session.prompt("wake up").await;
        assert_eq!(wake.status, pb::ControlStatus::Queued as i32);
        assert_eq!(
            session.get().await.status,
            pb::SessionStatus::Starting as i32
        );
        let change = session
            .act(set_model("mock-smart"))
            .await
            .expect("the change waits for the handshake instead of failing");
        assert_eq!(change.status, pb::ControlStatus::Sent as i32);
        let answer = watch.response_to(&change.action_id).await;
        let model = answer["result"]["configOptions"]
            .as_array()
            .and_then(|options| options.iter().find(|o| o["id"] == "model"))
            .unwrap_or_else(|| panic!("the change is accepted: {answer}"));
        assert_eq!(model["currentValue"], "mock-smart");
        watch.response_to(&wake.action_id).await;
    })
    .await
}
