//! Small pieces of the Markdown: statement excerpts, megabytes, verdicts.

/// The distinguishing part of a statement: from what its kind does on.
pub(crate) fn excerpt(q: &str, kind: &str) -> String {
    let key = match kind {
        "send" | "mail: sends+polls" | "mail: sends" => "INSERT INTO messages",
        "poll" | "mail: polls" => "UPDATE messages",
        _ => "",
    };
    let at = if key.is_empty() {
        0
    } else {
        q.find(key).unwrap_or(0)
    };
    let body = shorten(&q[at..], 140);
    if at > 0 { format!("…{body}") } else { body }
}

pub(crate) fn shorten(q: &str, n: usize) -> String {
    let q = q.replace('|', "\\|").replace('`', "'");
    if q.chars().count() > n {
        format!("{}…", q.chars().take(n).collect::<String>())
    } else {
        q
    }
}

pub(crate) fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}
