//! PNG plots of the training and evaluation stages (loss curves, reward curves, per-tier rates,
//! speedup distributions), drawn with `plotters`' bitmap backend. Text uses the Ubuntu Light
//! font bundled by `epaint_default_fonts` (egui's fonts), registered once per process, so no
//! system font is needed on a fresh machine.

use std::path::Path;
use std::sync::Once;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// Width and height of every plot, in pixels.
pub const SIZE: (u32, u32) = (960, 540);

/// One line of a chart: a legend label and its `(x, y)` points (non-finite y are skipped).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series from a label and points.
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            label: label.into(),
            points: points.into_iter().filter(|(_, y)| y.is_finite()).collect(),
        }
    }
}

static FONT: Once = Once::new();

fn font() {
    FONT.call_once(|| {
        // The bytes are a valid TTF shipped in the crate; a failure would be a packaging bug.
        let _ = register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        );
    });
}

/// The axis range of values `v`, padded 5% each side; flat data (one value, or all equal) gets
/// a span of 10% of its magnitude (at least 0.1) around it, so its tick labels differ.
fn range(v: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = v.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 * lo.abs().max(1.0) {
        let half = (lo.abs() * 0.1).max(0.1);
        return (lo - half, hi + half);
    }
    let pad = (hi - lo) * 0.05;
    (lo - pad, hi + pad)
}

/// A tick label for `v` on an axis spanning `span`: as many decimals as a tenth of the span
/// needs (none for a span of 10 or more), `-0` written `0`.
pub fn tick_label(v: f64, span: f64) -> String {
    let decimals = if span >= 10.0 {
        0
    } else {
        (-(span / 10.0).log10()).ceil().clamp(0.0, 6.0) as usize
    };
    let t = format!("{v:.decimals$}");
    if t.trim_start_matches('-')
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        t.trim_start_matches('-').to_string()
    } else {
        t
    }
}

/// Whether every x is a whole number (steps, epochs): the axis is then labelled with integers
/// only.
fn whole_numbers(series: &[Series]) -> bool {
    series
        .iter()
        .flat_map(|s| s.points.iter())
        .all(|p| (p.0 - p.0.round()).abs() < 1e-9)
}

/// A label of an integer axis at `x`: the integer, or nothing between integers.
fn integer_label(x: f64) -> String {
    if (x - x.round()).abs() < 1e-6 {
        format!("{}", x.round() as i64)
    } else {
        String::new()
    }
}

/// Why a chart was not written (the message names the PNG file).
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No series (or no bar, or no value) has a point.
    #[error("{0}: nothing to plot")]
    Empty(String),
    /// plotters could not draw or write the file.
    #[error("{path}: {message}")]
    Draw {
        /// The PNG file.
        path: String,
        /// plotters' message.
        message: String,
    },
}

