//! A runtime's whole process tree is the runtime, with the real binary: an agent
//! started through `sh -c` dies with a harness killed by `kill -9`, and a descendant an earlier
//! harness left on the data directory is killed at the next start. Checked through `/proc`.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use agent_harness::pb::v1 as pb;

use crate::{
    process::Serve,
    support::{Session, processes_with},
};

/// A profile whose command is `sh -c` wrapping the mock agent. The wrapper does not `exec`, so
/// the agent is the wrapper's child, as under `npx`.
pub fn wrapped_profile_config(dir: &Path, marker: &str) -> std::path::PathBuf {
    let program = env!("CARGO_BIN_EXE_agent-harness");
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[profiles.wrapped]
command = "sh"
args = ["-c", "\"$0\" mock-agent --resume --stderr-at-start {marker}; exit $?", "{program}"]
"#
        ),
    )
    .unwrap();
    path
}

/// Whether the process is gone (or a zombie: dead, only not yet collected by its new parent).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Kills the processes it names when dropped, so a failing test leaves nothing running.
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            if !dead(*pid) {
                // SAFETY: only sends a signal, to a process this test started.
                unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
            }
        }
    }
}

/// Polls `/proc` until `done` holds, failing after `limit`.
async fn within(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_of_the_harness_no_process_of_a_wrapped_runtime_is_alive_two_seconds_later() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let marker = uuid::Uuid::now_v7().to_string();
        let config = wrapped_profile_config(dir.path(), &marker);
        let mut server = Serve::on(dir.path().join("data"), &config).start();
        let mut session = Session::create_with_client(
            server.client().await,
            pb::CreateSessionRequest {
                profile: "wrapped".into(),
                cwd: agent_harness_testkit::workspace_in(dir.path())
                    .to_string_lossy()
                    .into_owned(),
                ..Default::default()
            },
        )
        .await;
        let mut watch = session.watch().await;
        // A turn that goes on without input: the agent does not stop at the end of its stdin.
        session.prompt("@sleep 600000").await;
        watch.chunk("echo: @sleep 600000").await;
        let tree = processes_with(&marker);
        let _cleanup = KillOnDrop(tree.clone());
        assert_eq!(tree.len(), 2, "the wrapper and the agent run: {tree:?}");

        server.kill_9();
        within(
            Duration::from_secs(2),
            "a runtime process outlived its harness",
            || tree.iter().all(|pid| dead(*pid)),
        )
        .await;
    })
    .await
    .expect("in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_descendant_of_an_earlier_harness_whose_leader_is_gone_is_killed_at_the_next_start()
 {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let marker = format!(
            "{}/an0earlier0harness/7",
            agent_harness::acp::process::data_dir_marker(&data).unwrap()
        );
        // What a runtime of an earlier harness left: its leader (the shell) is gone; its child
        // runs on with another parent and no group leader anyone recorded.
        let mut planter = Command::new("sh")
            .args(["-c", "sleep 600 </dev/null >/dev/null 2>&1 & echo $!"])
            .env(agent_harness::acp::process::MARKER_VAR, &marker)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(planter.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        planter.wait().unwrap();
        let leftover: u32 = line.trim().parse().unwrap();
        let _cleanup = KillOnDrop(vec![leftover]);
        assert!(!dead(leftover), "the leftover runs before the start");

        let config = wrapped_profile_config(dir.path(), "unused");
        let _server = Serve::on(&data, &config).start();
        within(
            Duration::from_secs(10),
            "the leftover of an earlier harness survived the next start",
            || dead(leftover),
        )
        .await;
    })
    .await
    .expect("in time")
}

#[tokio::test]
async fn closing_a_session_kills_a_descendant_that_left_the_runtimes_process_group() {
    crate::harness::bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("helper.pid");
        let program = env!("CARGO_BIN_EXE_agent-harness");
        let script = format!(
            "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $! > {}; \"$0\" mock-agent; exit $?",
            pid_file.display()
        );
        let h = crate::harness::Harness::start_with(|config| {
            crate::support::mock_profile_with(config, "wrapped", &[], |profile| {
                profile.command = "sh".into();
                profile.args = vec!["-c".into(), script, program.into()];
                // The marker sweep of an unboxed runtime is what this tests (a boxed runtime's
                // descendants die with its PID namespace, and its pids are not the host's).
                profile.sandbox = None;
            })
        })
        .await;
        let mut session = Session::create(&h, "wrapped").await;
        let helper: u32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _cleanup = KillOnDrop(vec![helper]);
        assert!(!dead(helper), "the helper runs in a session of its own");
        session
            .client
            .close_session(pb::CloseSessionRequest {
                session_id: session.id.clone(),
            })
            .await
            .unwrap();
        within(
            Duration::from_secs(10),
            "a descendant outside the runtime's group survived its session",
            || dead(helper),
        )
        .await;
    })
    .await
}
