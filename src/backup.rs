//! `agent-harness backup`: a consistent copy of the embedded SQLite store, taken while the
//! server runs, with SQLite's online backup API.
//!
//! The copy is made in one backup step, that is inside one read transaction: in WAL mode a
//! reader never blocks the server's writer, and the copy is the database exactly as of the
//! moment that transaction began (every commit acknowledged before it is in; none after). A
//! stepwise copy would restart whenever the server wrote, which a busy server does constantly.
//! The copy goes to a temporary file beside the target and is linked into place only once it
//! is complete and checked, so the target never holds a partial backup, and an existing file is
//! never overwritten.

use std::{
    fs::{OpenOptions, Permissions},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use rusqlite::{Connection, OpenFlags, backup::StepResult};

use crate::{
    config::{DEFAULT_DATA_DIR, FileConfig},
    store::sqlite::DB_FILE_NAME,
};

const BACKUP_HELP: &str = "Examples:
  agent-harness backup --to /backups/harness-$(date +%F).sqlite3
  agent-harness backup --to copy.sqlite3 --data-dir /var/lib/agent-harness

Restore: stop the server (or start a new one) on a fresh data directory holding the copy as
agent-harness.sqlite3:
  mkdir -p /var/lib/agent-harness-restored
  cp copy.sqlite3 /var/lib/agent-harness-restored/agent-harness.sqlite3
  agent-harness serve --data-dir /var/lib/agent-harness-restored

With PostgreSQL (--database-url) back up with the database's own tools (pg_dump).
Exit codes: 0 done, 1 failed (nothing is left at the target).";

/// The flags of `agent-harness backup`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = BACKUP_HELP)]
pub struct BackupArgs {
    /// The file to write; must not exist yet
    #[arg(long, value_name = "FILE")]
    pub to: PathBuf,
    /// The server's data directory [default: from --config, else ./data]
    #[arg(long, env = "AGENT_HARNESS_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The server's config file, to find its data directory
    #[arg(long, env = "AGENT_HARNESS_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// What a backup copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    pub source: PathBuf,
    pub target: PathBuf,
    pub pages: u64,
    pub bytes: u64,
}

/// Runs the subcommand: one line on stdout when done, one on stderr when not.
pub fn run(args: BackupArgs) -> u8 {
    match backup(&args) {
        Ok(report) => {
            println!(
                "backed up {} ({} pages, {} bytes) to {}",
                report.source.display(),
                report.pages,
                report.bytes,
                report.target.display()
            );
            0
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            1
        }
    }
}

/// The store file the arguments name.
fn source_of(args: &BackupArgs) -> anyhow::Result<PathBuf> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    if args.data_dir.is_none() && file.database_url.is_some() {
        bail!(
            "the config stores sessions in PostgreSQL (database_url): back it up with pg_dump \
             (see docs/operations.md)"
        );
    }
    let dir = args
        .data_dir
        .clone()
        .or(file.data_dir)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    Ok(dir.join(DB_FILE_NAME))
}

/// Copies the store the arguments name into `args.to`.
pub fn backup(args: &BackupArgs) -> anyhow::Result<BackupReport> {
    let source = source_of(args)?;
    backup_file(&source, &args.to)
}

/// Copies the SQLite database at `source` into the new file `target`.
pub fn backup_file(source: &Path, target: &Path) -> anyhow::Result<BackupReport> {
    if target.exists() {
        bail!(
            "the backup target {} already exists; name a new file (nothing was written)",
            target.display()
        );
    }
    if !source.is_file() {
        bail!(
            "no store at {} (is --data-dir the server's data directory?)",
            source.display()
        );
    }
    let partial = partial_path(target);
    // Reserves the name, and tells at once whether the target's directory takes a new file.
    // 0600 whatever the umask: the copy holds every transcript (its WAL takes the same mode).
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|_| std::fs::set_permissions(&partial, Permissions::from_mode(0o600)))
        .with_context(|| format!("cannot write the backup target {}", target.display()))?;
    let copied = copy_into(source, &partial).and_then(|pages| {
        // A hard link fails if the target appeared meanwhile: never overwrite.
        std::fs::hard_link(&partial, target)
            .with_context(|| format!("cannot write the backup target {}", target.display()))?;
        Ok(pages)
    });
    let _ = std::fs::remove_file(&partial);
    let pages = copied?;
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    let bytes = std::fs::metadata(target)
        .with_context(|| format!("reading {}", target.display()))?
        .len();
    Ok(BackupReport {
        source: source.to_path_buf(),
        target: target.to_path_buf(),
        pages,
        bytes,
    })
}

/// `<target>.partial`, beside it so the final link stays on one file system.
fn partial_path(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".partial-{}", std::process::id()));
    target.with_file_name(name)
}

/// The online backup into `partial` (already created, empty), checked and synced; the pages.
fn copy_into(source: &Path, partial: &Path) -> anyhow::Result<u64> {
    let from = Connection::open_with_flags(
        source,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening the store {}", source.display()))?;
    from.busy_timeout(std::time::Duration::from_secs(30))
        .context("setting the busy timeout")?;
    let mut to = Connection::open(partial)
        .with_context(|| format!("opening the backup file {}", partial.display()))?;
    let pages = {
        let backup =
            rusqlite::backup::Backup::new(&from, &mut to).context("starting the backup")?;
        // Every page in one step: one read transaction, one consistent moment.
        loop {
            match backup.step(-1).context("copying the store")? {
                StepResult::Done => break,
                StepResult::More => {}
                StepResult::Busy | StepResult::Locked => {
                    std::thread::sleep(std::time::Duration::from_millis(50))
                }
                _ => {}
            }
        }
        backup.progress().pagecount
    };
    let check: String = to
        .query_row("PRAGMA quick_check", [], |row| row.get(0))
        .context("checking the copy")?;
    if check != "ok" {
        bail!("the copy failed its integrity check: {check}");
    }
    // Leave one self-contained file: the copy's own WAL folded in.
    to.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .context("finishing the copy")?;
    drop(to);
    OpenOptions::new()
        .write(true)
        .open(partial)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", partial.display()))?;
    Ok(u64::try_from(pages).unwrap_or(0))
}
