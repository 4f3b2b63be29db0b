//! `agent-harness sandbox-exec`: builds one box and starts the agent in it. The harness starts
//! it as the runtime's process (its group leader, marked, with the runtime's stdio) and sends it
//! a [`BoxSpec`] over the control socket on descriptor [`CONTROL_FD`]. Three processes:
//!
//! - the **launcher** (this process, on the host): joins the runtime's cgroups, prepares
//!   id-mapped copies of the writable mounts when it runs as root, then forks the box's first
//!   process into new user, mount, PID, IPC, UTS, cgroup and (unless the network is open)
//!   network namespaces, writes its id maps, and waits for it. It ignores SIGTERM: a graceful
//!   stop reaches the agent directly (the whole group gets it), and the launcher must outlive
//!   the agent's grace — if it died first, the box would die with it at once. It ends as the
//!   agent ended (the same exit code or signal), so the harness sees the agent's own exit.
//! - the box's **init** (PID 1 inside): builds the file system (a read-only tmpfs root with the
//!   system's read-only mounts, the cwd and HOME read-write, a private `/tmp`, `/proc`, `/dev`,
//!   a generated `/etc/passwd`), brings up loopback and opens the listening sockets the harness
//!   serves, starts the agent, reports ready (or what failed) to the harness, and reaps. When the
//!   agent exits, init exits and the kernel kills whatever is left in the box; after a SIGTERM
//!   (a graceful stop) it waits instead for every process of the box, so helpers still writing
//!   their state get the runtime's whole grace.
//! - the **agent**: no capabilities, `no_new_privs`, the seccomp filter, the configured uid and
//!   gid, then `exec`.
//!
//! Only raw system calls run here; the process is single-threaded, so the forks are safe.

use std::{
    ffi::{CString, OsStr},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
};

use super::{
    seccomp,
    spec::{Access, BoxMount, BoxNetwork, BoxReply, BoxSpec, CONTROL_FD, MAX_MESSAGE_BYTES},
    sys,
};

/// Where init builds the new root before it becomes `/`: the host's `/tmp`, shadowed in this
/// mount namespace only (every host path the box shows was opened before).
const STAGING: &str = "/tmp";
/// The old root, under the new one until it is detached.
const OLD_ROOT: &str = ".harness-old-root";

/// Exit code when the box could not be built or the program not started.
const FAILED: i32 = 125;

/// The `sandbox-exec` subcommand; never returns normally when the agent starts.
pub fn main() -> i32 {
    // SAFETY: descriptor 3 was placed there by the harness for this process alone.
    let control = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    let spec = match read_spec(&control) {
        Ok(spec) => spec,
        Err(error) => {
            report(
                &control,
                &format!("the box's spec could not be read: {error}"),
            );
            return FAILED;
        }
    };
    let mut control = Some(control);
    let error = launch(&mut control, &spec);
    // Reported by this process only while the box's init has not taken the socket over.
    if let Some(control) = control {
        report(&control, &error.to_string());
    }
    eprintln!("sandbox: {error}");
    FAILED
}

fn read_spec(control: &OwnedFd) -> io::Result<BoxSpec> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let (n, _) = sys::recv_with_fds(control.as_raw_fd(), &mut buf)?;
        if n == 0 {
            return Err(io::Error::other("the harness closed the control socket"));
        }
        bytes.extend_from_slice(&buf[..n]);
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(io::Error::other("the spec is over its size limit"));
        }
        if let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            return serde_json::from_slice(&bytes[..end]).map_err(io::Error::other);
        }
    }
}

/// Sends the one answer; a harness that went away is not told.
fn report(control: &OwnedFd, error: &str) {
    send_reply(
        control,
        &BoxReply::Failed {
            error: error.to_owned(),
        },
        &[],
    );
}

fn send_reply(control: &OwnedFd, reply: &BoxReply, fds: &[RawFd]) {
    let mut line = serde_json::to_vec(reply).expect("a reply serialises");
    line.push(b'\n');
    let _ = sys::send_with_fds(control.as_raw_fd(), &line, fds);
}

enum Never {}

/// The launcher's part (module doc); returns only on failure. `control` is taken once the box's
/// init answers the harness instead of this process.
fn launch(control: &mut Option<OwnedFd>, spec: &BoxSpec) -> io::Error {
    match launch_inner(control, spec) {
        Ok(never) => match never {},
        Err(error) => error,
    }
}

