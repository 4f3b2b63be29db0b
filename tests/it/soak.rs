//! The scale-out soak (durability across replicas, under faults): three replicas on the real
//! PostgreSQL database, each reaching it through a fault proxy of its own, and 30 sessions, each in
//! a directory of its own. Clients prompt through random replicas while the replicas suffer one
//! fault after another: `kill -9` (then a restart), a pause (`SIGSTOP`, then `SIGCONT` after more
//! than the lease TTL) and a black hole between a replica and the database (packets dropped,
//! sockets left open, healed seconds later).
//!
//! Afterwards every acknowledged action is in its session's log exactly once or still queued, an
//! action that was answered with an error (not acknowledged: UNAVAILABLE, a timeout, an outcome
//! unknown) is in it at most once, every log's offsets are dense, nothing was sent to a runtime
//! twice, and no runtime process outlived the replica that ran it. Throughout, the runtime
//! processes are sampled every 100 ms (a runtime's session is its working directory): two replicas
//! never run a runtime for one session past the self-fencing bound (docs/replicas.md, "When the
//! database is slow or gone": last renewal sent + TTL − 30 %). A black-holed replica's runtimes are
//! gone by then, before any other replica may claim, so they never overlap; a paused replica cannot
//! act until it is resumed, and its deadline has passed by then, so its runtimes may overlap
//! another replica's only until it is resumed (and has had [`RESUME_REACTION`] to stop them).
//!
//! Bounded to 90 s. Needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests (and
//! fails without it when `CI=true`). Prints its figures (run with `--no-capture` to see them).

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
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
    postgres::{test_schema, url_in_schema},
    postgres_outage::through,
    proxy::FaultProxy,
    replica_ownership::{Replica, drop_schema, prompts_sent},
    support::{processes_with, prompt},
};

const SESSIONS: usize = 30;
/// How long the clients prompt: nine faults.
const LOAD: Duration = Duration::from_secs(36);
/// A fault starts this often while they do, on the next replica in turn.
const FAULT_EVERY: Duration = Duration::from_secs(4);
/// How long a replica stays paused: past the lease TTL (2 s), so others claim its busy sessions.
const PAUSE_FOR: Duration = Duration::from_millis(3000);
/// How long a replica's database link stays black-holed: past its self-fencing bound and the TTL.
const BLACK_HOLE_FOR: Duration = Duration::from_millis(3000);
/// Each client's pause between two prompts: a steady load the two shared cores can carry, so
/// the soak tests failover rather than the queue limit.
const CLIENT_PACE: Duration = Duration::from_millis(300);
/// The whole test, setup and checks included.
const SOAK_BOUND: Duration = Duration::from_secs(90);
/// How long the runtimes of a killed replica may take to die (with their harness).
const RUNTIMES_DIE_WITHIN: Duration = Duration::from_secs(3);
/// How often the runtime processes are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How long a resumed replica may take to stop the runtimes of the leases it could not renew
/// while it was stopped (its deadline passed meanwhile, so it acts at once), sampling included.
const RESUME_REACTION: Duration = Duration::from_secs(1);

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultKind {
    Kill,
    Pause,
    BlackHole,
}

/// The fault number `n` of the soak: on each replica in turn, the kinds rotating so that over
/// nine faults each replica suffers each kind once.
fn fault_number(n: usize) -> (usize, FaultKind) {
    let kinds = [FaultKind::Kill, FaultKind::Pause, FaultKind::BlackHole];
    (n % 3, kinds[(n + n / 3) % 3])
}

/// A fault as it happened: on which replica, what, from when until it was healed, and how many
/// sessions the replica had stopped by the clock by then (its log since it last started).
#[derive(Debug, Clone)]
struct Fault {
    replica: usize,
    kind: FaultKind,
    started: Instant,
    healed: Instant,
    self_fenced: usize,
}

/// What a replica logs when it stops a session whose lease it could not renew in time.
const SELF_FENCED: &str = "lease not renewed in time; stopping the session";

/// A sample in which one session had runtimes on more than one replica.
#[derive(Debug, Clone)]
struct Overlap {
    at: Instant,
    session: usize,
    replicas: Vec<usize>,
}

/// Whether replica `replica` may still run a runtime another replica runs too at `at`: it was
/// paused then, or resumed less than [`RESUME_REACTION`] before.
fn excused(faults: &[Fault], replica: usize, at: Instant) -> bool {
    faults.iter().any(|f| {
        f.replica == replica
            && f.kind == FaultKind::Pause
            && f.started <= at
            && at <= f.healed + RESUME_REACTION
    })
}

