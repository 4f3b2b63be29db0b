//! Forking a session (SPEC §18): a new session whose runtime opens with `session/fork` on the
//! parent's ACP session, and whose transcript starts with the parent's messages.

use super::Sessions;
use crate::domain::{Error, ErrorCode, Principal, Result, session::SessionRecord};

impl Sessions {
    pub(crate) async fn fork(
        &self,
        principal: &Principal,
        session_id: &str,
        _name: Option<String>,
        _traceparent: Option<String>,
    ) -> Result<(SessionRecord, u64)> {
        let _ = self.handle(principal, session_id).await?;
        Err(Error::new(ErrorCode::NotSupported, "fork is not built yet"))
    }
}