fn launch_inner(control: &mut Option<OwnedFd>, spec: &BoxSpec) -> io::Result<Never> {
    // Joined before anything starts, so nothing of the box escapes its limits.
    for cgroup in &spec.cgroups {
        join_cgroup(cgroup)?;
    }
    // SAFETY: plain getters.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let as_root = euid == 0;
    let (uid, gid) = if as_root {
        (spec.uid, spec.gid)
    } else {
        (euid, egid)
    };
    // Writable host paths owned by someone else are shown to the agent as its own through an
    // id-mapped mount (root only: the kernel asks for privilege over the file system). Built
    // here, on the host, then attached inside the box.
    let mut mapped = Vec::new();
    if as_root {
        // A layered share is mapped too: its files must be the agent's to be copied up into
        // its layer when written (the shared files themselves stay read-only).
        let writable = [
            (spec.cwd.as_path(), Access::ReadWrite),
            (spec.home.as_path(), Access::ReadWrite),
        ]
        .into_iter()
        .chain(
            spec.mounts
                .iter()
                .filter(|m| matches!(m.access, Access::ReadWrite | Access::Layered))
                .map(|m| (m.path.as_path(), m.access)),
        );
        for (path, access) in writable {
            if let Some(tree) = id_mapped_tree(path, uid, gid, access)? {
                mapped.push((path.to_path_buf(), tree));
            }
        }
    }
    let (go_read, go_write) = sys::pipe()?;
    let (status_read, status_write) = sys::pipe()?;
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    if matches!(spec.network, BoxNetwork::Own { .. }) {
        flags |= libc::CLONE_NEWNET;
    }
    let pid = sys::clone_into(flags).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!(
                "{error}; the kernel refused new namespaces: user namespaces must be allowed \
                 (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone = 1 where \
                 it exists, and no AppArmor or seccomp policy forbidding them; in Kubernetes see \
                 docs/security.md), or set sandbox = \"off\" on the profile"
            ),
        )
    })?;
    if pid == 0 {
        drop(go_write);
        drop(status_read);
        let control = control
            .take()
            .expect("the launcher holds the control socket");
        // The box's first process: never returns.
        let error = match init(&control, spec, uid, gid, &go_read, status_write, mapped) {
            Ok(never) => match never {},
            Err(error) => error,
        };
        report(&control, &error.to_string());
        eprintln!("sandbox: {error}");
        // SAFETY: leaving the child without running the parent's exit handlers.
        unsafe { libc::_exit(FAILED) }
    }
    drop(go_read);
    drop(status_write);
    drop(mapped);
    if let Err(error) = write_id_maps(pid, as_root, uid, gid, euid, egid) {
        // SAFETY: the child is ours; it dies before it did anything.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait(pid);
        return Err(error);
    }
    // The control socket is the box's from here on: the harness hears end of input only once
    // init has answered (or died).
    drop(control.take());
    sys::write_all(go_write.as_raw_fd(), b"g")?;
    drop(go_write);
    // Only the agent holds the runtime's stdin and stdout, so their ends mean what they say.
    redirect_to_null(&[0, 1]);
    ignore_stop_signals();
    let box_status = wait(pid);
    let agent_status = sys::read_to_end(status_read.as_raw_fd(), 64)
        .ok()
        .and_then(|bytes| <[u8; 4]>::try_from(bytes.as_slice()).ok())
        .map(i32::from_ne_bytes);
    end_as(agent_status.unwrap_or(box_status))
}

/// Moves this process into a cgroup (its directory).
fn join_cgroup(dir: &Path) -> io::Result<()> {
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("joining the runtime's cgroup {}: {e}", dir.display()),
        )
    })
}

/// An id-mapped, detached copy of the mount of `path` that shows its owner as `uid`/`gid`, when
/// its owner is someone else.
fn id_mapped_tree(path: &Path, uid: u32, gid: u32, access: Access) -> io::Result<Option<OwnedFd>> {
    use std::os::unix::fs::MetadataExt;
    let fd = sys::open_path_no_symlinks(path)?;
    let meta = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if meta.uid() == uid && meta.gid() == gid {
        return Ok(None);
    }
    let userns = mapping_namespace(meta.uid(), uid, meta.gid(), gid)?;
    let tree = sys::clone_tree(&fd, path)?;
    sys::set_tree_attributes(&tree, attributes(access), Some(&userns), path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{e} (an id-mapped mount lets the agent, uid {uid}, use a directory owned by \
                 uid {}; it needs Linux 5.12 or later and a file system that supports it; or \
                 make the directory owned by uid {uid})",
                meta.uid()
            ),
        )
    })?;
    Ok(Some(tree))
}

