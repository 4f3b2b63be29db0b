//! `grpc.health.v1.Health`: liveness on `""`, readiness per served service.

use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

use crate::harness::{GATEWAY_SERVICE, Harness, SESSIONS_SERVICE, TRANSLATOR_SERVICE, bounded};

#[tokio::test]
async fn health_reports_serving_for_the_process_and_for_each_served_service() {
    bounded(async {
        let h = Harness::start().await;
        for service in ["", SESSIONS_SERVICE, TRANSLATOR_SERVICE, GATEWAY_SERVICE] {
            let reply = h
                .health()
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap_or_else(|status| panic!("health of {service:?}: {status:?}"))
                .into_inner();
            assert_eq!(reply.status(), ServingStatus::Serving, "{service:?}");
        }
        h.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn health_watch_streams_serving_for_a_served_service() {
    bounded(async {
        let h = Harness::start().await;
        let mut updates = h
            .health()
            .watch(HealthCheckRequest {
                service: TRANSLATOR_SERVICE.into(),
            })
            .await
            .expect("a watch stream")
            .into_inner();
        let first = updates
            .message()
            .await
            .expect("a first update")
            .expect("the stream stays open");
        assert_eq!(first.status(), ServingStatus::Serving);
    })
    .await
}
