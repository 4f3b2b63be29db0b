//! `--services`: a process serves only the services it is asked to.

use agent_harness::{
    config::ServiceSet,
    pb::v1::{ChannelMessage, GetSessionRequest, TranslateChannelMessageRequest},
};
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

use crate::{
    harness::{
        GATEWAY_SERVICE, HEALTH_SERVICE, Harness, SESSIONS_SERVICE, TRANSLATOR_SERVICE, bounded,
        expect_err,
    },
    reflection::{list_services_v1, list_services_v1alpha},
};

async fn translator_only() -> Harness {
    Harness::start_with(|config| {
        config.services = ServiceSet {
            sessions: false,
            translator: true,
            gateway: false,
        };
    })
    .await
}

#[tokio::test]
async fn a_translator_only_server_translates_but_does_not_route_session_calls() {
    bounded(async {
        let h = translator_only().await;
        h.translator()
            .translate_channel_message(TranslateChannelMessageRequest {
                message: Some(ChannelMessage {
                    content: "hello".into(),
                    ..Default::default()
                }),
            })
            .await
            .expect("the translator is served");

        let status = expect_err(
            h.sessions()
                .get_session(GetSessionRequest {
                    session_id: "0190f5a0-0000-7000-8000-000000000000".into(),
                })
                .await,
        );
        assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
        h.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn a_translator_only_server_reports_the_session_service_unknown_to_health() {
    bounded(async {
        let h = translator_only().await;
        let check = |service: &str| {
            let mut health = h.health();
            let request = HealthCheckRequest {
                service: service.into(),
            };
            async move { health.check(request).await }
        };
        for service in ["", TRANSLATOR_SERVICE] {
            let reply = check(service).await.expect("served").into_inner();
            assert_eq!(reply.status(), ServingStatus::Serving, "{service:?}");
        }
        for service in [SESSIONS_SERVICE, GATEWAY_SERVICE] {
            let status = expect_err(check(service).await);
            assert_eq!(status.code(), Code::NotFound, "{service}: {status:?}");
        }
    })
    .await
}

#[tokio::test]
async fn a_translator_only_server_lists_only_the_translator_and_health_over_reflection() {
    bounded(async {
        let h = translator_only().await;
        for listed in [
            list_services_v1(h.channel()).await,
            list_services_v1alpha(h.channel()).await,
        ] {
            assert!(listed.contains(TRANSLATOR_SERVICE), "{listed:?}");
            assert!(listed.contains(HEALTH_SERVICE), "{listed:?}");
            assert!(!listed.contains(SESSIONS_SERVICE), "{listed:?}");
            assert!(!listed.contains(GATEWAY_SERVICE), "{listed:?}");
        }
    })
    .await
}
