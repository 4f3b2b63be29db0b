//! An idempotent CreateSession retry answers with the first prompt's action id,
//! however many log entries come before that prompt: the id is stored with the session, not
//! searched for in the start of the log.

use std::path::PathBuf;

use agent_harness::pb::v1::{self as pb, create_session_request::Origin};

use crate::{
    harness::{Harness, bounded},
    support::{create_request, mock_profile_with},
};

#[tokio::test]
async fn a_create_session_retry_answers_the_first_action_id_after_many_early_log_entries() {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "chatty", &[], |p| {
                // A wrapper that has the agent's side say 80 things before the handshake: each
                // is logged ahead of the first prompt.
                let agent = p.command.to_string_lossy().into_owned();
                p.command = PathBuf::from("/bin/sh");
                p.args = vec![
                    "-c".into(),
                    format!(
                        "i=0; while [ $i -lt 80 ]; do i=$((i+1)); \
                         echo '{{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{{\"sessionId\":\"early\",\"update\":{{\"sessionUpdate\":\"available_commands_update\",\"availableCommands\":[]}}}}}}'; \
                         done; exec '{agent}' mock-agent"
                    ),
                ];
            })
        })
        .await;
        let mut request = create_request(&h, "chatty");
        request.session_id = Some(uuid::Uuid::now_v7().to_string());
        request.origin = Some(Origin::TaskAssignment(pb::TaskAssignment {
            prompt: "hello".into(),
            assigned_by: "a".into(),
        }));
        let first = h
            .sessions()
            .create_session(request.clone())
            .await
            .unwrap()
            .into_inner();
        assert!(first.first_action_id.is_some());
        let again = h
            .sessions()
            .create_session(request)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again.first_action_id, first.first_action_id);
    })
    .await
}
