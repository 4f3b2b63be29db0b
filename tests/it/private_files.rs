//! Files only the server reads: started with the common umask 022 (new files readable by
//! everyone), a real `serve` process still makes its data directory 0700 and its store, WAL and
//! shared-memory files 0600, and so do `backup` and `export --out`; an existing data directory
//! or store that others may read is warned about at start, one only its group may read is not.

use std::{
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::Path,
    time::Duration,
};

use agent_harness::pb::v1 as pb;
use agent_harness_testkit::service_bin;

use crate::{
    harness::within,
    process::Serve,
    support::{Session, Watch},
};

const TEST_BOUND: Duration = Duration::from_secs(60);
const UMASK: libc::mode_t = 0o022;
const WARNING: &str = "is readable by other users of this machine";

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `agent-harness ARGS` with the umask 022.
fn run_with_umask(args: &[&std::ffi::OsStr], server: &str) -> std::process::Output {
    let mut command = std::process::Command::new(service_bin());
    command
        .args(args)
        .env("AGENT_HARNESS_SERVER", server)
        .env_remove("AGENT_HARNESS_TOKEN")
        .env_remove("AGENT_HARNESS_CONFIG");
    // SAFETY: umask(2) is async-signal-safe and touches nothing of the parent.
    unsafe {
        command.pre_exec(|| {
            libc::umask(UMASK);
            Ok(())
        });
    }
    command.output().expect("the command runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_and_every_file_the_server_writes_are_private_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let data = dir.path().join("data");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    // The session works apart from the server's files (a cwd holding its config is refused).
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let serve = Serve::on(&data, &config).umask(UMASK);
    let mut server = serve.start();
    within(TEST_BOUND, async {
        let client = server.client().await;
        let mut session = Session::create_with_client(
            client,
            pb::CreateSessionRequest {
                profile: "mock".into(),
                cwd: work.to_string_lossy().into_owned(),
                ..Default::default()
            },
        )
        .await;
        let mut watch: Watch = session.watch().await;
        let reply = session.prompt("a transcript to keep private").await;
        watch.response_to(&reply.action_id).await;

        let store = data.join("agent-harness.sqlite3");
        assert_eq!(mode(&data), 0o700, "the data directory");
        assert_eq!(mode(&store), 0o600, "the store");
        for suffix in ["-wal", "-shm"] {
            let file = data.join(format!("agent-harness.sqlite3{suffix}"));
            assert_eq!(mode(&file), 0o600, "{}", file.display());
        }
        assert!(!server.logged(WARNING), "nothing to warn about");

        let backup = dir.path().join("backup.sqlite3");
        let output = run_with_umask(
            &[
                "backup".as_ref(),
                "--to".as_ref(),
                backup.as_os_str(),
                "--data-dir".as_ref(),
                data.as_os_str(),
            ],
            "",
        );
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(mode(&backup), 0o600, "the backup");

        let export = dir.path().join("export.json");
        let address = format!("http://{}", server.addr());
        let output = run_with_umask(
            &[
                "export".as_ref(),
                session.id.as_ref(),
                "--out".as_ref(),
                export.as_os_str(),
            ],
            &address,
        );
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(mode(&export), 0o600, "the export");

        // A data directory its group may read (a Kubernetes fsGroup) is no warning...
        chmod(&data, 0o750);
        server.restart();
        assert!(!server.logged(WARNING), "the group's access is on purpose");
        // ...one that others may read is, and so is a store others may read.
        chmod(&data, 0o755);
        chmod(&store, 0o644);
        server.restart();
        let warnings: Vec<String> = server
            .log_lines()
            .into_iter()
            .filter(|line| line.contains(WARNING))
            .collect();
        assert_eq!(
            warnings.len(),
            2,
            "the directory and the store: {warnings:?}"
        );
    })
    .await;
}
