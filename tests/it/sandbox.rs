//! Every agent in a box: a hostile agent (`hostile-agent`, test-only; it does what its prompt
//! says, as a prompt-injected agent with a shell tool would) tries each way out of its box — the
//! server's files, its process, other owners' HOMEs and workspaces, mounting, tracing, the
//! network, the machine's processes and memory — and each attempt fails while the server serves
//! on. Every test runs twice: with the server as root (as in CI), and as an unprivileged user
//! (`setpriv`, uid 65534, with a cgroup delegated to it for its limits, as a service manager
//! would). Both need the test to run as root (to start the second, and delegate); otherwise they
//! say loudly that they were skipped.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_harness::pb::v1 as pb;
use tempfile::TempDir;
use tonic::{Code, transport::Channel};

use crate::{
    auth::{ADA, BOB, Bearer, CI, EVERYONE, control, tokens_text},
    harness::{error_reason, within},
    process::{Serve, ServeProcess},
    support::{Watch, prompt},
};

type Client = pb::agent_session_service_client::AgentSessionServiceClient<
    tonic::service::interceptor::InterceptedService<Channel, Bearer>,
>;

/// The unprivileged user the second run uses.
const NOBODY: u32 = 65534;
/// The limits of the hostile profile: low, so the fork bomb and the memory hog stay cheap.
const MEMORY_MIB: u64 = 128;
const PIDS: u64 = 48;
/// A secret planted in the server's environment.
const PLANTED: &str = "planted-server-secret-7f3a";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Root,
    Unprivileged,
}

fn running_as_root() -> bool {
    // SAFETY: a plain getter.
    unsafe { libc::geteuid() == 0 }
}

/// A server with two profiles running the hostile agent (`shell`, and `other`, which holds a
/// secret from a file), tokens for ada, bob and the service ci, and a workspace per owner.
struct World {
    _dir: TempDir,
    base: PathBuf,
    data: PathBuf,
    config: PathBuf,
    tokens: PathBuf,
    secret: PathBuf,
    cache: PathBuf,
    ws: PathBuf,
    server: ServeProcess,
    /// A second replica on the same store (`ModelSetup::replicas`).
    second: Option<ServeProcess>,
    /// A loopback port the profile's `egress.allow` names (it accepts and closes).
    allowed_port: u16,
    _allowed: std::net::TcpListener,
    _cgroups: Option<Delegated>,
}

/// What the model proxy's tests add to the world: a profile `modelled` whose Anthropic calls go
/// through the model proxy to `upstream`, with the key planted in the server's environment; and
/// optionally a budget for ada.
struct ModelSetup {
    upstream: String,
    ada_budget: Option<&'static str>,
    /// Where the server exports its traces.
    otlp: String,
    /// With a PostgreSQL store (a schema's URL): two replicas share it, the second in `second`.
    replicas: Option<String>,
}

/// The provider's key the server holds (and no agent may see).
const PLANTED_KEY: &str = "sk-ant-planted-model-key-93c1";
/// The same, read from a file (`env_files`).
const PLANTED_FILE_KEY: &str = "sk-ant-planted-file-key-5e27";

impl World {
    fn start(mode: Mode) -> Self {
        Self::start_with(mode, None)
    }

