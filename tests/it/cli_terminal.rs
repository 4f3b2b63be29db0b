//! The command line as a person sees it: each test drives the real CLI through a
//! pseudo-terminal against a real server, and reads back what the terminal would show by feeding
//! everything the CLI wrote (escape sequences included) through a terminal emulator (`vt100`).
//! So a line erased by a stray escape sequence is missing here as it would be on screen.

use std::{
    io::{Read, Write},
    num::NonZeroU16,
    process::Stdio,
    sync::{Arc, Mutex},
};

use agent_harness::pb::v1 as pb;
use agent_harness_testkit::service_bin;
use serde_json::Value;
use tokio::{
    process::{Child, Command},
    sync::Notify,
};

use crate::{
    cli::{Pty, cli, create_session, run, stderr, stdout},
    harness::{Harness, bounded},
    support::Session,
};

/// What the terminal shows, and every byte written to it.
struct Screen {
    emulator: Mutex<vt100::Parser>,
    raw: Mutex<String>,
    changed: Notify,
}

/// The CLI running on a pseudo-terminal.
struct Terminal {
    screen: Arc<Screen>,
    keyboard: std::fs::File,
    child: Child,
}

impl Terminal {
    /// Starts `command` with the terminal as its stdin, stdout and stderr. With `controlling`,
    /// the terminal is also its controlling terminal, so Ctrl-C typed on it sends SIGINT.
    fn spawn(mut command: Command, controlling: bool) -> Self {
        let pty = Pty::open();
        command
            .stdin(Stdio::from(pty.slave.try_clone().unwrap()))
            .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
            .stderr(Stdio::from(pty.slave.try_clone().unwrap()));
        if controlling {
            // SAFETY: between fork and exec only async-signal-safe calls (setsid, ioctl); fd 0
            // is the terminal by then.
            unsafe {
                command.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().expect("the CLI starts");
        drop(pty.slave);
        let screen = Arc::new(Screen {
            emulator: Mutex::new(vt100::Parser::new(
                NonZeroU16::new(400).unwrap(),
                NonZeroU16::new(200).unwrap(),
                0,
            )),
            raw: Mutex::new(String::new()),
            changed: Notify::new(),
        });
        let mut reader = std::fs::File::from(pty.master.try_clone().unwrap());
        let feed = screen.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            // Ends with EIO once the child has exited and the slave side is closed.
            while let Ok(n @ 1..) = reader.read(&mut buffer) {
                feed.emulator.lock().unwrap().process(&buffer[..n]);
                feed.raw
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
                feed.changed.notify_waiters();
            }
        });
        Self {
            screen,
            keyboard: std::fs::File::from(pty.master),
            child,
        }
    }

    /// The screen's text, one line per row, trailing blanks trimmed.
    fn shown(&self) -> String {
        self.screen.emulator.lock().unwrap().screen().contents()
    }

    async fn wait_for(&self, needle: &str) {
        loop {
            let changed = self.screen.changed.notified();
            if self.shown().contains(needle) {
                return;
            }
            changed.await;
        }
    }

    fn type_keys(&mut self, keys: &[u8]) {
        self.keyboard.write_all(keys).expect("typing");
    }

    async fn exit_code(&mut self) -> Option<i32> {
        self.child.wait().await.expect("the CLI exits").code()
    }
}

const SPINNER_FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

#[tokio::test]
async fn the_agents_last_line_stays_on_screen_when_its_turn_ends_under_the_spinner() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        // The last line arrives, then the agent works on (the spinner turns after it), then the
        // turn ends.
        let mut terminal = Terminal::spawn(
            cli(
                &h,
                None,
                &["prompt", &id, "The answer is:\n@sleep 800", "--follow"],
            ),
            false,
        );
        terminal.wait_for("ended: end_turn").await;
        assert_eq!(terminal.exit_code().await, Some(0), "{}", terminal.shown());

        let raw = terminal.screen.raw.lock().unwrap().clone();
        let after_text = &raw[raw.find("@sleep 800").expect("the last line was written")..];
        assert!(
            after_text.contains(SPINNER_FRAMES),
            "the spinner turned after the last line: {raw:?}"
        );
        let shown = terminal.shown();
        let lines: Vec<&str> = shown.lines().map(str::trim_end).collect();
        let last = lines
            .iter()
            .rposition(|line| *line == "@sleep 800")
            .unwrap_or_else(|| panic!("the agent's last line is on screen:\n{shown}"));
        assert!(
            lines[last - 1].ends_with("The answer is:"),
            "the line before it too:\n{shown}"
        );
        assert!(
            lines[last + 1].contains("turn 1 ended: end_turn"),
            "the turn's end follows on the next line:\n{shown}"
        );
    })
    .await;
}

