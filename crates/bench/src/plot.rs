//! The third wave's plots (`--plots DIR`), drawn from the run that measured them: turn latency
//! against the sessions a server holds (`sessions-latency`), and the memory MESSAGES subscribers
//! take against their number and the transcript's size (`messages-memory`). PNG, through
//! `plotters`' bitmap backend; text in DejaVu Sans read at run time (without the font the plots
//! are drawn without any text, and the bench says so).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context;
use plotters::{coord::types::RangedCoordf64, prelude::*};

/// Where the text's font is read from.
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const SIZE: (u32, u32) = (960, 600);
pub const LATENCY_FILE: &str = "bench-latency-vs-sessions.png";
pub const MEMORY_FILE: &str = "bench-memory-vs-subscribers.png";
const COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Turn latency of the active sessions with `sessions` held in all.
#[derive(Debug, Clone, Copy)]
pub struct LatencyPoint {
    pub sessions: usize,
    pub p50: Duration,
    pub p99: Duration,
}

/// Growth of the server's memory with `subscribers` MESSAGES subscribers of a transcript of
/// `transcript_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct MemoryPoint {
    pub transcript_bytes: usize,
    pub subscribers: usize,
    pub grown_kib: u64,
}

/// What a run measured for the plots.
#[derive(Debug, Clone, Default)]
pub struct Plots {
    pub latency: Vec<LatencyPoint>,
    /// Active sessions among them (for the axis's label).
    pub active: usize,
    pub memory: Vec<MemoryPoint>,
}

/// Registers the font; whether text can be drawn.
fn font() -> bool {
    let Ok(bytes) = std::fs::read(FONT) else {
        return false;
    };
    // plotters keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
}

/// Writes the plots the run has data for into `dir`; the files written, and what was not.
pub fn write(plots: &Plots, dir: &Path) -> anyhow::Result<(Vec<PathBuf>, Vec<String>)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let text = font();
    let mut written = Vec::new();
    let mut missing = Vec::new();
    if !text {
        missing.push(format!("no font at {FONT}: the plots carry no text"));
    }
    type Draw = fn(&Plots, &Path, bool) -> anyhow::Result<()>;
    let drawings: [(&str, bool, &str, Draw); 2] = [
        (
            LATENCY_FILE,
            plots.latency.is_empty(),
            "sessions-latency",
            latency,
        ),
        (
            MEMORY_FILE,
            plots.memory.is_empty(),
            "messages-memory",
            memory,
        ),
    ];
    for (file, unmeasured, figure, draw) in drawings {
        if unmeasured {
            missing.push(format!("{file}: not drawn, {figure} was not measured"));
            continue;
        }
        let path = dir.join(file);
        draw(plots, &path, text).with_context(|| format!("drawing {}", path.display()))?;
        written.push(path);
    }
    Ok((written, missing))
}

