//! Two replicas on PostgreSQL running a real agent: the owner is killed (`kill -9`) while the
//! session is idle, and the next prompt, sent to the other replica, continues the conversation.
//!
//! How the claimant reopens depends on whether it can reach the agent's session files:
//! - **shared HOME** (both replicas on one machine, or a shared volume): `session/resume` finds
//!   the session the first replica's agent wrote;
//! - **a HOME per replica** (separate machines, nothing shared): the agent does not know the
//!   session, so the profile's `on_reopen_failure = "fresh"` starts a new one primed with the
//!   transcript, and a `context_rebuilt` event says so.
//!
//! The database: `AGENT_HARNESS_AGENTS_DATABASE_URL` (the agents stage points it at the local
//! PostgreSQL's Unix socket, which the loopback-only network namespace still reaches). Each test
//! works in a schema of its own.

use std::{path::Path, time::Duration};

use agent_harness::pb::v1 as pb;
use agent_harness_testkit::{
    process::{Serve, ServeProcess},
    support::{Session, prompt},
};

use agent_harness_model_fakes::FakeServer;

use crate::{
    kit::{
        Agent, Outcome, PROFILE, ProfileSpec, agent_message, note, profile_toml, serve_with,
        text_of, turn_end,
    },
    scenarios::{reopened_by, reply_to, runtime_pids},
};

/// The database the replicas share (a `postgres://` URL; a Unix socket inside the namespace).
pub const DATABASE_VAR: &str = "AGENT_HARNESS_AGENTS_DATABASE_URL";

/// Leases as short as the replica tests use: the claimant takes over within seconds.
const LEASE_TTL: &str = "3s";

/// Where each replica's agent keeps its session files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Homes {
    Shared,
    PerReplica,
}

/// The owner killed mid-idle; the next prompt through the other replica continues.
pub async fn owner_killed_while_idle(agent: Agent, homes: Homes) -> Outcome {
    let url = std::env::var(DATABASE_VAR).unwrap_or_else(|_| {
        panic!("{DATABASE_VAR} is not set: the agents stage sets it to the local PostgreSQL")
    });
    let schema = format!("ah_agents_{}", uuid::Uuid::now_v7().simple());
    execute(&url, &format!("CREATE SCHEMA {schema}")).await;
    let outcome = run(&agent, homes, &url_in_schema(&url, &schema)).await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
    outcome
}

