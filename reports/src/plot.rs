//! Plots of a run as small multiples: one panel per metric, each on its own axis (a registry that
//! leaks 41 entries is not flattened beside a bounded cache of 4,000), failing metrics first and
//! tinted, the warm-up shaded, the fitted slope drawn over what the detector judged. The same
//! panel is drawn into `memory.{svg,png}` and `counts.{svg,png}` (a grid per unit) and, one SVG
//! each, into report.html. Counters are left out (they only climb). The font is embedded, so
//! nothing depends on the system's fonts.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::figures::{byte_scale, fmt_value, median, report_rank, thin};
use crate::samples::{Kind, Samples};
use crate::verdict::{Status, Verdict};

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../assets/DejaVuSans.ttf");
        if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_err() {
            // The embedded font is fixed at build time; a failure here is a build defect.
            panic!("embedded DejaVu Sans font does not load");
        }
    });
}

/// Points drawn per panel at most, twice this (see [`thin`]): a 2,000-iteration run still draws
/// every spike while report.html stays well under 2 MB with a hundred metrics.
const THIN_BUCKETS: usize = 150;

/// Panel size in pixels: three to a row fill a laptop-wide image; one fills a phone's width.
pub const PANEL_PX: (u32, u32) = (340, 200);
const GRID_COLUMNS: usize = 3;

/// One metric, ready to draw: its quiescent points against the iteration, thinned.
#[derive(Debug, Clone)]
pub struct Panel {
    pub name: String,
    pub unit: String,
    pub kind: Kind,
    pub status: Option<Status>,
    /// (iteration, value) at quiescent points (every point when the metric has none).
    pub points: Vec<(f64, f64)>,
    pub warmup_iterations: u64,
    /// The fitted line over the judged part, (iteration, value) at both ends.
    pub fit: Option<[(f64, f64); 2]>,
    pub slope_per_iter: Option<f64>,
    pub capacity: Option<u64>,
    /// The iteration its failure became conclusive at: among failing panels the earliest comes
    /// first (a registry that leaks from iteration 1 before the heap that grows with it).
    pub first_iter: Option<u64>,
}

impl Panel {
    /// The status as the panel shows it.
    pub fn status_word(&self) -> &'static str {
        match self.status {
            Some(Status::Fail) => "FAIL",
            Some(Status::Inconclusive) => "not judged",
            Some(Status::Pass) => "pass",
            None => "shown only",
        }
    }

    /// The fitted slope, signed, `+2.0 KiB/iteration` (gauges only).
    pub fn slope_text(&self) -> Option<String> {
        self.slope_per_iter
            .map(|s| format!("{}{}/iteration", if s >= 0.0 { "+" } else { "" }, fmt_value(s, &self.unit)))
    }

    /// `name: FAIL, +2.0 KiB/iteration` (what a reader needs beside the lines).
    pub fn caption(&self) -> String {
        match self.slope_text() {
            Some(slope) => format!("{}: {}, {slope}", self.name, self.status_word()),
            None => format!("{}: {}", self.name, self.status_word()),
        }
    }
}

