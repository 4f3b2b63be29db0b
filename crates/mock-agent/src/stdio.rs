//! The process's stdin and stdout as async streams. When they are pipes (as when the harness
//! spawns the agent) they are driven directly by the reactor — no blocking-pool thread hop per
//! read or write — and the agent owns fd 1, so closing stdout really closes the pipe. Otherwise
//! (a terminal, a file) tokio's blocking stdio is used.

use std::{
    fs::File,
    io,
    mem::ManuallyDrop,
    os::{
        fd::{FromRawFd, OwnedFd, RawFd},
        unix::fs::FileTypeExt,
    },
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::unix::pipe,
};

const STDIN: RawFd = 0;
const STDOUT: RawFd = 1;

fn is_pipe(fd: RawFd) -> bool {
    // Borrow the descriptor only long enough to fstat it.
    // SAFETY: fds 0 and 1 are open for the life of the process unless we close them, and
    // ManuallyDrop keeps this temporary `File` from closing it.
    let file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    file.metadata()
        .map(|meta| meta.file_type().is_fifo())
        .unwrap_or(false)
}

/// The process's stdin.
pub enum Input {
    Pipe(pipe::Receiver),
    Std(tokio::io::Stdin),
}

impl Input {
    pub fn stdin() -> io::Result<Self> {
        if is_pipe(STDIN) {
            // SAFETY: fd 0 is open and nothing else in this process owns it.
            let fd = unsafe { OwnedFd::from_raw_fd(STDIN) };
            Ok(Self::Pipe(pipe::Receiver::from_owned_fd(fd)?))
        } else {
            Ok(Self::Std(tokio::io::stdin()))
        }
    }
}

impl AsyncRead for Input {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Pipe(pipe) => Pin::new(pipe).poll_read(cx, buf),
            Self::Std(stdin) => Pin::new(stdin).poll_read(cx, buf),
        }
    }
}

/// The process's stdout; shutting it down closes fd 1.
pub enum Output {
    Pipe(pipe::Sender),
    Std(tokio::io::Stdout),
}

impl Output {
    pub fn stdout() -> io::Result<Self> {
        if is_pipe(STDOUT) {
            // SAFETY: fd 1 is open and nothing else in this process writes to it.
            let fd = unsafe { OwnedFd::from_raw_fd(STDOUT) };
            Ok(Self::Pipe(pipe::Sender::from_owned_fd(fd)?))
        } else {
            Ok(Self::Std(tokio::io::stdout()))
        }
    }
}

impl AsyncWrite for Output {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Pipe(pipe) => Pin::new(pipe).poll_write(cx, buf),
            Self::Std(stdout) => Pin::new(stdout).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Pipe(pipe) => Pin::new(pipe).poll_flush(cx),
            Self::Std(stdout) => Pin::new(stdout).poll_flush(cx),
        }
    }

    /// The pipe closes when the `Sender` is dropped; blocking stdout is flushed, then fd 1 is
    /// closed by hand.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Pipe(pipe) => Pin::new(pipe).poll_shutdown(cx),
            Self::Std(stdout) => {
                std::task::ready!(Pin::new(stdout).poll_flush(cx))?;
                // SAFETY: everything written has been flushed and nothing writes to fd 1 again.
                unsafe { libc::close(STDOUT) };
                Poll::Ready(Ok(()))
            }
        }
    }
}
