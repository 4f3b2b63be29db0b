//! Facts about network names and addresses that the server and its clients (the command line,
//! the bridge) share. It imports nothing of the crate, so every layer, clients included, may use it.

use std::net::IpAddr;

/// Whether `host` (a name or an address, IPv6 with or without brackets, no port) names this
/// machine's loopback: `localhost`, a name under `.localhost` (which resolvers keep on loopback),
/// 127.0.0.0/8 or ::1.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return ip.to_canonical().is_loopback();
    }
    let lower = host.to_ascii_lowercase();
    lower == "localhost" || lower.ends_with(".localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses_are_loopback_and_nothing_else_is() {
        for host in [
            "localhost",
            "LocalHost",
            "localhost.",
            "app.localhost",
            "127.0.0.1",
            "127.1.2.3",
            "[::1]",
            "::1",
            "[::ffff:127.0.0.1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "rebind.attacker.example",
            "localhost.attacker.example",
            "notlocalhost",
            "0.0.0.0",
            "10.0.0.1",
            "[::]",
            "128.0.0.1",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