/// Which session each runtime of each replica serves now (by its working directory).
fn runtimes_by_session(markers: &[String], sessions: &HashMap<PathBuf, usize>) -> Vec<Vec<usize>> {
    let mut found = vec![Vec::new(); SESSIONS];
    for (replica, marker) in markers.iter().enumerate() {
        for pid in processes_with(marker) {
            let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
                continue; // it just exited
            };
            if let Some(&session) = sessions.get(&cwd)
                && !found[session].contains(&replica)
            {
                found[session].push(replica);
            }
        }
    }
    found
}

/// What the sampler saw.
#[derive(Debug, Default)]
struct Sampled {
    samples: usize,
    /// Sessions seen with a runtime, summed over the samples.
    running: usize,
    overlaps: Vec<Overlap>,
}

/// Samples every [`SAMPLE_EVERY`] until `stop` is set.
fn sample_runtimes(
    markers: Vec<String>,
    sessions: HashMap<PathBuf, usize>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Sampled> {
    // A thread of its own: reading /proc must not wait behind the test's async work.
    std::thread::spawn(move || {
        let mut sampled = Sampled::default();
        while !stop.load(Ordering::Acquire) {
            let at = Instant::now();
            for (session, replicas) in runtimes_by_session(&markers, &sessions)
                .into_iter()
                .enumerate()
            {
                sampled.running += usize::from(!replicas.is_empty());
                if replicas.len() > 1 {
                    sampled.overlaps.push(Overlap {
                        at,
                        session,
                        replicas,
                    });
                }
            }
            sampled.samples += 1;
            std::thread::sleep(SAMPLE_EVERY.saturating_sub(at.elapsed()));
        }
        sampled
    })
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

/// Creates a session on `replica` in `cwd`; its id. A create may fail UNAVAILABLE on a loaded
/// machine (the new lease not renewed within its self-fencing bound while the runtime starts):
/// tried again, a few times.
async fn create_session(replica: &Replica, cwd: &std::path::Path) -> String {
    let mut client = replica.client().await;
    let mut tries = 0;
    loop {
        let created = client
            .create_session(pb::CreateSessionRequest {
                profile: "resumable".into(),
                cwd: cwd.to_string_lossy().into_owned(),
                ..Default::default()
            })
            .await;
        match created {
            Ok(created) => return created.into_inner().session.expect("the session").id,
            Err(status) if status.code() == Code::Unavailable && tries < 5 => tries += 1,
            Err(status) => panic!("the session is created: {status:?}"),
        }
    }
}

/// What the clients were told: the actions acknowledged, and those answered with an error (each
/// by session index and action id; the clients mint the ids, so both are known).
#[derive(Debug, Default)]
struct Answers {
    acknowledged: Vec<(usize, String)>,
    refused: Vec<(usize, String)>,
}

/// One client per session, each prompt through a replica picked at random, until `stop`.
fn start_clients(
    ids: &[String],
    channels: &Channels,
    stop: &Arc<AtomicBool>,
    answers: &Arc<Mutex<Answers>>,
    seed: u64,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut clients = Vec::new();
    for (session, id) in ids.iter().enumerate() {
        let (channels, stop, answers) = (channels.clone(), stop.clone(), answers.clone());
        let id = id.clone();
        let mut choices = Choices(seed.wrapping_add(session as u64 * 0x9e37_79b9));
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                let channel = channels.lock().unwrap()[choices.next(3)].clone();
                let action_id = uuid::Uuid::now_v7().to_string();
                let request = pb::ControlRequest {
                    session_id: id.clone(),
                    action_id: Some(action_id.clone()),
                    action: Some(prompt(&format!("soak {session}.{n}"))),
                    ..Default::default()
                };
                n += 1;
                let answer = AgentSessionServiceClient::new(channel)
                    .control(request)
                    .await;
                match answer {
                    Ok(reply) => {
                        assert_eq!(reply.into_inner().action_id, action_id, "the caller's id");
                        let mut answers = answers.lock().unwrap();
                        answers.acknowledged.push((session, action_id));
                    }
                    // A killed or paused replica, an owner not yet replaced, a database out of
                    // reach, a full queue: not acknowledged, so not owed (but never run twice).
                    Err(_) => answers.lock().unwrap().refused.push((session, action_id)),
                }
                tokio::time::sleep(CLIENT_PACE).await;
            }
        }));
    }
    clients
}

