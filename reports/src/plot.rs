//! Plots of a run: every memory level (MiB) and every count level (registries, mappings,
//! descriptors, threads) against time, as SVG and PNG; only counters are left out (they only
//! climb). The font is embedded, so nothing depends on the system's fonts.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::samples::{Kind, Samples};

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

/// A plotted line: its name and (seconds, value) points.
type Line = (String, Vec<(f64, f64)>);

fn lines(s: &Samples, pick: impl Fn(&str, Kind, &str) -> bool, scale: f64) -> Vec<Line> {
    s.names
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            let spec = &s.header.metrics[*n];
            pick(n, spec.kind, &spec.unit)
        })
        .map(|(i, n)| {
            (n.clone(), s.rows.iter().filter_map(|r| r.values[i].map(|v| (r.t, v / scale))).collect::<Vec<_>>())
        })
        .filter(|(_, pts)| !pts.is_empty())
        .collect()
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_label: &str,
    data: &[Line],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let x_max = data.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)).fold(1e-9, f64::max);
    let y_max = data.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)).fold(1e-9, f64::max) * 1.08;
    let y_min = data.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)).fold(f64::INFINITY, f64::min).min(0.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, y_min..y_max)
        .map_err(e)?;
    chart.configure_mesh().x_desc("seconds").y_desc(y_label).label_style(("sans-serif", 13)).draw().map_err(e)?;
    for (k, (name, pts)) in data.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(e)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Draws `memory.{svg,png}` and `counts.{svg,png}` into `dir`; returns the files written.
pub fn plot_run(s: &Samples, dir: &Path) -> Result<Vec<PathBuf>, String> {
    register_font();
    let title = format!("{} (seed {}, {})", s.header.scenario, s.header.seed, s.header.backend);
    let memory = lines(s, |_, k, u| k != Kind::Counter && u == "bytes", 1024.0 * 1024.0);
    let counts = lines(s, |_, k, u| k != Kind::Counter && u == "count", 1.0);
    let mut written = Vec::new();
    for (stem, what, label, data) in
        [("memory", "memory", "MiB", &memory), ("counts", "registries and other counts", "count", &counts)]
    {
        let t = format!("{title}: {what}");
        let svg = dir.join(format!("{stem}.svg"));
        draw(SVGBackend::new(&svg, (1100, 620)).into_drawing_area(), &t, label, data)?;
        let png = dir.join(format!("{stem}.png"));
        draw(BitMapBackend::new(&png, (1100, 620)).into_drawing_area(), &t, label, data)?;
        written.extend([svg, png]);
    }
    Ok(written)
}