/// A user namespace that maps `from_uid`/`from_gid` to `to_uid`/`to_gid`, for an id-mapped mount:
/// a short-lived child enters it, the maps are written from here, and a handle keeps it.
fn mapping_namespace(
    from_uid: u32,
    to_uid: u32,
    from_gid: u32,
    to_gid: u32,
) -> io::Result<OwnedFd> {
    let (ready_read, ready_write) = sys::pipe()?;
    let (done_read, done_write) = sys::pipe()?;
    let pid = sys::fork()?;
    if pid == 0 {
        drop(ready_read);
        drop(done_write);
        // SAFETY: raw calls in a forked child, which leaves with _exit.
        let entered = unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0;
        if entered {
            let _ = sys::write_all(ready_write.as_raw_fd(), b"r");
        }
        // End of input tells the parent it is in (or could not get in); it then waits for the
        // parent's end of input before leaving the namespace to its handle.
        drop(ready_write);
        if entered {
            let _ = sys::read_to_end(done_read.as_raw_fd(), 1);
        }
        // SAFETY: leaving the forked child.
        unsafe { libc::_exit(i32::from(!entered)) }
    }
    drop(ready_write);
    drop(done_read);
    let result = (|| {
        let ready = sys::read_to_end(ready_read.as_raw_fd(), 1).unwrap_or_default();
        if ready.is_empty() {
            return Err(io::Error::other(
                "could not create a user namespace for an id mapping",
            ));
        }
        std::fs::write(
            format!("/proc/{pid}/uid_map"),
            format!("{from_uid} {to_uid} 1\n"),
        )?;
        std::fs::write(
            format!("/proc/{pid}/gid_map"),
            format!("{from_gid} {to_gid} 1\n"),
        )?;
        let userns = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
        Ok(OwnedFd::from(userns))
    })();
    drop(done_write);
    wait(pid);
    result
}

/// Writes the box's uid and gid maps from outside it. As root the agent's configured ids map to
/// themselves; unprivileged, the launcher's own ids do (all a process may map without privilege).
fn write_id_maps(
    pid: libc::pid_t,
    as_root: bool,
    uid: u32,
    gid: u32,
    euid: u32,
    egid: u32,
) -> io::Result<()> {
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/{pid}/{file}"), text)
            .map_err(|e| io::Error::new(e.kind(), format!("writing the box's {file}: {e}")))
    };
    if !as_root {
        // Without privilege the group map needs supplementary groups switched off.
        write("setgroups", "deny".to_owned())?;
        write("uid_map", format!("{euid} {euid} 1\n"))?;
        write("gid_map", format!("{egid} {egid} 1\n"))?;
    } else {
        write("uid_map", format!("{uid} {uid} 1\n"))?;
        write("gid_map", format!("{gid} {gid} 1\n"))?;
    }
    Ok(())
}

/// Waits for a child; its wait status.
fn wait(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status.
        let result = unsafe { libc::waitpid(pid, &mut status, 0) };
        if result == pid {
            return status;
        }
        if result < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return libc::EXIT_FAILURE << 8;
        }
    }
}

/// Ends this process the way `status` says a process ended: the same exit code, or the same
/// signal.
fn end_as(status: i32) -> ! {
    // SAFETY: plain calls that end the process.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

const STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

fn ignore_stop_signals() {
    for signal in STOP_SIGNALS {
        // SAFETY: setting a disposition.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
}

fn redirect_to_null(fds: &[RawFd]) {
    // SAFETY: opening /dev/null and duplicating it over descriptors this process owns.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null < 0 {
            return;
        }
        for fd in fds {
            libc::dup2(null, *fd);
        }
        libc::close(null);
    }
}

