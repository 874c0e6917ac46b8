//! The outbound benchmark's picture, as SVG text: a panel per strategy,
//! with the requests and tokens the upstream took each second and its
//! 429s, against its limits. No plotting library: lines, text and a few
//! shapes, readable at 900 px wide.

use std::fmt::Write as _;

/// The picture's width, in pixels.
const WIDTH: f64 = 900.0;
/// The plot area's margins inside the picture.
const LEFT: f64 = 64.0;
const RIGHT: f64 = 76.0;
/// The legend's height, above the first panel.
const HEAD: f64 = 86.0;
/// A panel: its title lines, its plot, the strip of 100 ms buckets under
/// it, its time axis.
const TITLE: f64 = 34.0;
const PLOT: f64 = 170.0;
const GAP: f64 = 6.0;
const STRIP: f64 = 44.0;
const AXIS: f64 = 34.0;
const PANEL: f64 = TITLE + PLOT + GAP + STRIP + AXIS;

const REQUESTS: &str = "#1f6fb4";
const TOKENS: &str = "#e07b00";
const REFUSED: &str = "#d62728";

/// One bucket of time of a panel, as rates per second.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Point {
    /// Where the bucket ends, in seconds since the common start.
    pub end: f64,
    /// Calls admitted and refused in the bucket alone.
    pub admitted_here: u64,
    pub refused_here: u64,
    /// Requests admitted, tokens charged and calls refused in the second
    /// before `end`.
    pub requests: f64,
    pub tokens: f64,
    pub refused: f64,
}

/// A strategy's panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub name: String,
    pub what: String,
    /// One line of its figures, at the right of its title.
    pub summary: String,
    pub points: Vec<Point>,
}

/// The whole picture.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    /// The run's length and its warm-up, in seconds.
    pub secs: f64,
    pub warmup: f64,
    /// The span of a bucket, in seconds.
    pub bucket: f64,
    /// The upstream's limits.
    pub requests_limit: f64,
    pub tokens_limit: f64,
    pub panels: Vec<Panel>,
}

/// A round step for an axis spanning `span` with about `ticks` ticks.
fn step(span: f64, ticks: f64) -> f64 {
    let raw = (span / ticks).max(1e-9);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * power)
}

