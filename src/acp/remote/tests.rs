//! The gateway and its runtimes together, driven as the transport drives them: bridges
//! served in the background, runtimes spawned on them, lines both ways.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};

use super::*;
use crate::domain::ErrorCode;

fn hello(id: &str, labels: &[(&str, &str)]) -> Hello {
    Hello {
        bridge_id: id.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        profiles: vec!["mock".into()],
        ..Default::default()
    }
}

fn spec<'a>(labels: &'a BTreeMap<String, String>) -> RemoteSpec<'a> {
    RemoteSpec {
        labels,
        principals: None,
        bridge_profile: "mock",
        cwd: "/",
        session_id: "s",
        owner: "local",
        startup_timeout: Duration::from_secs(5),
        reconnect_grace: Duration::from_secs(5),
    }
}

/// A bridge served in the background: what the harness sends it, and a sender of its messages.
fn connect(
    gateway: &Arc<Gateway>,
    hello: Hello,
) -> (
    mpsc::Receiver<ToBridge>,
    mpsc::Sender<Result<FromBridge, Refused>>,
) {
    let (out_tx, out_rx) = mpsc::channel(OUTBOUND_MESSAGES);
    let (in_tx, in_rx) = mpsc::channel(16);
    let gateway = gateway.clone();
    tokio::spawn(async move {
        let inbound = tokio_stream::wrappers::ReceiverStream::new(in_rx);
        let _ = gateway
            .serve_bridge(hello, "local", inbound, out_tx, None)
            .await;
    });
    (out_rx, in_tx)
}

#[tokio::test]
async fn a_stream_relayed_by_another_replica_is_neither_placed_on_nor_published() {
    let gateway = Gateway::new();
    let (out_tx, _out_rx) = mpsc::channel(OUTBOUND_MESSAGES);
    let (_in_tx, in_rx) = mpsc::channel::<Result<FromBridge, Refused>>(16);
    let connected = gateway.connected();
    tokio::spawn({
        let gateway = gateway.clone();
        async move {
            let inbound = tokio_stream::wrappers::ReceiverStream::new(in_rx);
            let relayed_by = Some("10.0.0.3:50051".to_owned());
            let _ = gateway
                .serve_bridge(hello("b1", &[]), "local", inbound, out_tx, relayed_by)
                .await;
        }
    });
    connected.await;
    assert_eq!(gateway.relayed_by("b1").as_deref(), Some("10.0.0.3:50051"));
    assert!(gateway.summaries().iter().all(|s| !s.connected));
    assert!(!gateway.has_match(&BTreeMap::new(), None));
    let any = BTreeMap::new();
    let mut short = spec(&any);
    short.startup_timeout = Duration::from_millis(100);
    assert!(gateway.spawn(short).await.is_err());
}

/// A bridge of `principal` served in the background.
fn connect_as(
    gateway: &Arc<Gateway>,
    hello: Hello,
    principal: &str,
) -> (
    mpsc::Receiver<ToBridge>,
    mpsc::Sender<Result<FromBridge, Refused>>,
) {
    let (out_tx, out_rx) = mpsc::channel(OUTBOUND_MESSAGES);
    let (in_tx, in_rx) = mpsc::channel(16);
    let admitted = gateway
        .admit(&hello, principal, out_tx, None)
        .expect("admitted");
    let gateway = gateway.clone();
    tokio::spawn(async move {
        let inbound = tokio_stream::wrappers::ReceiverStream::new(in_rx);
        let _ = gateway.serve(admitted, inbound).await;
    });
    (out_rx, in_tx)
}

