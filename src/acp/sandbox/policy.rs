//! What a profile's box holds and may reach: extra paths, resource limits, the hosts it may
//! connect to, the HOME seed. Parsed and checked when the config is read, so a runtime start
//! never finds a bad value.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

/// How one profile's runtimes are boxed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BoxPolicy {
    /// Host paths shown read-only (an agent's install, tools).
    pub read_only: Vec<PathBuf>,
    /// Host paths shown read-write (shared scratch space; never a HOME or another's cwd).
    pub read_write: Vec<PathBuf>,
    /// Limits of the runtime's whole process tree (`None`: none).
    pub limits: Limits,
    pub egress: Egress,
    /// A directory copied into the owner's HOME before each start (config files the agent
    /// reads from HOME); the files it holds win over the HOME's.
    pub home_seed: Option<PathBuf>,
    /// The agent may build a sandbox of its own (Codex runs its commands in one): new user
    /// namespaces, and mounts in them, are not refused. Inside the box's own user namespace the
    /// agent still has no capability.
    pub nested: bool,
    /// The providers whose calls go through the model proxy (docs/model-proxy.md): the box gets
    /// a listener for it, and the agent its session's token in place of each key.
    pub model: Vec<crate::model_proxy::ModelRoute>,
}

/// Resource limits of one runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Bytes of memory (page cache and `/tmp` included); past it the runtime is killed whole.
    pub memory: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u64>,
    /// CPU time in thousandths of a CPU (`1500` is one and a half).
    pub cpu_millis: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.memory.is_none() && self.pids.is_none() && self.cpu_millis.is_none()
    }
}

/// Where a box may connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Egress {
    /// The host's network as it is (`egress = "open"`): no namespace of its own.
    Open,
    /// Only these destinations, through the harness's proxy (or a forward, for a loopback
    /// address with a port).
    Allow(Vec<EgressRule>),
}

impl Default for Egress {
    fn default() -> Self {
        Self::Allow(Vec::new())
    }
}

/// One `egress.allow` entry: a host (or `*.domain`, or an IP address) and optionally a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRule {
    pub host: HostPattern,
    /// `None`: any port.
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// A host name, lower case.
    Name(String),
    /// `*.example.com`: any name ending in `.example.com` (not `example.com` itself).
    Suffix(String),
    Ip(IpAddr),
}

impl EgressRule {
    /// Parses `host`, `host:port`, `*.domain[:port]`, `1.2.3.4[:port]` or `[::1][:port]`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{text:?} is not a host[:port] (e.g. \"api.anthropic.com\", \
                 \"registry.npmjs.org:443\", \"*.example.com\", \"127.0.0.1:8080\")"
            )
        };
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (ip, after) = rest.split_once(']').ok_or_else(bad)?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or_else(bad)?),
            };
            (ip, port)
        } else {
            match text.rsplit_once(':') {
                Some((host, port)) if !host.contains(':') => (host, Some(port)),
                Some(_) => (text, None), // a bare IPv6 address
                None => (text, None),
            }
        };
        let port = match port {
            Some(port) => Some(
                port.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(bad)?,
            ),
            None => None,
        };
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Self {
                host: HostPattern::Ip(ip),
                port,
            });
        }
        let (pattern, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        let valid_label = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(valid_label) {
            return Err(bad());
        }
        let name = name.to_ascii_lowercase();
        Ok(Self {
            host: match pattern {
                true => HostPattern::Suffix(name),
                false => HostPattern::Name(name),
            },
            port,
        })
    }

    /// Whether a connection to `host:port` (as the client asked for it) is this rule's.
    pub fn admits(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match &self.host {
            HostPattern::Ip(ip) => host.parse::<IpAddr>().is_ok_and(|h| h == *ip),
            HostPattern::Name(name) => host.eq_ignore_ascii_case(name),
            HostPattern::Suffix(suffix) => {
                let host = host.to_ascii_lowercase();
                host.len() > suffix.len() + 1
                    && host.ends_with(suffix.as_str())
                    && host[..host.len() - suffix.len()].ends_with('.')
            }
        }
    }

    /// A loopback address with a port: served as a forward inside the box to the same port on
    /// the host's loopback, so a local endpoint keeps its URL (`http://127.0.0.1:8080`).
    pub fn loopback_forward(&self) -> Option<(IpAddr, u16)> {
        match (&self.host, self.port) {
            (HostPattern::Ip(ip), Some(port)) if ip.is_loopback() => Some((*ip, port)),
            _ => None,
        }
    }
}

impl std::fmt::Display for EgressRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            HostPattern::Name(name) => f.write_str(name)?,
            HostPattern::Suffix(suffix) => write!(f, "*.{suffix}")?,
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
            HostPattern::Ip(ip) => write!(f, "{ip}")?,
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// Parses a size such as `"2GiB"`, `"512MiB"`, `"64k"` or a number of bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a size such as \"2GiB\" or \"512MiB\"");
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_lowercase();
    let scale: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    number.checked_mul(scale).filter(|n| *n > 0).ok_or_else(bad)
}

/// A size as people write it (`2 GiB`).
pub fn format_size(bytes: u64) -> String {
    for (unit, scale) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{} {unit}", bytes / scale);
        }
    }
    if bytes >= 1 << 30 {
        return format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64);
    }
    if bytes >= 1 << 20 {
        return format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64);
    }
    format!("{bytes} bytes")
}

/// Parses a CPU quota such as `"1.5"` (CPUs) into thousandths.
pub fn parse_cpu(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a number of CPUs such as \"1\" or \"0.5\"");
    let value: f64 = text.trim().parse().map_err(|_| bad())?;
    if !value.is_finite() || !(0.01..=4096.0).contains(&value) {
        return Err(bad());
    }
    Ok((value * 1000.0).round() as u64)
}

/// Whether two paths overlap: one is the other or lies under it.
pub fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_entries_are_hosts_with_optional_ports_and_nothing_else() {
        let rule = EgressRule::parse("API.Anthropic.com").unwrap();
        assert!(rule.admits("api.anthropic.com", 443));
        assert!(rule.admits("api.anthropic.com", 80));
        assert!(!rule.admits("evil.api.anthropic.com", 443));
        let rule = EgressRule::parse("registry.npmjs.org:443").unwrap();
        assert!(rule.admits("registry.npmjs.org", 443));
        assert!(!rule.admits("registry.npmjs.org", 80));
        let rule = EgressRule::parse("*.example.com").unwrap();
        assert!(rule.admits("a.example.com", 443));
        assert!(rule.admits("a.b.example.com", 443));
        assert!(!rule.admits("example.com", 443));
        assert!(!rule.admits("badexample.com", 443));
        let rule = EgressRule::parse("127.0.0.1:8080").unwrap();
        assert_eq!(
            rule.loopback_forward(),
            Some(("127.0.0.1".parse().unwrap(), 8080))
        );
        let rule = EgressRule::parse("[::1]:8080").unwrap();
        assert!(rule.admits("[::1]", 8080));
        assert_eq!(rule.to_string(), "[::1]:8080");
        for bad in [
            "",
            "http://example.com",
            "example.com/path",
            "example.com:0",
            "example.com:99999",
            "exa mple.com",
            "*.",
            "-a.com",
            "a..com",
            "[::1",
        ] {
            assert!(EgressRule::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_and_cpu_quotas_parse_strictly() {
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["", "0", "2 GB extra", "-1G", "1.5G", "lots", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_size(2 << 30), "2 GiB");
        assert_eq!(parse_cpu("1.5"), Ok(1500));
        assert!(parse_cpu("0").is_err());
        assert!(parse_cpu("many").is_err());
    }
}
