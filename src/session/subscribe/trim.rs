//! Memory given back once streams end. What a stream held (its queued snapshots, its fold's
//! copies of the messages of a running turn, the buffers of its HTTP/2 stream) is freed when it
//! ends, but glibc's allocator keeps freed memory in its arenas for reuse: after a thousand slow
//! streams of long answers closed, the server kept most of the gigabytes they had taken. So once
//! enough streams have ended, the allocator is asked to give its free pages back
//! (`malloc_trim`, off the async threads), at most once per [`QUIET`].
//!
//! A trim walks the allocator's free lists (a few milliseconds per gigabyte of heap), so it
//! runs only after many streams ended ([`ENDED`]) or the last one did — never per stream.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

/// Streams that end before a trim is due (unless the last open stream ended).
const ENDED: usize = 32;
/// A trim waits this long after it was called for: streams closed together (a client gone with
/// its connection) are trimmed for once, and trims come at most this often.
const QUIET: std::time::Duration = std::time::Duration::from_secs(2);

/// When to trim.
#[derive(Default, Clone)]
pub(super) struct Trim(Arc<State>);

#[derive(Default)]
struct State {
    /// Streams ended since the last trim.
    ended: AtomicUsize,
    /// A trim is waiting to run.
    due: AtomicBool,
}

impl Trim {
    /// A stream ended; `open` streams are left on this replica.
    pub(super) fn stream_ended(&self, open: usize) {
        let ended = self.0.ended.fetch_add(1, Ordering::AcqRel) + 1;
        if ended < ENDED && open > 0 {
            return;
        }
        if self.0.due.swap(true, Ordering::AcqRel) {
            return; // one is on its way
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.0.due.store(false, Ordering::Release);
            return;
        };
        let state = self.0.clone();
        runtime.spawn(async move {
            tokio::time::sleep(QUIET).await;
            state.ended.store(0, Ordering::Release);
            let _ = tokio::task::spawn_blocking(give_back).await;
            state.due.store(false, Ordering::Release);
        });
    }
}

/// Returns the allocator's free memory to the system.
fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases memory the allocator holds free; it has no other
        // effect on the process's allocations.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::debug!(released, "gave freed memory back after streams ended");
    }
}