/// The box's first process (module doc).
#[allow(clippy::too_many_arguments)]
fn init(
    control: &OwnedFd,
    spec: &BoxSpec,
    uid: u32,
    gid: u32,
    go: &OwnedFd,
    status: OwnedFd,
    mapped: Vec<(PathBuf, OwnedFd)>,
) -> io::Result<Never> {
    // SAFETY: plain calls. Die with the launcher; and if it is already gone, stop.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    }
    if sys::read_to_end(go.as_raw_fd(), 1)?.is_empty() {
        return Err(io::Error::other(
            "the launcher went away before the box was built",
        ));
    }
    sys::make_all_private()?;
    // Host paths are looked up with the launcher's own ids (as root: the owner of `/root` and
    // the like, where an operator may keep an interpreter the box shows); everything made
    // after belongs to the agent.
    let sources = open_sources(spec, mapped)?;
    become_agent_ids(uid, gid)?;
    let listeners = build_box(spec, uid, gid, sources)?;
    // SIGCHLD and the stop signals are taken with sigwaitinfo below: blocked from now on, so
    // none is lost between the fork and the wait; the agent unblocks them before its exec.
    let signals = blocked_signals();
    let (exec_read, exec_write) = sys::pipe()?;
    let agent = sys::fork()?;
    if agent == 0 {
        drop(exec_read);
        let error = start_agent(spec, &signals);
        let code = error.raw_os_error().unwrap_or(libc::EIO);
        let _ = sys::write_all(exec_write.as_raw_fd(), &code.to_ne_bytes());
        // SAFETY: leaving the forked child.
        unsafe { libc::_exit(127) }
    }
    drop(exec_write);
    let exec_error = sys::read_to_end(exec_read.as_raw_fd(), 16)?;
    if let Ok(code) = <[u8; 4]>::try_from(exec_error.as_slice()) {
        let error = io::Error::from_raw_os_error(i32::from_ne_bytes(code));
        return Err(io::Error::new(
            error.kind(),
            format!(
                "could not start {:?} in the box: {error} (is it on the box's PATH, or under \
                 one of the profile's sandbox.read_only paths?)",
                spec.program
            ),
        ));
    }
    // A pidfd of this process (PID 1 here) lets the harness wait for the whole box to end,
    // even when the launcher it started was killed first.
    let myself = sys::pidfd_open(1)?;
    let fds: Vec<RawFd> = listeners
        .iter()
        .chain(std::iter::once(&myself))
        .map(|fd| fd.as_raw_fd())
        .collect();
    send_reply(control, &BoxReply::Ready, &fds);
    drop(listeners);
    drop(myself);
    redirect_to_null(&[0, 1, CONTROL_FD]);
    drop_capabilities();
    // SAFETY: plain prctl: nothing in the box may read this process's memory.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
    let status_code = reap(agent, &signals);
    let _ = sys::write_all(status.as_raw_fd(), &status_code.to_ne_bytes());
    // SAFETY: init's end; the kernel kills what is left in the box.
    unsafe {
        libc::_exit(if libc::WIFEXITED(status_code) {
            libc::WEXITSTATUS(status_code)
        } else {
            128 + libc::WTERMSIG(status_code)
        })
    }
}

/// Takes the agent's uid and gid for good while keeping the capabilities this process has in
/// the box's user namespace (it still has to mount), so whatever it creates belongs to the agent.
fn become_agent_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: credential calls on this single-threaded process.
    unsafe {
        if libc::prctl(libc::PR_SET_KEEPCAPS, 1) != 0 {
            return Err(sys::last_error("keeping capabilities"));
        }
        // Supplementary groups may be off (unprivileged maps): then there is nothing to drop.
        libc::setgroups(0, std::ptr::null());
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(sys::last_error(format_args!("taking gid {gid}")));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(sys::last_error(format_args!("taking uid {uid}")));
        }
    }
    raise_all_capabilities()
}

/// The capability sets, as the kernel's version 3 interface has them.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn capset(data: [CapData; 2]) -> io::Result<()> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads the header and two data structs.
    let result = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if result != 0 {
        return Err(sys::last_error("setting capabilities"));
    }
    Ok(())
}

fn capget() -> io::Result<[CapData; 2]> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two data structs.
    let result = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if result != 0 {
        return Err(sys::last_error("reading capabilities"));
    }
    Ok(data)
}

/// Makes every permitted capability effective again (a uid change clears the effective set).
fn raise_all_capabilities() -> io::Result<()> {
    let mut data = capget()?;
    for part in &mut data {
        part.effective = part.permitted;
    }
    capset(data)
}

