//! The built-in console's files, compiled into the binary from `console/dist/`
//! (built from `console/src/` by `console/build.sh`; `scripts/test browser` checks the
//! committed bundle is current). Nothing is fetched at run time.

use http::{HeaderValue, Response, StatusCode, header};
use tonic::{body::Body, codegen::Bytes};

/// Path, content type, bytes. The icon answers at `/favicon.ico` too, where browsers and other
/// tools look without being told.
const ASSETS: [(&str, &str, &[u8]); 5] = [
    (
        "/",
        "text/html; charset=utf-8",
        include_bytes!("../../console/dist/index.html"),
    ),
    (
        "/app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../console/dist/app.js"),
    ),
    (
        "/app.css",
        "text/css; charset=utf-8",
        include_bytes!("../../console/dist/app.css"),
    ),
    (
        "/favicon.svg",
        "image/svg+xml",
        include_bytes!("../../console/dist/favicon.svg"),
    ),
    (
        "/favicon.ico",
        "image/svg+xml",
        include_bytes!("../../console/dist/favicon.svg"),
    ),
];

/// The page may talk only to its own origin and load only its own files: a transcript shows an
/// agent's output, which must never run as script.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The response for a console path, or `None` when `path` is not one of its files.
pub(crate) fn respond(path: &str) -> Option<Response<Body>> {
    let path = if path == "/index.html" { "/" } else { path };
    let (_, content_type, bytes) = ASSETS.iter().find(|(p, _, _)| *p == path)?;
    Some(file(Bytes::from_static(bytes), content_type))
}

/// `/defaults.json`: what the console's forms start with (`{"cwd": …}`).
pub(crate) fn defaults(json: Bytes) -> Response<Body> {
    file(json, "application/json")
}

fn file(bytes: Bytes, content_type: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::new(http_body_util::Full::new(bytes)));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // The bundle changes with the binary; a stale cached copy would speak an older contract.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
