//! The subcommands' stdout. SIGPIPE stays ignored (Rust's default): a server that closes the
//! connection while we write to it is then an error we report, never a silent death. A reader of
//! stdout that goes away (`agent-harness sessions list | head`) instead ends the process here,
//! quietly and with success, as other Unix filters do.

use std::io::{ErrorKind, Write};

/// Writes `text` to stdout and flushes it (a line at a time, as a terminal shows it).
pub(crate) fn write(text: &[u8]) {
    let mut out = std::io::stdout().lock();
    match out.write_all(text).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(error) if error.kind() == ErrorKind::BrokenPipe => std::process::exit(0),
        Err(error) => {
            super::render::clear_spinner();
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
