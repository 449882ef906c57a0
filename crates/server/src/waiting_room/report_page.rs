//! The sale report's page, `GET /admin/queues/{queue}/report` (SPEC 2.5): the JSON report drawn as
//! charts a shop manager reads at a glance. Rendered here, as HTML with inline SVG and no script, so it
//! needs nothing from the internet, works with scripts off, and its CSP allows inline styles only.
//!
//! Admin only, like the JSON it draws (the route sits with the admin API behind `require_admin`):
//! loopback browsers without admin keys, else `Authorization: Bearer <admin key>` (for a browser, from
//! the proxy or SSO gateway in front). The dashboard page differs because it carries no data itself.
//!
//! Each series is a `<g data-series="…" data-values="…">` holding the numbers it draws, and each total
//! a `data-total` element, so the browser test reads what is drawn and compares it with the JSON.

use std::fmt::Write as _;

use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::sale_report::{ReportMinute, SaleReport};

/// The chart's drawing box (SVG user units); it scales with the page.
const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;
/// Up to this many minutes each point gets a dot (a few minutes of a short sale would be invisible
/// as lines alone).
const DOTS_UP_TO: usize = 180;

/// One line of a chart.
struct Series<'a> {
    key: &'static str,
    name: &'static str,
    color: &'static str,
    dashed: bool,
    values: Vec<Option<f64>>,
    /// What the legend shows beside the name (a total, a percentile).
    legend: &'a str,
}

/// HTML text and attribute escaping (queue names are restricted already; this keeps it so).
fn escape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A number as the page shows it: whole numbers plainly, others to two decimals.
fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value:.2}")
    }
}

fn seconds(value: Option<u64>) -> String {
    value.map_or_else(|| "–".to_owned(), |s| format!("{s} s"))
}

/// The smallest of 1, 2, 5 × 10^k at or above `max` (an axis top with round halves).
fn axis_top(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let mut scale = 1.0;
    while scale * 10.0 < max {
        scale *= 10.0;
    }
    for step in [1.0, 2.0, 5.0, 10.0] {
        if step * scale >= max {
            return step * scale;
        }
    }
    10.0 * scale
}

/// `HH:MM` of an RFC 3339 minute.
fn clock_label(minute: &str) -> &str {
    minute.get(11..16).unwrap_or(minute)
}

fn line_chart(out: &mut String, chart: &str, title: &str, minutes: &[ReportMinute], series: &[Series<'_>]) {
    let count = minutes.len().max(1);
    let top = axis_top(
        series
            .iter()
            .flat_map(|s| s.values.iter().flatten())
            .fold(0.0_f64, |max, v| max.max(*v)),
    );
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| {
        if count == 1 {
            LEFT + plot_width / 2.0
        } else {
            LEFT + plot_width * i as f64 / (count - 1) as f64
        }
    };
    let y = |v: f64| TOP + plot_height * (1.0 - v / top);
    let _ = write!(
        out,
        r#"<figure><figcaption>{title}</figcaption><svg data-chart="{chart}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{title}">"#
    );
    for fraction in [0.0, 0.5, 1.0] {
        let level = top * fraction;
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#e5e7eb"/><text x="{:.1}" y="{:.1}" text-anchor="end" class="axis">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            y(level) + 4.0,
            number(level),
            y = y(level),
        );
    }
    let mut labelled = vec![0, count / 2, count - 1];
    labelled.dedup();
    for i in labelled {
        if let Some(minute) = minutes.get(i) {
            let _ = write!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="axis">{}</text>"#,
                x(i),
                HEIGHT - 8.0,
                escape(clock_label(&minute.minute))
            );
        }
    }
    for s in series {
        let values: Vec<String> = s
            .values
            .iter()
            .map(|v| v.map_or_else(String::new, number))
            .collect();
        let _ = write!(
            out,
            r#"<g data-series="{}" data-values="{}" stroke="{}" fill="{}">"#,
            s.key,
            values.join(","),
            s.color,
            s.color
        );
        // A line per run of known values: a minute without a value (no admission) breaks it.
        let mut run: Vec<String> = Vec::new();
        let flush = |run: &mut Vec<String>, out: &mut String| {
            if run.len() > 1 {
                let _ = write!(
                    out,
                    r#"<polyline fill="none" stroke-width="2"{} points="{}"/>"#,
                    if s.dashed {
                        r#" stroke-dasharray="6 4""#
                    } else {
                        ""
                    },
                    run.join(" ")
                );
            }
            run.clear();
        };
        for (i, value) in s.values.iter().enumerate() {
            match value {
                Some(v) => run.push(format!("{:.1},{:.1}", x(i), y(*v))),
                None => flush(&mut run, out),
            }
        }
        flush(&mut run, out);
        if s.values.len() <= DOTS_UP_TO {
            for (i, value) in s.values.iter().enumerate() {
                if let Some(v) = value {
                    let _ = write!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3"/>"#, x(i), y(*v));
                }
            }
        }
        out.push_str("</g>");
    }
    out.push_str("</svg><ul class=\"legend\">");
    for s in series {
        let _ = write!(
            out,
            r#"<li><span class="swatch{}" style="background:{}"></span>{} <b data-legend="{}">{}</b></li>"#,
            if s.dashed { " dashed" } else { "" },
            s.color,
            s.name,
            s.key,
            escape(s.legend)
        );
    }
    out.push_str("</ul></figure>");
}

