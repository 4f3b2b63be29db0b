//! No DNS rebinding (docs/security.md): with no tokens configured every caller is the
//! all-powerful `local` principal, so whatever a browser can reach must be reachable only from a
//! page on this machine. A page on `rebind.attacker.example`, whose name the attacker later points
//! at 127.0.0.1, sends that name as `Host`; a page elsewhere that calls us sends its own
//! `Origin`. This layer refuses both with 403 before anything is served or created.
//!
//! Browser-facing means anything but native gRPC: every HTTP/1 request (browsers speak plaintext
//! only as HTTP/1), gRPC-Web, the console's files, CORS preflights, and any request carrying an
//! `Origin` (browsers add it to every POST). Native gRPC over HTTP/2 without an `Origin` — tonic,
//! grpcurl, the bridges, other replicas — passes untouched, so a server listening on a
//! non-loopback address (`--insecure-allow-non-loopback`) still serves its remote native clients.
//!
//! Installed only when no tokens are configured: with tokens, a rebound page has none to send.

use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode, Version, header, uri::Authority};
use tonic::body::Body;
use tower::{Layer, Service};

use crate::{
    grpc::browser::{BoxFuture, plain},
    net::is_loopback_host,
};

/// Refuses browser-facing requests that are not from a loopback page; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct LoopbackOnlyLayer {
    /// The CORS allowlist: origins a page may be served from, exactly as browsers send them.
    allowed_origins: std::sync::Arc<[String]>,
}

impl LoopbackOnlyLayer {
    pub(crate) fn new(allowed_origins: &[String]) -> Self {
        Self {
            allowed_origins: allowed_origins.into(),
        }
    }

    /// `Ok` to serve the request; `Err` says why not.
    fn check<B>(&self, request: &Request<B>) -> Result<(), &'static str> {
        let headers = request.headers();
        let origin = headers.get(header::ORIGIN);
        if origin.is_none() && is_native_grpc(request) {
            return Ok(());
        }
        let host = loopback_authority(request)?;
        match origin {
            None => Ok(()),
            Some(origin)
                if self
                    .allowed_origins
                    .iter()
                    .any(|o| o.as_bytes() == origin.as_bytes()) =>
            {
                Ok(())
            }
            Some(origin) if is_same_origin(origin, &host) => Ok(()),
            Some(_) => Err(
                "the page's Origin is neither this server's own loopback origin nor on the \
                 allowlist (--cors-allow-origin)",
            ),
        }
    }
}

impl<S> Layer<S> for LoopbackOnlyLayer {
    type Service = LoopbackOnly<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LoopbackOnly {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`LoopbackOnlyLayer`].
#[derive(Debug, Clone)]
pub(crate) struct LoopbackOnly<S> {
    inner: S,
    layer: LoopbackOnlyLayer,
}

impl<S, B> Service<Request<B>> for LoopbackOnly<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Response<Body>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.layer.check(&request) {
            Ok(()) => Box::pin(self.inner.call(request)),
            Err(why) => {
                tracing::info!(
                    host = ?shown(request.headers().get(header::HOST)),
                    authority = ?request.uri().authority().map(|a| a.as_str().chars().take(256).collect::<String>()),
                    origin = ?shown(request.headers().get(header::ORIGIN)),
                    path = %request.uri().path().chars().take(256).collect::<String>(),
                    why,
                    "refused a browser request: with no tokens configured only pages on this machine are served"
                );
                Box::pin(std::future::ready(Ok(plain(
                    StatusCode::FORBIDDEN,
                    "refused: with no tokens configured, browsers are served only from loopback \
                     pages (Host localhost, *.localhost, 127.0.0.0/8 or [::1]; Origin this server \
                     or --cors-allow-origin). Configure tokens (--tokens-file) to serve other \
                     names; see docs/security.md\n",
                ))))
            }
        }
    }
}

/// Native gRPC: HTTP/2 with a gRPC content type that is not gRPC-Web. Browsers cannot send it
/// without an `Origin`.
fn is_native_grpc<B>(request: &Request<B>) -> bool {
    request.version() == Version::HTTP_2
        && request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.starts_with("application/grpc") && !v.starts_with("application/grpc-web")
            })
}

/// The authority the request was sent to, when every place that names it (the request line or
/// HTTP/2 `:authority`, and `Host`) names loopback. At least one must be there, and at most one
/// `Host`.
fn loopback_authority<B>(request: &Request<B>) -> Result<Authority, &'static str> {
    let mut named = request.uri().authority().cloned();
    let mut hosts = request.headers().get_all(header::HOST).iter();
    if let Some(host) = hosts.next() {
        let host =
            Authority::try_from(host.as_bytes()).map_err(|_| "the Host is not a host name")?;
        if named
            .as_ref()
            .is_some_and(|a| !a.as_str().eq_ignore_ascii_case(host.as_str()))
        {
            return Err("the Host and the request's authority differ");
        }
        named = Some(host);
    }
    if hosts.next().is_some() {
        return Err("more than one Host");
    }
    let authority = named.ok_or("no Host")?;
    // A `user@` before the host is no part of a Host a browser sends.
    if authority.as_str().contains('@') || !is_loopback_host(authority.host()) {
        return Err(
            "the Host is not a loopback name or address (a DNS-rebound page sends its own name)",
        );
    }
    Ok(authority)
}