fn drop_capabilities() {
    let _ = capset([CapData::default(); 2]);
}

/// Every host path the box shows, opened before the staging root hides any of them.
fn open_sources(spec: &BoxSpec, mut mapped: Vec<(PathBuf, OwnedFd)>) -> io::Result<Vec<Source>> {
    let mut sources = Vec::new();
    for mount in spec.mounts.iter().cloned() {
        if mount.access == Access::Hidden {
            let is_dir = std::fs::symlink_metadata(&mount.path).is_ok_and(|m| m.is_dir());
            sources.push(Source::Hidden { mount, is_dir });
            continue;
        }
        let kind = std::fs::symlink_metadata(&mount.path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", mount.path.display())))?;
        if kind.file_type().is_symlink() && mount.follow_links {
            sources.push(Source::Link(
                mount.path.clone(),
                std::fs::read_link(&mount.path)?,
            ));
            continue;
        }
        let fd = match mount.follow_links {
            true => sys::open_path(&mount.path)?,
            false => sys::open_path_no_symlinks(&mount.path)?,
        };
        sources.push(Source::Mount {
            is_dir: kind.is_dir(),
            mount,
            fd,
        });
    }
    for path in [&spec.home, &spec.cwd] {
        let mount = BoxMount {
            path: path.clone(),
            access: Access::ReadWrite,
            follow_links: false,
        };
        match mapped.iter().position(|(p, _)| p == path) {
            Some(at) => {
                let (_, tree) = mapped.swap_remove(at);
                sources.push(Source::Tree { mount, tree });
            }
            None => {
                let fd = sys::open_path_no_symlinks(path)?;
                sources.push(Source::Mount {
                    is_dir: true,
                    mount,
                    fd,
                });
            }
        }
    }
    // Writable extra mounts that needed a mapping use their prepared tree.
    for (path, tree) in mapped {
        if let Some(at) = sources
            .iter()
            .position(|s| matches!(s, Source::Mount { mount, .. } if mount.path == path))
        {
            let Source::Mount { mount, .. } = sources.remove(at) else {
                unreachable!()
            };
            sources.insert(at, Source::Tree { mount, tree });
        }
    }
    Ok(sources)
}

/// Builds the box's file system and network (module doc) from the opened host paths; the
/// listening sockets opened in it.
fn build_box(
    spec: &BoxSpec,
    uid: u32,
    gid: u32,
    mut sources: Vec<Source>,
) -> io::Result<Vec<OwnedFd>> {
    let staging = Path::new(STAGING);
    sys::mount(
        c"tmpfs",
        staging,
        c"tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(c"mode=0755,size=16m"),
    )?;
    let inside = |path: &Path| staging.join(path.strip_prefix("/").unwrap_or(path));
    // The box's own /proc, /dev and /tmp come first: host paths may be mounted below them.
    std::fs::create_dir_all(inside(Path::new("/proc")))?;
    sys::mount(
        c"proc",
        &inside(Path::new("/proc")),
        c"proc",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{e} (a new /proc for the box's PID namespace; container runtimes that mask \
                 parts of /proc forbid it: see docs/security.md)"
            ),
        )
    })?;
    build_dev(&inside(Path::new("/dev")))?;
    let tmp = inside(Path::new("/tmp"));
    std::fs::create_dir_all(&tmp)?;
    sys::mount(
        c"tmpfs",
        &tmp,
        c"tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(c"mode=1777"),
    )?;
    sources.sort_by_key(|s| s.path().components().count());
    // What each source needs in place: a covered directory makes room for what lies beneath it
    // before it turns read-only.
    let needs: Vec<(PathBuf, Need)> = sources.iter().map(Source::need).collect();
    let mut layers = 0;
    for source in sources {
        let target = inside(source.path());
        match source {
            Source::Link(_, to) => {
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::os::unix::fs::symlink(&to, &target)?;
            }
            Source::Mount { mount, fd, is_dir } => {
                make_mount_point(&target, is_dir)?;
                let tree = sys::clone_tree(&fd, &mount.path)?;
                sys::set_tree_attributes(&tree, attributes(mount.access), None, &mount.path)?;
                sys::move_mount(&tree, &target)?;
                if mount.access == Access::Layered && is_dir {
                    layers += 1;
                    layer_over(&target, &tmp.join(format!(".harness-layers/{layers}")))?;
                }
            }
            Source::Hidden { is_dir, mount } => {
                // Under a read-only mount the path exists already; elsewhere it is made here.
                if !target.exists() {
                    make_mount_point(&target, is_dir)?;
                }
                if is_dir {
                    // What is shown beneath a covered directory (an agent's HOME under a data
                    // dir the cwd holds) gets its mount point now, then the cover turns
                    // read-only: it shows those paths and nothing else.
                    let beneath: Vec<&(PathBuf, Need)> = needs
                        .iter()
                        .filter(|(p, _)| p.starts_with(&mount.path) && *p != mount.path)
                        .collect();
                    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                    let mode = match beneath.is_empty() {
                        true => c"mode=000,size=4k",
                        false => c"mode=0555,size=4k",
                    };
                    sys::mount(c"tmpfs", &target, c"tmpfs", flags, Some(mode))?;
                    for (path, need) in beneath {
                        let point = inside(path);
                        match need {
                            Need::Directory => make_mount_point(&point, true)?,
                            Need::File => make_mount_point(&point, false)?,
                            Need::Parent => {
                                if let Some(parent) = point.parent() {
                                    std::fs::create_dir_all(parent)?;
                                }
                            }
                        }
                    }
                    sys::mount(
                        c"none",
                        &target,
                        c"tmpfs",
                        flags | libc::MS_REMOUNT | libc::MS_RDONLY,
                        Some(mode),
                    )?;
                } else {
                    let null = sys::open_path(Path::new("/dev/null"))?;
                    let tree = sys::clone_tree(&null, Path::new("/dev/null"))?;
                    sys::set_tree_attributes(&tree, attributes(Access::ReadOnly), None, &target)?;
                    sys::move_mount(&tree, &target)?;
                }
            }
            Source::Tree { mount, tree } => {
                make_mount_point(&target, true)?;
                sys::move_mount(&tree, &target).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("{e} (the id-mapped mount of {})", mount.path.display()),
                    )
                })?;
                if mount.access == Access::Layered {
                    layers += 1;
                    layer_over(&target, &tmp.join(format!(".harness-layers/{layers}")))?;
                }
            }
        }
    }
    write_identity_files(&inside(Path::new("/etc")), spec, uid, gid)?;
    set_hostname(&spec.hostname)?;
    let listeners = match &spec.network {
        BoxNetwork::Host => Vec::new(),
        BoxNetwork::Own { listen } => {
            loopback_up()?;
            listen
                .iter()
                .map(|port| listen_on_loopback(*port))
                .collect::<io::Result<_>>()?
        }
    };
    enter_new_root(staging)?;
    Ok(listeners)
}

