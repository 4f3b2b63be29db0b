//! The box's seccomp filter: everything is allowed but the calls an agent has no business
//! making and that widen what a kernel bug could reach: tracing other processes, mounting,
//! loading BPF or modules, key rings, perf, userfaultfd, io_uring (whose requests bypass
//! seccomp), new user namespaces, and making set-user-id or set-group-id files (an agent's cwd
//! may be shown to it through an id mapping: a set-uid file it made there would be the server's
//! on disk). Refused calls fail with `EPERM`; `clone3` with `ENOSYS`, because its flags sit
//! behind a pointer the filter cannot read, and C libraries then fall back to `clone`, whose
//! flags it can. Calls of another ABI (x32, i386) kill the process.
//!
//! The program is written out here instead of generated: it needs a range check on the call
//! number (x32's bit) and two different errors, which the generator crates do not express.

use std::io;

const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
/// The low 32 bits of argument `i` (both supported architectures are little-endian).
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// x86_64's bit that marks an x32 call number.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const fn ret_errno(errno: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (errno as u32 & libc::SECCOMP_RET_DATA)
}

/// The calls that build namespaces and mounts: refused unless the agent may build a sandbox of
/// its own (`nested`). In the box's own user namespace the agent has no capability, so the
/// kernel refuses them anyway; they take effect only in a user namespace the agent made.
const NESTING: &[libc::c_long] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
];

/// Calls refused outright (`nested`: but those a sandbox of the agent's own needs).
fn refused(nested: bool) -> Vec<libc::c_long> {
    let mut calls = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_process_madvise,
        libc::SYS_pidfd_getfd,
        libc::SYS_bpf,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_vhangup,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([libc::SYS_iopl, libc::SYS_ioperm, libc::SYS_uselib]);
    if !nested {
        calls.extend(NESTING);
    }
    calls
}

/// Calls refused when an argument has one of these bits: (call, argument, mask).
fn refused_with(nested: bool) -> Vec<(libc::c_long, u32, u32)> {
    let new_user = libc::CLONE_NEWUSER as u32;
    let set_id = libc::S_ISUID | libc::S_ISGID;
    let mut calls = vec![(libc::SYS_fchmod, 1, set_id)];
    if !nested {
        calls.extend([
            (libc::SYS_clone, 0, new_user),
            (libc::SYS_unshare, 0, new_user),
        ]);
    }
    calls.extend([
        (libc::SYS_fchmodat, 2, set_id),
        (libc::SYS_fchmodat2, 2, set_id),
    ]);
    #[cfg(target_arch = "x86_64")]
    calls.push((libc::SYS_chmod, 1, set_id));
    calls
}

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JGE_K: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
const JSET_K: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
const RET_K: u32 = libc::BPF_RET | libc::BPF_K;