/// A logarithmic axis around the values, a little wider on each side.
fn log_span(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (lo / 1.5, hi * 1.5)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn latency(plots: &Plots, path: &Path, text: bool) -> anyhow::Result<()> {
    let points = &plots.latency;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (x_lo, x_hi) = log_span(points.iter().map(|p| p.sessions as f64));
    let y_hi = points.iter().map(|p| ms(p.p99)).fold(0.0, f64::max) * 1.2;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(24);
    if text {
        builder
            .caption(
                format!(
                    "Turn latency of {} active sessions against the sessions the server holds",
                    plots.active
                ),
                ("sans-serif", 22),
            )
            .x_label_area_size(56)
            .y_label_area_size(72);
    }
    let mut chart = builder.build_cartesian_2d((x_lo..x_hi).log_scale(), 0.0..y_hi.max(0.001))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc(format!(
            "sessions held by one server ({} active, the rest suspended by idle timeout)",
            plots.active
        ))
        .y_desc("turn latency, Control to response seen (ms)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.light_line_style(RGBColor(238, 238, 238)).draw()?;
    type Pick = fn(&LatencyPoint) -> Duration;
    let lines: [(&str, Pick); 2] = [("p50", |p| p.p50), ("p99", |p| p.p99)];
    for (i, (name, pick)) in lines.into_iter().enumerate() {
        let series = points
            .iter()
            .map(|p| (p.sessions as f64, ms(pick(p))))
            .collect();
        draw_line(&mut chart, series, COLOURS[i], name.to_owned())?;
    }
    if text {
        draw_legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

fn memory(plots: &Plots, path: &Path, text: bool) -> anyhow::Result<()> {
    let points = &plots.memory;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (x_lo, x_hi) = log_span(points.iter().map(|p| p.subscribers as f64));
    let mib = |p: &MemoryPoint| p.grown_kib as f64 / 1024.0;
    let y_hi = points.iter().map(mib).fold(0.0, f64::max) * 1.15;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(24);
    if text {
        builder
            .caption(
                "Server memory of MESSAGES subscribers of one session",
                ("sans-serif", 22),
            )
            .x_label_area_size(56)
            .y_label_area_size(72);
    }
    let mut chart = builder.build_cartesian_2d((x_lo..x_hi).log_scale(), 0.0..y_hi.max(0.001))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("MESSAGES subscribers of the session")
            .y_desc("growth of the server's RSS over a fresh process (MiB)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.light_line_style(RGBColor(238, 238, 238)).draw()?;
    let mut sizes: Vec<usize> = points.iter().map(|p| p.transcript_bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for (i, bytes) in sizes.into_iter().enumerate() {
        let series = points
            .iter()
            .filter(|p| p.transcript_bytes == bytes)
            .map(|p| (p.subscribers as f64, mib(p)))
            .collect();
        let label = if bytes >= 1024 * 1024 {
            format!("{} MiB transcript", bytes as f64 / (1024.0 * 1024.0))
        } else {
            format!("{} KiB transcript", bytes / 1024)
        };
        draw_line(&mut chart, series, COLOURS[i % COLOURS.len()], label)?;
    }
    if text {
        draw_legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

/// Both plots: sessions or subscribers on a log scale, milliseconds or MiB on a linear one.
type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<LogCoord<f64>, RangedCoordf64>>;

/// One line with a dot at each of its points, and its entry in the legend.
fn draw_line(
    chart: &mut Chart<'_, '_>,
    series: Vec<(f64, f64)>,
    colour: RGBColor,
    label: String,
) -> anyhow::Result<()> {
    chart
        .draw_series(LineSeries::new(series.clone(), colour.stroke_width(3)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3)));
    chart.draw_series(
        series
            .into_iter()
            .map(|point| Circle::new(point, 5, colour.filled())),
    )?;
    Ok(())
}

fn draw_legend<'a>(chart: &mut Chart<'a, 'a>) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 18))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_plots_are_written_as_png_files_from_a_runs_points() {
        let dir = std::env::temp_dir().join(format!("bench-plots-{}", std::process::id()));
        let plots = Plots {
            latency: [100, 1000, 10_000]
                .into_iter()
                .map(|sessions| LatencyPoint {
                    sessions,
                    p50: Duration::from_micros(900),
                    p99: Duration::from_millis(3),
                })
                .collect(),
            active: 100,
            memory: [1, 10, 100]
                .into_iter()
                .flat_map(|subscribers| {
                    [512 * 1024, 5 << 20].map(|transcript_bytes| MemoryPoint {
                        transcript_bytes,
                        subscribers,
                        grown_kib: (subscribers * transcript_bytes / 1024) as u64,
                    })
                })
                .collect(),
        };
        let (written, _) = write(&plots, &dir).unwrap();
        assert_eq!(written.len(), 2);
        for path in &written {
            let bytes = std::fs::read(path).unwrap();
            assert!(
                bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
                "{}",
                path.display()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_run_without_the_figures_draws_nothing_and_says_why() {
        let dir = std::env::temp_dir().join(format!("bench-no-plots-{}", std::process::id()));
        let (written, missing) = write(&Plots::default(), &dir).unwrap();
        assert!(written.is_empty());
        assert!(missing.iter().any(|m| m.contains("sessions-latency")));
        assert!(missing.iter().any(|m| m.contains("messages-memory")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