/// The panels of every metric `pick` takes (never counters), in report order: failing first,
/// earliest conclusive first among them.
pub fn panels(s: &Samples, v: &Verdict, pick: impl Fn(Kind, &str) -> bool) -> Vec<Panel> {
    let mut out: Vec<Panel> = s
        .names
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            let spec = &s.header.metrics[*n];
            spec.kind != Kind::Counter && pick(spec.kind, &spec.unit)
        })
        .filter_map(|(i, n)| {
            let spec = &s.header.metrics[n];
            let quiescent: Vec<(f64, f64)> = s.quiescent_series(i).into_iter().map(|(it, x)| (it as f64, x)).collect();
            let raw = if quiescent.is_empty() {
                s.rows.iter().filter_map(|r| r.values[i].map(|x| (r.iter as f64, x))).collect()
            } else {
                quiescent
            };
            if raw.is_empty() {
                return None;
            }
            let m = v.metrics.iter().find(|m| &m.name == n);
            let slope = m.and_then(|m| m.trend.as_ref()).map(|t| t.slope_per_iter);
            let fit = slope.and_then(|b| fit_line(&raw, v.warmup_iterations, b));
            Some(Panel {
                name: n.clone(),
                unit: spec.unit.clone(),
                kind: spec.kind,
                status: m.map(|m| m.status),
                points: thin(&raw, THIN_BUCKETS),
                warmup_iterations: v.warmup_iterations,
                fit,
                slope_per_iter: slope,
                capacity: spec.capacity,
                first_iter: m.filter(|m| m.status == Status::Fail).and_then(|m| m.first_iter),
            })
        })
        .collect();
    out.sort_by(|a, b| {
        report_rank(a.status)
            .cmp(&report_rank(b.status))
            .then_with(|| a.first_iter.unwrap_or(u64::MAX).cmp(&b.first_iter.unwrap_or(u64::MAX)))
            .then_with(|| a.name.cmp(&b.name))
    });
    out
}

/// The line of slope `b` through the judged points (after warm-up), placed at the median offset
/// of those points: the Theil–Sen line the detector fitted.
fn fit_line(pts: &[(f64, f64)], warmup: u64, b: f64) -> Option<[(f64, f64); 2]> {
    let judged: Vec<(f64, f64)> = pts.iter().copied().filter(|p| p.0 > warmup as f64).collect();
    let (x0, x1) = (judged.first()?.0, judged.last()?.0);
    let a = median(&mut judged.iter().map(|p| p.1 - b * p.0).collect::<Vec<_>>())?;
    Some([(x0, a + b * x0), (x1, a + b * x1)])
}

fn tint(status: Option<Status>) -> RGBColor {
    match status {
        Some(Status::Fail) => RGBColor(253, 234, 232),
        Some(Status::Inconclusive) => RGBColor(255, 247, 222),
        _ => WHITE,
    }
}

/// Draws one panel into `area`; with `caption`, its caption on top (the HTML report puts the
/// caption in the page instead).
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    p: &Panel,
    caption: bool,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    area.fill(&tint(p.status)).map_err(e)?;
    let x_min = p.points.first().map_or(0.0, |q| q.0).min(0.0);
    let x_max = p.points.last().map_or(1.0, |q| q.0).max(x_min + 1.0);
    let lo = p.points.iter().map(|q| q.1).fold(f64::INFINITY, f64::min);
    let hi = p.points.iter().map(|q| q.1).fold(f64::NEG_INFINITY, f64::max);
    let (div, suffix) = if p.unit == "bytes" { byte_scale(lo.abs().max(hi.abs())) } else { (1.0, "") };
    let pad = ((hi - lo) * 0.08).max(hi.abs() * 0.01).max(1.0);
    let (y_min, y_max) = ((lo - pad) / div, (hi + pad) / div);
    let mut b = ChartBuilder::on(area);
    b.margin(6).margin_right(14).x_label_area_size(22).y_label_area_size(56);
    if caption {
        let color = if p.status == Some(Status::Fail) { RGBColor(170, 20, 20) } else { BLACK };
        b.caption(p.caption(), ("sans-serif", 13).into_font().color(&color));
    }
    let mut chart = b.build_cartesian_2d(x_min..x_max, y_min..y_max).map_err(e)?;
    let y_desc = if p.unit == "bytes" { suffix.to_string() } else { p.unit.clone() };
    chart
        .configure_mesh()
        .light_line_style(WHITE.mix(0.0))
        .x_labels(5)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_labels(4)
        .y_label_formatter(&|y| if y.fract().abs() < 1e-9 { format!("{y:.0}") } else { format!("{y:.2}") })
        .y_desc(y_desc)
        .label_style(("sans-serif", 12))
        .draw()
        .map_err(e)?;
    if p.warmup_iterations > 0 {
        let w = (p.warmup_iterations as f64).min(x_max);
        chart
            .draw_series(std::iter::once(Rectangle::new([(x_min, y_min), (w, y_max)], BLACK.mix(0.07).filled())))
            .map_err(e)?;
    }
    if let Some(cap) = p.capacity {
        let c = cap as f64 / div;
        if c <= y_max * 4.0 {
            chart.draw_series(LineSeries::new([(x_min, c), (x_max, c)], RGBColor(150, 150, 150))).map_err(e)?;
        }
    }
    let line = RGBColor(31, 99, 180);
    chart.draw_series(LineSeries::new(p.points.iter().map(|q| (q.0, q.1 / div)), line.stroke_width(2))).map_err(e)?;
    if let Some([a, z]) = p.fit {
        let color = if p.status == Some(Status::Fail) { RGBColor(200, 30, 30) } else { RGBColor(90, 160, 90) };
        chart.draw_series(LineSeries::new([(a.0, a.1 / div), (z.0, z.1 / div)], color.stroke_width(2))).map_err(e)?;
    }
    Ok(())
}

