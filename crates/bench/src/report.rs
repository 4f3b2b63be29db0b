//! The table the benchmark prints: one row per figure, each beside what it is held against in the
//! same run, the ratio, the target and a verdict; then what each phase cost and what bounds it.

use std::{fmt::Write as _, time::Duration};

/// Every row key, in print order (the smoke stage of `scripts/test` checks each is printed; the
/// bench's tests hold the figures and the script to this list).
#[cfg(test)]
pub const ROW_KEYS: [&str; 31] = [
    "rtt-p50",
    "rtt-p99",
    "rtt-stretch",
    "rtt-messages-p50",
    "turns",
    "fanout-rate",
    "fanout-lag",
    "fanout-behind",
    "replay",
    "translate",
    "rss",
    "rss-48",
    "messages-memory",
    "sessions-latency",
    "turns-pg",
    "replica-lag",
    "bridge-rtt-p50",
    "warm-create",
    "idle-db",
    "idle-subscribers",
    "peers-log",
    "peers-messages",
    "peers-log-python",
    "peers-messages-python",
    "real-agent",
    "sandbox-cold",
    "sandbox-rtt",
    "tenant-memory",
    "tenant-latency",
    "tenant-memory-returned",
    "model-proxy-first-byte",
];

/// Whether a target is met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// The figure could not be measured (the phase failed).
    Failed,
    /// Not measured by choice (e.g. no database was given); a note says why.
    Skipped,
}

impl Verdict {
    pub fn of(met: bool) -> Self {
        if met { Self::Met } else { Self::Missed }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Met => "MET",
            Self::Missed => "MISSED",
            Self::Failed => "FAILED",
            Self::Skipped => "SKIPPED",
        }
    }
}

/// One printed figure.
#[derive(Debug, Clone)]
pub struct Row {
    pub key: &'static str,
    pub figure: String,
    pub measured: String,
    /// The baseline or limit it is held against, measured in this same run where there is one.
    pub against: String,
    /// `measured / against`, with what that means.
    pub ratio: Option<f64>,
    pub target: String,
    pub verdict: Verdict,
}

impl Row {
    pub fn failed(key: &'static str, figure: &str, target: &str, error: &str) -> Self {
        Self {
            key,
            figure: figure.to_owned(),
            measured: format!("error: {error}"),
            against: "-".to_owned(),
            ratio: None,
            target: target.to_owned(),
            verdict: Verdict::Failed,
        }
    }
}

/// What a phase used, for the notes under the table.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub wall: Duration,
    pub server_cpu: Duration,
    pub runtimes_cpu: Duration,
    pub runtimes: usize,
    pub bench_cpu: Duration,
}

impl Usage {
    pub fn describe(&self) -> String {
        let pct = |cpu: Duration| {
            if self.wall.is_zero() {
                0.0
            } else {
                100.0 * cpu.as_secs_f64() / self.wall.as_secs_f64()
            }
        };
        format!(
            "over {:.1} s: harness {:.0} %, {} runtimes {:.0} %, bench client {:.0} % of one core",
            self.wall.as_secs_f64(),
            pct(self.server_cpu),
            self.runtimes,
            pct(self.runtimes_cpu),
            pct(self.bench_cpu),
        )
    }
}

/// A phase's figures and notes.
#[derive(Debug, Clone, Default)]
pub struct PhaseReport {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

/// Formats `value` with thousands separators and `decimals` decimals.
pub fn grouped(value: f64, decimals: usize) -> String {
    let text = format!("{value:.decimals$}");
    let (int, frac) = match text.split_once('.') {
        Some((int, frac)) => (int.to_owned(), Some(frac.to_owned())),
        None => (text, None),
    };
    let (sign, digits) = match int.strip_prefix('-') {
        Some(digits) => ("-", digits),
        None => ("", int.as_str()),
    };
    let mut out = String::from(sign);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if let Some(frac) = frac {
        out.push('.');
        out.push_str(&frac);
    }
    out
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

const HEADERS: [&str; 7] = [
    "figure",
    "measured",
    "held against (same run)",
    "ratio",
    "target",
    "verdict",
    "key",
];

fn cells(row: &Row) -> [String; 7] {
    [
        row.figure.clone(),
        row.measured.clone(),
        row.against.clone(),
        row.ratio
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}")),
        row.target.clone(),
        row.verdict.as_str().to_owned(),
        row.key.to_owned(),
    ]
}

/// The table as aligned text; each line starts with the row key so scripts can find it.
pub fn text_table(rows: &[Row]) -> String {
    let mut all: Vec<[String; 7]> = vec![HEADERS.map(str::to_owned)];
    all.extend(rows.iter().map(cells));
    // Key first in text form.
    let order = [6, 0, 1, 2, 3, 4, 5];
    let widths: Vec<usize> = order
        .iter()
        .map(|&c| all.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, row) in all.iter().enumerate() {
        let line: Vec<String> = order
            .iter()
            .zip(&widths)
            .map(|(&c, &w)| format!("{:<w$}", row[c]))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
        if i == 0 {
            let _ = writeln!(out, "{}", "-".repeat(widths.iter().sum::<usize>() + 2 * 6));
        }
    }
    out
}

/// The table in Markdown, for docs/benchmarks.md.
pub fn markdown_table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", HEADERS.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(HEADERS.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", cells(row).join(" | "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &'static str, verdict: Verdict) -> Row {
        Row {
            key,
            figure: "sustained turns/s".to_owned(),
            measured: "1,234 turns/s".to_owned(),
            against: "limit 2,000".to_owned(),
            ratio: Some(0.617),
            target: ">= 2,000".to_owned(),
            verdict,
        }
    }

    #[test]
    fn numbers_are_grouped_by_thousands_with_the_decimals_asked_for() {
        assert_eq!(grouped(1_234_567.891, 1), "1,234,567.9");
        assert_eq!(grouped(999.0, 0), "999");
        assert_eq!(grouped(-12_345.0, 0), "-12,345");
        assert_eq!(grouped(0.5, 2), "0.50");
    }

    #[test]
    fn every_text_line_of_a_figure_starts_with_its_key_and_carries_its_verdict() {
        let table = text_table(&[row("turns", Verdict::Missed), row("rss", Verdict::Met)]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[2].starts_with("turns ") && lines[2].ends_with("MISSED"));
        assert!(lines[3].starts_with("rss ") && lines[3].ends_with("MET"));
        assert!(lines[2].contains("0.617"));
    }

    #[test]
    fn the_markdown_table_has_one_line_per_figure_under_its_header() {
        let table = markdown_table(&[row("turns", Verdict::Failed)]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[2].contains("| FAILED | turns |"));
    }

    #[test]
    fn usage_is_told_as_a_share_of_one_core() {
        let usage = Usage {
            wall: Duration::from_secs(10),
            server_cpu: Duration::from_secs(15),
            runtimes_cpu: Duration::from_secs(2),
            runtimes: 100,
            bench_cpu: Duration::from_secs(3),
        };
        assert_eq!(
            usage.describe(),
            "over 10.0 s: harness 150 %, 100 runtimes 20 %, bench client 30 % of one core"
        );
    }
}