/// Whether `origin` is the origin of the page served at `host` (same host and port, either scheme:
/// behind TLS or not, it is this server).
fn is_same_origin(origin: &HeaderValue, host: &Authority) -> bool {
    let Some(origin) = origin.to_str().ok().and_then(|o| url::Url::parse(o).ok()) else {
        return false;
    };
    let Some(default_port) = (match origin.scheme() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }) else {
        return false;
    };
    let Some(origin_host) = origin.host_str() else {
        return false;
    };
    origin_host.eq_ignore_ascii_case(host.host())
        && origin.port_or_known_default() == Some(host.port_u16().unwrap_or(default_port))
}

/// A header for the log: bounded, and never more than a line.
fn shown(value: Option<&HeaderValue>) -> Option<String> {
    value.map(|v| {
        String::from_utf8_lossy(v.as_bytes())
            .chars()
            .take(256)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOWED: &str = "https://ui.example:8443";

    fn layer() -> LoopbackOnlyLayer {
        LoopbackOnlyLayer::new(&[ALLOWED.to_owned()])
    }

    fn http1(host: &str, origin: Option<&str>) -> Request<()> {
        let mut builder = Request::post("/agent_harness.v1.AgentSessionService/CreateSession")
            .version(Version::HTTP_11)
            .header(header::HOST, host)
            .header(header::CONTENT_TYPE, "application/grpc-web+proto");
        if let Some(origin) = origin {
            builder = builder.header(header::ORIGIN, origin);
        }
        builder.body(()).unwrap()
    }

    fn native(authority: &str, content_type: &str) -> Request<()> {
        Request::post(format!(
            "http://{authority}/agent_harness.v1.AgentSessionService/ListSessions"
        ))
        .version(Version::HTTP_2)
        .header(header::CONTENT_TYPE, content_type)
        .body(())
        .unwrap()
    }

    #[test]
    fn a_page_on_a_rebound_name_is_refused_whatever_its_port() {
        assert!(
            layer()
                .check(&http1("rebind.attacker.example:50051", None))
                .is_err()
        );
        assert!(
            layer()
                .check(&http1(
                    "rebind.attacker.example:50051",
                    Some("http://rebind.attacker.example:50051")
                ))
                .is_err()
        );
        assert!(
            layer()
                .check(&http1("rebind.attacker.example", None))
                .is_err()
        );
    }

    #[test]
    fn a_loopback_host_with_its_own_origin_or_none_is_served() {
        for host in [
            "127.0.0.1:50051",
            "localhost:8080",
            "[::1]:1",
            "app.localhost",
        ] {
            assert_eq!(layer().check(&http1(host, None)), Ok(()), "{host}");
            let origin = format!("http://{host}");
            assert_eq!(layer().check(&http1(host, Some(&origin))), Ok(()), "{host}");
            let origin = format!("https://{host}");
            assert_eq!(layer().check(&http1(host, Some(&origin))), Ok(()), "{host}");
        }
        assert_eq!(
            layer().check(&http1("localhost", Some("http://localhost:80"))),
            Ok(())
        );
    }

    #[test]
    fn a_foreign_origin_is_refused_unless_allowed() {
        let host = "127.0.0.1:50051";
        for origin in [
            "http://rebind.attacker.example:50051",
            "http://127.0.0.1:50052",
            "http://localhost:50051",
            "null",
            "file://",
            "https://ui.example",
        ] {
            assert!(
                layer().check(&http1(host, Some(origin))).is_err(),
                "{origin}"
            );
        }
        assert_eq!(layer().check(&http1(host, Some(ALLOWED))), Ok(()));
    }

    #[test]
    fn native_grpc_passes_whatever_its_authority_unless_it_carries_an_origin() {
        for content_type in ["application/grpc", "application/grpc+proto"] {
            assert_eq!(
                layer().check(&native("10.1.2.3:50051", content_type)),
                Ok(())
            );
        }
        let web = native("10.1.2.3:50051", "application/grpc-web+proto");
        assert!(layer().check(&web).is_err());
        let mut from_a_page = native("10.1.2.3:50051", "application/grpc");
        from_a_page.headers_mut().insert(
            header::ORIGIN,
            HeaderValue::from_static("http://10.1.2.3:50051"),
        );
        assert!(layer().check(&from_a_page).is_err());
        // Native gRPC over HTTP/1 is not native gRPC: a browser can send it.
        let mut over_http1 = http1("rebind.attacker.example:50051", None);
        over_http1.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        assert!(layer().check(&over_http1).is_err());
    }

    #[test]
    fn no_host_two_hosts_or_a_host_that_contradicts_the_authority_are_refused() {
        let mut none = http1("127.0.0.1", None);
        none.headers_mut().remove(header::HOST);
        assert!(layer().check(&none).is_err());

        let mut two = http1("127.0.0.1", None);
        two.headers_mut().append(
            header::HOST,
            HeaderValue::from_static("rebind.attacker.example"),
        );
        assert!(layer().check(&two).is_err());

        let mut absolute = Request::get("http://127.0.0.1:50051/")
            .header(header::HOST, "rebind.attacker.example:50051")
            .body(())
            .unwrap();
        assert!(layer().check(&absolute).is_err());
        absolute
            .headers_mut()
            .insert(header::HOST, HeaderValue::from_static("127.0.0.1:50051"));
        assert_eq!(layer().check(&absolute), Ok(()));

        assert!(layer().check(&http1("user@127.0.0.1", None)).is_err());
    }

    #[test]
    fn the_console_over_http2_is_judged_by_its_authority() {
        let page = |authority: &str| {
            Request::get(format!("https://{authority}/"))
                .version(Version::HTTP_2)
                .body(())
                .unwrap()
        };
        assert_eq!(layer().check(&page("localhost:50051")), Ok(()));
        assert!(
            layer()
                .check(&page("rebind.attacker.example:50051"))
                .is_err()
        );
    }
}
