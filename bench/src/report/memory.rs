//! Section 7, memory per replica: every phase notes its replicas' idle and
//! loaded memory (`MemRow`); the targets are RSS ≤ 20 MB idle and ≤ 60 MB
//! loaded.

use std::fmt::Write as _;

use super::{Report, mb, verdict};
use crate::stats::Mem;

pub(crate) struct MemRow {
    pub(crate) role: String,
    pub(crate) idle: Mem,
    pub(crate) loaded: Mem,
    pub(crate) phase: String,
}

/// The rows of the table of targets: RSS idle and loaded.
pub(crate) fn target_rows(w: &mut String, r: &Report) {
    if !r.mem.is_empty() {
        let idle = r.mem.iter().map(|m| m.idle.rss_kb).max().unwrap_or(0);
        let loaded = r.mem.iter().map(|m| m.loaded.hwm_kb).max().unwrap_or(0);
        let _ = writeln!(
            w,
            "| RSS ≤ 20 MB idle | max idle VmRSS {:.1} MB | {} |",
            mb(idle),
            verdict(mb(idle) <= 20.0)
        );
        let _ = writeln!(
            w,
            "| RSS ≤ 60 MB loaded | max VmHWM {:.1} MB | {} |",
            mb(loaded),
            verdict(mb(loaded) <= 60.0)
        );
    }
}

/// Section 7.
pub(super) fn section(w: &mut String, r: &Report) {
    let _ = writeln!(w, "\n## 7. Memory per replica\n");
    let _ = writeln!(
        w,
        "From /proc/PID/status. Idle: after start-up (migrations), `/health` and one MCP handshake, 1 s later. Loaded: at the end of the phases named, VmHWM is the peak.\n"
    );
    let _ = writeln!(
        w,
        "| replica | idle VmRSS MB | after load VmRSS MB | peak VmHWM MB | load |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|");
    for m in &r.mem {
        let _ = writeln!(
            w,
            "| {} | {:.1} | {:.1} | {:.1} | {} |",
            m.role,
            mb(m.idle.rss_kb),
            mb(m.loaded.rss_kb),
            mb(m.loaded.hwm_kb),
            m.phase
        );
    }
}
