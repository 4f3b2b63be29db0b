//! What the benchmark reads about the machine and its processes from `/proc`: CPU model, cores,
//! kernel, load, a process's CPU time and resident memory.

use std::time::Duration;

/// The machine a run was measured on.
#[derive(Debug, Clone)]
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
}

impl Machine {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "model name").then(|| value.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        Self {
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".to_owned()),
        }
    }
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> Option<(f64, f64, f64)> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn parse_loadavg(text: &str) -> Option<(f64, f64, f64)> {
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    Some((
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    ))
}

/// Resident memory of a process, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resident {
    /// `VmRSS`: everything resident.
    pub rss_kib: u64,
    /// `RssAnon`: the heap, stacks and other private memory.
    pub anon_kib: u64,
}

pub fn resident(pid: u32) -> Option<Resident> {
    parse_status(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

fn parse_status(text: &str) -> Option<Resident> {
    let field = |name: &str| {
        text.lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
    };
    Some(Resident {
        rss_kib: field("VmRSS:")?,
        anon_kib: field("RssAnon:").unwrap_or(0),
    })
}

/// Resident memory of a process by kind of mapping, from `/proc/<pid>/smaps`, in KiB: `heap`
/// (the main malloc arena), `anonymous` (other malloc arenas, thread stacks, large
/// allocations), `file` (the executable, libraries, the SQLite shared-memory index), `other`.
pub fn resident_by_mapping(pid: u32) -> Option<std::collections::BTreeMap<&'static str, u64>> {
    Some(parse_smaps(
        &std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?,
    ))
}

fn parse_smaps(text: &str) -> std::collections::BTreeMap<&'static str, u64> {
    let mut kinds = std::collections::BTreeMap::new();
    let mut kind = "other";
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // A mapping header: range, perms, offset, dev, inode, [name].
            let name = fields.nth(4).unwrap_or("");
            kind = match name {
                "" => "anonymous",
                "[heap]" => "heap",
                n if n.starts_with('/') => "file",
                _ => "other",
            };
        } else if first == "Rss:" {
            let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *kinds.entry(kind).or_insert(0) += kib;
        }
    }
    kinds
}

/// The parent pid and the CPU time (user + system) of a process, from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(u32, Duration)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

fn parse_stat(text: &str) -> Option<(u32, Duration)> {
    // The command name (field 2) may hold spaces and parentheses: read after the last ')'.
    let rest = text.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields from 3 on: state (3), ppid (4), …, utime (14), stime (15).
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = clock_ticks();
    let cpu = Duration::from_micros((utime + stime) * 1_000_000 / ticks);
    Some((ppid, cpu))
}

/// CPU time used so far by a process.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    stat(pid).map(|(_, cpu)| cpu)
}

/// CPU time used so far by the live children of a process (its runtimes), and how many there are.
pub fn children_cpu_time(parent: u32) -> (Duration, usize) {
    let mut total = Duration::ZERO;
    let mut count = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, cpu)) = stat(pid)
            && ppid == parent
        {
            total += cpu;
            count += 1;
        }
    }
    (total, count)
}

/// CPU time used by this process so far.
pub fn own_cpu_time() -> Duration {
    cpu_time(std::process::id()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_average_is_read_from_its_first_three_fields() {
        assert_eq!(
            parse_loadavg("0.83 1.25 2.30 3/412 12345\n"),
            Some((0.83, 1.25, 2.30))
        );
        assert_eq!(parse_loadavg("garbage"), None);
    }

    #[test]
    fn resident_memory_is_read_from_vmrss_and_rssanon() {
        let status = "Name:\tagent-harness\nVmRSS:\t   12345 kB\nRssAnon:\t    9000 kB\n";
        assert_eq!(
            parse_status(status),
            Some(Resident {
                rss_kib: 12345,
                anon_kib: 9000
            })
        );
        assert_eq!(parse_status("Name:\tx\n"), None);
    }

    #[test]
    fn resident_memory_is_told_apart_by_kind_of_mapping() {
        let smaps = "\
55d0-55d1 r-xp 00000000 fe:00 1 /usr/bin/agent-harness
Rss:                 100 kB
55e0-55e9 rw-p 00000000 00:00 0                          [heap]
Rss:                 300 kB
7f00-7f10 rw-p 00000000 00:00 0 
Rss:                  40 kB
7f20-7f30 rw-p 00000000 00:00 0
Rss:                   2 kB
7ffc-7ffd rw-p 00000000 00:00 0                          [stack]
Rss:                   8 kB
";
        let kinds = parse_smaps(smaps);
        assert_eq!(kinds["file"], 100);
        assert_eq!(kinds["heap"], 300);
        assert_eq!(kinds["anonymous"], 42);
        assert_eq!(kinds["other"], 8);
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_stat_fields() {
        let ticks = clock_ticks();
        let stat = format!(
            "42 (odd (name) here) S 7 42 42 0 -1 4194304 100 0 0 0 {} {} 0 0 20 0 1 0 5 0 0",
            ticks * 2,
            ticks
        );
        assert_eq!(parse_stat(&stat), Some((7, Duration::from_secs(3))));
    }

    #[test]
    fn this_process_can_read_its_own_cpu_time_and_memory() {
        let pid = std::process::id();
        assert!(cpu_time(pid).is_some());
        assert!(resident(pid).is_some_and(|r| r.rss_kib > 0));
    }
}
