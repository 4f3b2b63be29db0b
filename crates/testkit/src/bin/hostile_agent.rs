//! `hostile-agent`: a test-only ACP agent that does what its prompt says, as a prompt-injected
//! coding agent would with its shell tool. The sandbox tests drive it to try every way out of
//! its box. It never ships: the built-in `mock` agent has no such directive, since that would
//! hand every user of the embedded default a shell.
//!
//! A prompt's first text block is one command; the reply is one agent message, then `end_turn`:
//!
//! - `sh <command>`: `/bin/sh -c`, answering `exit=<code>` and what it printed;
//! - `read <path>` / `write <path>`: read a file, or append a line to one;
//! - `kill <pid>` / `ptrace <pid>`: SIGTERM, or `PTRACE_ATTACH`;
//! - `mount`: a tmpfs on `/tmp`;
//! - `connect <host:port>`: a TCP connection; `proxy <host:port>`: CONNECT through the box's
//!   proxy, answering its status line;
//! - `forkbomb <n>`: up to n processes, answering how many it got before the kernel said no;
//! - `alloc <MiB>`: that much memory, touched;
//! - `self-sandbox <dir>`: what Codex does to its commands (Landlock: writes beneath `dir`
//!   only; a seccomp filter: no sockets), in a child, answering what the child could do;
//! - `model <n> <text>`: n Anthropic Messages calls in a row, as an agent on the Anthropic SDK
//!   makes them (`$ANTHROPIC_BASE_URL`, key `$ANTHROPIC_API_KEY`), answering `ok` and each
//!   call's status, then the last answer's body; `model-key <key> <text>`: one call with that
//!   key instead;
//! - `exit <code>`: ends the process.
//!
//! Each answer starts `ok` or `error: <what the system said>`.

use std::{
    io::{BufRead, Read, Write},
    net::{TcpStream, ToSocketAddrs},
    time::Duration,
};

use serde_json::{Value, json};

fn main() {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    let mut sessions = 0u64;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Ok(frame) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let id = frame.get("id").cloned();
        let method = frame
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let result = match method {
            "initialize" => json!({
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": false, "sessionCapabilities": {"resume": {}}},
                "authMethods": [],
                "agentInfo": {"name": "hostile-agent", "version": "0"},
            }),
            "session/new" => {
                sessions += 1;
                json!({"sessionId": format!("hostile-{sessions}")})
            }
            "session/resume" => json!({}),
            "session/prompt" => {
                let params = &frame["params"];
                let session = params["sessionId"].clone();
                let text = params["prompt"]
                    .as_array()
                    .and_then(|blocks| blocks.iter().find_map(|b| b["text"].as_str()))
                    .unwrap_or_default()
                    .to_owned();
                let answer = run(text.trim());
                send(
                    &mut stdout,
                    &json!({"jsonrpc": "2.0", "method": "session/update", "params": {
                        "sessionId": session,
                        "update": {"sessionUpdate": "agent_message_chunk",
                                   "content": {"type": "text", "text": answer}}}}),
                );
                json!({"stopReason": "end_turn"})
            }
            _ => {
                if let Some(id) = id {
                    send(
                        &mut stdout,
                        &json!({"jsonrpc": "2.0", "id": id,
                                "error": {"code": -32601, "message": "method not found"}}),
                    );
                }
                continue;
            }
        };
        if let Some(id) = id {
            send(
                &mut stdout,
                &json!({"jsonrpc": "2.0", "id": id, "result": result}),
            );
        }
    }
}

fn send(out: &mut std::io::Stdout, frame: &Value) {
    let mut out = out.lock();
    let _ = writeln!(out, "{frame}");
    let _ = out.flush();
}

fn errno() -> String {
    format!("error: {}", std::io::Error::last_os_error())
}