#[tokio::test]
async fn a_hello_naming_a_bridge_id_another_principal_holds_is_refused_and_changes_nothing() {
    let gateway = Gateway::new();
    let (mut out, inbound) = connect_as(&gateway, hello("b1", &[]), "victim");
    let spawning = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.spawn(spec(&BTreeMap::new())).await }
    });
    let ToBridge::Spawn { key, .. } = next(&mut out).await else {
        panic!("spawn first")
    };
    inbound
        .send(Ok(FromBridge::Spawned { key: key.clone() }))
        .await
        .unwrap();
    let mut runtime = spawning.await.unwrap().expect("spawned");
    let mut impostor = hello("b1", &[]);
    impostor.running = vec![StillRunning {
        key: key.clone(),
        last_stdin_seq: 0,
        last_stdout_seq: 0,
    }];
    let (impostor_out, mut impostor_rx) = mpsc::channel(OUTBOUND_MESSAGES);
    let refused = gateway
        .admit(&impostor, "mallory", impostor_out.clone(), None)
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Forbidden);
    assert_eq!(gateway.holder("b1").as_deref(), Some("victim"));
    assert_eq!(gateway.summaries()[0].principal, "victim");
    assert!(gateway.check_owner("b1", "mallory").is_err());
    gateway.check_owner("b1", "victim").unwrap();
    // Within the reconnect grace the id stays the victim's.
    drop(inbound);
    runtime.stdin.write_all(b"{\"a\":1}\n").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while gateway.connected_bridges() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the stream ended");
    let refused = gateway
        .admit(&impostor, "mallory", impostor_out, None)
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Forbidden);
    let summaries = gateway.summaries();
    assert_eq!(summaries.len(), 1, "still published, as the victim's");
    assert!(!summaries[0].connected && summaries[0].principal == "victim");
    assert!(
        impostor_rx.try_recv().is_err(),
        "nothing reached the impostor"
    );
    // The victim's bridge redials and gets the line the impostor never saw.
    let mut again = hello("b1", &[]);
    again.running = vec![StillRunning {
        key: key.clone(),
        last_stdin_seq: 0,
        last_stdout_seq: 0,
    }];
    let (mut out, _inbound) = connect_as(&gateway, again, "victim");
    assert_eq!(
        next(&mut out).await,
        ToBridge::Ack {
            key: key.clone(),
            seq: 0
        }
    );
    assert_eq!(
        next(&mut out).await,
        ToBridge::Stdin {
            key,
            seq: 1,
            line: b"{\"a\":1}".to_vec()
        }
    );
    drop(runtime);
}

#[tokio::test]
async fn without_tokens_every_bridge_is_local_and_a_redial_takes_its_id_over_as_before() {
    let gateway = Gateway::new();
    let (_out, _inbound) = connect_as(&gateway, hello("b1", &[]), "local");
    let (out_tx, _out_rx) = mpsc::channel(OUTBOUND_MESSAGES);
    gateway
        .admit(&hello("b1", &[]), "local", out_tx, None)
        .expect("the same principal takes its id over");
}

#[tokio::test]
async fn a_bridges_series_leave_the_exposition_when_the_bridge_leaves() {
    let gateway = Gateway::new();
    let (mut out, inbound) = connect_as(&gateway, hello("b\"1", &[]), "local");
    assert!(
        gateway
            .exposition()
            .contains("agent_harness_bridge_runtimes{bridge=\"b\\\"1\"} 0"),
        "{}",
        gateway.exposition()
    );
    let spawning = tokio::spawn({
        let gateway = gateway.clone();
        async move {
            let labels = BTreeMap::new();
            let mut short = spec(&labels);
            short.reconnect_grace = Duration::from_millis(100);
            gateway.spawn(short).await
        }
    });
    let ToBridge::Spawn { key, .. } = next(&mut out).await else {
        panic!("spawn first")
    };
    inbound.send(Ok(FromBridge::Spawned { key })).await.unwrap();
    let runtime = spawning.await.unwrap().expect("spawned");
    assert!(
        gateway.exposition().contains("} 1"),
        "{}",
        gateway.exposition()
    );
    // The stream breaks; the runtime outlives it for the grace, then the bridge is gone.
    drop(inbound);
    let _ = tokio::time::timeout(Duration::from_secs(5), runtime.exited)
        .await
        .expect("faulted after the grace");
    tokio::time::timeout(Duration::from_secs(5), async {
        while !gateway.exposition().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the series went with the bridge");
    assert_eq!(gateway.holder("b\"1"), None, "the id is free again");
}

#[tokio::test]
async fn a_spawn_failure_of_megabytes_is_capped_and_marked_as_cut() {
    let gateway = Gateway::new();
    let (mut out, inbound) = connect(&gateway, hello("b1", &[]));
    let spawning = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.spawn(spec(&BTreeMap::new())).await.err() }
    });
    let ToBridge::Spawn { key, .. } = next(&mut out).await else {
        panic!("spawn first")
    };
    inbound
        .send(Ok(FromBridge::SpawnFailed {
            key,
            error: "e".repeat(4 << 20),
            stderr_tail: "s".repeat(4 << 20),
        }))
        .await
        .unwrap();
    let why = spawning.await.unwrap().expect("failed");
    assert!(
        why.len() <= crate::domain::text::MAX_FOREIGN_TEXT_BYTES,
        "{}",
        why.len()
    );
    assert!(why.ends_with(crate::domain::text::CUT_MARK));
}

