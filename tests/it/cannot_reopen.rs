//! Sessions whose agent can be reopened neither by `session/resume` nor `session/load`:
//! their runtime is kept rather than suspended for idleness, since a suspended one could never
//! come back. (After a harness restart they are DISCONNECTED: see `crash`.)

use std::time::Duration;

use agent_harness::pb::v1 as pb;

use crate::{
    harness::{Harness, bounded},
    support::{Session, mock_profile_with, processes_with},
};

#[tokio::test]
async fn a_session_that_cannot_reopen_is_never_suspended_for_idleness() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = Harness::start_with(|config| {
            for (name, flags) in [("plain", &[][..]), ("resumable", &["--resume"][..])] {
                let mut flags = flags.to_vec();
                flags.extend(["--stderr-at-start", &marker]);
                mock_profile_with(config, name, &flags, |p| {
                    p.idle_timeout = Some(Duration::from_millis(100));
                });
            }
        })
        .await;
        // The plain session goes idle first, so its idle timer would fire first.
        let mut plain = Session::create(&h, "plain").await;
        let mut resumable = Session::create(&h, "resumable").await;
        let mut watch = resumable.watch().await;
        watch.status(pb::SessionStatus::Suspended).await;
        let got = plain.get().await;
        assert_eq!(
            got.status,
            pb::SessionStatus::Idle as i32,
            "{}",
            got.status_reason
        );
        assert_eq!(processes_with(&marker).len(), 1, "its runtime is kept");
        let mut watch = plain.watch().await;
        let reply = plain.prompt("still here").await;
        assert_eq!(reply.status, pb::ControlStatus::Sent as i32);
        watch.response_to(&reply.action_id).await;
    })
    .await
}
