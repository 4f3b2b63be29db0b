//! Thin wrappers over the Linux calls the box is built with that `std` does not offer: the new
//! mount API (`open_tree`, `move_mount`, `mount_setattr`), `openat2`, `pivot_root`, a fork-like
//! `clone` into new namespaces, and file descriptors over a Unix socket. Each turns `-1` into an
//! `io::Error` naming the call, so a failure reads as what the box could not do.

use std::{
    ffi::{CStr, CString},
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

/// An `io::Error` from `errno`, prefixed with what was being done.
pub(crate) fn last_error(what: impl std::fmt::Display) -> io::Error {
    let error = io::Error::last_os_error();
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

fn check(result: libc::c_long, what: impl std::fmt::Display) -> io::Result<libc::c_long> {
    if result < 0 {
        Err(last_error(what))
    } else {
        Ok(result)
    }
}

pub(crate) fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds a NUL byte"))
}

/// Opens `path` as an `O_PATH` handle without following any symbolic link on the way (the
/// harness gives canonical paths: a link found now was put there since it checked).
pub(crate) fn open_path_no_symlinks(path: &Path) -> io::Result<OwnedFd> {
    let c_path = cstring(path)?;
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads the path and `how` (of the size given) and returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = check(fd, format_args!("opening {}", path.display()))?;
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Opens `path` as an `O_PATH` handle, following links (system paths).
pub(crate) fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c_path = cstring(path)?;
    // SAFETY: open returns a new fd or -1.
    let fd = unsafe { libc::open(c_path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    let fd = check(
        fd as libc::c_long,
        format_args!("opening {}", path.display()),
    )?;
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A detached copy of the mount tree at `fd` (with the mounts below it), to be attached
/// elsewhere with [`move_mount`].
pub(crate) fn clone_tree(fd: &OwnedFd, what: &Path) -> io::Result<OwnedFd> {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC as libc::c_uint
        | libc::AT_RECURSIVE as libc::c_uint
        | libc::AT_EMPTY_PATH as libc::c_uint;
    // SAFETY: open_tree reads an empty path relative to the fd and returns a new fd or -1.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) };
    let tree = check(
        tree,
        format_args!("copying the mount of {}", what.display()),
    )?;
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(tree as RawFd) })
}

/// Sets `attr_set` (and an id mapping, when `userns` is given) on every mount of a detached
/// tree.
pub(crate) fn set_tree_attributes(
    tree: &OwnedFd,
    attr_set: u64,
    userns: Option<&OwnedFd>,
    what: &Path,
) -> io::Result<()> {
    let mut attr: libc::mount_attr = unsafe { std::mem::zeroed() };
    attr.attr_set = attr_set;
    if let Some(userns) = userns {
        attr.attr_set |= libc::MOUNT_ATTR_IDMAP;
        attr.userns_fd = userns.as_raw_fd() as u64;
    }
    // SAFETY: mount_setattr reads `attr` of the size given.
    let result = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    check(
        result,
        format_args!("setting the mount options of {}", what.display()),
    )?;
    Ok(())
}

/// Sets `attr_set` on the one mount at `path` (not those below it).
pub(crate) fn set_mount_attributes(path: &Path, attr_set: u64) -> io::Result<()> {
    let c_path = cstring(path)?;
    let mut attr: libc::mount_attr = unsafe { std::mem::zeroed() };
    attr.attr_set = attr_set;
    // SAFETY: as in `set_tree_attributes`.
    let result = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            0 as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    check(
        result,
        format_args!("setting the mount options of {}", path.display()),
    )?;
    Ok(())
}

/// Attaches a detached tree at `target`.
pub(crate) fn move_mount(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    let c_target = cstring(target)?;
    // SAFETY: move_mount reads two paths and returns 0 or -1.
    let result = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c_target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(result, format_args!("mounting on {}", target.display()))?;
    Ok(())
}

/// `mount(2)` with text arguments.
pub(crate) fn mount(
    source: &CStr,
    target: &Path,
    fstype: &CStr,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let c_target = cstring(target)?;
    // SAFETY: mount reads the strings given.
    let result = unsafe {
        libc::mount(
            source.as_ptr(),
            c_target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    check(
        result as libc::c_long,
        format_args!(
            "mounting {} on {}",
            fstype.to_string_lossy(),
            target.display()
        ),
    )?;
    Ok(())
}

/// Makes every mount of this (new) mount namespace private, so nothing done here reaches the
/// host's.
pub(crate) fn make_all_private() -> io::Result<()> {
    // SAFETY: mount with a null source and type only changes propagation.
    let result = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    check(result as libc::c_long, "making the mounts private")?;
    Ok(())
}

/// `pivot_root(new_root, put_old)`.
pub(crate) fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: pivot_root reads two paths.
    let result =
        unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) };
    check(result, "pivot_root")?;
    Ok(())
}

/// Detaches the mount at `path` (and everything below it).
pub(crate) fn detach(path: &CStr) -> io::Result<()> {
    // SAFETY: umount2 reads a path.
    let result = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    check(result as libc::c_long, "detaching the old root")?;
    Ok(())
}

/// A fork into new namespaces (`flags` are `CLONE_NEW*`): 0 in the child, its pid in the
/// parent. Only for a single-threaded process, like `fork`.
pub(crate) fn clone_into(flags: libc::c_int) -> io::Result<libc::pid_t> {
    // SAFETY: with a null stack, clone behaves like fork (the child runs on a copy of the
    // caller's stack); the caller is single-threaded.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    check(pid, "creating the box's namespaces (clone)").map(|pid| pid as libc::pid_t)
}

/// `fork()`.
pub(crate) fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: the caller is single-threaded.
    let pid = unsafe { libc::fork() };
    check(pid as libc::c_long, "fork").map(|pid| pid as libc::pid_t)
}

