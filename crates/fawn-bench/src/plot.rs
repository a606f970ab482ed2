//! A tiny SVG plotter for the paper's figures: line charts (optionally log-x, used for CDFs
//! too) and grouped bar charts. Plain SVG 1.1 text, viewable on GitHub; no dependencies.

use std::fmt::Write;

const W: f64 = 900.0;
const H: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

/// One named series of (x, y) points.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series { name: name.into(), points }
    }
}

/// Axis scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    Linear,
    Log10,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A short label for a tick value.
fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        trim(format!("{:.2}", v / 1e9)) + "G"
    } else if a >= 1e6 {
        trim(format!("{:.2}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.2}"))
    } else {
        trim(format!("{v:.3}"))
    }
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// "Nice" linear ticks covering [lo, hi].
fn linear_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step =
        [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| span / s <= 6.0).unwrap_or(mag * 10.0);
    let mut t = (lo / step).floor() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 20 {
        out.push(t);
        t += step;
    }
    out
}

struct Axis {
    lo: f64,
    hi: f64,
    scale: Scale,
}

impl Axis {
    fn fit(values: impl Iterator<Item = f64>, scale: Scale, zero: bool) -> Axis {
        let vals: Vec<f64> =
            values.filter(|v| v.is_finite() && (scale == Scale::Linear || *v > 0.0)).collect();
        let (mut lo, mut hi) = vals.iter().fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        if vals.is_empty() {
            (lo, hi) = (if scale == Scale::Log10 { 1.0 } else { 0.0 }, 1.0);
        }
        match scale {
            Scale::Linear => {
                if zero {
                    lo = lo.min(0.0);
                }
                if hi <= lo {
                    hi = lo + 1.0;
                }
                // Headroom so the tallest bar or point does not touch the frame.
                hi += (hi - lo) * 0.05;
                let t = linear_ticks(lo, hi);
                Axis {
                    lo: t.first().copied().unwrap_or(lo),
                    hi: t.last().copied().unwrap_or(hi).max(hi),
                    scale,
                }
            }
            Scale::Log10 => {
                let lo = 10f64.powf(lo.log10().floor());
                let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
                Axis { lo, hi, scale }
            }
        }
    }

    fn frac(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear => (v - self.lo) / (self.hi - self.lo),
            Scale::Log10 => (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10()),
        }
    }

    fn ticks(&self) -> Vec<f64> {
        match self.scale {
            Scale::Linear => linear_ticks(self.lo, self.hi),
            Scale::Log10 => {
                let mut t = self.lo;
                let mut out = Vec::new();
                while t <= self.hi * 1.0001 && out.len() < 30 {
                    out.push(t);
                    t *= 10.0;
                }
                out
            }
        }
    }
}

fn frame(svg: &mut String, title: &str, xlabel: &str, ylabel: &str) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="14" font-weight="bold">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>
"#,
        LEFT + (W - LEFT - RIGHT) / 2.0,
        esc(title),
        LEFT + (W - LEFT - RIGHT) / 2.0,
        H - 15.0,
        esc(xlabel),
        TOP + (H - TOP - BOTTOM) / 2.0,
        esc(ylabel)
    );
}

fn y_axis(svg: &mut String, y: &Axis) {
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    for t in y.ticks() {
        let py = TOP + ph * (1.0 - y.frac(t));
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            py + 4.0,
            fmt_tick(t)
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
}

fn legend(svg: &mut String, names: &[String]) {
    for (i, n) in names.iter().enumerate() {
        let (x, y) = (W - RIGHT + 12.0, TOP + 10.0 + 18.0 * i as f64);
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="{}" width="14" height="4" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            y - 4.0,
            COLORS[i % COLORS.len()],
            x + 20.0,
            y + 2.0,
            esc(n)
        );
    }
}

