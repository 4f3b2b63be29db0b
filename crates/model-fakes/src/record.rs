//! Every request a fake server received, in order, for a test's assertions (through
//! [`Recorder`]) or anyone else's (`GET /_requests` answers them as a JSON array).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::Serialize;
use tokio::sync::Notify;

/// One request, as far as tests care.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecordedRequest {
    /// Its position among the server's requests, from 0.
    pub seq: usize,
    /// The API module that answered it (`"anthropic"`).
    pub api: &'static str,
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// The key it carried (`x-api-key`, or a bearer token).
    pub key: Option<String>,
    /// The model the request names.
    pub model: Option<String>,
    /// How many messages (turns of the conversation) it carries.
    pub messages: usize,
    /// The text of the last prompt a person wrote.
    pub last_user_text: Option<String>,
    /// Every prompt text a person wrote, in order: the conversation the agent sent along.
    pub user_texts: Vec<String>,
    /// Whether it answers the model's own tool call.
    pub tool_result: bool,
    /// The names of the tools the agent offered.
    pub tools: Vec<String>,
    pub stream: bool,
    /// The HTTP status the fake answered.
    pub status: u16,
    /// The usage its answer reported (input, output tokens), once the answer was sent whole.
    pub served: Option<(u64, u64)>,
}

impl RecordedRequest {
    /// A call of the model that the script answered (not `HEAD /`, not a 404): what an agent
    /// sends for each step of a turn, and for side requests.
    pub fn is_model_call(&self) -> bool {
        self.method == "POST" && self.model.is_some()
    }

    /// A model call in the agent's main loop (it offered tools): one per step of a turn.
    pub fn is_turn_step(&self) -> bool {
        self.is_model_call() && !self.tools.is_empty()
    }

    /// Whether any prompt text of the conversation contains `needle`.
    pub fn carries(&self, needle: &str) -> bool {
        self.user_texts.iter().any(|t| t.contains(needle))
    }
}

/// The shared list of requests; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    requests: Mutex<Vec<RecordedRequest>>,
    added: Notify,
}

impl Recorder {
    /// Adds a request (its `seq` is assigned here) and wakes whoever waits.
    pub fn push(&self, mut request: RecordedRequest) -> RecordedRequest {
        let mut requests = self.inner.requests.lock().expect("not poisoned");
        request.seq = requests.len();
        requests.push(request.clone());
        drop(requests);
        self.inner.added.notify_waiters();
        request
    }

    /// The answer to request `seq` was sent whole, reporting this usage.
    pub fn served(&self, seq: usize, input: u64, output: u64) {
        if let Some(request) = self
            .inner
            .requests
            .lock()
            .expect("not poisoned")
            .get_mut(seq)
        {
            request.served = Some((input, output));
        }
    }

    /// The tokens of every answer sent whole so far (input, output): what a meter of the
    /// wire should have counted.
    pub fn served_tokens(&self) -> (u64, u64) {
        self.all()
            .iter()
            .filter_map(|r| r.served)
            .fold((0, 0), |(i, o), (a, b)| (i + a, o + b))
    }

    /// Every request so far.
    pub fn all(&self) -> Vec<RecordedRequest> {
        self.inner.requests.lock().expect("not poisoned").clone()
    }

    /// How many requests so far: a mark for [`Recorder::wait_after`].
    pub fn len(&self) -> usize {
        self.inner.requests.lock().expect("not poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first request that matches, waiting for it if none has yet.
    pub async fn wait_for(&self, matches: impl Fn(&RecordedRequest) -> bool) -> RecordedRequest {
        self.wait_after(0, matches).await
    }

    /// The first request from position `mark` on (see [`Recorder::len`]) that matches, waiting
    /// for it if none has yet.
    pub async fn wait_after(
        &self,
        mark: usize,
        matches: impl Fn(&RecordedRequest) -> bool,
    ) -> RecordedRequest {
        loop {
            let added = self.inner.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            if let Some(found) = self
                .inner
                .requests
                .lock()
                .expect("not poisoned")
                .iter()
                .skip(mark)
                .find(|r| matches(r))
            {
                return found.clone();
            }
            added.await;
        }
    }

    /// [`Recorder::wait_after`], or `None` after `limit`.
    pub async fn wait_after_within(
        &self,
        mark: usize,
        limit: Duration,
        matches: impl Fn(&RecordedRequest) -> bool,
    ) -> Option<RecordedRequest> {
        tokio::time::timeout(limit, self.wait_after(mark, matches))
            .await
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_wakes_for_a_later_matching_request() {
        let recorder = Recorder::default();
        recorder.push(RecordedRequest {
            path: "/first".into(),
            ..Default::default()
        });
        let waiting = tokio::spawn({
            let recorder = recorder.clone();
            async move { recorder.wait_after(1, |r| r.path == "/wanted").await }
        });
        recorder.push(RecordedRequest {
            path: "/other".into(),
            ..Default::default()
        });
        recorder.push(RecordedRequest {
            path: "/wanted".into(),
            ..Default::default()
        });
        let found = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("no panic");
        assert_eq!((found.seq, found.path.as_str()), (2, "/wanted"));
        assert_eq!(recorder.len(), 3);
    }
}
