//! Cross-replica wake-ups. Each replica keeps one `LISTEN` connection that fans the
//! notifications out to its local subscribers of sessions other replicas own, and one sending
//! task ([`Notifier`]) that reports its own commits. A notification is only a hint — the log table
//! is the buffer — so one lost while a connection was down delays a subscriber until its safety
//! poll, and after every (re)connection of the listener everyone is woken once.
//!
//! Why the sending is not part of the data transaction: `NOTIFY` takes a database-wide lock at
//! commit and holds it through the commit's WAL flush, so every notifying commit of every replica
//! queued behind one flush at a time and group commit could not help (turns/s on PostgreSQL were
//! about a tenth of SQLite's). The notifier instead sends after the commit returned, in a
//! transaction of its own that writes nothing and so need not wait for a flush, and it coalesces:
//! what commits while one notification is on its way goes into the next, one payload
//! `id:head,id:head,…` naming many sessions.

use std::{
    collections::HashMap,
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
/// The longest payload sent: the server refuses 8000 bytes or more.
const PAYLOAD_LIMIT: usize = 7_900;

/// The payload naming one session; [`Notifier`] joins several with commas.
pub(crate) fn payload(session_id: Uuid, head: u64) -> String {
    format!("{session_id}:{head}")
}

/// The wake-ups of one payload. A malformed item is skipped: the safety poll covers it.
fn parse(payload: &str) -> impl Iterator<Item = Wake> + '_ {
    payload.split(',').filter_map(|item| {
        let (id, head) = item.split_once(':')?;
        Some(Wake {
            session: Uuid::try_parse(id).ok()?,
            head: head.parse().ok()?,
        })
    })
}

/// Payloads naming every pending session once, each under [`PAYLOAD_LIMIT`].
fn payloads(pending: impl IntoIterator<Item = (Uuid, u64)>) -> Vec<String> {
    let mut all = Vec::new();
    let mut current = String::new();
    for (session, head) in pending {
        let item = payload(session, head);
        if !current.is_empty() && current.len() + 1 + item.len() > PAYLOAD_LIMIT {
            all.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push(',');
        }
        current.push_str(&item);
    }
    if !current.is_empty() {
        all.push(current);
    }
    all
}

/// Reports this store's commits to the other replicas; see the module documentation.
pub(crate) struct Notifier {
    committed: mpsc::UnboundedSender<(Uuid, u64)>,
}

impl Notifier {
    /// Starts the sending task; it ends once the notifier is dropped. A notification not sent
    /// within `within` is given up, and its connection closed.
    pub(crate) fn start(pool: deadpool_postgres::Pool, within: std::time::Duration) -> Self {
        let (committed, pending) = mpsc::unbounded_channel();
        tokio::spawn(send_coalesced(pool, within, pending));
        Self { committed }
    }

    /// Called once `session`'s commit is durable; `head` is its log's head (0: something other
    /// than the log changed).
    pub(crate) fn committed(&self, session: Uuid, head: u64) {
        let _ = self.committed.send((session, head));
    }
}

async fn send_coalesced(
    pool: deadpool_postgres::Pool,
    within: std::time::Duration,
    mut committed: mpsc::UnboundedReceiver<(Uuid, u64)>,
) {
    let mut pending: HashMap<Uuid, u64> = HashMap::new();
    // No timer: an idle replica sends at once, and a busy one gathers whatever committed while
    // the previous notification was on its way.
    while let Some((session, head)) = committed.recv().await {
        pending.insert(session, head);
        while let Ok((session, head)) = committed.try_recv() {
            let known = pending.entry(session).or_default();
            *known = (*known).max(head);
        }
        let sql = notify_sql(&payloads(pending.drain()));
        let sent = match super::pooled(&pool, within).await {
            Ok(client) => match tokio::time::timeout(within, client.batch_execute(&sql)).await {
                Ok(sent) => sent.map_err(|e| super::describe(&e)),
                Err(_) => {
                    // No answer: the connection is gone (its transaction ends on the server).
                    drop(deadpool_postgres::Object::take(client));
                    Err(format!("no answer within {within:?}"))
                }
            },
            Err(e) => Err(e.to_string()),
        };
        if let Err(error) = sent {
            // The subscribers of other replicas find these commits at their safety poll.
            tracing::debug!(%error, "postgres store: a wake-up notification was not sent");
        }
    }
}

/// One round trip: a transaction of its own that only notifies. It writes nothing worth a WAL
/// flush, so it does not wait for one (the data it announces is already durable).
fn notify_sql(payloads: &[String]) -> String {
    let mut sql = String::from("BEGIN; SET LOCAL synchronous_commit = off;");
    for payload in payloads {
        // Payloads hold only hex digits, dashes, colons and commas: nothing to escape.
        sql.push_str(&format!(" SELECT pg_notify('{CHANNEL}', '{payload}');"));
    }
    sql.push_str(" COMMIT");
    sql
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
                            for wake in parse(&payload) {
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
            parse(&payload(id, 42)).collect::<Vec<_>>(),
            [Wake {
                session: id,
                head: 42
            }]
        );
        assert_eq!(parse("nonsense").count(), 0);
        assert_eq!(parse("x:1").count(), 0);
        assert_eq!(parse(&format!("x:1,{id}:7")).count(), 1);
    }

    #[test]
    fn coalesced_sessions_are_split_into_payloads_the_server_accepts() {
        let pending: Vec<(Uuid, u64)> = (0..1_000).map(|i| (Uuid::now_v7(), i)).collect();
        let sent = payloads(pending.clone());
        assert!(sent.len() > 1);
        assert!(sent.iter().all(|p| p.len() <= PAYLOAD_LIMIT));
        let woken: Vec<(Uuid, u64)> = sent
            .iter()
            .flat_map(|p| parse(p))
            .map(|w| (w.session, w.head))
            .collect();
        assert_eq!(woken, pending);
    }
}
