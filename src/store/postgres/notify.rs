//! Cross-replica wake-ups (SPEC §15): every commit sends `NOTIFY` on one channel with the payload
//! `session_id:head`, and each replica keeps one `LISTEN` connection that fans the notifications
//! out to its local subscribers of sessions other replicas own. A notification is only a hint —
//! the log table is the buffer — so one lost while the connection was down delays a subscriber
//! until its safety poll, and after every (re)connection everyone is woken once.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use futures::StreamExt;
use tokio::sync::{broadcast, mpsc};
use tokio_postgres::{
    AsyncMessage, NoTls, Socket,
    tls::{MakeTlsConnect, TlsConnect},
};
use tokio_postgres_rustls::MakeRustlsConnect;
use uuid::Uuid;

use crate::store::Wake;

/// The channel of every notification (channels are per database).
pub(crate) const CHANNEL: &str = "agent_harness_log";
/// Wake-ups buffered per listener; one that lags is woken anyway (see [`crate::store::Wake`]).
const BUFFER: usize = 1024;
/// Wait before connecting again after the listening connection failed.
const RECONNECT: Duration = Duration::from_secs(1);

pub(crate) fn payload(session_id: Uuid, head: u64) -> String {
    format!("{session_id}:{head}")
}

fn parse(payload: &str) -> Option<Wake> {
    let (id, head) = payload.split_once(':')?;
    Some(Wake {
        session: Uuid::try_parse(id).ok()?,
        head: head.parse().ok()?,
    })
}

/// Starts the listening task; it ends once the returned sender (held by the store) is dropped.
pub(crate) fn start(
    config: tokio_postgres::Config,
    target: String,
    tls: Option<MakeRustlsConnect>,
) -> Arc<broadcast::Sender<Wake>> {
    let (sender, _) = broadcast::channel(BUFFER);
    let sender = Arc::new(sender);
    let wakes = Arc::downgrade(&sender);
    match tls {
        Some(tls) => tokio::spawn(listen(config, target, wakes, tls)),
        None => tokio::spawn(listen(config, target, wakes, NoTls)),
    };
    sender
}

async fn listen<T>(
    config: tokio_postgres::Config,
    target: String,
    wakes: Weak<broadcast::Sender<Wake>>,
    tls: T,
) where
    T: MakeTlsConnect<Socket> + Clone + Send + 'static,
    T::Stream: Send,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    loop {
        if wakes.strong_count() == 0 {
            return;
        }
        match config.connect(tls.clone()).await {
            Ok((client, mut connection)) => {
                let (found, mut notifications) = mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(AsyncMessage::Notification(n)) => {
                                if found.send(n.payload().to_owned()).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %super::describe(&e), "postgres store: the listening connection failed");
                                return;
                            }
                        }
                    }
                });
                match client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                    Ok(()) => {
                        // Whatever was committed while no connection listened is in the log.
                        if let Some(wakes) = wakes.upgrade() {
                            let _ = wakes.send(Wake::everyone());
                        }
                        while let Some(payload) = notifications.recv().await {
                            let Some(wakes) = wakes.upgrade() else {
                                driver.abort();
                                return;
                            };
                            if let Some(wake) = parse(&payload) {
                                let _ = wakes.send(wake);
                            }
                        }
                    }
                    Err(e) => tracing::warn!(
                        error = %super::describe(&e),
                        target = %target,
                        "postgres store: cannot listen for notifications"
                    ),
                }
                driver.abort();
            }
            Err(e) => tracing::warn!(
                error = %super::describe(&e),
                target = %target,
                "postgres store: cannot open the listening connection"
            ),
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_round_trips_and_garbage_is_ignored() {
        let id = Uuid::now_v7();
        assert_eq!(
            parse(&payload(id, 42)),
            Some(Wake {
                session: id,
                head: 42
            })
        );
        assert_eq!(parse("nonsense"), None);
        assert_eq!(parse("x:1"), None);
    }
}
