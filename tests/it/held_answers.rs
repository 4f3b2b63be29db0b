//! A held permission request survives an answer that could not be stored: nothing was
//! sent, so the request stays held whole — options included — and a retry is taken.
//!
//! The storage failure is injected on PostgreSQL (a trigger refusing new actions), so this test
//! needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests.

use agent_harness::pb::v1 as pb;
use tempfile::TempDir;

use crate::{
    harness::{Harness, bounded},
    postgres::{execute, test_schema, url_in_schema},
    support::{Session, answer_request, create_request},
};

#[tokio::test]
async fn a_permission_answer_that_could_not_be_stored_leaves_the_request_held_with_its_options() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    bounded(async {
        let cwd = TempDir::new().unwrap();
        let h = Harness::start_with(|c| c.database_url = Some(database_url.clone().into())).await;
        let mut request = create_request(&h, "mock");
        request.cwd = cwd.path().to_string_lossy().into_owned();
        let mut session = Session::create_with(&h, request).await;
        let mut watch = session.watch().await;
        session.prompt("@permission").await;
        let asked = watch.agent_request("session/request_permission").await;
        watch.status(pb::SessionStatus::AwaitingInput).await;

        execute(
            &url,
            &format!(
                "CREATE FUNCTION {schema}.refuse() RETURNS trigger AS $$ \
                 BEGIN RAISE EXCEPTION 'injected storage failure'; END $$ LANGUAGE plpgsql; \
                 CREATE TRIGGER refuse BEFORE INSERT ON {schema}.actions \
                 FOR EACH ROW EXECUTE FUNCTION {schema}.refuse();"
            ),
        )
        .await;
        session
            .act(answer_request(&asked, Some("allow-once")))
            .await
            .expect_err("the answer could not be stored");
        execute(&url, &format!("DROP TRIGGER refuse ON {schema}.actions")).await;

        session
            .act(answer_request(&asked, Some("allow-once")))
            .await
            .expect("the retry is taken: the request is still held with its options");
        watch.chunk("permission: selected allow-once").await;
        h.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}
