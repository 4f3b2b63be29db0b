//! Who is calling: every request passes through [`Authenticator`], which puts a [`Principal`] in
//! the request's extensions; handlers take it from there and pass it down.
//!
//! - No tokens configured: every caller is `local` (user and service rights); an
//!   `authorization` header is ignored.
//! - Tokens configured: `authorization: Bearer <token>` is required; a missing, malformed,
//!   unknown or revoked token is UNAUTHENTICATED (one message for all, so the answer tells a
//!   prober nothing). The request also carries a [`Credential`] so a stream opened with the
//!   token can end UNAUTHENTICATED when it is revoked ([`end_when_revoked`]).
//! - `x-acting-user` names the user a service (or `local`) acts for. From a user it is
//!   FORBIDDEN: a person acts only as themselves, and silently ignoring the header would hide a
//!   client's mistake.

use std::{pin::Pin, sync::Arc};

use futures::{Stream, StreamExt};
use tonic::{Request, Status, metadata::MetadataMap, service::Interceptor};

use crate::{
    auth::{Grant, TokenStore, tokens::MAX_PRINCIPAL_BYTES},
    domain::{Error, ErrorCode, Principal, PrincipalKind},
};

/// Header naming the user a service acts for.
pub(crate) const ACTING_USER_HEADER: &str = "x-acting-user";
/// Headers a `replica` principal sets on a forwarded call: the original caller's id
/// and kind. Only a replica may send them; from anyone else they are FORBIDDEN.
pub(crate) const FORWARDED_PRINCIPAL_HEADER: &str = "x-forwarded-principal";
pub(crate) const FORWARDED_KIND_HEADER: &str = "x-forwarded-principal-kind";
/// Longest bearer token read, in bytes; anything longer cannot be one of ours.
const MAX_TOKEN_BYTES: usize = 4096;

/// Authenticates requests.
#[derive(Debug, Clone, Default)]
pub(crate) struct Authenticator {
    tokens: Option<Arc<TokenStore>>,
    /// Guards `RuntimeGatewayService` (bridges only) rather than the other services.
    gateway: bool,
}

/// The token a request was authenticated with, so its streams can watch for revocation.
#[derive(Debug, Clone)]
pub(crate) struct Credential {
    store: Arc<TokenStore>,
    grant: Grant,
}

impl Credential {
    /// Resolves when the token is revoked.
    pub(crate) fn revoked(&self) -> impl Future<Output = ()> + Send + 'static {
        self.store.revocation(self.grant.clone())
    }

    /// What the token grants (a bridge's hello is checked against its labels).
    pub(crate) fn grant(&self) -> &Grant {
        &self.grant
    }
}

fn unauthenticated() -> Error {
    Error::new(
        ErrorCode::Unauthenticated,
        "a valid `authorization: Bearer <token>` header is required",
    )
}

impl Authenticator {
    /// Every caller is `local`.
    pub(crate) fn no_tokens() -> Self {
        Self {
            tokens: None,
            gateway: false,
        }
    }

    /// The same tokens, for `RuntimeGatewayService`: only bridges (`runtime` tokens, or `local`
    /// without tokens) may call it, and they may call nothing else.
    pub(crate) fn for_gateway(&self) -> Self {
        Self {
            tokens: self.tokens.clone(),
            gateway: true,
        }
    }

    /// Callers present bearer tokens listed in `store`.
    /// Principals' budgets from the tokens file as it stands at each look-up (none without one).
    pub(crate) fn budgets(&self) -> crate::session::metering::BudgetSource {
        match &self.tokens {
            Some(store) => {
                let store = store.clone();
                crate::session::metering::BudgetSource::new(move |principal| {
                    store.budget(principal)
                })
            }
            None => Default::default(),
        }
    }

    pub(crate) fn with_tokens(store: Arc<TokenStore>) -> Self {
        Self {
            tokens: Some(store),
            gateway: false,
        }
    }

    #[cfg(test)]
    fn authenticate(&self, metadata: &MetadataMap) -> Result<Principal, Error> {
        Ok(self.authenticate_with_credential(metadata)?.0)
    }

    fn authenticate_with_credential(
        &self,
        metadata: &MetadataMap,
    ) -> Result<(Principal, Option<Credential>), Error> {
        let (mut principal, credential) = match &self.tokens {
            None => (Principal::local(), None),
            Some(store) => {
                let token = bearer_token(metadata).ok_or_else(unauthenticated)?;
                let grant = store.authenticate(token).ok_or_else(unauthenticated)?;
                let principal = Principal {
                    id: grant.principal.clone(),
                    kind: grant.kind,
                    acting_user: None,
                };
                let credential = Credential {
                    store: store.clone(),
                    grant,
                };
                (principal, Some(credential))
            }
        };
        if let Some(forwarded) = forwarded_principal(metadata, &principal)? {
            principal = forwarded;
        }
        if principal.kind == PrincipalKind::Replica {
            return Err(Error::new(
                ErrorCode::Forbidden,
                "a replica token only forwards calls for another principal",
            ));
        }
        match (self.gateway, principal.kind) {
            (true, PrincipalKind::Runtime | PrincipalKind::Local) => {}
            (true, _) => {
                return Err(Error::new(
                    ErrorCode::Forbidden,
                    "only a bridge's runtime token may call RuntimeGatewayService.Connect",
                ));
            }
            (false, PrincipalKind::Runtime) => {
                return Err(Error::new(
                    ErrorCode::Forbidden,
                    "a runtime token may call only RuntimeGatewayService.Connect",
                ));
            }
            (false, _) => {}
        }
        principal.acting_user = acting_user(metadata, principal.kind)?;
        Ok((principal, credential))
    }
}

