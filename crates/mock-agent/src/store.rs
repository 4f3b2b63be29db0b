//! `--session-dir`: the agent's own record of its sessions, one file per session, as real agents
//! keep them (Claude Code writes its session files lazily). With `--save-delay MS` a change is
//! written only that long after it happened, or at once when the agent is asked to stop (SIGTERM,
//! the end of its stdin): a `kill -9` soon after a turn loses the session, a graceful stop keeps
//! it. `session/resume` and `session/load` then answer "Resource not found" for a session whose
//! file is not there (and that this process does not know either).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::time::Instant;

/// Sessions written to a directory, each `<session id>.json`.
#[derive(Debug)]
pub struct SessionStore {
    dir: PathBuf,
    delay: Duration,
    /// Sessions changed and not yet written, with how many turns each has had and when it is due.
    pending: BTreeMap<String, (u64, Instant)>,
    /// Turns per session this process has seen.
    turns: BTreeMap<String, u64>,
}

impl SessionStore {
    pub fn new(dir: &Path, delay: Duration) -> Self {
        Self {
            dir: dir.to_owned(),
            delay,
            pending: BTreeMap::new(),
            turns: BTreeMap::new(),
        }
    }

    fn path(&self, session_id: &str) -> PathBuf {
        // Session ids are the agent's own (`mock-session-…`) or what a client names: keep the
        // file name to safe characters.
        let name: String = session_id
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
                _ => '_',
            })
            .collect();
        self.dir.join(format!("{name}.json"))
    }

    /// Whether the session can be reopened: this process knows it, or its file is there.
    pub fn knows(&self, session_id: &str) -> bool {
        self.turns.contains_key(session_id) || self.path(session_id).is_file()
    }

    /// A session was created, reopened or had a turn: it is written now, or after the delay.
    pub fn touch(&mut self, session_id: &str, new_turn: bool) {
        let turns = self.turns.entry(session_id.to_owned()).or_insert(0);
        if new_turn {
            *turns += 1;
        }
        let turns = *turns;
        if self.delay.is_zero() {
            self.write(session_id, turns);
            return;
        }
        let due = Instant::now() + self.delay;
        self.pending
            .entry(session_id.to_owned())
            .and_modify(|(count, _)| *count = turns)
            .or_insert((turns, due));
    }

    /// When the next pending write is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending.values().map(|(_, due)| *due).min()
    }

    /// Writes what is due by now.
    pub fn write_due(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            if let Some((turns, _)) = self.pending.remove(&id) {
                self.write(&id, turns);
            }
        }
    }

    /// Writes everything pending (the agent is stopping).
    pub fn write_all(&mut self) {
        for (id, (turns, _)) in std::mem::take(&mut self.pending) {
            self.write(&id, turns);
        }
    }

    fn write(&self, session_id: &str, turns: u64) {
        let text = serde_json::json!({"sessionId": session_id, "turns": turns}).to_string();
        let path = self.path(session_id);
        // Written aside and renamed, so a kill never leaves half a file.
        let aside = path.with_extension("json.tmp");
        let written = std::fs::write(&aside, text).and_then(|()| std::fs::rename(&aside, &path));
        if let Err(error) = written {
            eprintln!(
                "mock-agent: could not write the session file {}: {error}",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_session_is_written_at_once_without_a_delay_and_only_when_due_or_stopping_with_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut at_once = SessionStore::new(dir.path(), Duration::ZERO);
        at_once.touch("a", false);
        assert!(dir.path().join("a.json").is_file());
        assert_eq!(at_once.next_due(), None);

        let mut lazy = SessionStore::new(dir.path(), Duration::from_secs(60));
        lazy.touch("b", false);
        lazy.touch("b", true);
        assert!(!dir.path().join("b.json").exists(), "not yet");
        assert!(lazy.knows("b"), "this process knows it anyway");
        assert!(lazy.next_due().is_some());
        lazy.write_due();
        assert!(!dir.path().join("b.json").exists(), "not due yet");
        lazy.write_all();
        let text = std::fs::read_to_string(dir.path().join("b.json")).unwrap();
        assert!(text.contains("\"turns\":1"), "{text}");

        let other = SessionStore::new(dir.path(), Duration::ZERO);
        assert!(other.knows("b") && other.knows("a"));
        assert!(!other.knows("c"), "never written");
        assert!(!other.knows("../a"), "a name is kept inside the directory");
    }
}
