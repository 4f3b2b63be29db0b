//! Server reflection v1 and v1alpha: what grpcurl, `buf curl` and Python's
//! reflection client rely on.

use std::collections::BTreeSet;

use prost::Message;
use prost_types::FileDescriptorProto;
use tonic::transport::Channel;
use tonic_reflection::pb::{
    v1::{self, server_reflection_client::ServerReflectionClient as ReflectionV1Client},
    v1alpha::{self, server_reflection_client::ServerReflectionClient as ReflectionV1AlphaClient},
};

use crate::harness::{
    GATEWAY_SERVICE, HEALTH_SERVICE, Harness, SESSIONS_SERVICE, TRANSLATOR_SERVICE, bounded,
};

pub const ALL_SERVICES: [&str; 4] = [
    SESSIONS_SERVICE,
    TRANSLATOR_SERVICE,
    GATEWAY_SERVICE,
    HEALTH_SERVICE,
];

/// One request/response exchange over reflection v1.
async fn ask_v1(
    channel: Channel,
    request: v1::server_reflection_request::MessageRequest,
) -> v1::server_reflection_response::MessageResponse {
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut replies = ReflectionV1Client::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("a reflection v1 stream")
        .into_inner();
    replies
        .message()
        .await
        .expect("a reflection v1 reply")
        .expect("one reply")
        .message_response
        .expect("a reply body")
}

/// Service names listed over reflection v1 (of a harness: `h.channel()`).
pub async fn list_services_v1(channel: Channel) -> BTreeSet<String> {
    match ask_v1(
        channel,
        v1::server_reflection_request::MessageRequest::ListServices(String::new()),
    )
    .await
    {
        v1::server_reflection_response::MessageResponse::ListServicesResponse(list) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection v1 reply {other:?}"),
    }
}

/// Service names listed over reflection v1alpha.
pub async fn list_services_v1alpha(channel: Channel) -> BTreeSet<String> {
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut replies = ReflectionV1AlphaClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("a reflection v1alpha stream")
        .into_inner();
    let reply = replies
        .message()
        .await
        .expect("a reflection v1alpha reply")
        .expect("one reply");
    match reply.message_response.expect("a reply body") {
        v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection v1alpha reply {other:?}"),
    }
}

#[tokio::test]
async fn reflection_v1_lists_the_three_harness_services_and_health() {
    bounded(async {
        let h = Harness::start().await;
        let listed = list_services_v1(h.channel()).await;
        for service in ALL_SERVICES {
            assert!(
                listed.contains(service),
                "{service} missing from {listed:?}"
            );
        }
        h.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn reflection_v1alpha_lists_the_three_harness_services_and_health() {
    bounded(async {
        let h = Harness::start().await;
        let listed = list_services_v1alpha(h.channel()).await;
        for service in ALL_SERVICES {
            assert!(
                listed.contains(service),
                "{service} missing from {listed:?}"
            );
        }
    })
    .await
}

#[tokio::test]
async fn reflection_serves_a_commented_descriptor_for_every_listed_service() {
    bounded(async {
        let h = Harness::start().await;
        for service in ALL_SERVICES {
            let reply = ask_v1(
                h.channel(),
                v1::server_reflection_request::MessageRequest::FileContainingSymbol(service.into()),
            )
            .await;
            let v1::server_reflection_response::MessageResponse::FileDescriptorResponse(files) =
                reply
            else {
                panic!("no descriptor for {service}: {reply:?}");
            };
            let (package, name) = service.rsplit_once('.').expect("a qualified name");
            let file = files
                .file_descriptor_proto
                .iter()
                .map(|bytes| FileDescriptorProto::decode(bytes.as_slice()).expect("a descriptor"))
                .find(|file| {
                    file.package() == package && file.service.iter().any(|s| s.name() == name)
                })
                .unwrap_or_else(|| panic!("{service} is not in the files reflection returned"));
            if package == "agent_harness.v1" {
                // grpcurl users read the comments: source info must survive into reflection.
                let comments = file
                    .source_code_info
                    .as_ref()
                    .map(|info| {
                        info.location
                            .iter()
                            .filter(|l| l.leading_comments.is_some())
                            .count()
                    })
                    .unwrap_or(0);
                assert!(comments > 0, "{service}'s file carries no comments");
            }
        }
    })
    .await
}