fn run(command: &str) -> String {
    let (verb, rest) = command.split_once(' ').unwrap_or((command, ""));
    match verb {
        "sh" => match std::process::Command::new("/bin/sh")
            .args(["-c", rest])
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(output) => {
                let mut text = format!("exit={}\n", output.status.code().unwrap_or(-1));
                text.push_str(&String::from_utf8_lossy(&output.stdout));
                text.push_str(&String::from_utf8_lossy(&output.stderr));
                text.chars().take(64 * 1024).collect()
            }
            Err(e) => format!("error: {e}"),
        },
        "read" => match std::fs::read(rest) {
            Ok(bytes) => format!("ok {}", String::from_utf8_lossy(&bytes)),
            Err(e) => format!("error: {e}"),
        },
        "write" => match std::fs::OpenOptions::new().append(true).open(rest) {
            Ok(mut file) => match file.write_all(b"\n[[tokens]]\n") {
                Ok(()) => "ok".into(),
                Err(e) => format!("error: {e}"),
            },
            Err(e) => format!("error: {e}"),
        },
        "kill" | "ptrace" => {
            let Ok(pid) = rest.parse::<libc::pid_t>() else {
                return "error: not a pid".into();
            };
            // SAFETY: plain system calls on a pid.
            let result = unsafe {
                match verb {
                    "kill" => libc::kill(pid, libc::SIGTERM) as libc::c_long,
                    _ => libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0),
                }
            };
            if result == 0 { "ok".into() } else { errno() }
        }
        "mount" => {
            // SAFETY: mount reads the strings given.
            let result = unsafe {
                libc::mount(
                    c"none".as_ptr(),
                    c"/tmp".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if result == 0 { "ok".into() } else { errno() }
        }
        "connect" => match connect(rest) {
            Ok(_) => "ok".into(),
            Err(e) => format!("error: {e}"),
        },
        "proxy" => {
            let proxy = std::env::var("HTTPS_PROXY").unwrap_or_default();
            let address = proxy.trim_start_matches("http://").trim_end_matches('/');
            let mut stream = match connect(address) {
                Ok(stream) => stream,
                Err(e) => return format!("error: the proxy {proxy:?}: {e}"),
            };
            let request = format!("CONNECT {rest} HTTP/1.1\r\nHost: {rest}\r\n\r\n");
            if let Err(e) = stream.write_all(request.as_bytes()) {
                return format!("error: {e}");
            }
            let mut buf = [0u8; 512];
            let n = stream.read(&mut buf).unwrap_or(0);
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            format!("ok {}", text.lines().next().unwrap_or_default())
        }
        "forkbomb" => {
            let limit: usize = rest.parse().unwrap_or(1000);
            let mut children = Vec::new();
            let mut error = String::from("none");
            for _ in 0..limit {
                // SAFETY: the child only waits to be killed.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    loop {
                        // SAFETY: the forked child sleeps until it is killed.
                        unsafe { libc::pause() };
                    }
                }
                if pid < 0 {
                    error = errno();
                    break;
                }
                children.push(pid);
            }
            let forked = children.len();
            for pid in children {
                // SAFETY: our own children.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
            }
            format!("ok forked={forked} {error}")
        }
        "alloc" => {
            let mib: usize = rest.parse().unwrap_or(1);
            let mut blocks: Vec<Vec<u8>> = Vec::new();
            for _ in 0..mib {
                blocks.push(vec![1u8; 1 << 20]);
            }
            format!("ok allocated {} MiB", blocks.len())
        }
        "self-sandbox" => self_sandbox(rest),
        "model" => {
            let (count, text) = rest.split_once(' ').unwrap_or((rest, ""));
            let key = std::env::var("ANTHROPIC_API_KEY").unwrap_or_default();
            let mut statuses = Vec::new();
            let mut last = String::new();
            for _ in 0..count.parse::<usize>().unwrap_or(1) {
                match model_call(&key, text) {
                    Ok((status, body)) => {
                        statuses.push(status.to_string());
                        last = body;
                    }
                    Err(e) => return format!("error: {e}"),
                }
            }
            format!("ok {}\n{last}", statuses.join(","))
        }
        "model-key" => {
            let (key, text) = rest.split_once(' ').unwrap_or((rest, ""));
            match model_call(key, text) {
                Ok((status, body)) => format!("ok {status}\n{body}"),
                Err(e) => format!("error: {e}"),
            }
        }
        "exit" => std::process::exit(rest.parse().unwrap_or(0)),
        _ => format!("error: unknown command {verb:?}"),
    }
}

fn connect(address: &str) -> std::io::Result<TcpStream> {
    let target = address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    TcpStream::connect_timeout(&target, Duration::from_secs(3))
}