/// A connected pair of Unix stream sockets, both close-on-exec.
/// A pidfd of `pid` (in this process's PID namespace); close-on-exec.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(last_error("opening a pidfd"));
    }
    // SAFETY: a fresh descriptor, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits up to `timeout` for the process behind `pidfd` to end; whether it has.
pub(crate) fn pidfd_wait(pidfd: &OwnedFd, timeout: std::time::Duration) -> bool {
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    loop {
        // SAFETY: poll reads and writes the one pollfd.
        let result = unsafe { libc::poll(&mut poll, 1, millis) };
        if result >= 0 {
            return result > 0;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// SIGKILL through a pidfd; an ended process is no error.
pub(crate) fn pidfd_kill(pidfd: &OwnedFd) {
    // SAFETY: pidfd_send_signal takes the descriptor, a signal, no info and no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

pub(crate) fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two fds into the array.
    let result = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    check(result as libc::c_long, "socketpair")?;
    // SAFETY: two fresh fds we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A pipe, both ends close-on-exec: (read, write).
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    let result = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    check(result as libc::c_long, "pipe")?;
    // SAFETY: two fresh fds we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The most descriptors one message carries.
pub(crate) const MAX_PASSED_FDS: usize = 16;

/// Sends `bytes` with `fds` attached over a Unix socket.
pub(crate) fn send_with_fds(socket: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_PASSED_FDS {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut control = vec![0u8; space.max(1)];
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    if !fds.is_empty() {
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        // SAFETY: the control buffer is CMSG_SPACE bytes for this many fds; the header and its
        // data are written inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(header).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    let mut sent = 0;
    while sent < bytes.len() {
        // SAFETY: the message points at live buffers.
        let n = unsafe { libc::sendmsg(socket, &message, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        sent += n as usize;
        // The descriptors travel with the first bytes only.
        message.msg_control = std::ptr::null_mut();
        message.msg_controllen = 0;
        iov.iov_base = bytes[sent..].as_ptr() as *mut libc::c_void;
        iov.iov_len = bytes.len() - sent;
        message.msg_iov = &mut iov;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and any descriptors attached to them (close-on-exec).
pub(crate) fn recv_with_fds(socket: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a size computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_PASSED_FDS * std::mem::size_of::<RawFd>()) as u32) }
        as usize;
    let mut control = vec![0u8; space];
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = space as _;
    let n = loop {
        // SAFETY: the message points at live buffers of the sizes given.
        let n = unsafe { libc::recvmsg(socket, &mut message, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote, within msg_controllen.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                let len = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(*data.add(i)));
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    Ok((n, fds))
}

/// Writes all of `bytes` to a raw descriptor.
pub(crate) fn write_all(fd: RawFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: write reads from a live buffer.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// Reads until end of input or `limit` bytes.
pub(crate) fn read_to_end(fd: RawFd, limit: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: read writes into a live buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n as usize]);
        if out.len() > limit {
            return Err(io::Error::other("input over its limit"));
        }
    }
}