/// The [`PlotError::Draw`] of `path` with plotters' error `e`.
fn draw_error(path: &Path, e: &dyn std::fmt::Display) -> PlotError {
    PlotError::Draw {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Width of the strip right of the plot that holds the legend, in pixels.
const LEGEND_W: u32 = 220;

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// A white [`SIZE`] canvas writing to `path`: (the whole, the plot area, the legend strip).
fn canvas(path: &Path) -> Result<(Area<'_>, Area<'_>, Area<'_>), PlotError> {
    font();
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_error(path, &e))?;
    let (area, legend) = root.split_horizontally(SIZE.0 - LEGEND_W);
    Ok((root, area, legend))
}

/// The chart every plot draws in: `title` above, room for tick labels, f64 axes over `x`, `y`
/// (plotters' error text, without the file: callers name it).
#[allow(clippy::type_complexity)]
fn chart_on<'a, 'b>(
    area: &'a Area<'b>,
    title: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
) -> Result<
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    DrawingAreaErrorKind<<BitMapBackend<'b> as DrawingBackend>::ErrorType>,
> {
    ChartBuilder::on(area)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
}

/// Draws the mesh `mesh` (its labels and axis descriptions set by the caller) in the charts'
/// fonts; a drawing error names the PNG file `path`.
fn draw_mesh(
    mesh: &mut plotters::chart::MeshStyle<
        '_,
        '_,
        RangedCoordf64,
        RangedCoordf64,
        BitMapBackend<'_>,
    >,
    path: &Path,
) -> Result<(), PlotError> {
    mesh.label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(|e| draw_error(path, &e))
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Draws `series` as lines (with point markers when a series has fewer than 40 points) into
/// the PNG file `path` ([`SIZE`] pixels), with a title, axis labels and a legend.
///
/// # Errors
/// No series with a point, or the PNG cannot be written (the message names the file).
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Err(PlotError::Empty(path.display().to_string()));
    }
    let err = |e: &dyn std::fmt::Display| draw_error(path, e);
    let (root, area, legend) = canvas(path)?;
    let xs = range(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let ys = range(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let integer_x = whole_numbers(series);
    // Whole-number x: at most one label per integer, the integers only.
    let x_labels = if integer_x {
        ((xs.1 - xs.0).floor() as usize + 1).clamp(2, 10)
    } else {
        10
    };
    let (x_span, y_span) = (xs.1 - xs.0, ys.1 - ys.0);
    let x_fmt = move |x: &f64| {
        if integer_x {
            integer_label(*x)
        } else {
            tick_label(*x, x_span)
        }
    };
    let y_fmt = move |y: &f64| tick_label(*y, y_span);
    let mut chart = chart_on(&area, title, xs.0..xs.1, ys.0..ys.1).map_err(|e| err(&e))?;
    draw_mesh(
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_labels(x_labels)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt),
        path,
    )?;
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
            .map_err(|e| err(&e))?;
        if s.points.len() < 40 {
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
    }
    legend_and_write(&legend, &root, series, path)
}

/// Draws `series` as grouped bars over named categories (series point `(i, y)`: the bar of
/// category `categories[i]`), one colour per series, into the PNG file `path`: for discrete x
/// such as tiers, where a line between categories would mean nothing.
///
/// # Errors
/// No series with a point, or the PNG cannot be written (the message names the file).
pub fn bar_chart(
    path: &Path,
    title: &str,
    categories: &[String],
    y_label: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    if series.iter().all(|s| s.points.is_empty()) || categories.is_empty() {
        return Err(PlotError::Empty(path.display().to_string()));
    }
    let err = |e: &dyn std::fmt::Display| draw_error(path, e);
    let (root, area, legend) = canvas(path)?;
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let ymax = if top > 0.0 { top * 1.1 } else { 1.0 };
    let n = categories.len();
    let cats = categories.to_vec();
    let x_fmt = move |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
            cats[i as usize].clone()
        } else {
            String::new()
        }
    };
    let y_fmt = move |y: &f64| tick_label(*y, ymax);
    let mut chart =
        chart_on(&area, title, -0.5..(n as f64 - 0.5), 0.0..ymax).map_err(|e| err(&e))?;
    draw_mesh(
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .y_desc(y_label),
        path,
    )?;
    let k = series.len().max(1) as f64;
    let w = 0.8 / k;
    for (si, s) in series.iter().enumerate() {
        let c = COLORS[si % COLORS.len()];
        chart
            .draw_series(s.points.iter().map(|&(x, y)| {
                let x0 = x - 0.4 + w * si as f64;
                Rectangle::new([(x0, 0.0), (x0 + w * 0.9, y)], c.mix(0.85).filled())
            }))
            .map_err(|e| err(&e))?;
    }
    legend_and_write(&legend, &root, series, path)
}

/// Draws a histogram of `values` in `bins` equal-width bins (one colour per group, bars side by
/// side) into the PNG file `path`.
///
/// # Errors
/// No values at all, or the PNG cannot be written.
pub fn histogram(
    path: &Path,
    title: &str,
    x_label: &str,
    groups: &[Series],
    bins: usize,
) -> Result<(), PlotError> {
    let all: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.points.iter().map(|p| p.1))
        .collect();
    if all.is_empty() {
        return Err(PlotError::Empty(path.display().to_string()));
    }
    let bins = bins.max(1);
    let (lo, hi) = range(all.iter().copied());
    let w = (hi - lo) / bins as f64;
    let counts: Vec<Vec<usize>> = groups
        .iter()
        .map(|g| {
            let mut c = vec![0usize; bins];
            for &(_, v) in &g.points {
                c[(((v - lo) / w) as usize).min(bins - 1)] += 1;
            }
            c
        })
        .collect();
    let ymax = counts.iter().flatten().copied().max().unwrap_or(1).max(1) as f64 * 1.1;
    let bars: Vec<Series> = groups
        .iter()
        .zip(&counts)
        .map(|(g, c)| {
            Series::new(
                g.label.clone(),
                c.iter()
                    .enumerate()
                    .map(|(i, &n)| (lo + (i as f64 + 0.5) * w, n as f64))
                    .collect(),
            )
        })
        .collect();
    let err = |e: &dyn std::fmt::Display| draw_error(path, e);
    let (root, area, legend) = canvas(path)?;
    let span = hi - lo;
    let x_fmt = move |x: &f64| tick_label(*x, span);
    let y_fmt = |y: &f64| integer_label(*y);
    let mut chart = chart_on(&area, title, lo..hi, 0.0..ymax).map_err(|e| err(&e))?;
    draw_mesh(
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc("count")
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt),
        path,
    )?;
    let k = bars.len().max(1) as f64;
    for (gi, s) in bars.iter().enumerate() {
        let c = COLORS[gi % COLORS.len()];
        let off = w * gi as f64 / k;
        chart
            .draw_series(s.points.iter().map(|&(x, n)| {
                let x0 = x - w / 2.0 + off;
                Rectangle::new([(x0, 0.0), (x0 + w / k * 0.9, n)], c.mix(0.8).filled())
            }))
            .map_err(|e| err(&e))?;
    }
    legend_and_write(&legend, &root, &bars, path)
}