/// The principal a peer replica forwards a call for, if the call carries one.
/// Without tokens every caller, forwarded or not, is `local` and the headers change nothing.
fn forwarded_principal(
    metadata: &MetadataMap,
    caller: &Principal,
) -> Result<Option<Principal>, Error> {
    let id = metadata.get(FORWARDED_PRINCIPAL_HEADER);
    let kind = metadata.get(FORWARDED_KIND_HEADER);
    if id.is_none() && kind.is_none() {
        return Ok(None);
    }
    match caller.kind {
        PrincipalKind::Local => return Ok(None),
        PrincipalKind::Replica => {}
        _ => {
            return Err(Error::new(
                ErrorCode::Forbidden,
                "only a replica may forward a call for another principal",
            ));
        }
    }
    fn text(
        value: Option<&tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    ) -> Option<&str> {
        value
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.len() <= MAX_PRINCIPAL_BYTES)
    }
    let (Some(id), Some(kind)) = (text(id), text(kind)) else {
        return Err(Error::invalid(
            "a forwarded call needs both x-forwarded-principal and x-forwarded-principal-kind",
        ));
    };
    let kind = match kind {
        "user" => PrincipalKind::User,
        "service" => PrincipalKind::Service,
        // A bridge's stream relayed to the replica owning its runtimes; such a
        // principal may call Connect only, as the bridge itself.
        "runtime" => PrincipalKind::Runtime,
        other => {
            return Err(Error::invalid(format!(
                "x-forwarded-principal-kind {other:?} is not user, service or runtime"
            )));
        }
    };
    Ok(Some(Principal {
        id: id.to_owned(),
        kind,
        acting_user: None,
    }))
}

/// The token of the one `authorization: Bearer <token>` header (the scheme is
/// case-insensitive); `None` for anything else, including two such headers.
fn bearer_token(metadata: &MetadataMap) -> Option<&str> {
    let mut values = metadata.get_all("authorization").iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let value = value.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && token.len() <= MAX_TOKEN_BYTES)
        .then_some(token)
}

fn acting_user(metadata: &MetadataMap, kind: PrincipalKind) -> Result<Option<String>, Error> {
    let mut values = metadata.get_all(ACTING_USER_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if kind == PrincipalKind::User {
        return Err(Error::new(
            ErrorCode::Forbidden,
            "only services may act for a user (x-acting-user)",
        ));
    }
    if values.next().is_some() {
        return Err(Error::invalid("x-acting-user is sent more than once"));
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
        let (principal, credential) = self.authenticate_with_credential(request.metadata())?;
        request.extensions_mut().insert(principal);
        if let Some(credential) = credential {
            request.extensions_mut().insert(credential);
        }
        Ok(request)
    }
}

/// The credential a request was authenticated with (none without tokens).
pub(crate) fn credential<T>(request: &Request<T>) -> Option<Credential> {
    request.extensions().get::<Credential>().cloned()
}

/// A server stream that ends with UNAUTHENTICATED as soon as `credential` is revoked,
/// whatever the inner stream is doing (catching up, live, or idle). Without a credential
/// the stream is returned as it is.
pub(crate) fn end_when_revoked<T: Send + 'static>(
    stream: Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>,
    credential: Option<Credential>,
) -> Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>> {
    let Some(credential) = credential else {
        return stream;
    };
    let revoked = Box::pin(credential.revoked());
    Box::pin(futures::stream::unfold(
        Some((stream, revoked)),
        |state| async move {
            let (mut stream, mut revoked) = state?;
            tokio::select! {
                biased;
                () = &mut revoked => {
                    let status = Status::from(Error::new(
                        ErrorCode::Unauthenticated,
                        "the token this stream was opened with has been revoked",
                    ));
                    // Dropping the inner stream ends its subscription task.
                    Some((Err(status), None))
                }
                item = stream.next() => item.map(|item| (item, Some((stream, revoked)))),
            }
        },
    ))
}

/// The principal the [`Authenticator`] attached to a request.
pub(crate) fn principal<T>(request: &Request<T>) -> Result<Principal, Status> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::internal("request reached a handler without authentication"))
}

