//! The operator's overview: counts, messages per day as an SVG bar chart
//! drawn here (no script, no third-party service), projects, backlog,
//! waiters and the webhook queue.

use chrono::NaiveDate;
use maud::{Markup, html};

use super::pages::{Chrome, page};
use crate::domain::console::Overview;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 28.0;
const TOP: f64 = 12.0;

/// A bar per day, a label every few days, the scale's top and middle.
pub fn daily_chart(daily: &[(NaiveDate, i64)]) -> Markup {
    let max = daily.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    // A round top for the scale: 1, 2, 5 × 10^k.
    let top = {
        let mut step = 1i64;
        loop {
            if let Some(t) = [1, 2, 5].iter().map(|m| m * step).find(|t| *t >= max) {
                break t;
            }
            step = step.saturating_mul(10);
        }
    };
    let plot_w = WIDTH - LEFT - 8.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let n = daily.len().max(1) as f64;
    let slot = plot_w / n;
    let bar = (slot * 0.7).max(1.0);
    let label_every = (daily.len() / 7).max(1);
    let total: i64 = daily.iter().map(|(_, n)| n).sum();
    let y = |v: i64| TOP + plot_h - plot_h * (v as f64) / (top as f64);
    html! {
        svg.chart viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img"
            aria-label=(format!("Messages per day over the last {} days: {total} in all", daily.len())) {
            title { "Messages per day (UTC)" }
            @for v in [0, top / 2, top] {
                // Closed explicitly: in SVG a bare `<line>` swallows what follows.
                line.grid x1=(LEFT) x2=(WIDTH - 8.0) y1=(y(v)) y2=(y(v)) {}
                text.axis x=(LEFT - 6.0) y=(y(v) + 4.0) text-anchor="end" { (v) }
            }
            @for (i, (day, count)) in daily.iter().enumerate() {
                @let x = LEFT + slot * i as f64 + (slot - bar) / 2.0;
                rect.bar x=(format!("{x:.1}")) y=(format!("{:.1}", y(*count)))
                    width=(format!("{bar:.1}")) height=(format!("{:.1}", TOP + plot_h - y(*count))) {
                    title { (day) ": " (count) " messages" }
                }
                @if (daily.len() - 1 - i).is_multiple_of(label_every) {
                    text.axis x=(format!("{:.1}", x + bar / 2.0)) y=(HEIGHT - 8.0) text-anchor="middle" {
                        (day.format("%m-%d"))
                    }
                }
            }
        }
    }
}

pub fn page_for(chrome: &Chrome<'_>, o: &Overview, days: u32) -> Markup {
    let stat = |label: &str, value: String| {
        html! { div.stat { span.value { (value) } span.label { (label) } } }
    };
    page(
        "Overview",
        chrome,
        None,
        html! {
            div.heading { h1 { "Overview" } p.muted { "The whole service, from the analytics views. Days are UTC days." } }
            div.stats {
                (stat("agents registered", o.agents.to_string()))
                (stat("seen in the last day", o.agents_seen_today.to_string()))
                (stat("suspended", o.agents_suspended.to_string()))
                (stat("messages (ids issued)", o.messages.to_string()))
                (stat("unread backlog", o.unread.to_string()))
                (stat("waiting long polls", o.waiters.to_string()))
                (stat("webhooks pending", o.webhooks_pending.to_string()))
                (stat("webhooks due now", o.webhooks_due.to_string()))
                (stat("webhooks failed today", o.webhooks_failed_today.to_string()))
            }
            @if let Some(oldest) = o.webhooks_oldest_due {
                p.notice.problem { "The oldest webhook delivery due has waited since " (oldest.format("%Y-%m-%d %H:%M:%S UTC")) "." }
            }
            section.card {
                h2 { "Messages per day, last " (days) " days" }
                (daily_chart(&o.daily))
            }
            div.columns {
                section.card {
                    h2 { "Projects, last " (days) " days" }
                    @if o.projects.is_empty() { p.empty { "No mail in this period." } } @else {
                        table {
                            thead { tr { th { "Project" } th.num { "Sent" } th.num { "Received" } } }
                            tbody { @for p in &o.projects { tr { td { bdi { (p.project) } } td.num { (p.sent) } td.num { (p.received) } } } }
                        }
                    }
                }
                section.card {
                    h2 { "Largest unread backlogs" }
                    @if o.backlog.is_empty() { p.empty { "Every inbox is read." } } @else {
                        table {
                            thead { tr { th { "Agent" } th { "Project" } th.num { "Unread" } th { "Oldest" } } }
                            tbody {
                                @for b in &o.backlog {
                                    tr {
                                        td { bdi { (b.agent) } } td { bdi { (b.project) } } td.num { (b.unread) }
                                        td { @if let Some(t) = b.oldest_unread_at { (t.format("%Y-%m-%d %H:%M")) } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_has_a_bar_per_day_and_a_round_scale() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
        let daily: Vec<_> = (0..14)
            .map(|i| (day + chrono::Days::new(i), (i as i64) * 3))
            .collect();
        let svg = daily_chart(&daily).into_string();
        assert_eq!(svg.matches("<rect").count(), 14);
        assert_eq!(svg.matches("<line").count(), svg.matches("</line>").count());
        assert!(
            svg.contains(">50<"),
            "top of the scale for a maximum of 39: {svg}"
        );
        assert!(svg.contains("2026-12-14: 39 messages"));
        let empty = daily_chart(&[(day, 0)]).into_string();
        assert!(empty.contains("height=\"0.0\""), "{empty}");
    }
}