/// The soak's cluster: the replicas, the proxy between each and the database, and a channel to
/// each for the clients.
struct Cluster {
    replicas: Vec<Replica>,
    proxies: Vec<FaultProxy>,
    channels: Channels,
}

impl Cluster {
    /// Brings fault `kind` on replica `victim` and heals it; returns what happened.
    async fn fault(&mut self, victim: usize, kind: FaultKind) -> Fault {
        let started = Instant::now();
        let replica = &mut self.replicas[victim];
        match kind {
            FaultKind::Kill => {
                tokio::task::block_in_place(|| replica.process.kill_9());
                let died = Instant::now() + RUNTIMES_DIE_WITHIN;
                while replica.runs_a_runtime() {
                    assert!(
                        Instant::now() < died,
                        "runtimes of a killed replica outlived it: {:?}",
                        processes_with(&replica.marker)
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::task::block_in_place(|| replica.process.restart());
                self.channels.lock().unwrap()[victim] = lazy_channel(replica);
            }
            FaultKind::Pause => {
                replica.process.pause();
                tokio::time::sleep(PAUSE_FOR).await;
                replica.process.resume();
            }
            FaultKind::BlackHole => {
                self.proxies[victim].black_hole();
                tokio::time::sleep(BLACK_HOLE_FOR).await;
                self.proxies[victim].restore();
            }
        }
        let self_fenced = replica
            .process
            .log_lines()
            .iter()
            .filter(|line| line.contains(SELF_FENCED))
            .count();
        Fault {
            replica: victim,
            kind,
            started,
            healed: Instant::now(),
            self_fenced,
        }
    }
}

/// Checks every session's log and queue against what the clients were told; the numbers of
/// acknowledged actions found in the logs and still queued.
async fn check_logs(
    reader: &AgentSessionServiceClient<Channel>,
    ids: &[String],
    answers: &Answers,
) -> (usize, usize) {
    let mut owed: HashMap<usize, Vec<&str>> = HashMap::new();
    for (session, action) in &answers.acknowledged {
        owed.entry(*session).or_default().push(action);
    }
    let (mut in_log, mut still_queued) = (0, 0);
    for (session, id) in ids.iter().enumerate() {
        // The queue first: an action leaves it only for the log, which is read after.
        let queue = queued(reader, id).await;
        let log = whole_log(reader, id).await;
        for (i, entry) in log.iter().enumerate() {
            assert_eq!(
                entry.offset,
                i as u64 + 1,
                "session {id}: offsets are dense"
            );
        }
        let mut times_sent: HashMap<String, usize> = HashMap::new();
        for action in prompts_sent(&log) {
            *times_sent.entry(action).or_default() += 1;
        }
        // Acknowledged or not, nothing runs twice.
        if let Some((action, times)) = times_sent.iter().find(|(_, times)| **times > 1) {
            panic!("session {id}: {action} was sent to the runtime {times} times");
        }
        for action in owed.get(&session).into_iter().flatten() {
            if times_sent.contains_key(*action) {
                in_log += 1;
            } else if queue.contains(*action) {
                still_queued += 1;
            } else {
                panic!("session {id}: acknowledged action {action} is neither logged nor queued");
            }
        }
    }
    (in_log, still_queued)
}

/// Checks the sampled overlaps against the faults (module doc); the longest a paused replica's
/// runtime overlapped another's after it was resumed.
fn check_overlaps(overlaps: &[Overlap], faults: &[Fault]) -> Duration {
    let mut after_resume = Duration::ZERO;
    for overlap in overlaps {
        let unexcused: Vec<usize> = overlap
            .replicas
            .iter()
            .copied()
            .filter(|r| !excused(faults, *r, overlap.at))
            .collect();
        assert!(
            unexcused.len() <= 1,
            "replicas {:?} ran a runtime for session {} at once, past the self-fencing bound \
             ({overlap:?}; faults: {faults:?})",
            overlap.replicas,
            overlap.session
        );
        // How much of its reaction time a resumed replica used.
        for fault in faults.iter().filter(|f| f.kind == FaultKind::Pause) {
            let reacting =
                fault.healed < overlap.at && overlap.at <= fault.healed + RESUME_REACTION;
            if reacting && overlap.replicas.contains(&fault.replica) {
                after_resume = after_resume.max(overlap.at - fault.healed);
            }
        }
    }
    after_resume
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_replica_soak_with_kills_pauses_and_black_holes_loses_nothing_acknowledged_and_never_runs_a_session_twice()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let (_, upstream) = through(&url, 0);
    let dir = tempfile::tempdir().unwrap();
    let mut proxies = Vec::new();
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        let proxy = FaultProxy::start(&upstream).await;
        let (proxied, _) = through(&url, proxy.port());
        replicas.push(Replica::start(
            dir.path(),
            name,
            &url_in_schema(&proxied, &schema),
        ));
        proxies.push(proxy);
    }
    let markers: Vec<String> = replicas.iter().map(|r| r.marker.clone()).collect();
    let root = dir.path().canonicalize().unwrap();
    let sampled = markers.clone();
    let started = Instant::now();
    let replicas = within(SOAK_BOUND, async move {
        let mut ids = Vec::new();
        let mut cwds = HashMap::new();
        for i in 0..SESSIONS {
            let cwd = root.join(format!("session-{i}"));
            std::fs::create_dir(&cwd).unwrap();
            ids.push(create_session(&replicas[i % 3], &cwd).await);
            cwds.insert(cwd, i);
        }
        let channels: Channels = Arc::new(Mutex::new(replicas.iter().map(lazy_channel).collect()));
        let mut cluster = Cluster {
            replicas,
            proxies,
            channels: channels.clone(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Answers::default()));
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        println!("soak: seed {seed}");
        let sampling = Arc::new(AtomicBool::new(false));
        let sampler = sample_runtimes(sampled, cwds, sampling.clone());
        let clients = start_clients(&ids, &channels, &stop, &answers, seed);

        // One fault after another, each healed before the next one starts.
        let mut faults = Vec::new();
        let load_ends = tokio::time::Instant::now() + LOAD;
        let mut next_fault = tokio::time::Instant::now() + FAULT_EVERY / 2;
        while next_fault < load_ends {
            tokio::time::sleep_until(next_fault).await;
            let (victim, kind) = fault_number(faults.len());
            faults.push(cluster.fault(victim, kind).await);
            next_fault += FAULT_EVERY;
        }
        tokio::time::sleep_until(load_ends).await;
        stop.store(true, Ordering::Release);
        for client in clients {
            client.await.expect("a client task");
        }
        sampling.store(true, Ordering::Release);
        let sampled = tokio::task::block_in_place(|| sampler.join().unwrap());

        let answers = std::mem::take(&mut *answers.lock().unwrap());
        let reader = AgentSessionServiceClient::new(channels.lock().unwrap()[0].clone());
        let (in_log, still_queued) = check_logs(&reader, &ids, &answers).await;
        let after_resume = check_overlaps(&sampled.overlaps, &faults);
        let count = |kind| faults.iter().filter(|f| f.kind == kind).count();
        let black_holes_fenced: Vec<usize> = faults
            .iter()
            .filter(|f| f.kind == FaultKind::BlackHole)
            .map(|f| f.self_fenced)
            .collect();
        println!(
            "soak: {SESSIONS} sessions on 3 replicas, {} acknowledged ({in_log} in the log, \
             {still_queued} still queued), {} refused; faults: {} kills, {} pauses, {} black \
             holes (sessions stopped by the clock: {black_holes_fenced:?}); {} samples ({} \
             session-runtimes), {} with a session on two replicas (paused ones), the longest \
             {after_resume:?} past a resume; {:.1} s",
            answers.acknowledged.len(),
            answers.refused.len(),
            count(FaultKind::Kill),
            count(FaultKind::Pause),
            count(FaultKind::BlackHole),
            sampled.samples,
            sampled.running,
            sampled.overlaps.len(),
            started.elapsed().as_secs_f64()
        );
        for kind in [FaultKind::Kill, FaultKind::Pause, FaultKind::BlackHole] {
            assert_eq!(
                count(kind),
                3,
                "each kind of fault struck thrice: {faults:?}"
            );
        }
        assert!(
            black_holes_fenced.iter().any(|n| *n > 0),
            "a black-holed replica stopped its sessions by the clock: {faults:?}"
        );
        assert!(sampled.running > 0, "the sampler saw the runtimes");
        assert!(!answers.acknowledged.is_empty(), "the clients were served");
        (cluster.replicas, cluster.proxies)
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
