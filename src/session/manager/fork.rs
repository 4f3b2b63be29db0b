//! Forking a session: a new session whose runtime opens with `session/fork` on the
//! parent's ACP session, and whose transcript starts with the parent's messages up to the fork
//! point, marked inherited. Forked on the replica that runs the parent (the call is routed
//! there), so the parent's kept fold and log are at hand. The parent's log is copied into the
//! fork's first entry, so a fork is refused (LIMIT_EXCEEDED, `grpc_message_bytes`) when that
//! entry would not fit one ReadLog page.

use serde_json::Value;

use super::{CreateInput, Creation, Sessions, create::ForkFrom, reads::PAGE_OVERHEAD_BYTES};
use crate::{
    acp::fold::{Fold, forked_event},
    domain::{Error, ErrorCode, Principal, Result, session::SessionRecord},
    session::SessionHandle,
};

/// Log entries read per page while copying the parent's log.
const PAGE: usize = 1000;
/// What the default name of a fork adds to its parent's.
const FORK_SUFFIX: &str = " (fork)";

impl Sessions {
    /// A fork's name, checked before its parent is located.
    pub(crate) fn check_fork_name(&self, name: Option<&str>) -> Result<()> {
        match name {
            Some(name) => self.ctx.limits.check_session_name(name),
            None => Ok(()),
        }
    }

    /// Forks the session of `handle`, located here (a caller checks the name with
    /// [`Sessions::check_fork_name`] before locating, so a bad one claims nothing).
    pub(crate) async fn fork(
        &self,
        handle: &SessionHandle,
        principal: &Principal,
        name: Option<String>,
        traceparent: Option<String>,
    ) -> Result<(SessionRecord, u64)> {
        self.check_fork_name(name.as_deref())?;
        let (parent, _) = handle.shared.snapshot();
        // What the parent's agent advertised, from the log (the runtime may be suspended).
        let (capabilities, head) = {
            let mut cached = handle.shared.transcript.lock().await;
            let fold = cached.get_or_insert_with(|| Fold::new(self.ctx.meta_key.clone()));
            self.fold_since(parent.id, fold).await?;
            (fold.metadata().agent_capabilities_json.clone(), fold.head())
        };
        let advertised = serde_json::from_str::<Value>(&capabilities)
            .ok()
            .and_then(|c| c.pointer("/sessionCapabilities/fork").cloned())
            .is_some_and(|fork| !fork.is_null());
        if !advertised || parent.acp_session_id.is_empty() {
            return Err(Error::new(
                ErrorCode::NotSupported,
                format!(
                    "the agent of session {} does not advertise session/fork",
                    parent.id
                ),
            ));
        }
        // The fork's first entry carries the parent's log up to the fork point. It must fit
        // one ReadLog page and one Subscribe message, so a parent too large for that is
        // refused, before anything is created, rather than stored as an entry no client can read.
        let budget = self
            .ctx
            .limits
            .grpc_message_bytes
            .saturating_sub(PAGE_OVERHEAD_BYTES);
        let too_large = |bytes: usize| {
            Error::limit(
                "grpc_message_bytes",
                self.ctx.limits.grpc_message_bytes,
                format!(
                    "forking session {}: its log up to offset {head} ({bytes} bytes, copied into \
                     the fork's first log entry)",
                    parent.id
                ),
            )
        };
        let mut entries = Vec::new();
        let mut copied = 0;
        while (entries.len() as u64) < head {
            let page = self
                .ctx
                .store
                .read_log(parent.id, entries.len() as u64, PAGE)
                .await?;
            if page.is_empty() {
                break;
            }
            let page = page.into_iter().filter(|e| e.offset <= head);
            for entry in page {
                // The entries' JSON alone (escaping only adds to it): stop reading early.
                copied += entry.json.len();
                if copied > budget {
                    return Err(too_large(copied));
                }
                entries.push(entry);
            }
        }
        let name = name.or_else(|| {
            let keep = self
                .ctx
                .limits
                .session_name_chars
                .saturating_sub(FORK_SUFFIX.len());
            let base: String = parent.name.chars().take(keep).collect();
            (!base.trim().is_empty()).then(|| format!("{base}{FORK_SUFFIX}"))
        });
        let input = CreateInput {
            profile: parent.profile.clone(),
            cwd: parent.cwd.clone(),
            name,
            labels: parent.labels.clone(),
            editors: parent.editors.clone(),
            ..Default::default()
        };
        let forked_event = forked_event(&parent.id.to_string(), &entries);
        let bytes = forked_event.to_string().len();
        if bytes > budget {
            return Err(too_large(bytes));
        }
        let fork = ForkFrom {
            parent_acp_session_id: parent.acp_session_id.clone(),
            forked_event,
        };
        let Creation::Here(created) = self
            .create_from(principal, input, traceparent, Some(fork))
            .await?
        else {
            unreachable!("create_from refuses a fork whose home is another replica")
        };
        tracing::info!(parent = %parent.id, session = %created.record.id, "session forked");
        Ok((created.record, created.head))
    }
}
