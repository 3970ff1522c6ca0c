//! SVG plots in the style of the Homa paper's figures: slowdown (log scale)
//! against message size on a count-weighted axis (a message size's position is
//! the fraction of messages no larger than it), a solid p99 line and a dashed
//! p50 line per variant.

use crate::stats::Group;
use std::fmt::Write;

/// One variant's curve: groups of equal message count, smallest first.
pub struct Series {
    pub label: String,
    pub groups: Vec<Group>,
}

const W: f64 = 720.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Short size label: 8, 1.2K, 35K, 2.9M.
pub fn size_label(bytes: u32) -> String {
    let b = bytes as f64;
    if b < 1_000.0 {
        format!("{bytes}")
    } else if b < 1_000_000.0 {
        trim(b / 1e3, "K")
    } else {
        trim(b / 1e6, "M")
    }
}

fn trim(v: f64, unit: &str) -> String {
    if v < 10.0 {
        format!("{:.1}{unit}", v).replace(".0", "")
    } else {
        format!("{:.0}{unit}", v)
    }
}

/// Renders the series as a standalone SVG document. The x axis uses the first
/// series' groups for size labels (all series of one plot share a workload).
pub fn render_svg(title: &str, series: &[Series]) -> String {
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let finite = |v: f64| v.is_finite() && v > 0.0;
    let ymax_data = series
        .iter()
        .flat_map(|s| s.groups.iter().map(|g| g.p99_slowdown))
        .filter(|v| finite(*v))
        .fold(1.0f64, f64::max);
    // Log axis from 1 to the next power of ten (at least 10).
    let decades = ymax_data.log10().ceil().max(1.0);
    let ymax = 10f64.powf(decades);
    let x = |f: f64| LEFT + f.clamp(0.0, 1.0) * pw;
    let y = |v: f64| TOP + ph * (1.0 - (v.max(1.0).log10() / decades).min(1.0));

    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">"##
    );
    let _ = writeln!(s, r##"<rect width="{W}" height="{H}" fill="white"/>"##);
    let _ = writeln!(
        s,
        r##"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"##,
        LEFT + pw / 2.0,
        esc(title)
    );
    // Horizontal grid lines and y labels at 1, 2, 5, 10, 20, 50, ...
    let mut v = 1.0;
    while v <= ymax * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let t = v * m;
            if t > ymax * 1.0001 {
                break;
            }
            let yy = y(t);
            let stroke = if m == 1.0 { "#bbbbbb" } else { "#e5e5e5" };
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="{stroke}"/>"##,
                LEFT + pw
            );
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT - 6.0,
                yy + 4.0,
                t
            );
        }
        v *= 10.0;
    }
    // X ticks: the size at each decile of messages.
    if let Some(first) = series.first() {
        let n = first.groups.len().max(1);
        let every = n.div_ceil(10).max(1);
        for (i, g) in first.groups.iter().enumerate() {
            if (i + 1) % every != 0 && i + 1 != n {
                continue;
            }
            let xx = x(g.cum_fraction);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#e5e5e5"/>"##,
                TOP,
                TOP + ph
            );
            let _ = writeln!(
                s,
                r##"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + ph + 16.0,
                size_label(g.max_size)
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">Message size (bytes; axis weighted by message count)</text>"##,
        LEFT + pw / 2.0,
        H - 18.0
    );
    let _ = writeln!(
        s,
        r##"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">Slowdown</text>"##,
        TOP + ph / 2.0
    );
    // Curves: points at the middle of each group on the count-weighted axis.
    for (k, ser) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        for (pick, dash) in [(0usize, ""), (1usize, r##" stroke-dasharray="6,4""##)] {
            let mut pts = String::new();
            let mut prev = 0.0;
            for g in &ser.groups {
                let mid = (prev + g.cum_fraction) / 2.0;
                prev = g.cum_fraction;
                let val = if pick == 0 {
                    g.p99_slowdown
                } else {
                    g.p50_slowdown
                };
                if !finite(val) {
                    continue;
                }
                let _ = write!(pts, "{:.1},{:.1} ", x(mid), y(val));
            }
            let _ = writeln!(
                s,
                r##"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"##,
                pts.trim_end()
            );
        }
        // Legend.
        let ly = TOP + 10.0 + 36.0 * k as f64;
        let lx = LEFT + pw + 12.0;
        let _ = writeln!(
            s,
            r##"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{} p99</text>"##,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            esc(&ser.label)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="2" stroke-dasharray="6,4"/><text x="{:.1}" y="{:.1}">{} p50</text>"##,
            ly + 16.0,
            lx + 24.0,
            ly + 16.0,
            lx + 30.0,
            ly + 20.0,
            esc(&ser.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(max_size: u32, p50: f64, p99: f64, cum: f64) -> Group {
        Group {
            min_size: max_size,
            max_size,
            count: 10,
            p50_slowdown: p50,
            p99_slowdown: p99,
            mean_slowdown: p50,
            cum_fraction: cum,
        }
    }

    #[test]
    fn labels() {
        assert_eq!(size_label(8), "8");
        assert_eq!(size_label(1_000), "1K");
        assert_eq!(size_label(1_460), "1.5K");
        assert_eq!(size_label(35_000), "35K");
        assert_eq!(size_label(2_900_000), "2.9M");
    }

    #[test]
    fn svg_has_one_solid_and_one_dashed_line_per_series() {
        let groups = vec![g(100, 1.1, 1.5, 0.5), g(10_000, 2.0, 40.0, 1.0)];
        let s = render_svg(
            "W3 <80%>",
            &[
                Series {
                    label: "homa".into(),
                    groups: groups.clone(),
                },
                Series {
                    label: "basic".into(),
                    groups,
                },
            ],
        );
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 4);
        assert!(s.contains("W3 &lt;80%&gt;"));
        assert!(s.contains(">10K<"));
        // p99 of 40 -> axis up to 100.
        assert!(s.contains(">100<"));
        assert!(!s.contains("NaN"));
    }

    #[test]
    fn nan_groups_are_skipped() {
        let s = render_svg(
            "t",
            &[Series {
                label: "x".into(),
                groups: vec![g(1, f64::NAN, f64::NAN, 1.0)],
            }],
        );
        assert!(!s.contains("NaN"));
    }
}