/// `text` with the XML's special characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A number as an axis labels it.
fn label(value: f64) -> String {
    if value.fract().abs() < 1e-9 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

impl Chart {
    /// The top of the left axis, in requests a second: the highest
    /// second of any panel with a little room, at least 1.5 times the
    /// limit and at most 4 times (what is higher is cut off).
    fn y_max(&self) -> f64 {
        let scale = self.requests_limit / self.tokens_limit;
        let highest = self
            .panels
            .iter()
            .flat_map(|panel| &panel.points)
            .map(|p| p.requests.max(p.tokens * scale).max(p.refused))
            .fold(0.0, f64::max);
        let top = (highest * 1.1).clamp(1.5 * self.requests_limit, 4.0 * self.requests_limit);
        let step = step(top, 5.0);
        (top / step).ceil() * step
    }

    /// The top of the strips, in calls per bucket: the most calls of any
    /// bucket, at least twice a bucket's share of the requests limit.
    fn strip_max(&self) -> f64 {
        self.panels
            .iter()
            .flat_map(|panel| &panel.points)
            .map(|p| (p.admitted_here + p.refused_here) as f64)
            .fold(2.0 * self.requests_limit * self.bucket, f64::max)
    }

    /// The SVG document.
    pub fn render(&self) -> String {
        let height = HEAD + PANEL * self.panels.len() as f64 + 24.0;
        let mut svg = String::with_capacity(64 * 1024);
        let _ = writeln!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
             viewBox=\"0 0 {WIDTH} {height}\" font-family=\"Helvetica, Arial, sans-serif\" \
             font-size=\"12\">"
        );
        let _ = writeln!(
            svg,
            "<rect width=\"{WIDTH}\" height=\"{height}\" fill=\"white\"/>\n\
             <text x=\"{LEFT}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>",
            escape(&self.title)
        );
        self.legend(&mut svg);
        let (y_max, strip_max) = (self.y_max(), self.strip_max());
        for (index, panel) in self.panels.iter().enumerate() {
            let top = HEAD + PANEL * index as f64;
            self.panel(&mut svg, panel, index, top, (y_max, strip_max));
        }
        let bottom = HEAD + PANEL * self.panels.len() as f64;
        let middle = LEFT + (WIDTH - LEFT - RIGHT) / 2.0;
        let _ = writeln!(
            svg,
            "<text x=\"{middle}\" y=\"{}\" text-anchor=\"middle\">seconds since the workers \
             started (the upstream's own clock, 100 ms buckets)</text>",
            bottom + 6.0
        );
        svg.push_str("</svg>\n");
        svg
    }

    fn legend(&self, svg: &mut String) {
        let (requests, tokens) = (self.requests_limit, self.tokens_limit);
        let items: [(&str, String); 6] = [
            (
                "requests",
                "requests/s admitted, over the last second (left axis)".to_owned(),
            ),
            (
                "strip",
                "strip: calls in each 100 ms, admitted (blue) and refused (red)".to_owned(),
            ),
            (
                "tokens",
                "tokens/s charged, over the last second (right axis)".to_owned(),
            ),
            (
                "refused",
                "429s/s, over the last second (left axis)".to_owned(),
            ),
            (
                "limit",
                format!("the upstream's limits: {requests} requests/s = {tokens} tokens/s"),
            ),
            ("warmup", "warm-up, left out of the table".to_owned()),
        ];
        for (i, (kind, text)) in items.iter().enumerate() {
            let x = LEFT + if i % 2 == 0 { 0.0 } else { 390.0 };
            let y = 42.0 + 17.0 * (i / 2) as f64;
            let line = |color: &str, width: f64, extra: &str| {
                format!(
                    "<line x1=\"{x}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{color}\" \
                     stroke-width=\"{width}\"{extra}/>",
                    y - 4.0,
                    x + 26.0,
                    y - 4.0
                )
            };
            let mark = match *kind {
                "requests" => line(REQUESTS, 2.0, ""),
                "strip" => format!(
                    "<rect x=\"{x}\" y=\"{}\" width=\"5\" height=\"9\" fill=\"{REQUESTS}\"/>\
                     <rect x=\"{}\" y=\"{}\" width=\"5\" height=\"12\" fill=\"{REQUESTS}\"/>\
                     <rect x=\"{}\" y=\"{}\" width=\"5\" height=\"3\" fill=\"{REFUSED}\"/>",
                    y - 9.0,
                    x + 10.0,
                    y - 9.0,
                    x + 10.0,
                    y - 12.0
                ),
                "tokens" => line(TOKENS, 2.0, ""),
                "refused" => format!(
                    "<rect x=\"{x}\" y=\"{}\" width=\"26\" height=\"9\" fill=\"{REFUSED}\" \
                     fill-opacity=\"0.3\" stroke=\"{REFUSED}\"/>",
                    y - 9.0
                ),
                "limit" => line("black", 1.2, " stroke-dasharray=\"6 4\""),
                _ => format!(
                    "<rect x=\"{x}\" y=\"{}\" width=\"26\" height=\"10\" fill=\"#000\" \
                     fill-opacity=\"0.07\"/>",
                    y - 9.0
                ),
            };
            let _ = writeln!(
                svg,
                "{mark}<text x=\"{}\" y=\"{y}\">{}</text>",
                x + 32.0,
                escape(text)
            );
        }
    }

    fn panel(&self, svg: &mut String, panel: &Panel, index: usize, top: f64, maxes: (f64, f64)) {
        let (y_max, strip_max) = maxes;
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
        let (y0, y1) = (top + TITLE, top + TITLE + PLOT);
        let secs = self.secs.max(1e-3);
        let x = |t: f64| x0 + (x1 - x0) * t.clamp(0.0, secs) / secs;
        let y = |v: f64| y1 - (y1 - y0) * v / y_max;
        let scale = self.requests_limit / self.tokens_limit;
        let _ = writeln!(
            svg,
            "<text x=\"{x0}\" y=\"{}\" font-size=\"13\"><tspan font-weight=\"bold\">{}</tspan>\
             <tspan fill=\"#555\" dx=\"6\">\u{2014} {}</tspan></text>\n\
             <text x=\"{x1}\" y=\"{}\" text-anchor=\"end\" fill=\"#333\">{}</text>",
            top + 14.0,
            escape(&panel.name),
            escape(&panel.what),
            top + 29.0,
            escape(&panel.summary)
        );
        // The warm-up, the grid and the axes.
        let _ = writeln!(
            svg,
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{}\" height=\"{PLOT}\" fill=\"#000\" \
             fill-opacity=\"0.07\"/>\n\
             <clipPath id=\"plot{index}\"><rect x=\"{x0}\" y=\"{y0}\" width=\"{}\" \
             height=\"{PLOT}\"/></clipPath>",
            x(self.warmup) - x0,
            x1 - x0
        );
        let y_step = step(y_max, 5.0);
        let mut value = 0.0;
        while value <= y_max + 1e-9 {
            let at = y(value);
            let _ = writeln!(
                svg,
                "<line x1=\"{x0}\" y1=\"{at:.1}\" x2=\"{x1}\" y2=\"{at:.1}\" stroke=\"#ddd\"/>\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{REQUESTS}\">{}</text>\
                 <text x=\"{}\" y=\"{:.1}\" fill=\"{TOKENS}\">{}</text>",
                x0 - 6.0,
                at + 4.0,
                label(value),
                x1 + 6.0,
                at + 4.0,
                label(value / scale)
            );
            value += y_step;
        }
        let (s0, s1) = (y1 + GAP, y1 + GAP + STRIP);
        let x_step = step(secs, 10.0).max(1.0);
        let mut t = 0.0;
        while t <= secs + 1e-9 {
            let at = x(t);
            let _ = writeln!(
                svg,
                "<line x1=\"{at:.1}\" y1=\"{y0}\" x2=\"{at:.1}\" y2=\"{y1}\" stroke=\"#eee\"/>\
                 <line x1=\"{at:.1}\" y1=\"{s0}\" x2=\"{at:.1}\" y2=\"{s1}\" stroke=\"#eee\"/>\
                 <line x1=\"{at:.1}\" y1=\"{s1}\" x2=\"{at:.1}\" y2=\"{}\" stroke=\"#333\"/>\
                 <text x=\"{at:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                s1 + 4.0,
                s1 + 16.0,
                label(t)
            );
            t += x_step;
        }
        self.strip(svg, panel, index, (x0, x1), (s0, s1), strip_max);
        let middle = (y0 + y1) / 2.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{}\" height=\"{PLOT}\" fill=\"none\" \
             stroke=\"#333\"/>\n\
             <text transform=\"translate({},{middle}) rotate(-90)\" text-anchor=\"middle\" \
             fill=\"{REQUESTS}\">requests/s, 429s/s</text>\n\
             <text transform=\"translate({},{middle}) rotate(90)\" text-anchor=\"middle\" \
             fill=\"{TOKENS}\">tokens/s</text>",
            x1 - x0,
            x0 - 44.0,
            WIDTH - 16.0
        );
        // The data, cut off at the plot's edges.
        let path = |value: &dyn Fn(&Point) -> f64| {
            let mut d = String::new();
            for (i, point) in panel.points.iter().enumerate() {
                let _ = write!(
                    d,
                    "{}{:.1},{:.1}",
                    if i == 0 { "M" } else { " L" },
                    x(point.end),
                    y(value(point))
                );
            }
            d
        };
        let _ = writeln!(svg, "<g clip-path=\"url(#plot{index})\" fill=\"none\">");
        if let (Some(first), Some(last)) = (panel.points.first(), panel.points.last()) {
            let _ = writeln!(
                svg,
                "<path d=\"{} L{:.1},{y1} L{:.1},{y1} Z\" fill=\"{REFUSED}\" \
                 fill-opacity=\"0.25\" stroke=\"{REFUSED}\" stroke-width=\"1\"/>",
                path(&|p| p.refused),
                x(last.end),
                x(first.end)
            );
        }
        let _ = writeln!(
            svg,
            "<path d=\"{}\" stroke=\"{TOKENS}\" stroke-width=\"2\"/>\n\
             <path d=\"{}\" stroke=\"{REQUESTS}\" stroke-width=\"2\"/>\n</g>",
            path(&|p| p.tokens * scale),
            path(&|p| p.requests),
        );
        let limit = y(self.requests_limit);
        let _ = writeln!(
            svg,
            "<line x1=\"{x0}\" y1=\"{limit:.1}\" x2=\"{x1}\" y2=\"{limit:.1}\" stroke=\"black\" \
             stroke-width=\"1.2\" stroke-dasharray=\"6 4\"/>"
        );
    }

    /// The strip under a panel: each bucket's calls as a bar, those
    /// admitted (blue) in front of all of them (red), on a logarithmic
    /// scale of its own (`ln(1 + calls)`), so that a herd's bursts and an
    /// even pace both show.
    fn strip(
        &self,
        svg: &mut String,
        panel: &Panel,
        index: usize,
        (x0, x1): (f64, f64),
        (s0, s1): (f64, f64),
        strip_max: f64,
    ) {
        let secs = self.secs.max(1e-3);
        let x = |t: f64| x0 + (x1 - x0) * t / secs;
        let h = |calls: f64| STRIP * calls.ln_1p() / strip_max.ln_1p();
        let width = ((x1 - x0) * self.bucket / secs - 0.4).max(0.6);
        let _ = writeln!(
            svg,
            "<rect x=\"{x0}\" y=\"{s0}\" width=\"{}\" height=\"{STRIP}\" fill=\"#000\" \
             fill-opacity=\"0.07\" clip-path=\"url(#strip{index})\"/>\n\
             <clipPath id=\"strip{index}\"><rect x=\"{x0}\" y=\"{s0}\" width=\"{}\" \
             height=\"{STRIP}\"/></clipPath>\n<g clip-path=\"url(#strip{index})\">",
            x(self.warmup) - x0,
            x1 - x0
        );
        for point in &panel.points {
            let left = x(point.end - self.bucket) + 0.2;
            let all = point.admitted_here + point.refused_here;
            for (calls, color) in [(all, REFUSED), (point.admitted_here, REQUESTS)] {
                if calls > 0 {
                    let height = h(calls as f64);
                    let _ = write!(
                        svg,
                        "<rect x=\"{left:.1}\" y=\"{:.1}\" width=\"{width:.1}\" \
                         height=\"{height:.1}\" fill=\"{color}\"/>",
                        s1 - height
                    );
                }
            }
        }
        svg.push_str("</g>\n");
        let mut tick = 1.0;
        while tick <= strip_max {
            let at = s1 - h(tick);
            let _ = writeln!(
                svg,
                "<line x1=\"{}\" y1=\"{at:.1}\" x2=\"{x0}\" y2=\"{at:.1}\" stroke=\"#333\"/>\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"10\">{}</text>",
                x0 - 3.0,
                x0 - 5.0,
                at + 3.5,
                label(tick)
            );
            tick *= 10.0;
        }
        let _ = writeln!(
            svg,
            "<rect x=\"{x0}\" y=\"{s0}\" width=\"{}\" height=\"{STRIP}\" fill=\"none\" \
             stroke=\"#333\"/>\n\
             <text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#333\">calls per</text>\
             <text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#333\">{} ms (log)</text>",
            x1 - x0,
            x1 + 6.0,
            s0 + 18.0,
            x1 + 6.0,
            s0 + 30.0,
            label(self.bucket * 1e3)
        );
    }
}
