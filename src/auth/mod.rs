//! Authentication material: bearer tokens from the tokens file, reloaded on SIGHUP or
//! when the file changes, with revocation of open streams; and the server's TLS settings.
//!
//! The transport side (reading `authorization`, putting a principal on each request, ending a
//! revoked stream) is `grpc::auth`; this module has no tonic request types.
//!
//! Reload rules:
//! - SIGHUP reloads at once. Otherwise the file is polled (its mtime, size, device and inode, so a
//!   Kubernetes Secret's symlink swap is seen too) and reloaded once a change has held still for
//!   one poll interval, so a writer caught half-way is not taken for a shorter file.
//! - A file that fails to read or parse on reload keeps the previous table and logs an error
//!   naming the problem. (At startup the same failure stops the server.)
//! - A token missing from the new table — or now naming another principal or kind — is revoked:
//!   calls with it are UNAUTHENTICATED, and every stream opened with it ends UNAUTHENTICATED.

pub(crate) mod tls;
pub(crate) mod tokens;

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use tokio::{sync::watch, task::JoinHandle};

pub(crate) use tokens::{Grant, TokenTable};

/// How often the tokens file is checked for changes, unless configured otherwise.
pub(crate) const DEFAULT_TOKENS_POLL: Duration = Duration::from_secs(1);

/// What identifies one version of the file on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    dev: u64,
    ino: u64,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// The outcome of a successful reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reloaded {
    /// Tokens in the new table.
    pub tokens: usize,
    /// Grants of the previous table the new one no longer holds.
    pub revoked: usize,
}

/// The live token table of a server, and its source file.
#[derive(Debug)]
pub(crate) struct TokenStore {
    path: PathBuf,
    table: watch::Sender<Arc<TokenTable>>,
    /// The file version last read (successfully or not).
    loaded: Mutex<Option<FileStamp>>,
}

impl TokenStore {
    /// Loads the tokens file; any problem with it is an error naming the file and the problem.
    pub(crate) fn open(path: &Path) -> anyhow::Result<Arc<Self>> {
        let loaded = stamp(path);
        let table = TokenTable::load(path)?;
        if table.is_empty() {
            tracing::warn!(file = %path.display(), "the tokens file lists no tokens: every call will be refused");
        }
        tracing::info!(file = %path.display(), tokens = table.len(), "tokens loaded");
        Ok(Arc::new(Self {
            path: path.to_owned(),
            table: watch::Sender::new(Arc::new(table)),
            loaded: Mutex::new(loaded),
        }))
    }

    /// The grant of a presented bearer token, if the current table lists it.
    pub(crate) fn authenticate(&self, token: &str) -> Option<Grant> {
        self.table.borrow().authenticate(token)
    }

    /// The budget the current table sets for a principal.
    pub(crate) fn budget(&self, principal: &str) -> Option<crate::domain::usage::Budget> {
        self.table.borrow().budget(principal).cloned()
    }

    /// Rereads the file now. On failure the previous table stays in force and the error is
    /// logged (and returned).
    pub(crate) fn reload(&self) -> anyhow::Result<Reloaded> {
        *self.loaded.lock().expect("not poisoned") = stamp(&self.path);
        let next = match TokenTable::load(&self.path) {
            Ok(next) => next,
            Err(error) => {
                tracing::error!(
                    file = %self.path.display(),
                    error = format!("{error:#}"),
                    "tokens file reload failed: the previous tokens stay in force"
                );
                return Err(error);
            }
        };
        let revoked = self.table.borrow().revoked_by(&next);
        let tokens = next.len();
        self.table.send_if_modified(|table| {
            if **table == next {
                return false;
            }
            *table = Arc::new(next);
            true
        });
        tracing::info!(file = %self.path.display(), tokens, revoked, "tokens reloaded");
        Ok(Reloaded { tokens, revoked })
    }

    /// Resolves when `grant` no longer holds (its token was revoked). Never resolves while it
    /// holds, nor after the store is gone.
    pub(crate) fn revocation(&self, grant: Grant) -> impl Future<Output = ()> + Send + 'static {
        let mut table = self.table.subscribe();
        async move {
            loop {
                if !table.borrow_and_update().still_grants(&grant) {
                    return;
                }
                if table.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// Watches for SIGHUP and, with `poll`, for changes of the file; reloads on either. The task
    /// runs until aborted.
    pub(crate) fn watch(
        self: &Arc<Self>,
        poll: Option<Duration>,
    ) -> anyhow::Result<JoinHandle<()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = signal(SignalKind::hangup())
            .map_err(|e| anyhow::anyhow!("installing the SIGHUP handler: {e}"))?;
        let store = self.clone();
        Ok(tokio::spawn(async move {
            let mut ticks = poll.map(|every| {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                ticks
            });
            // A change seen at the last tick, reloaded once it is still the same at the next.
            let mut settling: Option<Option<FileStamp>> = None;
            loop {
                tokio::select! {
                    signal = hangup.recv() => {
                        if signal.is_none() {
                            return;
                        }
                        tracing::info!(file = %store.path.display(), "SIGHUP: reloading tokens");
                        let _ = store.reload();
                        settling = None;
                    }
                    _ = tick(&mut ticks) => {
                        let now = stamp(&store.path);
                        if now == *store.loaded.lock().expect("not poisoned") {
                            settling = None;
                        } else if settling == Some(now) {
                            let _ = store.reload();
                            settling = None;
                        } else {
                            settling = Some(now);
                        }
                    }
                }
            }
        }))
    }
}

async fn tick(ticks: &mut Option<tokio::time::Interval>) {
    match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(token: &str, principal: &str) -> String {
        format!(
            "[[tokens]]\nsha256 = \"{}\"\nprincipal = \"{principal}\"\nkind = \"user\"\n",
            hex::encode(tokens::digest(token))
        )
    }

    #[tokio::test]
    async fn a_reload_revokes_removed_tokens_and_a_malformed_file_keeps_the_old_table() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tokens.toml");
            std::fs::write(&path, row("a", "ada") + &row("b", "bob")).unwrap();
            let store = TokenStore::open(&path).unwrap();
            let ada = store.authenticate("a").unwrap();
            let bob = store.authenticate("b").unwrap();
            let ada_revoked = store.revocation(ada);
            let bob_revoked = store.revocation(bob);

            std::fs::write(&path, "[[tokens]\nnot toml").unwrap();
            assert!(store.reload().is_err());
            assert!(store.authenticate("a").is_some(), "the old table stays");

            std::fs::write(&path, row("b", "bob")).unwrap();
            assert_eq!(
                store.reload().unwrap(),
                Reloaded {
                    tokens: 1,
                    revoked: 1
                }
            );
            ada_revoked.await;
            assert!(store.authenticate("a").is_none());
            assert!(store.authenticate("b").is_some());
            let still = tokio::time::timeout(Duration::from_millis(50), bob_revoked).await;
            assert!(still.is_err(), "bob's grant still holds");
        })
        .await
        .unwrap();
    }

    #[test]
    fn a_missing_or_malformed_file_at_startup_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.toml");
        let err = format!("{:#}", TokenStore::open(&path).unwrap_err());
        assert!(err.contains("absent.toml"), "{err}");
        std::fs::write(
            &path,
            "[[tokens]]\nsha256 = \"x\"\nprincipal = \"a\"\nkind = \"user\"\n",
        )
        .unwrap();
        let err = format!("{:#}", TokenStore::open(&path).unwrap_err());
        assert!(
            err.contains("absent.toml") && err.contains("sha256"),
            "{err}"
        );
    }
}