/// A host path to show in the box.
enum Source {
    /// The same symbolic link.
    Link(PathBuf, PathBuf),
    /// A bind of what `fd` names.
    Mount {
        mount: BoxMount,
        fd: OwnedFd,
        is_dir: bool,
    },
    /// A tree prepared on the host (id-mapped).
    Tree { mount: BoxMount, tree: OwnedFd },
    /// Covered over.
    Hidden { mount: BoxMount, is_dir: bool },
}

/// What a source needs made before it is mounted: a directory or a file to mount on, or (a
/// link) its parent.
#[derive(Clone, Copy)]
enum Need {
    Directory,
    File,
    Parent,
}

impl Source {
    fn need(&self) -> (PathBuf, Need) {
        let need = match self {
            Self::Link(..) => Need::Parent,
            Self::Mount { is_dir: false, .. } | Self::Hidden { is_dir: false, .. } => Need::File,
            _ => Need::Directory,
        };
        (self.path().to_path_buf(), need)
    }

    fn path(&self) -> &Path {
        match self {
            Self::Link(path, _) => path,
            Self::Mount { mount, .. } | Self::Tree { mount, .. } | Self::Hidden { mount, .. } => {
                &mount.path
            }
        }
    }
}

fn attributes(access: Access) -> u64 {
    let base = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    match access {
        Access::ReadWrite => base,
        Access::ReadOnly | Access::Hidden | Access::Layered => base | libc::MOUNT_ATTR_RDONLY,
    }
}

