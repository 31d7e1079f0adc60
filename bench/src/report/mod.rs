//! `RESULTS.md`: what a run found (`Report`, filled in by the phases) and
//! its rendering: the header (`header`), the table of targets, then one
//! section per phase, each written by its phase's module.

mod header;
pub(crate) mod memory;
mod text;

use std::{fmt::Write as _, time::Duration};

use crate::cli::Opts;
use crate::mode::Mode;
use crate::phase::{
    growth::{self, GrowthRow},
    hot::{self, HotBase, HotRow},
    mix::{self, MixRow, NoDbRow},
    policy::{self, PolicyReport},
    quotas::{self, QuotaReport},
    rate::{self, RateRow},
    search::{self, SearchRow},
    wake::{self, WakeReport},
    webhooks::{self, HookReport},
};
pub(crate) use header::git_revision;
use memory::MemRow;
pub(crate) use text::{excerpt, mb, shorten, verdict};

/// What a run found, filled in by the phases as they go.
#[derive(Default)]
pub(crate) struct Report {
    pub(crate) revision: String,
    pub(crate) notes: Vec<String>,
    pub(crate) fsync: Option<f64>,
    pub(crate) mix: Vec<MixRow>,
    pub(crate) no_db: Vec<NoDbRow>,
    pub(crate) rate: Vec<RateRow>,
    pub(crate) search: Vec<SearchRow>,
    /// (size, seconds to seed up to it, indexes rebuilt after the load)
    pub(crate) search_seed: Vec<(i64, f64, bool)>,
    pub(crate) search_seeded: i64,
    pub(crate) growth: Vec<GrowthRow>,
    pub(crate) growth_seed_secs: f64,
    pub(crate) wake: Option<WakeReport>,
    pub(crate) hot: Vec<HotRow>,
    pub(crate) hot_base: Vec<HotBase>,
    pub(crate) hot_rate: Option<RateRow>,
    pub(crate) webhooks: Option<HookReport>,
    pub(crate) policy: Option<PolicyReport>,
    pub(crate) teams: Option<crate::phase::teams::TeamsReport>,
    pub(crate) quotas: Option<QuotaReport>,
    pub(crate) before: Option<QuotaReport>,
    pub(crate) mem: Vec<MemRow>,
    pub(crate) skipped: Vec<String>,
}

/// The whole of `RESULTS.md`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn render(
    opts: &Opts,
    mode: &Mode,
    r: &Report,
    pg_version: &str,
    settings: &str,
    started_at: chrono::DateTime<chrono::Utc>,
    elapsed: Duration,
    loadavg: &str,
) -> String {
    let mut s = String::new();
    let w = &mut s;
    header::write(
        w, opts, mode, r, pg_version, settings, started_at, elapsed, loadavg,
    );

    // Targets first.
    let _ = writeln!(w, "\n## Against the targets\n");
    let _ = writeln!(w, "| target | measured | verdict |");
    let _ = writeln!(w, "|---|---|---|");
    mix::target_rows(w, r);
    rate::target_rows(w, r);
    hot::target_rows(w, r);
    search::target_rows(w, r);
    growth::target_rows(w, r);
    if let Some(wk) = &r.wake {
        wake::target_rows(w, wk);
    }
    if let Some(x) = &r.webhooks {
        let _ = writeln!(w, "{}", webhooks::target_row(x));
    }
    if let Some(x) = &r.policy {
        let _ = writeln!(w, "{}", policy::target_row(x));
    }
    if let Some(x) = &r.teams {
        crate::phase::teams::target_rows(w, x);
    }
    if let Some(x) = &r.quotas {
        quotas::target_row(w, x);
    }
    if let Some(x) = &r.before {
        quotas::target_row(w, x);
    }
    memory::target_rows(w, r);

    // Then the sections, each when its phase ran.
    if !r.mix.is_empty() || r.fsync.is_some() {
        mix::section(w, r, mode);
    }
    if !r.rate.is_empty() {
        rate::section(w, r);
    }
    if !r.search.is_empty() {
        search::section(w, r);
    }
    if !r.growth.is_empty() {
        growth::section(w, r);
    }
    if let Some(wk) = &r.wake {
        wake::section(w, wk, opts, mode);
    }
    if !r.mem.is_empty() {
        memory::section(w, r);
    }
    if !r.hot.is_empty() || !r.hot_base.is_empty() {
        hot::section(w, r, mode);
    }
    if let Some(x) = &r.webhooks {
        webhooks::section(w, x, opts, mode);
    }
    if let Some(x) = &r.policy {
        policy::section(w, x, opts, mode);
    }
    if let Some(x) = &r.teams {
        crate::phase::teams::section(w, x);
    }
    if let Some(x) = &r.quotas {
        quotas::section(w, x, mode);
    }
    if let Some(x) = &r.before {
        quotas::section(w, x, mode);
    }
    // The profile (bench/profile.sh) is read and written up by hand: its
    // write-up is carried into every report, marked as such.
    if let Ok(profile) = std::fs::read_to_string("bench/PROFILE.md") {
        let _ = writeln!(
            w,
            "\n<!-- from bench/PROFILE.md (written by hand from bench/profile.sh; not measured by this run) -->\n"
        );
        let _ = write!(w, "{profile}");
    }
    s
}
