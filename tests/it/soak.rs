//! The scale-out soak (durability across replicas): three replicas on the real PostgreSQL
//! database, 30 sessions, clients prompting through random replicas while one replica after
//! another is killed with `kill -9` and restarted. Afterwards every acknowledged action is in its
//! session's log exactly once or still queued, every log's offsets are dense, nothing was sent to
//! a runtime twice, and no runtime process outlived the replica that ran it.
//!
//! Bounded to 60 s. Needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests (and
//! fails without it when `CI=true`). Prints its figures (run with `--no-capture` to see them).

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use agent_harness::pb::v1::{self as pb, agent_session_service_client::AgentSessionServiceClient};
use tonic::{
    Code, Status,
    transport::{Channel, Endpoint},
};

use crate::{
    harness::within,
    replica_ownership::{Replica, create_on, drop_schema, prompts_sent, three_replicas},
    support::{processes_with, prompt},
};

const SESSIONS: usize = 30;
/// How long the clients prompt.
const LOAD: Duration = Duration::from_secs(20);
/// A replica is killed and restarted this often while they do.
const KILL_EVERY: Duration = Duration::from_secs(4);
/// Each client's pause between two prompts: a steady load the two shared cores can carry, so
/// the soak tests failover rather than the queue limit.
const CLIENT_PACE: Duration = Duration::from_millis(300);
/// The whole test, setup and checks included.
const SOAK_BOUND: Duration = Duration::from_secs(60);
/// How long the runtimes of a killed replica may take to die (with their harness).
const RUNTIMES_DIE_WITHIN: Duration = Duration::from_secs(3);

/// A connection to each replica, replaced when the replica restarts on a new port.
type Channels = Arc<Mutex<Vec<Channel>>>;

fn lazy_channel(replica: &Replica) -> Channel {
    Endpoint::from_shared(format!("http://{}", replica.process.addr()))
        .expect("a valid endpoint")
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .connect_lazy()
}

/// A small xorshift generator: the soak's choices need spread, not quality.
struct Choices(u64);

impl Choices {
    fn next(&mut self, below: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % below as u64) as usize
    }
}

/// Retries a read while the session's owner cannot be reached (its lease has not expired yet,
/// or the session is moving): each retry follows an UNAVAILABLE answer.
async fn read_when_served<T, F, Fut>(mut read: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    loop {
        match read().await {
            Ok(value) => return value,
            Err(status) if status.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("a read failed: {status:?}"),
        }
    }
}

async fn whole_log(client: &AgentSessionServiceClient<Channel>, id: &str) -> Vec<pb::LogEntry> {
    let mut entries: Vec<pb::LogEntry> = Vec::new();
    loop {
        let after_offset = entries.last().map_or(0, |e| e.offset);
        let page = read_when_served(|| {
            let mut client = client.clone();
            async move {
                client
                    .read_log(pb::ReadLogRequest {
                        session_id: id.to_owned(),
                        after_offset,
                        limit: 5000,
                    })
                    .await
            }
        })
        .await
        .into_inner();
        if page.entries.is_empty() {
            return entries;
        }
        entries.extend(page.entries);
    }
}