/// A line chart of `series` (points drawn in the given order, with markers).
pub fn line_chart(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    xs: Scale,
    ys: Scale,
) -> String {
    let x = Axis::fit(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), xs, false);
    let y = Axis::fit(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), ys, true);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let mut svg = String::new();
    frame(&mut svg, title, xlabel, ylabel);
    for t in x.ticks() {
        let px = LEFT + pw * x.frac(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#eee"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 18.0,
            fmt_tick(t)
        );
    }
    y_axis(&mut svg, &y);
    for (i, s) in series.iter().enumerate() {
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|(a, b)| a.is_finite() && b.is_finite())
            .map(|&(a, b)| format!("{:.1},{:.1}", LEFT + pw * x.frac(a), TOP + ph * (1.0 - y.frac(b))))
            .collect();
        let c = COLORS[i % COLORS.len()];
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        if pts.len() <= 40 {
            for p in &pts {
                let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(svg, r#"<circle cx="{px}" cy="{py}" r="3" fill="{c}"/>"#);
            }
        }
    }
    legend(&mut svg, &series.iter().map(|s| s.name.clone()).collect::<Vec<_>>());
    svg.push_str("</svg>\n");
    svg
}

/// A grouped bar chart: one group per category, one bar per series (values[i] for category i).
pub fn bar_chart(
    title: &str,
    ylabel: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
    ys: Scale,
) -> String {
    let y = Axis::fit(series.iter().flat_map(|s| s.1.iter().copied()), ys, true);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let mut svg = String::new();
    frame(&mut svg, title, "", ylabel);
    y_axis(&mut svg, &y);
    let gw = pw / categories.len().max(1) as f64;
    let bw = gw * 0.8 / series.len().max(1) as f64;
    for (ci, cat) in categories.iter().enumerate() {
        let gx = LEFT + gw * ci as f64;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            gx + gw / 2.0,
            TOP + ph + 18.0,
            esc(cat)
        );
        for (si, (_, vals)) in series.iter().enumerate() {
            let Some(&v) = vals.get(ci) else { continue };
            if !v.is_finite() || (ys == Scale::Log10 && v <= 0.0) {
                continue;
            }
            let top = TOP + ph * (1.0 - y.frac(v));
            let base = TOP + ph * (1.0 - y.frac(y.lo.max(if ys == Scale::Linear { 0.0 } else { y.lo })));
            let _ = writeln!(
                svg,
                r#"<rect x="{:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                gx + gw * 0.1 + bw * si as f64,
                bw * 0.95,
                (base - top).max(0.0),
                COLORS[si % COLORS.len()],
                fmt_tick(v)
            );
        }
    }
    legend(&mut svg, &series.iter().map(|s| s.0.clone()).collect::<Vec<_>>());
    svg.push_str("</svg>\n");
    svg
}

/// The CDF of a latency histogram as (latency µs, fraction ≤) points, for [`line_chart`].
pub fn cdf_points(h: &hdrhistogram::Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let n = h.len() as f64;
    let mut out = Vec::new();
    let mut seen = 0u64;
    for v in h.iter_log(1000, 1.2) {
        seen += v.count_since_last_iteration();
        out.push((v.value_iterated_to() as f64 / 1000.0, seen as f64 / n));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_valid_looking_svg() {
        let s = line_chart(
            "t",
            "x",
            "y",
            &[Series::new("a", vec![(1.0, 2.0), (10.0, 5.0)]), Series::new("b<c", vec![(2.0, 1.0)])],
            Scale::Log10,
            Scale::Linear,
        );
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n") && s.contains("b&lt;c"));
        let b =
            bar_chart("t", "y", &["x".into(), "z".into()], &[("s".into(), vec![1.0, 3.0])], Scale::Linear);
        assert_eq!(b.matches("<rect x=").count(), 4); // 2 bars, the frame, 1 legend swatch
        assert_eq!(fmt_tick(150_000.0), "150k");
        assert_eq!(linear_ticks(0.0, 1.0).len(), 6);
    }
}
