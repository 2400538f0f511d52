//! `--latency-plot`: an SVG of the latency distribution, a histogram above and the CDF
//! below, drawn with `plotters` (SVG backend only).

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;

use crate::error::{AppError, Result};

/// Bars in the histogram.
const BARS: u64 = 100;

/// Writes the plot of `hist` (values in ns) to `path`.
pub fn write_svg(path: &Path, hist: &Histogram<u64>, title: &str) -> Result<()> {
    if hist.is_empty() {
        return Err(AppError::runtime(format!(
            "--latency-plot {}: no I/O completed, nothing to plot",
            path.display()
        )));
    }
    let svg = render_svg(hist, title)
        .map_err(|e| AppError::runtime(format!("drawing the latency plot: {e}")))?;
    std::fs::write(path, svg).map_err(|e| AppError::Os {
        context: format!("writing the latency plot {}", path.display()),
        source: e,
    })
}

/// Renders the plot into an SVG document.
pub fn render_svg(hist: &Histogram<u64>, title: &str) -> std::result::Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1000, 800)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(title, ("sans-serif", 22))
            .map_err(|e| e.to_string())?;
        let (top, bottom) = root.split_vertically(390);

        // Range: from the minimum to the 99.9th percentile (the far tail would squash the
        // body of the distribution; the CDF below shows it).
        let lo_ns = hist.min();
        let hi_ns = hist.value_at_quantile(0.999).max(lo_ns + BARS);
        let step = (hi_ns - lo_ns).div_ceil(BARS).max(1);
        let mut bars: Vec<(f64, f64, u64)> = Vec::with_capacity(BARS as usize + 1);
        let mut start = lo_ns;
        while start <= hi_ns {
            let end = start + step;
            let n = hist.count_between(start, end - 1);
            bars.push((start as f64 / 1e3, end as f64 / 1e3, n));
            start = end;
        }
        let max_count = bars.iter().map(|b| b.2).max().unwrap_or(1).max(1);
        let x_lo = lo_ns as f64 / 1e3;
        let x_hi = (hi_ns + step) as f64 / 1e3;
        let mut chart = ChartBuilder::on(&top)
            .caption("Latency histogram (min to p99.9)", ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x_lo..x_hi, 0u64..max_count + max_count / 10 + 1)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("latency (µs)")
            .y_desc("I/Os")
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(
                bars.iter()
                    .map(|&(a, b, n)| Rectangle::new([(a, 0), (b, n)], BLUE.mix(0.6).filled())),
            )
            .map_err(|e| e.to_string())?;

        // CDF over the whole range, logarithmic x so the tail is visible.
        let max_ns = hist.max().max(lo_ns + 1);
        let mut pts: Vec<(f64, f64)> = hist
            .iter_quantiles(4)
            .map(|v| {
                (
                    v.value_iterated_to().max(1) as f64 / 1e3,
                    v.quantile_iterated_to() * 100.0,
                )
            })
            .collect();
        pts.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        let mut cdf = ChartBuilder::on(&bottom)
            .caption("Latency CDF", ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(
                ((lo_ns.max(1) as f64 / 1e3) * 0.9..(max_ns as f64 / 1e3) * 1.1).log_scale(),
                0f64..100.5,
            )
            .map_err(|e| e.to_string())?;
        cdf.configure_mesh()
            .x_desc("latency (µs, log scale)")
            .y_desc("percentile")
            .draw()
            .map_err(|e| e.to_string())?;
        cdf.draw_series(LineSeries::new(pts, RED.stroke_width(2)))
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_an_svg() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for i in 1..10_000u64 {
            h.record(5_000 + (i % 97) * 40 + if i % 1000 == 0 { 900_000 } else { 0 })
                .unwrap();
        }
        let svg = render_svg(&h, "test").unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
        assert!(svg.contains("Latency CDF"));
        assert!(svg.contains("<rect"));
        assert!(svg.contains("<polyline"));
    }
}