    fn start_with(mode: Mode, model: Option<ModelSetup>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The data dir inside a directory of the server's own: a profile rooted there lets a
        // session's cwd hold it (the box covers it over).
        let data = base.join("srv").join("data");
        let ws = base.join("ws");
        let cache = base.join("npm-cache");
        for d in [&data, &ws.join("ada"), &ws.join("bob"), &cache] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(cache.join("_cacache"), "shared").unwrap();
        // The provider's key in a file, as from a mounted Secret (beside the server's files).
        let key_file = base.join("srv").join("provider-key");
        std::fs::write(&key_file, format!("{PLANTED_FILE_KEY}\n")).unwrap();
        let secret = base.join("other-secret");
        std::fs::write(&secret, "other-profile-secret-1c9e\n").unwrap();
        let tokens = base.join("tokens.toml");
        let mut tokens_rows = tokens_text(&EVERYONE[..1]);
        if let Some(budget) = model.as_ref().and_then(|m| m.ada_budget) {
            tokens_rows.push_str(&format!("budget = {budget}\n\n"));
        }
        tokens_rows.push_str(&tokens_text(&EVERYONE[1..]));
        std::fs::write(&tokens, tokens_rows).unwrap();
        let modelled = match &model {
            Some(setup) => format!(
                r#"
[profiles.modelled]
command = {agent:?}
allowed_cwd_roots = ["{ws}/{{principal}}"]
env_passthrough = ["ANTHROPIC_API_KEY"]
model_proxy = {{ anthropic = {{ key = "ANTHROPIC_API_KEY", upstream = "{upstream}" }} }}

[profiles.modelled-file]
command = {agent:?}
allowed_cwd_roots = ["{ws}/{{principal}}"]
env_files = {{ ANTHROPIC_API_KEY = {key_file:?} }}
model_proxy = {{ anthropic = {{ key = "ANTHROPIC_API_KEY", upstream = "{upstream}" }} }}

[profiles.modelled-down]
command = {agent:?}
allowed_cwd_roots = ["{ws}/{{principal}}"]
env_passthrough = ["ANTHROPIC_API_KEY"]
model_proxy = {{ anthropic = {{ key = "ANTHROPIC_API_KEY", upstream = "http://127.0.0.1:1" }} }}

[model_proxy]
timeout = "2s"

[model_proxy.prices]
"claude-host*" = {{ currency = "USD", input = "3", output = "15" }}
"#,
                agent = agent_harness_testkit::hostile_agent_bin(),
                ws = ws.display(),
                upstream = setup.upstream,
                key_file = key_file,
            ),
            None => String::new(),
        };
        let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let allowed_port = allowed.local_addr().unwrap().port();
        let cgroups = (mode == Mode::Unprivileged).then(Delegated::new);
        let cgroup_line = match &cgroups {
            Some(delegated) => format!("cgroup = {:?}\n", delegated.name),
            None => String::new(),
        };
        let agent = agent_harness_testkit::hostile_agent_bin();
        let config = base.join("config.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[sandbox]
npm_cache = {cache:?}
memory = "{MEMORY_MIB}MiB"
pids = {PIDS}
{cgroup_line}
[profiles.shell]
command = {agent:?}
allowed_cwd_roots = ["{ws}/{{principal}}"]
egress = {{ allow = ["127.0.0.1:{allowed_port}", "allowed.invalid"] }}

[profiles.other]
command = {agent:?}
env_files = {{ OTHER_SECRET = {secret:?} }}
allowed_cwd_roots = ["{ws}/{{principal}}"]

[profiles.server-side]
command = {agent:?}
allowed_cwd_roots = [{srv:?}, {base:?}]

[profiles.nesting]
command = {agent:?}
allowed_cwd_roots = ["{ws}/{{principal}}"]
sandbox = {{ nested = true }}
{modelled}"#,
                ws = ws.display(),
                srv = base.join("srv"),
            ),
        )
        .unwrap();
        if mode == Mode::Unprivileged {
            for path in [
                &data,
                &base.join("srv"),
                &ws.join("ada"),
                &ws.join("bob"),
                &secret,
                &tokens,
                &key_file,
            ] {
                std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
            }
            std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let mut serve = Serve::on(&data, &config)
            .arg("--tokens-file")
            .arg(&tokens)
            .env("AGENT_HARNESS_PLANTED", PLANTED)
            .env("ANTHROPIC_API_KEY", PLANTED_KEY);
        if let Some(setup) = &model {
            serve = serve.arg("--otlp-endpoint").arg(&setup.otlp);
        }
        if mode == Mode::Unprivileged {
            serve = serve.run_as(NOBODY, NOBODY);
        }
        let replicas = model.as_ref().and_then(|m| m.replicas.clone());
        let second = replicas.as_deref().map(|url| {
            assert_eq!(mode, Mode::Root, "the two-replica world runs as root");
            Serve::on(base.join("srv").join("data-2"), &config)
                .arg("--tokens-file")
                .arg(&tokens)
                .env("ANTHROPIC_API_KEY", PLANTED_KEY)
                .replica(url, "10s")
                .start()
        });
        if let Some(url) = &replicas {
            serve = serve.replica(url, "10s");
        }
        let server = serve.start();
        Self {
            _dir: dir,
            base,
            data,
            config,
            tokens,
            secret,
            cache,
            ws,
            server,
            second,
            allowed_port,
            _allowed: allowed,
            _cgroups: cgroups,
        }
    }

    async fn client(&self, token: &str, acting: Option<&str>) -> Client {
        Self::client_at(self.server.addr(), token, acting).await
    }

    async fn client_at(addr: std::net::SocketAddr, token: &str, acting: Option<&str>) -> Client {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .expect("a connection");
        pb::agent_session_service_client::AgentSessionServiceClient::with_interceptor(
            channel,
            Bearer::new(Some(token), acting),
        )
    }

    fn workspace(&self, owner: &str) -> PathBuf {
        self.ws.join(owner)
    }

    /// A session of `profile` owned by the token's user, in its workspace.
    async fn session(&self, token: &str, owner: &str, profile: &str) -> Agent {
        self.session_in(token, profile, &self.workspace(owner))
            .await
            .expect("the session is created")
    }