/// Puts an overlay on the read-only mount at `target`: reads see it, writes land in `layer`
/// (in the box's own `/tmp`), so the shared files never change.
fn layer_over(target: &Path, layer: &Path) -> io::Result<()> {
    let (upper, work) = (layer.join("upper"), layer.join("work"));
    std::fs::create_dir_all(&upper)?;
    std::fs::create_dir_all(&work)?;
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        target.display(),
        upper.display(),
        work.display()
    );
    let options = CString::new(options)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds a NUL byte"))?;
    sys::mount(
        c"overlay",
        target,
        c"overlay",
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&options),
    )
    .map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{e} (a layer over the shared {}: overlayfs in a user namespace needs Linux 5.11)",
                target.display()
            ),
        )
    })
}

/// The devices of `/dev` the box gets from the host (read-write: they are the harmless ones).
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// A target to mount on: a directory, or an empty file for a file. Existing ones (under a
/// read-only mount made before) are fine as they are.
fn make_mount_point(target: &Path, is_dir: bool) -> io::Result<()> {
    if target.exists() {
        return Ok(());
    }
    if is_dir {
        return std::fs::create_dir_all(target);
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::File::create(target).map(drop)
}

/// A small `/dev`: the harmless devices bound from the host, a private devpts and shm, and the
/// usual links.
fn build_dev(dev: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dev)?;
    sys::mount(
        c"tmpfs",
        dev,
        c"tmpfs",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"mode=0755,size=64k"),
    )?;
    for name in DEVICES {
        let host = Path::new("/dev").join(name);
        let Ok(fd) = sys::open_path(&host) else {
            continue;
        };
        let target = dev.join(name);
        std::fs::File::create(&target)?;
        let tree = sys::clone_tree(&fd, &host)?;
        sys::set_tree_attributes(
            &tree,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
            None,
            &host,
        )?;
        sys::move_mount(&tree, &target)?;
    }
    let pts = dev.join("pts");
    std::fs::create_dir_all(&pts)?;
    sys::mount(
        c"devpts",
        &pts,
        c"devpts",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"newinstance,ptmxmode=0666,mode=0620"),
    )?;
    std::os::unix::fs::symlink("pts/ptmx", dev.join("ptmx"))?;
    let shm = dev.join("shm");
    std::fs::create_dir_all(&shm)?;
    sys::mount(
        c"tmpfs",
        &shm,
        c"tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(c"mode=1777"),
    )?;
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(name))?;
    }
    Ok(())
}

/// `/etc/passwd`, `/etc/group`, `/etc/hosts` and `/etc/hostname` of the box: the agent's user
/// exists (Node's `os.userInfo()` throws without an entry), with its HOME.
fn write_identity_files(etc: &Path, spec: &BoxSpec, uid: u32, gid: u32) -> io::Result<()> {
    std::fs::create_dir_all(etc)?;
    let home = spec.home.display();
    let shell = ["/bin/bash", "/bin/sh"]
        .into_iter()
        .find(|s| Path::new(s).exists())
        .unwrap_or("/bin/sh");
    let mut passwd = format!("agent:x:{uid}:{gid}:agent:{home}:{shell}\n");
    if uid != 0 {
        passwd.insert_str(0, "root:x:0:0:root:/root:/usr/sbin/nologin\n");
    }
    if uid != 65534 {
        passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    }
    let mut group = format!("agent:x:{gid}:\n");
    if gid != 0 {
        group.insert_str(0, "root:x:0:\n");
    }
    if gid != 65534 {
        group.push_str("nogroup:x:65534:\n");
    }
    let hostname = &spec.hostname;
    let hosts = format!("127.0.0.1 localhost {hostname}\n::1 localhost ip6-localhost\n");
    for (name, text) in [
        ("passwd", passwd),
        ("group", group),
        ("hosts", hosts),
        ("hostname", format!("{hostname}\n")),
    ] {
        let path = etc.join(name);
        // A file the profile shows at this path is kept.
        if path.exists() {
            continue;
        }
        std::fs::write(path, text)?;
    }
    Ok(())
}

fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: sethostname reads the bytes given.
    let result = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    if result != 0 {
        return Err(sys::last_error("setting the box's host name"));
    }
    Ok(())
}