async fn queued(client: &AgentSessionServiceClient<Channel>, id: &str) -> HashSet<String> {
    read_when_served(|| {
        let mut client = client.clone();
        async move {
            client
                .get_queue(pb::GetQueueRequest {
                    session_id: id.to_owned(),
                })
                .await
        }
    })
    .await
    .into_inner()
    .entries
    .into_iter()
    .map(|a| a.action_id)
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_replica_soak_with_kills_loses_no_acknowledged_action() {
    let Some((dir, url, schema, replicas)) = three_replicas().await else {
        return;
    };
    let markers: Vec<String> = replicas.iter().map(|r| r.marker.clone()).collect();
    let cwd = dir.path().to_owned();
    let started = Instant::now();
    let replicas = within(SOAK_BOUND, async move {
        let mut ids = Vec::new();
        for i in 0..SESSIONS {
            ids.push(create_on(&replicas[i % 3], &cwd).await.id);
        }
        let channels: Channels = Arc::new(Mutex::new(replicas.iter().map(lazy_channel).collect()));
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(Mutex::new(Vec::<(usize, String)>::new()));
        let refused = Arc::new(AtomicUsize::new(0));
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        println!("soak: seed {seed}");

        // One client per session, each prompt through a replica picked at random.
        let mut clients = Vec::new();
        for (session, id) in ids.iter().enumerate() {
            let (channels, stop, acknowledged, refused) = (
                channels.clone(),
                stop.clone(),
                acknowledged.clone(),
                refused.clone(),
            );
            let id = id.clone();
            let mut choices = Choices(seed.wrapping_add(session as u64 * 0x9e37_79b9));
            clients.push(tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    let channel = channels.lock().unwrap()[choices.next(3)].clone();
                    let request = pb::ControlRequest {
                        session_id: id.clone(),
                        action: Some(prompt(&format!("soak {session}.{n}"))),
                        ..Default::default()
                    };
                    n += 1;
                    match AgentSessionServiceClient::new(channel)
                        .control(request)
                        .await
                    {
                        Ok(reply) => acknowledged
                            .lock()
                            .unwrap()
                            .push((session, reply.into_inner().action_id)),
                        // A killed replica, an owner not yet replaced, a full queue: not
                        // acknowledged, so not owed.
                        Err(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::time::sleep(CLIENT_PACE).await;
                }
            }));
        }

        // Kill one replica after another, each restarted on its data dir once its runtimes died.
        let mut replicas = replicas;
        let mut kills = 0;
        let load_ends = tokio::time::Instant::now() + LOAD;
        let mut next_kill = tokio::time::Instant::now() + KILL_EVERY;
        while next_kill < load_ends {
            tokio::time::sleep_until(next_kill).await;
            let victim = &mut replicas[kills % 3];
            tokio::task::block_in_place(|| victim.process.kill_9());
            kills += 1;
            let died = tokio::time::Instant::now() + RUNTIMES_DIE_WITHIN;
            while !processes_with(&victim.marker).is_empty() {
                assert!(
                    tokio::time::Instant::now() < died,
                    "runtimes of a killed replica outlived it: {:?}",
                    processes_with(&victim.marker)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::task::block_in_place(|| victim.process.restart());
            channels.lock().unwrap()[(kills - 1) % 3] = lazy_channel(victim);
            next_kill += KILL_EVERY;
        }
        tokio::time::sleep_until(load_ends).await;
        stop.store(true, Ordering::Release);
        for client in clients {
            client.await.expect("a client task");
        }

        // Every acknowledged action is logged once or still queued; offsets are dense.
        let acknowledged = acknowledged.lock().unwrap().clone();
        let mut owed: HashMap<usize, Vec<String>> = HashMap::new();
        for (session, action) in &acknowledged {
            owed.entry(*session).or_default().push(action.clone());
        }
        let reader = AgentSessionServiceClient::new(channels.lock().unwrap()[0].clone());
        let (mut in_log, mut still_queued) = (0, 0);
        for (session, id) in ids.iter().enumerate() {
            // The queue first: an action leaves it only for the log, which is read after.
            let queue = queued(&reader, id).await;
            let log = whole_log(&reader, id).await;
            for (i, entry) in log.iter().enumerate() {
                assert_eq!(
                    entry.offset,
                    i as u64 + 1,
                    "session {id}: offsets are dense"
                );
            }
            let sent = prompts_sent(&log);
            let mut times_sent: HashMap<&str, usize> = HashMap::new();
            for action in &sent {
                *times_sent.entry(action.as_str()).or_default() += 1;
            }
            if let Some((action, times)) = times_sent.iter().find(|(_, times)| **times > 1) {
                panic!("session {id}: {action} was sent to the runtime {times} times");
            }
            for action in owed.get(&session).into_iter().flatten() {
                if times_sent.contains_key(action.as_str()) {
                    in_log += 1;
                } else if queue.contains(action) {
                    still_queued += 1;
                } else {
                    panic!(
                        "session {id}: acknowledged action {action} is neither logged nor queued"
                    );
                }
            }
        }
        println!(
            "soak: {SESSIONS} sessions on 3 replicas, {} acknowledged ({in_log} in the log, \
             {still_queued} still queued), {} refused, {kills} kills, {:.1} s",
            acknowledged.len(),
            refused.load(Ordering::Relaxed),
            started.elapsed().as_secs_f64()
        );
        assert!(kills >= 3, "every replica was killed once");
        assert!(!acknowledged.is_empty(), "the clients were served");
        replicas
    })
    .await;

    // Stopped with `kill -9` too: no runtime outlives its replica.
    drop(replicas);
    let died = Instant::now() + RUNTIMES_DIE_WITHIN;
    while markers.iter().any(|m| !processes_with(m).is_empty()) {
        assert!(
            Instant::now() < died,
            "runtimes outlived their replicas: {:?}",
            markers
                .iter()
                .map(|m| processes_with(m))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(dir);
    drop_schema(&url, &schema).await;
}