#[tokio::test]
async fn follow_goes_on_when_another_client_answers_the_permission_it_asks_about() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let mut session = Session::attach(h.sessions(), &id);
        let mut watch = session.watch().await;
        let terminal = Terminal::spawn(cli(&h, None, &["follow", &id]), false);

        let sent = run(&h, &["prompt", &id, "@permission Deploy"]).await;
        assert!(sent.status.success(), "{}", stderr(&sent));
        terminal.wait_for("choose for permission").await;

        // Someone else answers while the terminal asks.
        let (_, request) = watch
            .entry(|_, f| f["method"] == "session/request_permission")
            .await;
        let request_id = request["id"].to_string();
        let answered = run(&h, &["answer", &id, &request_id, "--option", "allow-once"]).await;
        assert_eq!(answered.status.code(), Some(0), "{}", stderr(&answered));

        terminal.wait_for("answered elsewhere").await;
        terminal.wait_for("turn 1 ended: end_turn").await;
        // No key was pressed, and the transcript goes on.
        let next = run(&h, &["prompt", &id, "And then?"]).await;
        assert!(next.status.success(), "{}", stderr(&next));
        terminal.wait_for("echo: And then?").await;
        terminal.wait_for("turn 2 ended: end_turn").await;
    })
    .await;
}

#[tokio::test]
async fn stop_and_queue_manage_a_running_turn_from_the_command_line() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let mut terminal = Terminal::spawn(
            cli(
                &h,
                None,
                &["prompt", &id, "Wait for me\n@wait-cancel", "--follow"],
            ),
            false,
        );
        terminal.wait_for("echo: Wait for me").await;

        let queued = run(&h, &["prompt", &id, "Then this"]).await;
        let queued_text = stdout(&queued);
        assert!(queued_text.starts_with("queued "), "{queued_text}");
        let action = queued_text.split_whitespace().nth(1).unwrap().to_owned();

        let listed = run(&h, &["queue", &id]).await;
        assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
        let listed = stdout(&listed);
        assert!(
            listed.starts_with("1. ") && listed.contains(&action) && listed.contains("Then this"),
            "{listed}"
        );

        let edited = run(&h, &["queue", &id, "edit", &action, "Then that"]).await;
        assert_eq!(edited.status.code(), Some(0), "{}", stderr(&edited));
        let json = run(&h, &["queue", &id, "list", "--json"]).await;
        let entries: Vec<Value> = stdout(&json)
            .lines()
            .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0]["action_id"], action.as_str());
        assert_eq!(entries[0]["prompt"], "Then that");

        let removed = run(&h, &["queue", &id, "rm", &action]).await;
        assert_eq!(removed.status.code(), Some(0), "{}", stderr(&removed));
        let empty = run(&h, &["queue", &id]).await;
        assert!(
            stdout(&empty).contains("nothing is queued"),
            "{}",
            stdout(&empty)
        );
        // Removing it again: gone, said with its reason and the not-found exit code.
        let again = run(&h, &["queue", &id, "rm", &action]).await;
        assert_eq!(again.status.code(), Some(5), "{}", stderr(&again));
        assert!(
            stderr(&again).contains("QUEUED_ACTION_NOT_FOUND"),
            "{}",
            stderr(&again)
        );

        let stopped = run(&h, &["stop", &id]).await;
        assert_eq!(stopped.status.code(), Some(0), "{}", stderr(&stopped));
        assert!(
            stdout(&stopped).contains("stop sent"),
            "{}",
            stdout(&stopped)
        );
        terminal.wait_for("turn 1 ended: cancelled").await;
        assert_eq!(terminal.exit_code().await, Some(7), "{}", terminal.shown());
    })
    .await;
}

#[tokio::test]
async fn ctrl_c_during_prompt_follow_says_the_turn_goes_on_and_how_to_stop_it() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let mut terminal = Terminal::spawn(
            cli(
                &h,
                None,
                &["prompt", &id, "Wait for me\n@wait-cancel", "--follow"],
            ),
            true,
        );
        terminal.wait_for("echo: Wait for me").await;
        terminal.type_keys(b"\x03");
        terminal.wait_for(&format!("agent-harness stop {id}")).await;
        assert_eq!(
            terminal.exit_code().await,
            Some(130),
            "{}",
            terminal.shown()
        );
        assert!(terminal.shown().contains("goes on"), "{}", terminal.shown());

        // It does go on, until stopped as it says.
        let mut session = Session::attach(h.sessions(), &id);
        assert_eq!(session.get().await.status(), pb::SessionStatus::Running);
        let mut watch = session.watch().await;
        let stopped = run(&h, &["stop", &id]).await;
        assert_eq!(stopped.status.code(), Some(0), "{}", stderr(&stopped));
        watch
            .entry(|e, f| {
                e.direction == pb::LogDirection::FromRuntime as i32
                    && f["result"]["stopReason"] == "cancelled"
            })
            .await;
    })
    .await;
}

