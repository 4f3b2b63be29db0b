//! Who is calling: every request passes through [`Authenticator`], which puts a [`Principal`] in
//! the request's extensions; handlers take it from there and pass it down.

use tonic::{Request, Status, metadata::MetadataMap, service::Interceptor};

use crate::domain::{Error, ErrorCode, Principal, PrincipalKind};

/// Header naming the user a service acts for.
pub const ACTING_USER_HEADER: &str = "x-acting-user";
/// Longest accepted principal id, in bytes.
const MAX_PRINCIPAL_BYTES: usize = 256;

/// Authenticates requests. With no tokens configured every caller is `local` (SPEC §11).
#[derive(Debug, Clone, Default)]
pub struct Authenticator {}

impl Authenticator {
    pub fn no_tokens() -> Self {
        Self {}
    }

    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Principal, Error> {
        let mut principal = Principal::local();
        principal.acting_user = acting_user(metadata, principal.kind)?;
        Ok(principal)
    }
}

fn acting_user(metadata: &MetadataMap, kind: PrincipalKind) -> Result<Option<String>, Error> {
    let Some(value) = metadata.get(ACTING_USER_HEADER) else {
        return Ok(None);
    };
    if kind == PrincipalKind::User {
        return Err(Error::new(
            ErrorCode::Forbidden,
            "only services may act for a user (x-acting-user)",
        ));
    }
    let user = value
        .to_str()
        .map_err(|_| Error::invalid("x-acting-user is not printable ASCII"))?
        .trim();
    if user.is_empty() || user.len() > MAX_PRINCIPAL_BYTES {
        return Err(Error::invalid(format!(
            "x-acting-user must hold 1 to {MAX_PRINCIPAL_BYTES} bytes"
        )));
    }
    Ok(Some(user.to_owned()))
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let principal = self.authenticate(request.metadata())?;
        request.extensions_mut().insert(principal);
        Ok(request)
    }
}

/// The principal the [`Authenticator`] attached to a request.
pub fn principal<T>(request: &Request<T>) -> Result<Principal, Status> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::internal("request reached a handler without authentication"))
}

/// The caller's W3C trace context, if it sent one.
pub fn traceparent<T>(request: &Request<T>) -> Option<String> {
    let value = request.metadata().get("traceparent")?.to_str().ok()?;
    is_traceparent(value).then(|| value.to_owned())
}

/// `version-traceid-parentid-flags` in lower-case hex, as W3C Trace Context defines it.
fn is_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    parts.len() >= 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1] != "0".repeat(32)
        && hex(parts[2], 16)
        && parts[2] != "0".repeat(16)
        && hex(parts[3], 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_tokens_every_caller_is_local_and_may_name_an_acting_user() {
        let auth = Authenticator::no_tokens();
        let mut metadata = MetadataMap::new();
        assert_eq!(auth.authenticate(&metadata).unwrap(), Principal::local());
        metadata.insert(ACTING_USER_HEADER, "ada".parse().unwrap());
        let principal = auth.authenticate(&metadata).unwrap();
        assert_eq!(principal.actor(), "ada");
        assert_eq!(principal.id, "local");
    }

    #[test]
    fn only_well_formed_traceparents_are_forwarded() {
        assert!(is_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_traceparent(
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_traceparent(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        ));
        assert!(!is_traceparent("garbage"));
    }
}
