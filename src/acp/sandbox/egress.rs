//! A box's only ways out: an HTTP proxy (CONNECT for TLS, absolute-form requests for plain
//! HTTP) that admits the hosts of the profile's `egress.allow`, and forwards of allowed loopback
//! ports. Both listen inside the box's own network namespace (the launcher opens the sockets
//! there and hands them over) and are served here, on the harness's side, so the box itself
//! never holds a route anywhere.
//!
//! A name is resolved here, and refused when it resolves to a loopback, link-local (cloud
//! metadata), private or otherwise local address: an allowed name cannot be pointed at the
//! harness, its database or the node's metadata service. An address written in `egress.allow`
//! is the operator's choice and is taken as written, except the harness's own ports, which no
//! entry opens.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use super::policy::{EgressRule, HostPattern};

/// The port of the proxy inside every box with a network of its own.
pub const PROXY_PORT: u16 = 3128;
/// The largest request head the proxy reads.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a client may take to send its request head, and the proxy to connect upstream.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The counter of the proxy's decisions.
pub(crate) const EGRESS_REQUESTS: &str = "agent_harness_egress_requests_total";

/// What one box may reach.
#[derive(Debug)]
pub struct EgressPolicy {
    pub profile: String,
    pub rules: Vec<EgressRule>,
    /// The harness's own listening addresses: never reachable from a box.
    pub harness: Vec<SocketAddr>,
}

/// Serves the proxy on `listener` until the returned task is aborted.
pub fn serve_proxy(listener: TcpListener, policy: Arc<EgressPolicy>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                // Only a closed or broken listener ends here.
                return;
            };
            let policy = policy.clone();
            tokio::spawn(async move {
                let _ = proxy_one(client, &policy).await;
            });
        }
    })
}

/// Serves a forward of `listener` (inside a box) to `target` on the host's loopback.
pub fn serve_forward(listener: TcpListener, target: SocketAddr) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                if let Ok(Ok(mut upstream)) =
                    tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    })
}

/// A request the proxy read: where to, and how.
struct Request {
    connect: bool,
    host: String,
    port: u16,
    /// The head to send upstream (plain HTTP), rewritten to origin form.
    head: Vec<u8>,
    /// Bytes the client sent after its head.
    rest: Vec<u8>,
}

async fn proxy_one(mut client: TcpStream, policy: &EgressPolicy) -> std::io::Result<()> {
    let request = match tokio::time::timeout(HEAD_TIMEOUT, read_request(&mut client)).await {
        Ok(Ok(request)) => request,
        Ok(Err(why)) => return answer(&mut client, 400, &why).await,
        Err(_) => return Ok(()),
    };
    let target = format!("{}:{}", request.host, request.port);
    let upstream = match admit(policy, &request.host, request.port).await {
        Ok(addresses) => addresses,
        Err(why) => {
            metrics::counter!(EGRESS_REQUESTS, "profile" => policy.profile.clone(), "decision" => "refused").increment(1);
            tracing::info!(profile = %policy.profile, %target, %why, "egress refused");
            return answer(
                &mut client,
                403,
                &format!("egress to {target} refused: {why}"),
            )
            .await;
        }
    };
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&upstream[..])).await;
    let mut server = match connected {
        Ok(Ok(server)) => server,
        Ok(Err(e)) => {
            metrics::counter!(EGRESS_REQUESTS, "profile" => policy.profile.clone(), "decision" => "failed").increment(1);
            return answer(
                &mut client,
                502,
                &format!("could not connect to {target}: {e}"),
            )
            .await;
        }
        Err(_) => {
            metrics::counter!(EGRESS_REQUESTS, "profile" => policy.profile.clone(), "decision" => "failed").increment(1);
            return answer(
                &mut client,
                504,
                &format!("connecting to {target} timed out"),
            )
            .await;
        }
    };
    metrics::counter!(EGRESS_REQUESTS, "profile" => policy.profile.clone(), "decision" => "allowed").increment(1);
    if request.connect {
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await?;
    } else {
        server.write_all(&request.head).await?;
    }
    server.write_all(&request.rest).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}

async fn read_request(client: &mut TcpStream) -> Result<Request, String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return Err("the request ended before its head".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                return request_of(&parsed, &buf[len..]);
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD_BYTES => continue,
            Ok(httparse::Status::Partial) => return Err("the request head is too long".into()),
            Err(e) => return Err(format!("not an HTTP request: {e}")),
        }
    }
}

