//! Signals to the real binary: SIGHUP never stops the server.

use std::time::Duration;

use crate::{process::Serve, process_tree::wrapped_profile_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tokens_file_sighup_is_ignored_and_sigterm_still_drains_to_exit_0() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let config = wrapped_profile_config(dir.path(), "unused");
        let mut server = Serve::on(dir.path().join("data"), &config).start();
        server.signal(libc::SIGHUP);
        assert!(
            server
                .next_logged("SIGHUP: no tokens file to reload; ignored")
                .await
                .is_some(),
            "the server died of SIGHUP: {:?}",
            server.try_wait()
        );
        // Still serving.
        let mut client = server.client().await;
        client
            .list_sessions(agent_harness::pb::v1::ListSessionsRequest::default())
            .await
            .expect("still serving after SIGHUP");
        server.signal(libc::SIGTERM);
        assert!(server.next_logged("stopped").await.is_some(), "drained");
        let status = server.wait().await;
        assert!(status.success(), "{status:?}");
    })
    .await
    .expect("in time")
}
