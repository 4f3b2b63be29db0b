//! `agent-harness backup`: a copy of the embedded store taken while a client runs turns,
//! restored into a fresh data directory, serves every action acknowledged before the backup
//! began; a bad target is refused with one clear line and the server carries on.

use std::{
    collections::HashSet,
    path::Path,
    process::Output,
    sync::{Arc, Mutex},
};

use agent_harness::pb::v1 as pb;
use agent_harness_testkit::service_bin;

use crate::{
    harness::{Harness, bounded},
    support::Session,
};

async fn backup(data_dir: &Path, to: &Path) -> Output {
    tokio::process::Command::new(service_bin())
        .args(["backup", "--to"])
        .arg(to)
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("AGENT_HARNESS_CONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .expect("the backup command runs")
}

/// Every action id the store holds for the session: in its log or still queued.
async fn stored_actions(session: &mut Session) -> HashSet<String> {
    let mut ids: HashSet<String> = session
        .log()
        .await
        .into_iter()
        .filter_map(|entry| entry.action_id)
        .collect();
    ids.extend(session.queue().await.into_iter().map(|q| q.action_id));
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_during_turns_restores_to_a_server_serving_every_action_acknowledged_before_it()
 {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let acknowledged: Arc<Mutex<Vec<String>>> = Arc::default();
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let (enough_tx, mut enough_rx) = tokio::sync::watch::channel(0usize);
        // The client: turn after turn, each prompt acknowledged by the server before the
        // client waits for the agent's answer.
        let client = {
            let mut session = Session::attach(h.sessions(), &session.id);
            let acknowledged = acknowledged.clone();
            tokio::spawn(async move {
                let mut watch = session.watch().await;
                let mut n = 0;
                while !*stop_rx.borrow_and_update() {
                    n += 1;
                    let reply = session.prompt(&format!("turn {n}\n@chunks 3")).await;
                    let count = {
                        let mut acked = acknowledged.lock().unwrap();
                        acked.push(reply.action_id.clone());
                        acked.len()
                    };
                    let _ = enough_tx.send(count);
                    watch.response_to(&reply.action_id).await;
                }
                n
            })
        };
        enough_rx.wait_for(|n| *n >= 10).await.unwrap();
        let before: Vec<String> = acknowledged.lock().unwrap().clone();
        let target = tempfile::tempdir().unwrap();
        let file = target.path().join("harness.sqlite3");
        let output = backup(h.data_dir(), &file).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.starts_with("backed up "), "{stdout}");
        // The client keeps going after the backup; the server is unaffected.
        let during = *enough_rx.borrow();
        enough_rx.wait_for(|n| *n >= during + 3).await.unwrap();
        stop_tx.send(true).unwrap();
        let turns = client.await.unwrap();
        eprintln!(
            "{} actions acknowledged before the backup, {turns} in all; {stdout}",
            before.len()
        );

        // Restore: the copy as the store of a fresh data directory.
        let restored = tempfile::tempdir().unwrap();
        std::fs::copy(&file, restored.path().join("agent-harness.sqlite3")).unwrap();
        let check: String = rusqlite::Connection::open(&file)
            .unwrap()
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        let second = Harness::start_with(|c| c.data_dir = restored.path().to_path_buf()).await;
        let mut again = Session::attach(second.sessions(), &session.id);
        let stored = stored_actions(&mut again).await;
        for id in &before {
            assert!(
                stored.contains(id),
                "acknowledged action {id} is in the restored store"
            );
        }
        // The restored server serves the session: its turns go on.
        let mut watch = again.watch().await;
        let reply = again.prompt("after the restore").await;
        watch.response_to(&reply.action_id).await;
        second.shutdown().await;

        // The original server too.
        let mut watch = session.watch().await;
        let reply = session.prompt("still here").await;
        watch.response_to(&reply.action_id).await;
        h.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_backup_target_that_exists_or_cannot_be_written_is_refused_and_the_server_carries_on() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let dir = tempfile::tempdir().unwrap();

        let existing = dir.path().join("taken.sqlite3");
        std::fs::write(&existing, b"keep me").unwrap();
        let output = backup(h.data_dir(), &existing).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("already exists"), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");

        let unwritable = dir.path().join("no-such-dir").join("backup.sqlite3");
        let output = backup(h.data_dir(), &unwritable).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("cannot write the backup target"),
            "{stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(!unwritable.exists());

        let mut watch = session.watch().await;
        let reply = session.prompt("unaffected").await;
        watch.response_to(&reply.action_id).await;
        // The turn ends (the record turns idle after the agent's answer is stored).
        watch.status(pb::SessionStatus::Idle).await;
        h.shutdown().await;
    })
    .await;
}