/// Brings up `lo` in the box's network namespace (it starts down).
fn loopback_up() -> io::Result<()> {
    // SAFETY: an ioctl on a datagram socket with an `ifreq` naming lo.
    unsafe {
        let socket = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if socket < 0 {
            return Err(sys::last_error("a socket to bring up loopback"));
        }
        let socket = OwnedFd::from_raw_fd(socket);
        let mut request: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            request.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) != 0 {
            return Err(sys::last_error("reading loopback's flags"));
        }
        request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) != 0 {
            return Err(sys::last_error("bringing up loopback"));
        }
    }
    Ok(())
}

/// A listening TCP socket on 127.0.0.1:`port` in the box's network namespace.
fn listen_on_loopback(port: u16) -> io::Result<OwnedFd> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("listening on 127.0.0.1:{port} in the box: {e}"),
        )
    })?;
    Ok(OwnedFd::from(listener))
}

/// Makes the staging root `/`, detaches the host's root, and makes the new root read-only.
fn enter_new_root(staging: &Path) -> io::Result<()> {
    std::env::set_current_dir(staging)?;
    std::fs::create_dir(OLD_ROOT)?;
    let old = CString::new(OLD_ROOT).expect("no NUL");
    sys::pivot_root(c".", &old)?;
    std::env::set_current_dir("/")?;
    let old_abs = CString::new(format!("/{OLD_ROOT}")).expect("no NUL");
    sys::detach(&old_abs)?;
    std::fs::remove_dir(format!("/{OLD_ROOT}"))?;
    sys::set_mount_attributes(
        Path::new("/"),
        libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
    )
}

/// The signals init takes with `sigwaitinfo`, blocked; the mask before, for the agent.
fn blocked_signals() -> (libc::sigset_t, libc::sigset_t) {
    // SAFETY: building and applying a signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for signal in STOP_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, &set, &mut before);
        (set, before)
    }
}

/// The agent's last steps before `exec`; returns only on failure.
fn start_agent(spec: &BoxSpec, signals: &(libc::sigset_t, libc::sigset_t)) -> io::Error {
    // SAFETY: raw calls in the forked child, which execs or leaves.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, &signals.1, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        // No capability can come back: not from the bounding set, not as ambient ones.
        for cap in 0..=63 {
            libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return io::Error::last_os_error();
        }
    }
    drop_capabilities();
    if let Err(error) = std::env::set_current_dir(&spec.cwd) {
        return error;
    }
    let program = match CString::new(spec.program.as_bytes()) {
        Ok(program) => program,
        Err(_) => return io::Error::from_raw_os_error(libc::EINVAL),
    };
    let args: Vec<CString> = std::iter::once(spec.program.as_str())
        .chain(spec.args.iter().map(String::as_str))
        .filter_map(|a| CString::new(a).ok())
        .collect();
    let env: Vec<CString> = spec
        .env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let filter = seccomp::program(spec.nested);
    if let Err(error) = seccomp::install(&filter) {
        return error;
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // The box's PATH decides where a bare program name is found.
    let path = spec
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    if spec.program.contains('/') {
        // SAFETY: execve with NUL-terminated arrays of live strings.
        unsafe { libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        return io::Error::last_os_error();
    }
    let mut last = io::Error::from_raw_os_error(libc::ENOENT);
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(OsStr::from_bytes(spec.program.as_bytes()));
        let Ok(candidate) = sys::cstring(&candidate) else {
            continue;
        };
        // SAFETY: as above.
        unsafe { libc::execve(candidate.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::ENOENT) {
            last = error;
        }
    }
    last
}

/// Init's wait: the agent's wait status. When the agent exits, init ends at once (the kernel
/// kills the rest of the box); after a stop signal it waits for every process of the box first.
fn reap(agent: libc::pid_t, signals: &(libc::sigset_t, libc::sigset_t)) -> i32 {
    let mut stopping = false;
    let mut agent_status = None;
    loop {
        // Collect every child that has ended.
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes the status.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid == agent {
                agent_status = Some(status);
            }
            if pid > 0 {
                continue;
            }
            let none_left =
                pid < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
            if let Some(status) = agent_status
                && (!stopping || none_left)
            {
                return status;
            }
            break;
        }
        // SAFETY: waiting for one of the blocked signals.
        let signal = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigwaitinfo(&signals.0, &mut info)
        };
        if STOP_SIGNALS.contains(&signal) {
            stopping = true;
        }
    }
}