fn counts(minutes: &[ReportMinute], of: impl Fn(&ReportMinute) -> u64) -> Vec<Option<f64>> {
    minutes.iter().map(|m| Some(of(m) as f64)).collect()
}

fn optional(minutes: &[ReportMinute], of: impl Fn(&ReportMinute) -> Option<u64>) -> Vec<Option<f64>> {
    minutes.iter().map(|m| of(m).map(|v| v as f64)).collect()
}

/// Orders over admissions so far, minute by minute (`None` before the first admission).
fn running_orders_per_admission(minutes: &[ReportMinute]) -> Vec<Option<f64>> {
    let (mut orders, mut admitted) = (0u64, 0u64);
    minutes
        .iter()
        .map(|m| {
            orders += m.orders;
            admitted += m.admitted;
            (admitted > 0).then(|| (orders as f64 / admitted as f64 * 100.0).round() / 100.0)
        })
        .collect()
}

/// The page's HTML.
#[must_use]
pub fn render(report: &SaleReport) -> String {
    let queue = escape(&report.queue);
    let t = &report.totals;
    let mut out = String::with_capacity(16 * 1024 + report.minutes.len() * 200);
    let _ = write!(
        out,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Sale report · {queue}</title><style>
body{{font:15px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f8fafc;color:#0f172a}}
main{{max-width:1040px;margin:0 auto;padding:24px}}h1{{font-size:24px;margin:0 0 4px}}
.muted{{color:#64748b}}.totals{{display:grid;grid-template-columns:repeat(auto-fit,minmax(180px,1fr));gap:12px;margin:20px 0}}
.totals div{{background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:10px 12px}}
dt{{font-size:13px;color:#64748b}}dd{{margin:2px 0 0;font-size:22px;font-weight:600}}
figure{{background:#fff;border:1px solid #e2e8f0;border-radius:8px;margin:0 0 16px;padding:12px 16px}}
figcaption{{font-weight:600;margin-bottom:6px}}svg{{width:100%;height:auto;display:block}}
.axis{{font-size:11px;fill:#64748b;stroke:none}}.legend{{list-style:none;display:flex;flex-wrap:wrap;gap:16px;padding:0;margin:6px 0 0;font-size:13px}}
.swatch{{display:inline-block;width:14px;height:4px;margin-right:6px;vertical-align:middle}}.swatch.dashed{{height:2px;border-top:2px dashed #fff}}
</style></head><body><main><h1>Sale report: <span data-queue>{queue}</span></h1>"#
    );
    let from = report.first_entry_at.as_deref().map_or_else(
        || "no entries counted yet".to_owned(),
        |at| format!("from {}", escape(at)),
    );
    let _ = write!(
        out,
        r#"<p class="muted">{from} · generated {} · minutes in UTC · the last {} minutes are kept · <a href="/v1/admin/queues/{queue}/report">JSON</a></p>"#,
        escape(&report.generated_at),
        report.minutes_kept
    );
    let ratio = t
        .orders_per_admission
        .map_or_else(|| "–".to_owned(), |r| format!("{r:.2}"));
    out.push_str(r#"<dl class="totals">"#);
    for (key, name, value) in [
        ("arrivals", "Arrivals", t.arrivals.to_string()),
        ("admitted", "Admitted", t.admitted.to_string()),
        ("abandoned", "Abandoned", t.abandoned.to_string()),
        ("refused", "Refused", t.refused.total().to_string()),
        ("orders", "Orders", t.orders.to_string()),
        ("ordersPerAdmission", "Orders per admission", ratio),
        (
            "wait",
            "Wait p50 / p90",
            format!(
                "{} / {}",
                seconds(t.wait_seconds_p50),
                seconds(t.wait_seconds_p90)
            ),
        ),
        (
            "estimate",
            "Estimated p50 / p90",
            format!(
                "{} / {}",
                seconds(t.estimate_seconds_p50),
                seconds(t.estimate_seconds_p90)
            ),
        ),
    ] {
        let _ = write!(
            out,
            r#"<div><dt>{name}</dt><dd data-total="{key}">{}</dd></div>"#,
            escape(&value)
        );
    }
    out.push_str("</dl>");
    let minutes = &report.minutes;
    if minutes.is_empty() {
        out.push_str(
            r#"<p data-empty>Nothing has been counted for this queue yet.</p></main></body></html>"#,
        );
        return out;
    }
    let (arrivals, admitted, abandoned) = (
        t.arrivals.to_string(),
        t.admitted.to_string(),
        t.abandoned.to_string(),
    );
    line_chart(
        &mut out,
        "flow",
        "Arrivals, admissions and abandonment per minute",
        minutes,
        &[
            Series {
                key: "arrivals",
                name: "arrivals",
                color: "#2563eb",
                dashed: false,
                values: counts(minutes, |m| m.arrivals),
                legend: &arrivals,
            },
            Series {
                key: "admitted",
                name: "admitted",
                color: "#16a34a",
                dashed: false,
                values: counts(minutes, |m| m.admitted),
                legend: &admitted,
            },
            Series {
                key: "abandoned",
                name: "abandoned",
                color: "#dc2626",
                dashed: false,
                values: counts(minutes, |m| m.abandoned),
                legend: &abandoned,
            },
        ],
    );
    let (challenge, address, captcha) = (
        t.refused.challenge.to_string(),
        t.refused.address.to_string(),
        t.refused.captcha.to_string(),
    );
    line_chart(
        &mut out,
        "refusals",
        "Refused entries per minute, by reason",
        minutes,
        &[
            Series {
                key: "challenge",
                name: "challenge",
                color: "#7c3aed",
                dashed: false,
                values: counts(minutes, |m| m.refused.challenge),
                legend: &challenge,
            },
            Series {
                key: "address",
                name: "per-address budget",
                color: "#ea580c",
                dashed: false,
                values: counts(minutes, |m| m.refused.address),
                legend: &address,
            },
            Series {
                key: "captcha",
                name: "CAPTCHA",
                color: "#0891b2",
                dashed: false,
                values: counts(minutes, |m| m.refused.captcha),
                legend: &captcha,
            },
        ],
    );
    let (wait50, wait90, est50, est90) = (
        seconds(t.wait_seconds_p50),
        seconds(t.wait_seconds_p90),
        seconds(t.estimate_seconds_p50),
        seconds(t.estimate_seconds_p90),
    );
    line_chart(
        &mut out,
        "waits",
        "Actual wait of the members admitted each minute against their estimate at entry (seconds)",
        minutes,
        &[
            Series {
                key: "waitP50",
                name: "wait p50",
                color: "#1d4ed8",
                dashed: false,
                values: optional(minutes, |m| m.wait_seconds_p50),
                legend: &wait50,
            },
            Series {
                key: "waitP90",
                name: "wait p90",
                color: "#1d4ed8",
                dashed: true,
                values: optional(minutes, |m| m.wait_seconds_p90),
                legend: &wait90,
            },
            Series {
                key: "estimateP50",
                name: "estimate p50",
                color: "#d97706",
                dashed: false,
                values: optional(minutes, |m| m.estimate_seconds_p50),
                legend: &est50,
            },
            Series {
                key: "estimateP90",
                name: "estimate p90",
                color: "#d97706",
                dashed: true,
                values: optional(minutes, |m| m.estimate_seconds_p90),
                legend: &est90,
            },
        ],
    );
    let orders = t.orders.to_string();
    line_chart(
        &mut out,
        "orders",
        "Orders per minute against admissions",
        minutes,
        &[
            Series {
                key: "admitted",
                name: "admitted",
                color: "#16a34a",
                dashed: true,
                values: counts(minutes, |m| m.admitted),
                legend: &admitted,
            },
            Series {
                key: "orders",
                name: "orders",
                color: "#0f766e",
                dashed: false,
                values: counts(minutes, |m| m.orders),
                legend: &orders,
            },
        ],
    );
    let ratio_legend = t
        .orders_per_admission
        .map_or_else(|| "–".to_owned(), |r| format!("{r:.2}"));
    line_chart(
        &mut out,
        "conversion",
        "Orders per admission so far",
        minutes,
        &[Series {
            key: "ordersPerAdmission",
            name: "orders per admission (running)",
            color: "#0f766e",
            dashed: false,
            values: running_orders_per_admission(minutes),
            legend: &ratio_legend,
        }],
    );
    out.push_str("</main></body></html>");
    out
}

/// The page as a response: no caching (the numbers move), a CSP that allows inline styles only.
pub(crate) fn response(report: &SaleReport) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
        ],
        render(report),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_tops_are_round() {
        assert_eq!(axis_top(0.0), 1.0);
        assert_eq!(axis_top(0.4), 1.0);
        assert_eq!(axis_top(3.0), 5.0);
        assert_eq!(axis_top(17.0), 20.0);
        assert_eq!(axis_top(100.0), 100.0);
        assert_eq!(axis_top(101.0), 200.0);
    }

    #[test]
    fn running_ratio_waits_for_the_first_admission() {
        let minute = |admitted, orders| ReportMinute {
            minute: "2026-12-04T10:00:00Z".into(),
            arrivals: 0,
            admitted,
            abandoned: 0,
            refused: Default::default(),
            orders,
            wait_seconds_p50: None,
            wait_seconds_p90: None,
            estimate_seconds_p50: None,
            estimate_seconds_p90: None,
        };
        let minutes = [minute(0, 0), minute(4, 1), minute(0, 2)];
        assert_eq!(
            running_orders_per_admission(&minutes),
            vec![None, Some(0.25), Some(0.75)]
        );
        assert_eq!(escape("<a&\"'>"), "&lt;a&amp;&quot;&#39;&gt;");
    }
}