#[tokio::test]
async fn placement_hands_a_runtime_only_to_a_bridge_of_an_allowed_principal() {
    let gateway = Gateway::new();
    let (_out, _inbound) = connect_as(&gateway, hello("a-theirs", &[]), "mallory");
    let any = BTreeMap::new();
    let allowed = vec!["sandbox-7".to_owned()];
    assert!(!gateway.has_match(&any, Some(&allowed)));
    assert!(gateway.has_match(&any, None));
    let (mut out, _inbound) = connect_as(&gateway, hello("ours", &[]), "sandbox-7");
    assert!(gateway.has_match(&any, Some(&allowed)));
    let spawning = tokio::spawn({
        let gateway = gateway.clone();
        let allowed = allowed.clone();
        async move {
            let any = BTreeMap::new();
            let mut wanted = spec(&any);
            wanted.principals = Some(&allowed);
            gateway.spawn(wanted).await.err()
        }
    });
    assert!(matches!(next(&mut out).await, ToBridge::Spawn { .. }));
    spawning.abort();
}

async fn next(rx: &mut mpsc::Receiver<ToBridge>) -> ToBridge {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("in time")
        .expect("open")
}

#[tokio::test]
async fn placement_waits_for_a_matching_bridge_and_names_the_labels_when_none_comes() {
    let gateway = Gateway::new();
    let labels: BTreeMap<String, String> = [("pool".into(), "gpu".into())].into();
    let _other = connect(&gateway, hello("b1", &[("pool", "cpu")]));
    let mut short = spec(&labels);
    short.startup_timeout = Duration::from_millis(200);
    let error = gateway.spawn(short).await.err().expect("no bridge matched");
    assert!(error.contains("pool=gpu"), "{error}");
}

#[tokio::test]
async fn lines_travel_numbered_both_ways_and_duplicates_are_dropped() {
    let gateway = Gateway::new();
    let (mut out, inbound) = connect(&gateway, hello("b1", &[]));
    let spawning = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.spawn(spec(&BTreeMap::new())).await }
    });
    let ToBridge::Spawn { key, .. } = next(&mut out).await else {
        panic!("spawn first")
    };
    inbound
        .send(Ok(FromBridge::Spawned { key: key.clone() }))
        .await
        .unwrap();
    let mut runtime = spawning.await.unwrap().expect("spawned");
    runtime.stdin.write_all(b"{\"a\":1}\n").await.unwrap();
    assert_eq!(
        next(&mut out).await,
        ToBridge::Stdin {
            key: key.clone(),
            seq: 1,
            line: b"{\"a\":1}".to_vec()
        }
    );
    for seq in [1, 1, 2] {
        let line = format!("{{\"n\":{seq}}}").into_bytes();
        inbound
            .send(Ok(FromBridge::Stdout {
                key: key.clone(),
                seq,
                line,
            }))
            .await
            .unwrap();
    }
    let mut buf = vec![0u8; 16];
    let mut got = Vec::new();
    while got.len() < 16 {
        let n = runtime.stdout.read(&mut buf).await.unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"{\"n\":1}\n{\"n\":2}\n");
}