    /// A session of `profile` owned by the token's user, in `cwd`.
    async fn session_in(
        &self,
        token: &str,
        profile: &str,
        cwd: &Path,
    ) -> Result<Agent, tonic::Status> {
        let mut client = self.client(token, None).await;
        let session = client
            .create_session(pb::CreateSessionRequest {
                profile: profile.into(),
                cwd: cwd.to_string_lossy().into_owned(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .session
            .unwrap();
        let watch = crate::auth::watch(&mut client, &session.id).await;
        Ok(Agent {
            client,
            id: session.id,
            watch,
            answers: 0,
        })
    }
}

/// A session of the hostile agent, and what it answered so far.
struct Agent {
    client: Client,
    id: String,
    watch: Watch,
    answers: usize,
}

impl Agent {
    /// Sends `command` as a prompt and returns the agent's answer.
    async fn ask(&mut self, command: &str) -> String {
        self.client
            .control(control(&self.id, prompt(command)))
            .await
            .expect("the prompt is taken");
        self.next_answer().await
    }

    /// The agent's answer to looking for `secret` everywhere it can: any process's environment
    /// or command line, its HOME, its cwd (the pattern is read from a file, so no command line
    /// here holds it). `exit=0\nend\n` when it is nowhere.
    async fn places_holding(&mut self, secret: &str) -> String {
        let (head, tail) = secret.split_at(10);
        self.ask(&format!(
            "sh printf %s {head} > /tmp/p; printf %s {tail} >> /tmp/p; grep -rlsF -f /tmp/p \
             /proc/[0-9]*/environ /proc/[0-9]*/cmdline \"$HOME\" \"$PWD\"; echo end"
        ))
        .await
    }

    async fn next_answer(&mut self) -> String {
        loop {
            let chunks: Vec<String> = self
                .watch
                .entries
                .iter()
                .filter_map(|e| {
                    let frame: serde_json::Value = serde_json::from_str(&e.json).ok()?;
                    (frame["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
                        .then(|| {
                            frame["params"]["update"]["content"]["text"]
                                .as_str()
                                .map(str::to_owned)
                        })
                        .flatten()
                })
                .collect();
            if let Some(answer) = chunks.get(self.answers) {
                self.answers += 1;
                return answer.clone();
            }
            self.watch
                .next()
                .await
                .expect("the stream stays open")
                .expect("the stream does not fail");
        }
    }

    async fn get(&mut self) -> pb::AgentSession {
        self.client
            .get_session(pb::GetSessionRequest {
                session_id: self.id.clone(),
            })
            .await
            .expect("the session reads")
            .into_inner()
            .session
            .unwrap()
    }
}

/// cgroups the test hands to the unprivileged server (as a service manager delegates one), and
/// removes afterwards.
struct Delegated {
    name: String,
    dirs: Vec<PathBuf>,
}

impl Delegated {
    fn new() -> Self {
        let name = format!("/agent-harness-test-{}", uuid::Uuid::now_v7().simple());
        let mut dirs = Vec::new();
        for controller in ["memory", "pids"] {
            let dir = Path::new("/sys/fs/cgroup")
                .join(controller)
                .join(&name[1..]);
            std::fs::create_dir_all(&dir).expect("a delegated cgroup (cgroup v1 is mounted here)");
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let _ = std::os::unix::fs::chown(entry.path(), Some(NOBODY), Some(NOBODY));
            }
            std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
            dirs.push(dir);
        }
        Self { name, dirs }
    }
}

impl Drop for Delegated {
    fn drop(&mut self) {
        for dir in &self.dirs {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.path().is_dir() {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Runs `body` with the server as root and as an unprivileged user (only the latter when the
/// test is not root).
macro_rules! both_ways {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn with_the_server_as_root() {
                if skipped() {
                    return;
                }
                within(Duration::from_secs(90), $body(Mode::Root)).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn with_the_server_unprivileged() {
                if skipped() {
                    return;
                }
                within(Duration::from_secs(90), $body(Mode::Unprivileged)).await
            }
        }
    };
}

/// Whether this run cannot start the servers the tests need (not root); said loudly.
fn skipped() -> bool {
    if running_as_root() {
        return false;
    }
    let banner = "!".repeat(78);
    eprintln!(
        "{banner}\n!! SKIPPED: the sandbox tests start servers as root and as uid {NOBODY} (with a \
         delegated cgroup):\n!! run them as root (CI does).\n{banner}"
    );
    true
}

fn refused(answer: &str, what: &str) {
    assert!(
        answer.starts_with("error:")
            || answer.starts_with("exit=") && !answer.starts_with("exit=0"),
        "{what} should fail, the agent got: {answer}"
    );
}

both_ways!(
    the_store_config_tokens_and_another_profiles_secret_are_not_in_the_box,
    |mode| async move {
        let world = World::start(mode);
        let mut agent = world.session(ADA, "ada", "shell").await;
        for path in [
            world.data.join("agent-harness.sqlite3"),
            world.config.clone(),
            world.tokens.clone(),
            world.secret.clone(),
        ] {
            let answer = agent.ask(&format!("read {}", path.display())).await;
            refused(&answer, &format!("reading {}", path.display()));
        }
        // The data dir's path is there only as far as the agent's own HOME lies in it.
        let answer = agent
            .ask(&format!("sh ls -A {}", world.data.display()))
            .await;
        assert_eq!(
            answer, "exit=0\nhomes\n",
            "the data dir shows nothing of the server's"
        );
        let answer = agent
            .ask(&format!("sh ls -A {}/homes/shell", world.data.display()))
            .await;
        assert_eq!(answer, "exit=0\nada\n", "nor anyone else's HOME");
        // The other profile's secret is not in this agent's environment either.
        let answer = agent.ask("sh env").await;
        assert!(!answer.contains("other-profile-secret-1c9e"), "{answer}");
        assert!(!answer.contains(PLANTED), "{answer}");
        // The server serves on.
        assert_eq!(agent.get().await.id, agent.id);
    }
);

both_ways!(
    a_cwd_may_hold_the_servers_data_dir_which_the_box_covers_but_never_its_files,
    |mode| async move {
        let world = World::start(mode);
        let srv = world.base.join("srv");
        let mut agent = world
            .session_in(ADA, "server-side", &srv)
            .await
            .expect("a cwd holding the data dir is taken");
        // The agent works in its cwd, and its HOME (which lies in the data dir) is its own.
        let answer = agent
            .ask("sh touch made-here && touch \"$HOME/kept\" && echo done")
            .await;
        assert!(answer.ends_with("done\n"), "{answer}");
        assert!(srv.join("made-here").exists());
        // The data dir itself is covered: no store, nothing of the server's, nothing written.
        refused(
            &agent
                .ask(&format!(
                    "read {}",
                    world.data.join("agent-harness.sqlite3").display()
                ))
                .await,
            "reading the store under the cwd",
        );
        let listed = agent
            .ask(&format!("sh ls -A {}", world.data.display()))
            .await;
        assert_eq!(listed, "exit=0\nhomes\n", "only the way to its HOME");
        let wrote = agent
            .ask(&format!("sh touch {}/planted", world.data.display()))
            .await;
        assert!(!wrote.starts_with("exit=0"), "{wrote}");
        assert!(!world.data.join("planted").exists());
        // A cwd holding a file of the server's (its config, tokens, a secret) is refused.
        let status = world
            .session_in(ADA, "server-side", &world.base)
            .await
            .err()
            .expect("a cwd holding the server's files is refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(agent.get().await.id, agent.id, "the server serves on");
    }
);

both_ways!(
    the_servers_process_environment_and_command_line_are_out_of_sight,
    |mode| async move {
        let world = World::start(mode);
        let mut agent = world.session(ADA, "ada", "shell").await;
        let pid = world.server.pid();
        for command in [
            format!("read /proc/{pid}/environ"),
            format!("read /proc/{pid}/cmdline"),
            format!("kill {pid}"),
            format!("ptrace {pid}"),
        ] {
            refused(&agent.ask(&command).await, &command);
        }
        // Only the box's own processes are visible, and none carries the server's secret.
        let listing = agent
            .ask("sh ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '")
            .await;
        assert!(!listing.contains(&format!(" {pid} ")), "{listing}");
        let environ = agent
            .ask("sh cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c AGENT_HARNESS_PLANTED")
            .await;
        assert!(environ.starts_with("exit=1\n0"), "{environ}");
        assert!(!environ.contains(PLANTED));
        // The agent is not root, and has no capabilities.
        let id = agent.ask("sh id -u; grep CapEff /proc/self/status").await;
        assert!(!id.contains("\n0\n"), "{id}");
        assert!(id.contains("0000000000000000"), "{id}");
        assert_eq!(agent.get().await.id, agent.id);
    }
);

both_ways!(
    another_owners_home_and_workspace_are_out_of_sight,
    |mode| async move {
        let world = World::start(mode);
        let mut bob = world.session(BOB, "bob", "shell").await;
        let left = bob
            .ask("sh echo bob-was-here > \"$HOME/note\" && echo bob-was-here > note && echo \"$HOME\"")
            .await;
        assert!(left.starts_with("exit=0"), "{left}");
        let bob_home = left.lines().nth(1).unwrap().to_owned();
        let mut ada = world.session(ADA, "ada", "shell").await;
        let ada_home = ada.ask("sh echo \"$HOME\"").await;
        assert!(
            !ada_home.contains(&bob_home),
            "one HOME per owner: {ada_home}"
        );
        for path in [
            format!("{bob_home}/note"),
            world.workspace("bob").join("note").display().to_string(),
        ] {
            refused(&ada.ask(&format!("read {path}")).await, &path);
        }
        let homes = ada
            .ask(&format!(
                "sh ls {}",
                Path::new(&bob_home).parent().unwrap().display()
            ))
            .await;
        assert!(!homes.contains("bob"), "{homes}");
        // Nor may ada start a session in bob's workspace: it reads as any disallowed cwd.
        let mut client = world.client(ADA, None).await;
        let status = client
            .create_session(pb::CreateSessionRequest {
                profile: "shell".into(),
                cwd: world.workspace("bob").to_string_lossy().into_owned(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("not under an allowed root")
                && !status.message().contains("bob's"),
            "{status:?}"
        );
    }
);

both_ways!(
    the_tokens_file_cannot_be_written_and_the_shared_npm_cache_never_changes,
    |mode| async move {
        let world = World::start(mode);
        let mut agent = world.session(ADA, "ada", "shell").await;
        refused(
            &agent
                .ask(&format!("write {}", world.tokens.display()))
                .await,
            "writing the tokens file",
        );
        assert!(
            !std::fs::read_to_string(&world.tokens)
                .unwrap()
                .ends_with("[[tokens]]\n")
        );
        // The shared cache is there; what an agent writes to it lands in its own box's layer
        // (npm writes to its cache even to read it) and never in the shared files.
        let cached = world.cache.join("_cacache");
        let read = agent.ask(&format!("read {}", cached.display())).await;
        assert_eq!(read, "ok shared", "the shared cache is there");
        agent.ask(&format!("write {}", cached.display())).await;
        assert_eq!(std::fs::read_to_string(&cached).unwrap(), "shared");
        let mut bob = world.session(BOB, "bob", "shell").await;
        let seen = bob.ask(&format!("read {}", cached.display())).await;
        assert_eq!(seen, "ok shared", "another box never sees what one wrote");
    }
);

both_ways!(
    mounting_tracing_and_new_user_namespaces_are_refused,
    |mode| async move {
        let world = World::start(mode);
        let mut agent = world.session(ADA, "ada", "shell").await;
        refused(&agent.ask("mount").await, "mounting");
        refused(&agent.ask("ptrace 1").await, "tracing the box's init");
        refused(
            &agent.ask("sh unshare -U true").await,
            "a new user namespace",
        );
        let filter = agent
            .ask("sh grep -E 'NoNewPrivs|Seccomp:' /proc/self/status")
            .await;
        assert!(
            filter.contains("NoNewPrivs:\t1") && filter.contains("Seccomp:\t2"),
            "{filter}"
        );
        assert_eq!(agent.get().await.id, agent.id);
    }
);

both_ways!(
    an_agent_builds_a_sandbox_of_its_own_only_where_its_profile_allows_it,
    |mode| async move {
        let world = World::start(mode);
        // What Codex's own sandbox does (bubblewrap): a user namespace of its own, and mounts
        // in it.
        let nested = "sh unshare --user --map-root-user --mount sh -c \
             'mount -t tmpfs scratch /tmp && touch /tmp/inner && echo nested-sandbox-ok'";
        let mut plain = world.session(ADA, "ada", "shell").await;
        refused(&plain.ask(nested).await, "a nested sandbox");
        // What Codex does to the commands it runs (Landlock and a seccomp filter of its own)
        // needs no privilege, so it works in every box.
        let inside = world.workspace("ada").join("scratch");
        let made = plain.ask(&format!("sh mkdir {}", inside.display())).await;
        assert_eq!(made, "exit=0\n");
        let answer = plain
            .ask(&format!("self-sandbox {}", inside.display()))
            .await;
        assert_eq!(
            answer, "ok wrote beneath its directory, refused elsewhere, no sockets",
            "Landlock and seccomp inside the box"
        );
        let mut agent = world.session(ADA, "ada", "nesting").await;
        let answer = agent.ask(nested).await;
        assert!(answer.contains("nested-sandbox-ok"), "{answer}");
        // The mount was the nested sandbox's own: the box's /tmp is as it was.
        let tmp = agent.ask("sh ls /tmp").await;
        assert!(!tmp.contains("inner"), "{tmp}");
        // Tracing is refused all the same, and the agent has no capability in its box.
        refused(&agent.ask("ptrace 1").await, "tracing");
        refused(&agent.ask("mount").await, "mounting in the box itself");
    }
);

both_ways!(
    the_network_reaches_only_what_egress_allows,
    |mode| async move {
        let world = World::start(mode);
        let mut agent = world.session(ADA, "ada", "shell").await;
        let harness = world.server.addr().port();
        for target in [
            format!("127.0.0.1:{harness}"),
            "127.0.0.1:5432".into(),
            "1.1.1.1:443".into(),
        ] {
            refused(&agent.ask(&format!("connect {target}")).await, &target);
        }
        // Through the box's proxy: only what egress.allow names, and never the harness.
        for target in [
            format!("127.0.0.1:{harness}"),
            "127.0.0.1:5432".into(),
            "169.254.169.254:80".into(),
            "example.com:443".into(),
        ] {
            let answer = agent.ask(&format!("proxy {target}")).await;
            assert!(answer.starts_with("ok HTTP/1.1 403"), "{target}: {answer}");
        }
        // An allowed loopback port is forwarded at the same address.
        let answer = agent
            .ask(&format!("connect 127.0.0.1:{}", world.allowed_port))
            .await;
        assert_eq!(answer, "ok", "the allowed port is reachable");
        assert_eq!(agent.get().await.id, agent.id);
    }
);

both_ways!(
    a_fork_bomb_stops_at_the_process_limit_and_the_server_serves_on,
    |mode| async move {
        let world = World::start(mode);
        let mut agent = world.session(ADA, "ada", "shell").await;
        let answer = agent.ask("forkbomb 10000").await;
        let forked: u64 = answer
            .strip_prefix("ok forked=")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{answer}"));
        assert!(forked < PIDS, "{answer}");
        assert!(answer.contains("error:"), "the kernel said no: {answer}");
        // Another tenant is unaffected, and this agent goes on.
        let mut bob = world.session(BOB, "bob", "shell").await;
        assert!(bob.ask("sh echo fine").await.starts_with("exit=0\nfine"));
        assert!(agent.ask("sh echo still here").await.starts_with("exit=0"));
    }
);

both_ways!(
    a_memory_hog_kills_its_whole_runtime_and_the_session_says_which_limit,
    |mode| async move {
        let world = World::start(mode);
        let mut agent = world.session(ADA, "ada", "shell").await;
        assert!(agent.ask("sh echo warm").await.starts_with("exit=0"));
        agent
            .client
            .control(control(
                &agent.id,
                prompt(&format!("alloc {}", MEMORY_MIB * 4)),
            ))
            .await
            .expect("the prompt is taken");
        agent.watch.event("fault").await;
        let session = agent.get().await;
        assert_eq!(session.status, pb::SessionStatus::Disconnected as i32);
        assert!(
            session
                .status_reason
                .contains(&format!("memory limit {MEMORY_MIB} MiB reached")),
            "{}",
            session.status_reason
        );
        // The next prompt reopens it.
        assert!(agent.ask("sh echo back").await.starts_with("exit=0\nback"));
    }
);

both_ways!(
    a_cwd_swapped_for_a_link_to_the_data_dir_is_refused_when_the_runtime_starts_again,
    |mode| async move {
        let world = World::start(mode);
        let project = world.workspace("ada").join("project");
        std::fs::create_dir(&project).unwrap();
        if mode == Mode::Unprivileged {
            std::os::unix::fs::chown(&project, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        let mut client = world.client(ADA, None).await;
        let session = client
            .create_session(pb::CreateSessionRequest {
                profile: "shell".into(),
                cwd: project.to_string_lossy().into_owned(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .session
            .unwrap();
        let watch = crate::auth::watch(&mut client, &session.id).await;
        let mut agent = Agent {
            client,
            id: session.id,
            watch,
            answers: 0,
        };
        assert!(
            agent
                .ask("sh pwd")
                .await
                .contains(&project.display().to_string())
        );
        // The agent exits; meanwhile the project becomes a link to the server's data dir.
        agent
            .client
            .control(control(&agent.id, prompt("exit 0")))
            .await
            .unwrap();
        agent.watch.event("fault").await;
        std::fs::rename(&project, world.base.join("moved")).unwrap();
        std::os::unix::fs::symlink(&world.data, &project).unwrap();
        let answer = agent
            .client
            .control(control(&agent.id, prompt("sh ls")))
            .await;
        let reopen = agent.watch.event("reopen_failed").await;
        assert!(
            reopen["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("no longer allowed"),
            "{reopen} (the prompt: {answer:?})"
        );
        assert_eq!(agent.answers, 1, "the agent never ran in the data dir");
    }
);

both_ways!(
    a_principal_that_is_not_a_plain_name_has_no_workspace,
    |mode| async move {
        let world = World::start(mode);
        for (acting, cwd) in [
            ("..", world.ws.clone()),
            ("../ada", world.workspace("ada")),
            ("ada/..", world.ws.clone()),
        ] {
            let mut client = world.client(CI, Some(acting)).await;
            let status = client
                .create_session(pb::CreateSessionRequest {
                    profile: "shell".into(),
                    cwd: cwd.to_string_lossy().into_owned(),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{acting}: {status:?}");
            assert_eq!(error_reason(&status), "INVALID_ARGUMENT");
        }
        // Acting for ada, the service gets ada's workspace.
        let mut client = world.client(CI, Some("ada")).await;
        client
            .create_session(pb::CreateSessionRequest {
                profile: "shell".into(),
                cwd: world.workspace("ada").to_string_lossy().into_owned(),
                ..Default::default()
            })
            .await
            .expect("ada's workspace, for ada");
    }
);

/// Ada's usage as GetUsage answers it, once it has reached `at_least` tokens (a model call's
/// usage is stored as its answer ends).
async fn ada_tokens(world: &World, at_least: u64) -> (u64, u64) {
    let mut client = world.client(ADA, None).await;
    loop {
        let totals = client
            .get_usage(pb::GetUsageRequest {
                principal: "ada".into(),
                since: None,
            })
            .await
            .expect("usage reads")
            .into_inner()
            .principals
            .into_iter()
            .find(|p| p.principal == "ada")
            .and_then(|p| p.totals)
            .unwrap_or_default();
        if totals.input_tokens + totals.output_tokens >= at_least {
            return (totals.input_tokens, totals.output_tokens);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fake Anthropic API, and a world whose `modelled` profile calls it through the model proxy
/// (its traces exported to the receiver).
async fn model_world(
    mode: Mode,
    ada_budget: Option<&'static str>,
) -> (
    agent_harness_model_fakes::FakeServer,
    World,
    agent_harness_testkit::otlp::OtlpReceiver,
) {
    let fake =
        agent_harness_model_fakes::FakeServer::start(agent_harness_model_fakes::Api::Anthropic)
            .await
            .unwrap();
    let receiver = agent_harness_testkit::otlp::OtlpReceiver::start().await;
    let world = World::start_with(
        mode,
        Some(ModelSetup {
            upstream: fake.base_url(),
            ada_budget,
            otlp: receiver.endpoint(),
            replicas: None,
        }),
    );
    (fake, world, receiver)
}

both_ways!(
    the_providers_key_never_enters_the_box_and_each_call_is_metered_from_the_wire,
    |mode| async move {
        let (fake, world, receiver) = model_world(mode, None).await;
        let mut agent = world.session(ADA, "ada", "modelled").await;
        let env = agent.ask("sh env").await;
        assert!(!env.contains(PLANTED_KEY), "{env}");
        assert!(env.contains("ANTHROPIC_API_KEY=ahm-"), "{env}");
        assert!(
            env.contains("ANTHROPIC_BASE_URL=http://127.0.0.1:3129/anthropic"),
            "{env}"
        );
        assert_eq!(agent.places_holding(PLANTED_KEY).await, "exit=0\nend\n");
        // A model call reaches the provider with the real key, and its usage is the provider's.
        let answer = agent.ask("model 1 hello there").await;
        assert!(answer.starts_with("ok 200\n"), "{answer}");
        let seen = fake.requests();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].key.as_deref(), Some(PLANTED_KEY));
        assert_eq!(seen[0].last_user_text.as_deref(), Some("hello there"));
        assert_eq!(ada_tokens(&world, 1).await, (100, 10), "the fake's usage");
        // Priced by the table: 100 in at $3/M and 10 out at $15/M.
        let ada = world
            .client(ADA, None)
            .await
            .get_usage(pb::GetUsageRequest {
                principal: "ada".into(),
                since: None,
            })
            .await
            .unwrap()
            .into_inner();
        let costs = &ada.principals[0].totals.as_ref().unwrap().costs;
        assert_eq!(costs.len(), 1, "{costs:?}");
        assert_eq!(
            (costs[0].amount.as_str(), costs[0].currency.as_str()),
            ("0.00045", "USD")
        );
        // Read from the wire, and said so; nothing of the agent's own.
        assert_eq!(ada.sources.len(), 1, "{:?}", ada.sources);
        assert_eq!(ada.sources[0].source, pb::UsageSource::ModelProxy as i32);
        assert_eq!(ada.sessions[0].sources.len(), 1);
        // The call is a `model_call` span under its turn's.
        let spans = receiver
            .wait_for(|spans| {
                spans.iter().any(|call| {
                    call.name == "model_call"
                        && spans
                            .iter()
                            .any(|s| s.name == "turn" && s.span_id == call.parent_span_id)
                })
            })
            .await;
        let call = spans.iter().find(|s| s.name == "model_call").unwrap();
        let turn = spans
            .iter()
            .find(|s| s.name == "turn" && s.span_id == call.parent_span_id)
            .unwrap_or_else(|| panic!("the model call's turn in {spans:#?}"));
        assert_eq!(turn.trace_id, call.trace_id);
        assert_eq!(call.attribute("agent_harness.provider"), Some("anthropic"));
        assert_eq!(call.attribute("http.response.status_code"), Some("200"));
        assert_eq!(call.attribute("agent_harness.input_tokens"), Some("100"));
        // Another session's token, or none, is refused and nothing reaches the provider.
        let mut bob = world.session(BOB, "bob", "modelled").await;
        let bobs = bob.ask("sh printenv ANTHROPIC_API_KEY").await;
        let bobs = bobs.trim_start_matches("exit=0\n").trim();
        assert!(bobs.starts_with("ahm-"), "{bobs}");
        for key in [bobs, "none", PLANTED_KEY] {
            let answer = agent.ask(&format!("model-key {key} hi")).await;
            assert!(answer.starts_with("ok 401\n"), "{key}: {answer}");
        }
        assert_eq!(fake.requests().len(), 1);
        assert_eq!(agent.get().await.id, agent.id);
        // A key read from a file: likewise nowhere in the box, and at the provider.
        let mut filed = world.session(ADA, "ada", "modelled-file").await;
        assert_eq!(
            filed.places_holding(PLANTED_FILE_KEY).await,
            "exit=0\nend\n"
        );
        let answer = filed.ask("model 1 from a file").await;
        assert!(answer.starts_with("ok 200\n"), "{answer}");
        assert_eq!(
            fake.requests()
                .last()
                .and_then(|r| r.key.clone())
                .as_deref(),
            Some(PLANTED_FILE_KEY)
        );
    }
);

both_ways!(
    a_spent_budget_stops_the_next_model_call_even_inside_a_turn,
    |mode| async move {
        let (fake, world, _receiver) =
            model_world(mode, Some(r#"{ tokens = 100, period = "day" }"#)).await;
        let mut agent = world.session(ADA, "ada", "modelled").await;
        // One turn, three calls: the first spends the budget (110 tokens), the next two are
        // refused before they reach the provider, in a shape agents do not retry.
        let answer = agent.ask("model 3 spend it").await;
        assert!(answer.starts_with("ok 200,403,403\n"), "{answer}");
        assert!(answer.contains("BUDGET_EXHAUSTED"), "{answer}");
        assert!(answer.contains("permission_error"), "{answer}");
        assert_eq!(fake.requests().len(), 1);
        assert_eq!(ada_tokens(&world, 1).await, (100, 10));
        // The harness ended the turn itself at the first refusal, FAILED with the reason, and
        // asked the agent to stop; whatever the agent answered after did not change that.
        let ended = agent.watch.event("turn_ended").await;
        assert_eq!(ended["stop_reason"], "failed", "{ended}");
        let error = ended["error"].as_str().unwrap_or_default();
        assert!(error.starts_with("BUDGET_EXHAUSTED: "), "{ended}");
        let failed = agent.watch.event("turn_failed").await;
        assert_eq!(failed["failed_turn"], ended["request_id"], "{failed}");
        agent
            .watch
            .entry(|e, f| {
                e.direction == pb::LogDirection::ToRuntime as i32 && f["method"] == "session/cancel"
            })
            .await;
        // The next prompt is refused at admission; the session stays usable.
        let refused = agent
            .client
            .control(control(&agent.id, prompt("model 1 more")))
            .await
            .unwrap_err();
        assert_eq!(error_reason(&refused), "BUDGET_EXHAUSTED", "{refused:?}");
        agent.watch.status(pb::SessionStatus::Idle).await;
        assert_eq!(agent.get().await.status, pb::SessionStatus::Idle as i32);
        // Bob, with no budget, goes on.
        let mut bob = world.session(BOB, "bob", "modelled").await;
        let answer = bob.ask("model 1 mine").await;
        assert!(answer.starts_with("ok 200\n"), "{answer}");
    }
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_agent_cannot_read_its_bridges_token_file() {
    if skipped() {
        return;
    }
    within(Duration::from_secs(90), async {
        let h = crate::harness::Harness::start_with(|config| {
            crate::bridge::remote_profile(
                config,
                "far",
                &[("pool", "boxed")],
                "shell",
                Duration::from_secs(20),
                Duration::from_secs(30),
            );
        })
        .await;
        let profile = format!(
            "[profiles.shell]\ncommand = {:?}\n",
            agent_harness_testkit::hostile_agent_bin()
        );
        let bridge = crate::bridge::Bridge::start(
            &crate::bridge::url(h.addr()),
            "boxed-bridge",
            &[("pool", "boxed")],
            &profile,
            Some("bridge-token-never-in-a-box"),
        );
        let mut session = crate::support::Session::create(&h, "far").await;
        let mut watch = session.watch().await;
        let token = bridge.token_file();
        assert!(token.is_file());
        session.prompt(&format!("read {}", token.display())).await;
        let answer = watch.chunk("error").await;
        assert!(
            answer["params"]["update"]["content"]["text"]
                .as_str()
                .is_some_and(|t| !t.contains("bridge-token")),
            "{answer}"
        );
        session
            .prompt("sh id -u; ls /proc | grep -cE '^[0-9]+$'")
            .await;
        let boxed = watch.chunk("exit=0").await;
        let text = boxed["params"]["update"]["content"]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(
            text.starts_with("exit=0\n65532\n"),
            "the bridged agent is boxed: {text}"
        );
    })
    .await
}

both_ways!(
    the_agent_gets_its_providers_error_when_the_upstream_fails_is_slow_or_down_and_goes_on,
    |mode| async move {
        let (_fake, world, _receiver) = model_world(mode, None).await;
        let mut agent = world.session(ADA, "ada", "modelled").await;
        // The provider's own error passes through as it is.
        let answer = agent.ask("model 1 [error 500]").await;
        assert!(answer.starts_with("ok 500\n"), "{answer}");
        assert!(answer.contains("api_error"), "{answer}");
        // An answer that does not start within the timeout (2 s here): 504, in the
        // provider's shape.
        let answer = agent.ask("model 1 [stall 5] slow").await;
        assert!(answer.starts_with("ok 504\n"), "{answer}");
        assert!(answer.contains(r#""type":"error""#), "{answer}");
        // The session goes on, and only the answered call counts.
        let answer = agent.ask("model 1 fine").await;
        assert!(answer.starts_with("ok 200\n"), "{answer}");
        assert_eq!(ada_tokens(&world, 1).await, (100, 10));
        // An upstream that cannot be reached: 502, in the provider's shape.
        let mut down = world.session(ADA, "ada", "modelled-down").await;
        let answer = down.ask("model 1 hello").await;
        assert!(answer.starts_with("ok 502\n"), "{answer}");
        assert!(answer.contains(r#""type":"error""#), "{answer}");
        assert!(down.ask("sh echo still here").await.contains("still here"));
    }
);

/// Ada's budget of 10,000 tokens; turns of 990 (nine model calls of 110 each); 50 prompts sent
/// at once over five sessions on two replicas sharing one PostgreSQL store. What is spent stops
/// within one model call per session running at once past the budget (5 × 110 = 550 tokens): a
/// session's calls follow one another, each waits for the previous one's usage to be stored,
/// and every call is checked against the shared store. At least one turn completes; every turn
/// past the budget ends FAILED with BUDGET_EXHAUSTED, or its prompt is refused at admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_holds_across_two_replicas_to_within_one_model_call_per_running_session() {
    const SESSIONS: usize = 5;
    const PROMPTS_EACH: usize = 10;
    const BUDGET: u64 = 10_000;
    const CALL_TOKENS: u64 = 110;
    if skipped() {
        return;
    }
    let Some((url, schema)) = crate::postgres::test_schema().await else {
        return;
    };
    within(Duration::from_secs(240), async move {
        let fake =
            agent_harness_model_fakes::FakeServer::start(agent_harness_model_fakes::Api::Anthropic)
                .await
                .unwrap();
        let receiver = agent_harness_testkit::otlp::OtlpReceiver::start().await;
        let world = World::start_with(
            Mode::Root,
            Some(ModelSetup {
                upstream: fake.base_url(),
                ada_budget: Some(r#"{ tokens = 10000, period = "day" }"#),
                otlp: receiver.endpoint(),
                replicas: Some(crate::postgres::url_in_schema(&url, &schema)),
            }),
        );
        let replicas = [
            world.server.addr(),
            world.second.as_ref().expect("two replicas").addr(),
        ];
        let mut sessions = Vec::new();
        for i in 0..SESSIONS {
            let mut client = World::client_at(replicas[i % 2], ADA, None).await;
            let id = client
                .create_session(pb::CreateSessionRequest {
                    profile: "modelled".into(),
                    cwd: world.workspace("ada").to_string_lossy().into_owned(),
                    ..Default::default()
                })
                .await
                .expect("the session is created")
                .into_inner()
                .session
                .unwrap()
                .id;
            let watch = crate::auth::watch(&mut client, &id).await;
            sessions.push((client, id, watch));
        }
        // All fifty at once.
        let sends = sessions.iter().flat_map(|(client, id, _)| {
            (0..PROMPTS_EACH).map(move |n| {
                let mut client = client.clone();
                let id = id.clone();
                async move {
                    client
                        .control(control(&id, prompt(&format!("model 9 turn {n}"))))
                        .await
                }
            })
        });
        let answers = futures::future::join_all(sends).await;
        let mut refused = 0;
        let mut admitted = [0usize; SESSIONS];
        for (i, answer) in answers.iter().enumerate() {
            match answer {
                Ok(_) => admitted[i / PROMPTS_EACH] += 1,
                Err(status) => {
                    assert_eq!(error_reason(status), "BUDGET_EXHAUSTED", "{status:?}");
                    refused += 1;
                }
            }
        }
        let (mut completed, mut failed) = (0, 0);
        for (i, (_, _, watch)) in sessions.iter_mut().enumerate() {
            let ends = |watch: &Watch| -> Vec<serde_json::Value> {
                watch
                    .entries
                    .iter()
                    .filter_map(|e| serde_json::from_str::<serde_json::Value>(&e.json).ok())
                    .filter(|f| f["event"] == "turn_ended")
                    .collect()
            };
            while ends(watch).len() < admitted[i] {
                watch
                    .next()
                    .await
                    .expect("the stream stays open")
                    .expect("the stream does not fail");
            }
            for end in ends(watch) {
                match end["stop_reason"].as_str() {
                    Some("end_turn") => completed += 1,
                    Some("failed")
                        if end["error"]
                            .as_str()
                            .is_some_and(|e| e.starts_with("BUDGET_EXHAUSTED: ")) =>
                    {
                        failed += 1
                    }
                    _ => panic!("a turn ended otherwise: {end}"),
                }
            }
        }
        // Every call the provider answered is in GetUsage once its usage is stored.
        let (input, output) = loop {
            let served = fake.served_tokens();
            let stored = ada_tokens(&world, 0).await;
            if stored == served {
                break stored;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let spent = input + output;
        let bound = SESSIONS as u64 * CALL_TOKENS;
        eprintln!(
            "budget {BUDGET}: spent {spent} (bound {}), {completed} turns completed, {failed} \
             failed BUDGET_EXHAUSTED, {refused} prompts refused at admission, over {} calls",
            BUDGET + bound,
            fake.requests().len()
        );
        assert!(spent >= BUDGET, "the budget was reached: {spent}");
        assert!(
            spent <= BUDGET + bound,
            "spent {spent}, past the budget by more than one call per session"
        );
        assert!(completed >= 1, "at least one turn completes");
        assert_eq!(
            completed + failed + refused,
            SESSIONS * PROMPTS_EACH,
            "every prompt is accounted for"
        );
        assert!(failed >= 1, "the turns past the budget fail");
    })
    .await;
}