fn request_of(parsed: &httparse::Request<'_, '_>, rest: &[u8]) -> Result<Request, String> {
    let method = parsed.method.unwrap_or_default();
    let path = parsed.path.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_host_port(path, None)?;
        return Ok(Request {
            connect: true,
            host,
            port,
            head: Vec::new(),
            rest: rest.to_vec(),
        });
    }
    // A plain HTTP request through a proxy names its whole URL.
    let url = url::Url::parse(path).map_err(|_| {
        "only CONNECT and absolute http:// requests go through this proxy".to_owned()
    })?;
    if url.scheme() != "http" {
        return Err(format!(
            "scheme {} is not proxied (use CONNECT)",
            url.scheme()
        ));
    }
    let host = url
        .host_str()
        .ok_or_else(|| "the URL has no host".to_owned())?
        .to_owned();
    let port = url.port_or_known_default().unwrap_or(80);
    let mut origin = url.path().to_owned();
    if let Some(query) = url.query() {
        origin.push('?');
        origin.push_str(query);
    }
    let mut head = format!(
        "{method} {origin} HTTP/1.{}\r\n",
        parsed.version.unwrap_or(1)
    )
    .into_bytes();
    for header in parsed.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        // Hop-by-hop and proxy headers stay here; one request per connection, so a client
        // reusing it for another host cannot reach that host through this one's upstream.
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        head.extend_from_slice(header.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(header.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Request {
        connect: false,
        host,
        port,
        head,
        rest: rest.to_vec(),
    })
}

fn split_host_port(text: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("{text:?} is not host:port");
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        (host.to_owned(), after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (text.to_owned(), None),
        }
    };
    let port = match port {
        Some(port) => port.parse().map_err(|_| bad())?,
        None => default_port.ok_or_else(bad)?,
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

/// The addresses to connect to for `host:port`, or why not.
async fn admit(policy: &EgressPolicy, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let Some(rule) = policy.rules.iter().find(|r| r.admits(host, port)) else {
        return Err(format!(
            "not in egress.allow of profile {} (allowed: {})",
            policy.profile,
            if policy.rules.is_empty() {
                "nothing".to_owned()
            } else {
                policy
                    .rules
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
    };
    let literal = matches!(rule.host, HostPattern::Ip(_));
    let addresses: Vec<SocketAddr> = match host.trim_matches(['[', ']']).parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| format!("{host} does not resolve: {e}"))?
            .collect(),
    };
    if addresses.is_empty() {
        return Err(format!("{host} does not resolve"));
    }
    for address in &addresses {
        if is_harness(policy, address) {
            return Err("the harness's own ports are never reachable from a box".into());
        }
        if !literal && is_local(address.ip()) {
            return Err(format!(
                "{host} resolves to {}, a local or private address (write the address itself \
                 in egress.allow to allow it)",
                address.ip()
            ));
        }
    }
    Ok(addresses)
}

fn is_harness(policy: &EgressPolicy, address: &SocketAddr) -> bool {
    policy.harness.iter().any(|own| {
        own.port() == address.port()
            && (own.ip() == address.ip()
                || own.ip().is_unspecified()
                || address.ip().is_loopback()
                || address.ip().is_unspecified())
    })
}

/// Loopback, link-local (where cloud metadata lives), private, shared, unspecified, multicast
/// or broadcast.
pub(crate) fn is_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
                || (a == 198 && (b == 18 || b == 19)) // benchmarking
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local (fd00:ec2::254 among them)
                || (first & 0xffc0) == 0xfe80 // link-local
                || v6.to_ipv4_mapped().is_some_and(|v4| is_local(IpAddr::V4(v4)))
        }
    }
}

async fn answer(client: &mut TcpStream, status: u16, why: &str) -> std::io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        _ => "Gateway Timeout",
    };
    let body = format!("{why}\n");
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_private_and_metadata_addresses_are_local() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_local(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["1.1.1.1", "104.18.0.1", "2606:4700::1111"] {
            assert!(!is_local(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn the_harness_ports_are_refused_whatever_the_rules_say() {
        let policy = EgressPolicy {
            profile: "p".into(),
            rules: vec![EgressRule::parse("127.0.0.1").unwrap()],
            harness: vec!["0.0.0.0:50051".parse().unwrap()],
        };
        assert!(admit(&policy, "127.0.0.1", 50051).await.is_err());
        assert!(admit(&policy, "127.0.0.1", 8080).await.is_ok());
        assert!(admit(&policy, "example.com", 443).await.is_err());
    }
}
