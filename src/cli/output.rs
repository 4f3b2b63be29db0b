//! The subcommands' stdout. SIGPIPE stays ignored (Rust's default): a server that closes the
//! connection while we write to it is then an error we report, never a silent death. A reader of
//! stdout that goes away (`agent-harness sessions list | head`) instead ends the process here,
//! quietly and with success, as other Unix filters do.

use std::{
    io::{ErrorKind, Write},
    sync::atomic::{AtomicBool, Ordering},
};

/// Whether a spinner frame is on stderr now (so an error message first erases it). The spinner
/// is drawn by `render`; its state lives here, with the output that must erase it first.
pub(crate) static SPINNER_SHOWN: AtomicBool = AtomicBool::new(false);

/// Erases the spinner on stderr, if one is drawn. The frame sits after the cursor (it is drawn
/// with the cursor saved and restored), so erasing to the end of the line removes the frame and
/// nothing else: the agent's text before it on the same line stays.
pub(crate) fn clear_spinner() {
    if SPINNER_SHOWN.swap(false, Ordering::Relaxed) {
        let mut err = std::io::stderr();
        let _ = write!(err, "\x1b[K");
        let _ = err.flush();
    }
}

/// Writes `text` to stdout and flushes it (a line at a time, as a terminal shows it).
pub(crate) fn write(text: &[u8]) {
    let mut out = std::io::stdout().lock();
    match out.write_all(text).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(error) if error.kind() == ErrorKind::BrokenPipe => std::process::exit(0),
        Err(error) => {
            clear_spinner();
            eprintln!("error: cannot write to stdout: {error}");
            std::process::exit(1);
        }
    }
}

/// `println!` through [`write`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::output::write(format!("{}\n", format_args!($($arg)*)).as_bytes())
    };
}