/// The caller's W3C trace context, if it sent one.
pub(crate) fn traceparent<T>(request: &Request<T>) -> Option<String> {
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

    fn with_tokens(dir: &std::path::Path) -> Authenticator {
        let path = dir.join("tokens.toml");
        let row = |token: &str, principal: &str, kind: &str| {
            format!(
                "[[tokens]]\nsha256 = \"{}\"\nprincipal = \"{principal}\"\nkind = \"{kind}\"\n",
                hex::encode(crate::auth::tokens::digest(token))
            )
        };
        std::fs::write(
            &path,
            row("ada-token", "ada", "user")
                + &row("ci-token", "ci", "service")
                + &row("peer-token", "replica-b", "replica"),
        )
        .unwrap();
        Authenticator::with_tokens(TokenStore::open(&path).unwrap())
    }

    #[test]
    fn a_replica_acts_only_as_the_principal_it_forwards_for_and_nobody_else_may_forward() {
        let dir = tempfile::tempdir().unwrap();
        let auth = with_tokens(dir.path());
        let forwarded = auth
            .authenticate(&metadata(&[
                ("authorization", "Bearer peer-token"),
                (FORWARDED_PRINCIPAL_HEADER, "ci"),
                (FORWARDED_KIND_HEADER, "service"),
                (ACTING_USER_HEADER, "ada"),
            ]))
            .unwrap();
        assert_eq!(
            (forwarded.id.as_str(), forwarded.kind, forwarded.actor()),
            ("ci", PrincipalKind::Service, "ada")
        );
        let as_itself = auth
            .authenticate(&metadata(&[("authorization", "Bearer peer-token")]))
            .unwrap_err();
        assert_eq!(as_itself.code, ErrorCode::Forbidden);
        for bearer in ["Bearer ada-token", "Bearer ci-token"] {
            let spoofed = auth
                .authenticate(&metadata(&[
                    ("authorization", bearer),
                    (FORWARDED_PRINCIPAL_HEADER, "root"),
                    (FORWARDED_KIND_HEADER, "user"),
                ]))
                .unwrap_err();
            assert_eq!(spoofed.code, ErrorCode::Forbidden, "{bearer}");
        }
        let bad_kind = auth
            .authenticate(&metadata(&[
                ("authorization", "Bearer peer-token"),
                (FORWARDED_PRINCIPAL_HEADER, "x"),
                (FORWARDED_KIND_HEADER, "replica"),
            ]))
            .unwrap_err();
        assert_eq!(bad_kind.code, ErrorCode::InvalidArgument);
        // Without tokens the headers change nothing: every caller is `local`.
        let local = Authenticator::no_tokens()
            .authenticate(&metadata(&[
                (FORWARDED_PRINCIPAL_HEADER, "ada"),
                (FORWARDED_KIND_HEADER, "user"),
            ]))
            .unwrap();
        assert_eq!(local, Principal::local());
    }

    fn metadata(pairs: &[(&'static str, &str)]) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        for (key, value) in pairs {
            metadata.append(*key, value.parse().unwrap());
        }
        metadata
    }

    #[test]
    fn with_tokens_only_one_well_formed_bearer_header_with_a_listed_token_authenticates() {
        let dir = tempfile::tempdir().unwrap();
        let auth = with_tokens(dir.path());
        let ada = auth
            .authenticate(&metadata(&[("authorization", "Bearer ada-token")]))
            .unwrap();
        assert_eq!(ada, Principal::user("ada"));
        let lower = auth
            .authenticate(&metadata(&[("authorization", "bearer   ada-token ")]))
            .unwrap();
        assert_eq!(lower, Principal::user("ada"));
        for refused in [
            vec![],
            vec![("authorization", "ada-token")],
            vec![("authorization", "Basic ada-token")],
            vec![("authorization", "Bearer ")],
            vec![("authorization", "Bearer someone-elses")],
            vec![
                ("authorization", "Bearer ada-token"),
                ("authorization", "Bearer ci-token"),
            ],
        ] {
            let err = auth.authenticate(&metadata(&refused)).unwrap_err();
            assert_eq!(err.code, ErrorCode::Unauthenticated, "{refused:?}");
        }
        let long = format!("Bearer {}", "x".repeat(MAX_TOKEN_BYTES + 1));
        let err = auth
            .authenticate(&metadata(&[("authorization", &long)]))
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Unauthenticated);
    }

    #[test]
    fn a_service_may_act_for_a_user_but_a_user_naming_anyone_is_forbidden() {
        let dir = tempfile::tempdir().unwrap();
        let auth = with_tokens(dir.path());
        let service = auth
            .authenticate(&metadata(&[
                ("authorization", "Bearer ci-token"),
                (ACTING_USER_HEADER, "ada"),
            ]))
            .unwrap();
        assert_eq!((service.id.as_str(), service.actor()), ("ci", "ada"));
        let err = auth
            .authenticate(&metadata(&[
                ("authorization", "Bearer ada-token"),
                (ACTING_USER_HEADER, "ada"),
            ]))
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Forbidden);
        let err = auth
            .authenticate(&metadata(&[
                ("authorization", "Bearer ci-token"),
                (ACTING_USER_HEADER, "ada"),
                (ACTING_USER_HEADER, "bob"),
            ]))
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
    }

    #[test]
    fn without_tokens_an_authorization_header_is_ignored() {
        let auth = Authenticator::no_tokens();
        let principal = auth
            .authenticate(&metadata(&[("authorization", "Bearer whatever")]))
            .unwrap();
        assert_eq!(principal, Principal::local());
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