/// The filter program (`nested`: the agent may build a sandbox of its own). Each rule reloads
/// the call number, so every jump is a short forward one.
pub(crate) fn program(nested: bool) -> Vec<libc::sock_filter> {
    let mut p = vec![
        statement(LD_W_ABS, SECCOMP_DATA_ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        statement(RET_K, RET_KILL),
        statement(LD_W_ABS, SECCOMP_DATA_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        p.push(jump(JGE_K, X32_SYSCALL_BIT, 0, 1));
        p.push(statement(RET_K, RET_KILL));
    }
    p.push(jump(JEQ_K, libc::SYS_clone3 as u32, 0, 1));
    p.push(statement(RET_K, ret_errno(libc::ENOSYS)));
    for call in refused(nested) {
        p.push(jump(JEQ_K, call as u32, 0, 1));
        p.push(statement(RET_K, ret_errno(libc::EPERM)));
    }
    for (call, arg, mask) in refused_with(nested) {
        // Not this call: skip the three statements that test its argument.
        p.push(jump(JEQ_K, call as u32, 0, 3));
        p.push(statement(LD_W_ABS, arg_low(arg)));
        p.push(jump(JSET_K, mask, 0, 1));
        p.push(statement(RET_K, ret_errno(libc::EPERM)));
        // Back to the call number for the next rule.
        p.push(statement(LD_W_ABS, SECCOMP_DATA_NR));
    }
    p.push(statement(RET_K, RET_ALLOW));
    p
}

/// Installs `program` on the calling thread; `no_new_privs` must be set already (it is what lets
/// an unprivileged process install a filter).
pub(crate) fn install(program: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: the kernel copies the program it is given.
    let result = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if result != 0 {
        return Err(super::sys::last_error("installing the seccomp filter"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `body` in a forked child under the filter; its exit code.
    fn under_filter(body: impl FnOnce() -> i32) -> i32 {
        under(program(false), body)
    }

    fn under(program: Vec<libc::sock_filter>, body: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child makes only raw system calls and leaves with _exit.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    libc::_exit(90);
                }
                let fprog = libc::sock_fprog {
                    len: program.len() as u16,
                    filter: program.as_ptr() as *mut libc::sock_filter,
                };
                if libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog) != 0 {
                    libc::_exit(91);
                }
                libc::_exit(body());
            }
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            assert!(libc::WIFEXITED(status), "the child died: {status:#x}");
            libc::WEXITSTATUS(status)
        }
    }

    fn errno() -> i32 {
        io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn the_filter_refuses_tracing_mounting_and_new_user_namespaces_and_allows_the_rest() {
        assert_eq!(
            under_filter(|| unsafe {
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == 0 || errno() != libc::EPERM {
                    return 1;
                }
                if libc::unshare(libc::CLONE_NEWUSER) == 0 || errno() != libc::EPERM {
                    return 2;
                }
                let none = std::ptr::null();
                if libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REMOUNT,
                    std::ptr::null(),
                ) == 0
                    || errno() != libc::EPERM
                {
                    return 3;
                }
                if libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0) == 0
                    || errno() != libc::ENOSYS
                {
                    return 4;
                }
                if libc::syscall(libc::SYS_bpf, 0, 0, 0) == 0 || errno() != libc::EPERM {
                    return 5;
                }
                // Plain calls still work, and so do namespaces other than the user's (refused
                // here only for want of privilege, not by the filter).
                if libc::getpid() <= 0 {
                    return 6;
                }
                if libc::unshare(libc::CLONE_NEWUTS) != 0 && errno() == libc::ENOSYS {
                    return 7;
                }
                0
            }),
            0
        );
    }

    #[test]
    fn the_filter_refuses_set_id_bits_and_allows_other_modes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tool");
        std::fs::write(&file, b"#!/bin/sh\n").unwrap();
        let path = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        assert_eq!(
            under_filter(move || unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
                if fd < 0 {
                    return 1;
                }
                if libc::fchmod(fd, 0o4755) == 0 || errno() != libc::EPERM {
                    return 2;
                }
                if libc::fchmodat(libc::AT_FDCWD, path.as_ptr(), 0o2755, 0) == 0
                    || errno() != libc::EPERM
                {
                    return 3;
                }
                if libc::fchmod(fd, 0o755) != 0 {
                    return 4;
                }
                0
            }),
            0
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755);
    }

    #[test]
    fn a_nesting_filter_lets_new_user_namespaces_through_and_still_refuses_tracing() {
        assert_eq!(
            under(program(true), || unsafe {
                // Refused by the kernel or taken, but never by the filter.
                if libc::unshare(libc::CLONE_NEWUSER) != 0 && errno() == libc::EPERM {
                    let refused_by_kernel =
                        std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone")
                            .is_ok_and(|v| v.trim() == "0");
                    if !refused_by_kernel && libc::geteuid() == 0 {
                        return 1;
                    }
                }
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == 0 || errno() != libc::EPERM {
                    return 2;
                }
                0
            }),
            0
        );
    }
}