#[tokio::test]
async fn a_gap_in_the_bridges_numbers_ends_the_runtime_as_lost() {
    let gateway = Gateway::new();
    let (mut out, inbound) = connect(&gateway, hello("b1", &[]));
    let spawning = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.spawn(spec(&BTreeMap::new())).await }
    });
    let ToBridge::Spawn { key, .. } = next(&mut out).await else {
        panic!()
    };
    inbound
        .send(Ok(FromBridge::Spawned { key: key.clone() }))
        .await
        .unwrap();
    let runtime = spawning.await.unwrap().unwrap();
    inbound
        .send(Ok(FromBridge::Stdout {
            key: key.clone(),
            seq: 3,
            line: b"{}".to_vec(),
        }))
        .await
        .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(5), runtime.exited)
        .await
        .unwrap()
        .unwrap();
    assert!(exit.unwrap_err().to_string().contains("lost"));
    assert_eq!(next(&mut out).await, ToBridge::Kill { key, grace: None });
}

#[tokio::test]
async fn after_a_broken_stream_the_redialled_bridge_gets_what_it_had_not_received_again() {
    let gateway = Gateway::new();
    let (mut out, inbound) = connect(&gateway, hello("b1", &[]));
    let spawning = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.spawn(spec(&BTreeMap::new())).await }
    });
    let ToBridge::Spawn { key, .. } = next(&mut out).await else {
        panic!()
    };
    inbound
        .send(Ok(FromBridge::Spawned { key: key.clone() }))
        .await
        .unwrap();
    let mut runtime = spawning.await.unwrap().unwrap();
    runtime
        .stdin
        .write_all(b"{\"one\":1}\n{\"two\":2}\n")
        .await
        .unwrap();
    for seq in [1, 2] {
        assert!(matches!(next(&mut out).await, ToBridge::Stdin { seq: s, .. } if s == seq));
    }
    // The bridge took line 1 only, then the stream broke.
    drop(inbound);
    drop(out);
    let mut again = hello("b1", &[]);
    again.running = vec![StillRunning {
        key: key.clone(),
        last_stdin_seq: 1,
        last_stdout_seq: 0,
    }];
    let (mut out, _inbound) = connect(&gateway, again);
    assert_eq!(
        next(&mut out).await,
        ToBridge::Ack {
            key: key.clone(),
            seq: 0
        }
    );
    assert_eq!(
        next(&mut out).await,
        ToBridge::Stdin {
            key,
            seq: 2,
            line: b"{\"two\":2}".to_vec()
        }
    );
}

#[tokio::test]
async fn a_graceful_stop_asks_the_bridge_with_its_grace_and_ends_once_the_bridge_reports_the_exit()
{
    let gateway = Gateway::new();
    let (mut out, inbound) = connect(&gateway, hello("b1", &[]));
    let spawning = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.spawn(spec(&BTreeMap::new())).await }
    });
    let ToBridge::Spawn { key, .. } = next(&mut out).await else {
        panic!()
    };
    inbound
        .send(Ok(FromBridge::Spawned { key: key.clone() }))
        .await
        .unwrap();
    let mut runtime = spawning.await.unwrap().unwrap();
    runtime.killer.stop(Duration::from_secs(3));
    let grace = Some(Duration::from_secs(3));
    assert_eq!(
        next(&mut out).await,
        ToBridge::Kill {
            key: key.clone(),
            grace
        }
    );
    // What the agent writes on its way out is taken (acknowledged), not faulted.
    inbound
        .send(Ok(FromBridge::Stdout {
            key: key.clone(),
            seq: 1,
            line: b"{}".to_vec(),
        }))
        .await
        .unwrap();
    assert_eq!(
        next(&mut out).await,
        ToBridge::Ack {
            key: key.clone(),
            seq: 1
        }
    );
    inbound
        .send(Ok(FromBridge::Exited {
            key,
            code: Some(0),
            signal: None,
            stderr_tail: String::new(),
        }))
        .await
        .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(5), runtime.exited)
        .await
        .unwrap()
        .unwrap();
    assert!(exit.unwrap().success());
}