/// One panel as an SVG element that scales to its container (for report.html).
pub fn panel_svg(p: &Panel) -> Result<String, String> {
    register_font();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PANEL_PX).into_drawing_area();
        draw_panel(&root, p, false)?;
        root.present().map_err(|e| e.to_string())?;
    }
    // plotters writes a fixed width and height; the page sizes it from the viewBox instead.
    let fixed = format!("width=\"{}\" height=\"{}\"", PANEL_PX.0, PANEL_PX.1);
    Ok(svg.replacen(&fixed, "class=\"plot\" preserveAspectRatio=\"xMidYMid meet\"", 1))
}

fn draw_grid<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    ps: &[Panel],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 18)).map_err(e)?;
    if ps.is_empty() {
        root.draw_text("no metrics of this unit", &("sans-serif", 14).into_text_style(&root), (20, 20)).map_err(e)?;
    } else {
        let rows = ps.len().div_ceil(GRID_COLUMNS);
        let cells = root.split_evenly((rows, GRID_COLUMNS));
        for (cell, p) in cells.iter().zip(ps) {
            draw_panel(cell, p, true)?;
        }
    }
    root.present().map_err(e)
}

/// Writes an RGB picture of `size` (width, height) as a PNG file.
fn write_png(path: &Path, size: (u32, u32), rgb: &[u8]) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| format!("{}: {x}", path.display());
    let file = std::fs::File::create(path).map_err(|x| e(&x))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), size.0, size.1);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|x| e(&x))?;
    w.write_image_data(rgb).map_err(|x| e(&x))?;
    w.finish().map_err(|x| e(&x))
}

/// Draws `memory.{svg,png}` and `counts.{svg,png}` into `dir`, a grid of panels each; returns the
/// files written.
pub fn plot_run(s: &Samples, v: &Verdict, dir: &Path) -> Result<Vec<PathBuf>, String> {
    register_font();
    let title = format!("{} (seed {}, {})", s.header.scenario, s.header.seed, s.header.backend);
    let mut written = Vec::new();
    for (stem, what, unit) in [("memory", "memory", "bytes"), ("counts", "registries and other counts", "count")] {
        let ps = panels(s, v, |_, u| u == unit);
        let rows = ps.len().div_ceil(GRID_COLUMNS).max(1) as u32;
        let size = (PANEL_PX.0 * GRID_COLUMNS as u32, PANEL_PX.1 * rows + 34);
        let t = format!("{title}: {what}");
        let svg = dir.join(format!("{stem}.svg"));
        draw_grid(SVGBackend::new(&svg, size).into_drawing_area(), &t, &ps)?;
        let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
        draw_grid(BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area(), &t, &ps)?;
        let png = dir.join(format!("{stem}.png"));
        write_png(&png, size, &rgb)?;
        written.extend([svg, png]);
    }
    Ok(written)
}
