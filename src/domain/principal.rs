//! Who is calling. Extracted from each request by the transport and passed into every
//! operation.

/// What kind of caller a principal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrincipalKind {
    /// A person.
    User,
    /// A program acting for people (it names them in `x-acting-user`).
    Service,
    /// The only principal when no tokens are configured: it has both user and service rights.
    Local,
    /// A peer replica forwarding a call: it has no rights of its own and acts only
    /// as the principal it forwards for.
    Replica,
    /// A bridge running agents elsewhere: it may call only
    /// `RuntimeGatewayService.Connect`, and nobody else may.
    Runtime,
}

impl PrincipalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Service => "service",
            Self::Local => "local",
            Self::Replica => "replica",
            Self::Runtime => "runtime",
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub id: String,
    pub kind: PrincipalKind,
    /// For services (and `local`): the user named in `x-acting-user`.
    pub acting_user: Option<String>,
}

/// The most bytes of a principal used as one path component.
pub const MAX_PATH_SEGMENT_BYTES: usize = 128;

/// `principal` when it can stand as one component of a path as it is (in `{principal}` of an
/// allowed cwd root, or as a HOME's directory name): letters, digits and `._@+=,-`, at most
/// [`MAX_PATH_SEGMENT_BYTES`], and neither `.` nor `..`. Anything else (a `/`, `..`, spaces,
/// non-ASCII) would let a name reach another place, or read ambiguously.
pub fn path_segment(principal: &str) -> Option<&str> {
    let plain = !principal.is_empty()
        && principal.len() <= MAX_PATH_SEGMENT_BYTES
        && principal != "."
        && principal != ".."
        && principal
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@+=,-".contains(&b));
    plain.then_some(principal)
}

/// The id of the no-token principal.
pub const LOCAL_PRINCIPAL: &str = "local";

impl Principal {
    pub fn local() -> Self {
        Self {
            id: LOCAL_PRINCIPAL.to_owned(),
            kind: PrincipalKind::Local,
            acting_user: None,
        }
    }

    pub fn user(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            kind: PrincipalKind::User,
            acting_user: None,
        }
    }

    pub fn service(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            kind: PrincipalKind::Service,
            acting_user: None,
        }
    }

    /// Who the caller acts as: the acting user for a service that names one, else itself. This
    /// is recorded as `actor`, and as `owner` of a session it creates.
    pub fn actor(&self) -> &str {
        self.acting_user.as_deref().unwrap_or(&self.id)
    }

    /// `context` (a trigger) may come only from services.
    pub fn may_send_context(&self) -> bool {
        matches!(self.kind, PrincipalKind::Service | PrincipalKind::Local)
    }

    /// Permission and elicitation answers may come only from a person.
    pub fn may_answer(&self) -> bool {
        matches!(self.kind, PrincipalKind::User | PrincipalKind::Local)
    }

    /// Whether the caller may see and drive a session with this owner and these editors.
    pub fn may_access(&self, owner: &str, editors: &[String]) -> bool {
        if self.kind == PrincipalKind::Local {
            return true;
        }
        let actor = self.actor();
        owner == actor || editors.iter().any(|editor| editor == actor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_acts_as_the_user_it_names() {
        let mut service = Principal::service("ci-bot");
        assert_eq!(service.actor(), "ci-bot");
        service.acting_user = Some("ada".into());
        assert_eq!(service.actor(), "ada");
        assert!(service.may_access("ada", &[]));
        assert!(!service.may_access("bob", &[]));
    }

    #[test]
    fn only_services_send_context_and_only_people_answer() {
        assert!(Principal::service("s").may_send_context());
        assert!(!Principal::user("u").may_send_context());
        assert!(Principal::user("u").may_answer());
        assert!(!Principal::service("s").may_answer());
        let local = Principal::local();
        assert!(local.may_send_context() && local.may_answer());
    }

    #[test]
    fn owners_and_editors_may_access_a_session_and_nobody_else() {
        let editors = vec!["eve".to_owned()];
        assert!(Principal::user("ada").may_access("ada", &editors));
        assert!(Principal::user("eve").may_access("ada", &editors));
        assert!(!Principal::user("bob").may_access("ada", &editors));
        assert!(Principal::local().may_access("ada", &[]));
    }

    #[test]
    fn only_plain_names_stand_as_a_path_component() {
        for plain in ["alice", "ada@example.com", "svc-ci_1.prod", "a+b=c,d"] {
            assert_eq!(path_segment(plain), Some(plain));
        }
        for odd in [
            "",
            ".",
            "..",
            "a/b",
            "../etc",
            "a b",
            "é",
            "a\\b",
            &"x".repeat(129),
        ] {
            assert_eq!(path_segment(odd), None, "{odd:?}");
        }
    }
}