/// What Codex does to the commands it runs (Landlock + seccomp, no privilege needed), in a
/// forked child: writes only beneath `dir`, and no new sockets. Answers what the child saw.
fn self_sandbox(dir: &str) -> String {
    const WRITE_FILE: u64 = 1 << 1;
    const REMOVE_FILE: u64 = 1 << 5;
    const MAKE_DIR: u64 = 1 << 7;
    const MAKE_REG: u64 = 1 << 8;
    const HANDLED: u64 = WRITE_FILE | REMOVE_FILE | MAKE_DIR | MAKE_REG;
    #[repr(C)]
    struct RulesetAttr {
        handled_access_fs: u64,
    }
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    let Ok(inside) = std::ffi::CString::new(dir) else {
        return "error: a path with a NUL".into();
    };
    let (mut fds, outside) = (
        [0; 2],
        std::ffi::CString::new("/tmp/outside-the-self-sandbox"),
    );
    let outside = outside.expect("no NUL");
    let file_inside = std::ffi::CString::new(format!("{dir}/written-inside")).expect("no NUL");
    // SAFETY: a pipe into the fds array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return errno();
    }
    // SAFETY: the child makes raw calls only (this agent has one thread) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: raw calls in the forked child on values prepared before the fork.
        unsafe {
            let report = |byte: u8| {
                libc::write(fds[1], (&byte as *const u8).cast(), 1);
            };
            let attr = RulesetAttr {
                handled_access_fs: HANDLED,
            };
            let ruleset = libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const RulesetAttr,
                std::mem::size_of::<RulesetAttr>(),
                0u32,
            ) as i32;
            let parent = libc::open(inside.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            let rule = PathBeneath {
                allowed_access: HANDLED,
                parent_fd: parent,
            };
            let added = libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset,
                1u32, // LANDLOCK_RULE_PATH_BENEATH
                &rule as *const PathBeneath,
                0u32,
            );
            let restricted = libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32);
            if ruleset < 0 || parent < 0 || added != 0 || restricted != 0 {
                report(b'L');
                libc::_exit(1);
            }
            // A filter of its own: socket() answers EACCES, everything else runs.
            let mut program = [
                libc::sock_filter {
                    code: 0x20,
                    jt: 0,
                    jf: 0,
                    k: 0,
                }, // ld nr
                libc::sock_filter {
                    code: 0x15, // jeq
                    jt: 0,
                    jf: 1,
                    k: libc::SYS_socket as u32,
                },
                libc::sock_filter {
                    code: 0x06, // ret
                    jt: 0,
                    jf: 0,
                    k: libc::SECCOMP_RET_ERRNO | libc::EACCES as u32,
                },
                libc::sock_filter {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: libc::SECCOMP_RET_ALLOW,
                },
            ];
            let prog = libc::sock_fprog {
                len: program.len() as u16,
                filter: program.as_mut_ptr(),
            };
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) != 0
            {
                report(b'S');
                libc::_exit(1);
            }
            let create = libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC;
            let wrote_inside = libc::open(file_inside.as_ptr(), create, 0o600) >= 0;
            let wrote_outside = libc::open(outside.as_ptr(), create, 0o600) >= 0;
            let outside_errno = *libc::__errno_location();
            let socket = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            let socket_errno = *libc::__errno_location();
            report(if wrote_inside { b'i' } else { b'-' });
            report(match (wrote_outside, outside_errno) {
                (false, libc::EACCES) => b'o',
                _ => b'-',
            });
            report(match (socket, socket_errno) {
                (-1, libc::EACCES) => b's',
                _ => b'-',
            });
            libc::_exit(0);
        }
    }
    // SAFETY: our end of the pipe; the child's write end closed here.
    unsafe { libc::close(fds[1]) };
    // Until the child's end closes: its reports come one byte at a time.
    let mut seen = [0u8; 3];
    let mut n = 0usize;
    while n < seen.len() {
        // SAFETY: reads into the rest of the local buffer.
        let got = unsafe { libc::read(fds[0], seen[n..].as_mut_ptr().cast(), seen.len() - n) };
        if got <= 0 {
            break;
        }
        n += got as usize;
    }
    // SAFETY: our own child and descriptor.
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        libc::close(fds[0]);
    }
    match &seen[..n] {
        b"ios" => "ok wrote beneath its directory, refused elsewhere, no sockets".into(),
        b"L" => "error: Landlock refused".into(),
        b"S" => "error: a seccomp filter of its own was refused".into(),
        other => format!("error: saw {:?}", String::from_utf8_lossy(other)),
    }
}

/// One non-streamed Messages call to `$ANTHROPIC_BASE_URL` (a plain `http://host:port/prefix`),
/// offering a tool as an agent's turn does: the status and the body.
fn model_call(key: &str, text: &str) -> std::io::Result<(u16, String)> {
    let base = std::env::var("ANTHROPIC_BASE_URL").unwrap_or_default();
    let rest = base
        .strip_prefix("http://")
        .ok_or_else(|| std::io::Error::other(format!("ANTHROPIC_BASE_URL is {base:?}")))?;
    let (authority, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let body = json!({
        "model": "claude-hostile",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
        "tools": [{"name": "Write", "description": "writes a file",
                   "input_schema": {"type": "object", "properties": {}}}],
    })
    .to_string();
    let mut stream = TcpStream::connect(authority)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "POST /{prefix}/v1/messages HTTP/1.1\r\nHost: {authority}\r\nx-api-key: {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    Ok((status, body.chars().take(2000).collect()))
}
