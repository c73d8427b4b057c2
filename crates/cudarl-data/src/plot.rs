//! PNG plots of the training and evaluation stages (loss curves, reward curves, per-tier rates,
//! speedup distributions), drawn with `plotters`' bitmap backend. Text uses the Ubuntu Light
//! font bundled by `epaint_default_fonts` (egui's fonts), registered once per process, so no
//! system font is needed on a fresh machine.

use std::path::Path;
use std::sync::Once;

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

fn range(v: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = v.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-9);
    (lo - pad, hi + pad)
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
) -> Result<(), String> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Err(format!("{}: nothing to plot", path.display()));
    }
    font();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let xs = range(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let ys = range(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(xs.0..xs.1, ys.0..ys.1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        if s.points.len() < 40 {
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
    }
    legend_and_write(&mut chart, &root, path)
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
) -> Result<(), String> {
    let all: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.points.iter().map(|p| p.1))
        .collect();
    if all.is_empty() {
        return Err(format!("{}: nothing to plot", path.display()));
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
    font();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(lo..hi, 0.0..ymax)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("count")
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(|e| err(&e))?;
    let k = bars.len().max(1) as f64;
    for (gi, s) in bars.iter().enumerate() {
        let c = COLORS[gi % COLORS.len()];
        let off = w * gi as f64 / k;
        chart
            .draw_series(s.points.iter().map(|&(x, n)| {
                let x0 = x - w / 2.0 + off;
                Rectangle::new([(x0, 0.0), (x0 + w / k * 0.9, n)], c.mix(0.8).filled())
            }))
            .map_err(|e| err(&e))?
            .label(s.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    legend_and_write(&mut chart, &root, path)
}

/// Draws the series' legend (upper right, on a light box) and writes the PNG file `path`.
fn legend_and_write<'a, 'b: 'a>(
    chart: &mut ChartContext<
        'a,
        BitMapBackend<'b>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    root: &DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    path: &Path,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
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
        assert!(err.contains("loss.png"), "{err}");
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