async fn run(agent: &Agent, homes: Homes, database_url: &str) -> Outcome {
    let dir = tempfile::Builder::new()
        .prefix("agent-harness-agents-replicas-")
        .tempdir()
        .expect("a temporary folder");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).expect("the work folder");
    let fake = FakeServer::start(agent.api)
        .await
        .expect("the fake model server starts");
    let mut a = replica(agent, &fake, dir.path(), "a", homes, database_url);
    let b = replica(agent, &fake, dir.path(), "b", homes, database_url);

    let mut session = Session::create_with_client(
        a.client().await,
        pb::CreateSessionRequest {
            profile: PROFILE.into(),
            cwd: work.to_string_lossy().into_owned(),
            ..Default::default()
        },
    )
    .await;
    let mut watch = session.watch().await;
    let first = session.prompt("before-the-owner-died").await;
    assert_eq!(turn_end(&mut watch, &first.action_id).await, "end_turn");
    drop(watch);
    let runtimes = runtime_pids(&a);
    note(&format!(
        "killing the owner (replica a); its runtime: {runtimes:?}"
    ));
    a.kill_9();
    agent_harness_testkit::support::exited(&runtimes).await;
    if homes == Homes::PerReplica {
        // A session keeps the HOME path it was created with; on another machine that path
        // holds nothing of the first one's. Both replicas share this machine, so the first
        // one's HOMEs go with it, as they would with its disk.
        std::fs::rename(dir.path().join("homes-a"), dir.path().join("homes-a-gone"))
            .expect("replica a's HOMEs move away");
    }

    let mut session = Session::attach(b.client().await, &session.id);
    let mark = fake.recorder().len();
    let action_id = prompt_until_taken(&mut session, "after-the-owner-died").await;
    let mut watch = session.watch().await;
    let reason = turn_end(&mut watch, &action_id).await;
    let reply = text_of(&agent_message(&mut session, &action_id).await);
    assert_eq!(reason, "end_turn", "{reply:?}");
    assert!(
        reply.contains(&reply_to("after-the-owner-died")),
        "{reply:?}"
    );
    let request = fake
        .recorder()
        .wait_after(mark, |r| {
            r.is_turn_step() && r.carries("after-the-owner-died")
        })
        .await;
    assert!(
        request.carries("before-the-owner-died"),
        "the claimant's model request carries the earlier conversation: {:?}",
        request.user_texts
    );
    let rebuilt = session.log().await.iter().any(|entry| {
        entry.direction == pb::LogDirection::Event as i32
            && entry.json.contains("\"context_rebuilt\"")
    });
    let how = match (homes, reopened_by(&mut session).await, rebuilt) {
        (Homes::Shared, Some(method), false) => {
            format!("shared HOME: reopened by {method} (the agent's session files were reachable)")
        }
        (Homes::PerReplica, _, true) => "a HOME per replica: session/resume failed (the \
             agent's session files were on the dead replica), so on_reopen_failure = fresh \
             started a new session primed with the transcript (context_rebuilt)"
            .to_owned(),
        (homes, method, rebuilt) => {
            return Outcome::Deviates(format!(
                "{homes:?}: reopened by {method:?}, context_rebuilt logged: {rebuilt}"
            ));
        }
    };
    note(&how);
    drop(b);
    Outcome::Pass(how)
}

/// A replica of the agent's profile; `homes` says whether its agent shares the HOME.
fn replica(
    agent: &Agent,
    fake: &FakeServer,
    dir: &Path,
    name: &str,
    homes: Homes,
    database_url: &str,
) -> ServeProcess {
    // Shared: both replicas keep their agents' HOMEs in one folder (a volume every replica
    // mounts); per replica: each its own.
    let homes_dir = match homes {
        Homes::Shared => dir.join("homes"),
        Homes::PerReplica => dir.join(format!("homes-{name}")),
    };
    let boxing = crate::kit::Boxing {
        homes_dir,
        seed: dir.join(format!("seed-{name}")),
        fake: fake.addr(),
    };
    std::fs::create_dir_all(&boxing.seed).expect("the seed of the agent's HOME");
    let mut spec: ProfileSpec = (agent.profile)(fake, &boxing.seed);
    spec.keys.push_str("on_reopen_failure = \"fresh\"\n");
    let config = dir.join(format!("config-{name}.toml"));
    std::fs::write(&config, profile_toml(agent, &spec, &boxing)).expect("the config is written");
    serve_with(Serve::on(dir.join(format!("data-{name}")), &config), &spec)
        .replica(database_url, LEASE_TTL)
        .start()
}

/// Sends a prompt through a replica that may first have to wait out the dead owner's lease
/// (it answers UNAVAILABLE until then); the same action id each time, so it is taken once.
async fn prompt_until_taken(session: &mut Session, text: &str) -> String {
    let action_id = uuid::Uuid::now_v7().to_string();
    loop {
        let mut request = session.control_request(prompt(text));
        request.action_id = Some(action_id.clone());
        match session.control(request).await {
            Ok(taken) => return taken.action_id,
            Err(status) if status.code() == tonic::Code::Unavailable => {
                note(&format!("not yet: {}", status.message()));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(status) => panic!("the prompt was refused: {status:?}"),
        }
    }
}

async fn execute(url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("the agents' database ({DATABASE_VAR}) is unreachable: {e}"));
    tokio::spawn(connection);
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The URL with the tables placed in `schema`.
fn url_in_schema(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20search_path%3D{schema}")
}
