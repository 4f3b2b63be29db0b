//! GetTranscript pages by bytes as well as turns: however large the agent's output,
//! every page fits the default 4 MiB gRPC message limit, and a turn too large for any page reads
//! with its large parts elided, pointing at the log offsets that hold them.

use agent_harness::pb::v1 as pb;

use crate::{
    harness::{Harness, bounded},
    support::Session,
};

/// Every page of the transcript, read with a client on the default message limits.
async fn read_all(session: &mut Session) -> (Vec<pb::TranscriptMessage>, usize) {
    let mut messages = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = session
            .client
            .get_transcript(pb::GetTranscriptRequest {
                session_id: session.id.clone(),
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("every page fits the message limit")
            .into_inner();
        pages += 1;
        messages.extend(page.messages);
        if page.next_page_token.is_empty() {
            return (messages, pages);
        }
        token = page.next_page_token;
    }
}

fn agent_text(message: &pb::TranscriptMessage) -> usize {
    message
        .parts
        .iter()
        .filter_map(|p| match &p.kind {
            Some(pb::message_part::Kind::Text(t)) => Some(t.text.len()),
            _ => None,
        })
        .sum()
}

#[tokio::test]
async fn a_transcript_of_6_mib_of_agent_output_reads_completely_through_pages_under_the_limit() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        for _ in 0..3 {
            let reply = session.prompt("@long 2000000").await;
            watch.response_to(&reply.action_id).await;
        }
        let (messages, pages) = read_all(&mut session).await;
        assert!(pages >= 2, "6 MiB cannot fit one page");
        let turns: Vec<u32> = messages
            .iter()
            .filter(|m| m.role == pb::MessageRole::Agent as i32)
            .map(|m| m.turn)
            .collect();
        assert_eq!(turns, [1, 2, 3], "every turn, once, in order");
        let total: usize = messages.iter().map(agent_text).sum();
        assert!(total >= 6_000_000, "all of the output is there: {total}");
    })
    .await
}

#[tokio::test]
async fn a_turn_larger_than_any_page_reads_with_its_large_parts_elided_and_their_log_offsets() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        // The log entry itself is larger than 4 MiB: this watcher reads with a larger limit.
        let mut watcher = Session::attach(
            pb::agent_session_service_client::AgentSessionServiceClient::new(h.channel())
                .max_decoding_message_size(64 << 20),
            &session.id,
        );
        let mut watch = watcher.watch().await;
        let reply = session.prompt("@long 5000000").await;
        watch.response_to(&reply.action_id).await;
        let (messages, _) = read_all(&mut session).await;
        let agent = messages
            .iter()
            .find(|m| m.role == pb::MessageRole::Agent as i32)
            .expect("the agent's message");
        let Some(pb::message_part::Kind::Text(pb::TextPart { text })) = &agent.parts[0].kind else {
            panic!("{:?}", agent.parts[0]);
        };
        assert!(
            text.starts_with("[agent-harness: ") && text.contains("bytes elided"),
            "{text}"
        );
        assert!(text.contains("ReadLog from offset"), "{text}");
    })
    .await
}