/// Draws the legend of `series`' labels (colours in order) in the strip `legend` right of the
/// plot, where it never covers the data, and writes the PNG file `path`.
fn legend_and_write(
    legend: &Area<'_>,
    root: &Area<'_>,
    series: &[Series],
    path: &Path,
) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| draw_error(path, e);
    for (i, l) in series.iter().map(|s| &s.label).enumerate() {
        let c = COLORS[i % COLORS.len()];
        let y = 70 + 28 * i as i32;
        legend
            .draw(&Rectangle::new([(4, y - 6), (24, y + 6)], c.filled()))
            .map_err(|e| err(&e))?;
        legend
            .draw(&Text::new(
                l.clone(),
                (32, y - 9),
                ("sans-serif", 16).into_font().color(&BLACK),
            ))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_size(bytes: &[u8]) -> (u32, u32) {
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG signature");
        let be = |o: usize| u32::from_be_bytes(bytes[o..o + 4].try_into().unwrap());
        (be(16), be(20))
    }

    #[test]
    fn line_chart_writes_a_png_with_text_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("loss.png");
        let s = Series::new(
            "train",
            (1..=50).map(|i| (i as f64, 5.0 / i as f64)).collect(),
        );
        let e = Series::new("eval", vec![(10.0, 0.6), (50.0, f64::NAN), (50.0, 0.2)]);
        assert_eq!(e.points.len(), 2, "non-finite points are dropped");
        line_chart(&p, "loss", "step", "nats/token", &[s, e]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(png_size(&bytes), SIZE);
        // An empty white image compresses to a few hundred bytes; lines and glyphs do not.
        assert!(bytes.len() > 8_000, "{} bytes", bytes.len());
        // Nothing to plot is an error naming the file.
        let err = line_chart(&p, "t", "x", "y", &[Series::new("a", vec![])]).unwrap_err();
        assert!(
            matches!(&err, PlotError::Empty(f) if f.ends_with("loss.png")),
            "{err}"
        );
    }

    #[test]
    fn small_and_flat_series_get_readable_axes() {
        // Flat at 0 (a CPU run's pass rate): distinct labels across the range, no "-0".
        let (lo, hi) = range([0.0, 0.0, 0.0].into_iter());
        assert!(hi - lo >= 0.2, "{lo}..{hi}");
        let ticks: Vec<String> = (0..=4)
            .map(|i| tick_label(lo + (hi - lo) * i as f64 / 4.0, hi - lo))
            .collect();
        let distinct: std::collections::BTreeSet<_> = ticks.iter().collect();
        assert_eq!(distinct.len(), ticks.len(), "{ticks:?}");
        let zero = |t: &str| {
            t.trim_start_matches('-')
                .chars()
                .all(|c| c == '0' || c == '.')
        };
        assert!(
            ticks.iter().all(|t| !(t.starts_with('-') && zero(t))),
            "no negative zero: {ticks:?}"
        );
        assert_eq!(tick_label(-0.0001, 0.2), "0.00");
        assert_eq!(tick_label(0.123, 0.05), "0.123");
        assert_eq!(tick_label(1234.6, 500.0), "1235");
        // Flat away from 0 (a reward stuck at 0.35).
        let (lo, hi) = range([0.35; 5].into_iter());
        assert!(lo < 0.35 && hi > 0.35 && tick_label(lo, hi - lo) != tick_label(hi, hi - lo));
        // Two steps: integer labels only, and the chart draws.
        let s = [Series::new("reward", vec![(1.0, 0.0), (2.0, 0.0)])];
        assert!(whole_numbers(&s));
        assert_eq!(integer_label(1.0), "1");
        assert_eq!(integer_label(1.5), "");
        let dir = tempfile::tempdir().unwrap();
        line_chart(&dir.path().join("flat.png"), "flat", "step", "reward", &s).unwrap();
        // Tiers as categories.
        let p = dir.path().join("tiers.png");
        let cats = vec!["tier 0".to_string(), "tier 1".to_string()];
        bar_chart(
            &p,
            "per tier",
            &cats,
            "rate",
            &[Series::new("sft", vec![(0.0, 0.1), (1.0, 0.3)])],
        )
        .unwrap();
        assert_eq!(png_size(&std::fs::read(&p).unwrap()), SIZE);
        assert!(bar_chart(&p, "t", &[], "y", &s).is_err());
    }

    #[test]
    fn histogram_writes_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.png");
        let g = Series::new("rl", (0..100).map(|i| (0.0, (i % 7) as f64)).collect());
        histogram(&p, "speedup", "x", &[g], 10).unwrap();
        assert_eq!(png_size(&std::fs::read(&p).unwrap()), SIZE);
    }
}