#[tokio::test]
async fn answer_without_an_id_shows_the_question_and_confirms_the_choice() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let mut session = Session::attach(h.sessions(), &id);
        let mut watch = session.watch().await;
        let sent = run(&h, &["prompt", &id, "@permission Deploy"]).await;
        assert!(sent.status.success(), "{}", stderr(&sent));
        let (_, request) = watch
            .entry(|_, f| f["method"] == "session/request_permission")
            .await;
        let request_id = request["id"].to_string();

        let mut terminal = Terminal::spawn(cli(&h, None, &["answer", &id]), false);
        terminal.wait_for("choose for permission").await;
        let shown = terminal.shown();
        assert!(
            shown.contains(&format!("permission {request_id}: Deploy")),
            "the question itself is shown:\n{shown}"
        );
        assert!(shown.contains("1) Allow once [allow-once]"), "{shown}");
        terminal.type_keys(b"1\n");
        terminal
            .wait_for(&format!("answered {request_id}: Allow once [allow-once]"))
            .await;
        assert_eq!(terminal.exit_code().await, Some(0), "{}", terminal.shown());
    })
    .await;
}

#[tokio::test]
async fn follow_tail_shows_only_the_last_messages_and_from_now_only_what_follows() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        for text in ["first", "second"] {
            let done = run(&h, &["prompt", &id, text, "--follow"]).await;
            assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
        }

        let tail = Terminal::spawn(cli(&h, None, &["follow", &id, "--tail", "2"]), false);
        tail.wait_for("echo: second").await;
        let shown = tail.shown();
        assert!(shown.contains("› second"), "{shown}");
        assert!(!shown.contains("first"), "{shown}");
        drop(tail);

        let live = Terminal::spawn(cli(&h, None, &["follow", &id, "--from-now"]), false);
        live.wait_for("from now").await;
        let third = run(&h, &["prompt", &id, "third"]).await;
        assert!(third.status.success(), "{}", stderr(&third));
        live.wait_for("echo: third").await;
        let shown = live.shown();
        assert!(
            !shown.contains("first") && !shown.contains("second"),
            "{shown}"
        );
    })
    .await;
}

#[tokio::test]
async fn follow_says_when_the_connection_is_lost_and_that_it_reconnects() {
    bounded(async {
        let h = Harness::start().await;
        let id = create_session(&h).await;
        let done = run(&h, &["prompt", &id, "hello", "--follow"]).await;
        assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
        let terminal = Terminal::spawn(cli(&h, None, &["follow", &id]), false);
        terminal.wait_for("echo: hello").await;
        h.shutdown().await;
        terminal.wait_for("connection lost").await;
        terminal.wait_for("reconnecting").await;
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_server_is_said_once_in_one_line() {
    bounded(async {
        // A port nothing listens on: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let output = Command::new(service_bin())
            .args(["sessions", "list"])
            .env("AGENT_HARNESS_SERVER", format!("http://127.0.0.1:{port}"))
            .env_remove("AGENT_HARNESS_TOKEN")
            .stdin(Stdio::null())
            .output()
            .await
            .expect("the CLI runs");
        assert_eq!(output.status.code(), Some(3));
        let text = stderr(&output);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("cannot reach"), "{text}");
        assert!(text.matches("tcp connect error").count() <= 1, "{text}");
    })
    .await;
}

#[tokio::test]
async fn help_points_at_the_guide_and_never_at_the_spec() {
    bounded(async {
        for command in [
            vec!["--help"],
            vec!["sessions", "--help"],
            vec!["prompt", "--help"],
            vec!["follow", "--help"],
            vec!["answer", "--help"],
            vec!["stop", "--help"],
            vec!["queue", "--help"],
            vec!["log", "--help"],
        ] {
            let output = Command::new(service_bin())
                .args(&command)
                .output()
                .await
                .expect("the CLI runs");
            let text = stdout(&output);
            assert!(output.status.success(), "{command:?}: {}", stderr(&output));
            assert!(
                !text.contains("SPEC") && !text.contains('§'),
                "{command:?}:\n{text}"
            );
            if command.len() > 1 {
                assert!(text.contains("docs/cli.md"), "{command:?}:\n{text}");
            }
        }
    })
    .await;
}
