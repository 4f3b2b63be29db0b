//! Secrets for agents without writing them into the config file: a profile passes named
//! variables of the harness's own environment through (`env_passthrough`) or reads them from
//! files (`env_files`, a mounted Secret). The runtime gets them; the values appear nowhere the
//! harness writes or answers: its log (at debug level), GetSession, the transcript, the session
//! log, the metrics, errors, and `agent-harness profiles`.

use std::{path::Path, time::Duration};

use agent_harness::pb::v1 as pb;
use sha2::{Digest, Sha256};
use tonic::Code;

use crate::{
    harness::{assert_error, within},
    operations::scrape,
    process::{Serve, ServeProcess},
    support::Session,
};

/// What the mock agent's `@env-digest` says of a value it was given.
fn digest_line(name: &str, value: &str) -> String {
    format!(
        "env-digest {name}: set, {} bytes, sha256 {}",
        value.len(),
        hex::encode(Sha256::digest(value.as_bytes()))
    )
}

/// A config with a profile `secret` that passes one variable through and reads another from
/// `key_file`, and a profile `broken` whose file holds a NUL byte after a secret.
fn config(dir: &Path, key_file: &Path, broken_file: &Path) -> std::path::PathBuf {
    let program = env!("CARGO_BIN_EXE_agent-harness");
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[profiles.secret]
command = "{program}"
args = ["mock-agent", "--resume"]
env_passthrough = ["TEST_PASSED_KEY", "TEST_KEY_NOBODY_SET"]
env_files = {{ TEST_FILE_KEY = "{}" }}

[profiles.broken]
command = "{program}"
args = ["mock-agent"]
env_files = {{ TEST_FILE_KEY = "{}" }}
"#,
            key_file.display(),
            broken_file.display()
        ),
    )
    .unwrap();
    path
}

/// The metrics address the process logged.
fn metrics_addr(server: &ServeProcess) -> std::net::SocketAddr {
    server
        .log_lines()
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find_map(|event| event["metrics_addr"].as_str()?.parse().ok())
        .expect("the metrics address is logged")
}

#[tokio::test]
async fn secrets_passed_through_or_read_from_files_reach_the_runtime_and_appear_nowhere_else() {
    within(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let unique = uuid::Uuid::now_v7().simple().to_string();
        let (passed, filed, unlisted) = (
            format!("planted-env-{unique}"),
            format!("planted-file-{unique}"),
            format!("planted-unlisted-{unique}"),
        );
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, format!("{filed}\n")).unwrap();
        let broken_file = dir.path().join("broken");
        std::fs::write(&broken_file, format!("{filed}\0rest")).unwrap();
        let config = config(dir.path(), &key_file, &broken_file);
        let server = Serve::on(dir.path().join("data"), &config)
            .args(["--metrics-listen", "127.0.0.1:0"])
            .env("TEST_PASSED_KEY", &passed)
            .env("TEST_UNLISTED_KEY", &unlisted)
            .env("RUST_LOG", "debug")
            .start();

        let mut session = Session::create_with_client(
            server.client().await,
            pb::CreateSessionRequest {
                profile: "secret".into(),
                cwd: agent_harness_testkit::workspace_in(dir.path())
                    .to_string_lossy()
                    .into_owned(),
                ..Default::default()
            },
        )
        .await;
        let mut watch = session.watch().await;
        let turn = session
            .prompt(
                "@env-digest TEST_PASSED_KEY\n@env-digest TEST_FILE_KEY\n\
                 @env-digest TEST_KEY_NOBODY_SET\n@env-digest TEST_UNLISTED_KEY",
            )
            .await;
        let answer = watch.response_to(&turn.action_id).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        watch.status(pb::SessionStatus::Idle).await;
        let transcript = session.transcript().await;
        let said = format!("{transcript:?}");
        // The runtime got both, exactly (the file's trailing newline dropped) …
        assert!(
            said.contains(&digest_line("TEST_PASSED_KEY", &passed)),
            "{said}"
        );
        assert!(
            said.contains(&digest_line("TEST_FILE_KEY", &filed)),
            "{said}"
        );
        // … and nothing it was not given.
        assert!(
            said.contains("env-digest TEST_KEY_NOBODY_SET: unset"),
            "{said}"
        );
        assert!(
            said.contains("env-digest TEST_UNLISTED_KEY: unset"),
            "{said}"
        );

        // An unfit file fails the start, naming the variable and the file, not the value.
        let refused = server
            .client()
            .await
            .create_session(pb::CreateSessionRequest {
                profile: "broken".into(),
                cwd: agent_harness_testkit::workspace_in(dir.path())
                    .to_string_lossy()
                    .into_owned(),
                ..Default::default()
            })
            .await
            .expect_err("the file holds a NUL byte");
        assert_error(&refused, Code::Unavailable, "RUNTIME_START_FAILED");
        assert!(
            refused.message().contains("env_files.TEST_FILE_KEY")
                && refused.message().contains("NUL"),
            "{}",
            refused.message()
        );

        let mut seen = vec![
            ("the transcript", said),
            ("GetSession", format!("{:?}", session.get().await)),
            ("the session log", format!("{:?}", session.log().await)),
            ("the refused creation", format!("{refused:?}")),
            ("the metrics", scrape(metrics_addr(&server)).await),
            ("the harness's log", server.log_lines().join("\n")),
        ];
        let listing = std::process::Command::new(env!("CARGO_BIN_EXE_agent-harness"))
            .args(["profiles", "--json", "--config"])
            .arg(&config)
            .env("TEST_PASSED_KEY", &passed)
            .output()
            .unwrap();
        assert!(listing.status.success(), "{listing:?}");
        let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
        assert!(listing.contains("TEST_PASSED_KEY") && listing.contains("TEST_FILE_KEY"));
        seen.push(("agent-harness profiles", listing));
        for (place, text) in seen {
            for value in [&passed, &filed, &unlisted, &unique] {
                assert!(
                    !text.contains(value.as_str()),
                    "{place} shows a secret: {text}"
                );
            }
        }
    })
    .await;
}
