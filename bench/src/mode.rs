//! How big and how long: the quick and the full mode (`--quick`), and the
//! shapes and settings more than one phase uses.

use std::time::Duration;

pub(crate) struct Mode {
    pub(crate) name: &'static str,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
    pub(crate) pgbench_secs: u64,
    pub(crate) search_sizes: Vec<i64>,
    pub(crate) search_secs: Duration,
    pub(crate) growth_small: i64,
    pub(crate) growth_large: i64,
    /// Long polls: each quiet window and each send-rate measurement.
    pub(crate) wake_window: Duration,
    pub(crate) wake_warmup: Duration,
    /// Rounds per wake-up pair, and the most time they may take.
    pub(crate) wake_rounds: usize,
    pub(crate) wake_pairs_secs: Duration,
    /// The popular inbox: each closed-loop run (server or pgbench) and the
    /// fixed-rate run, and the time the phase may take.
    pub(crate) hot_warmup: Duration,
    pub(crate) hot_measure: Duration,
    pub(crate) hot_allowance: Duration,
    /// Webhooks and contact policies: recipients per kind, each closed-loop
    /// run's warm-up and measured window, rounds of the comparison (each
    /// kind once per round), the webhook fixed-rate run, the longest wait
    /// for the webhook queue to drain, and the time each phase may take.
    pub(crate) ab_agents: i64,
    pub(crate) ab_warmup: Duration,
    pub(crate) ab_measure: Duration,
    pub(crate) ab_rounds: usize,
    pub(crate) hook_latency: Duration,
    pub(crate) hook_drain: Duration,
    pub(crate) hook_allowance: Duration,
    pub(crate) policy_allowance: Duration,
    /// Quotas on against off: two replicas, `ab_rounds` rounds of two mix runs.
    pub(crate) quota_allowance: Duration,
    pub(crate) budget: Duration,
}

impl Mode {
    pub(crate) fn new(quick: bool) -> Self {
        if quick {
            Mode {
                name: "quick",
                warmup: Duration::from_millis(700),
                measure: Duration::from_secs(3),
                pgbench_secs: 3,
                search_sizes: vec![10_000, 100_000],
                search_secs: Duration::from_millis(1000),
                growth_small: 10_000,
                growth_large: 1_000_000,
                wake_window: Duration::from_millis(1500),
                wake_warmup: Duration::from_millis(300),
                wake_rounds: 16,
                wake_pairs_secs: Duration::from_secs(8),
                hot_warmup: Duration::from_secs(1),
                hot_measure: Duration::from_secs(4),
                hot_allowance: Duration::from_secs(80),
                ab_agents: 200,
                ab_warmup: Duration::from_millis(300),
                ab_measure: Duration::from_millis(1200),
                ab_rounds: 3,
                hook_latency: Duration::from_secs(3),
                hook_drain: Duration::from_secs(8),
                hook_allowance: Duration::from_secs(18),
                policy_allowance: Duration::from_secs(16),
                quota_allowance: Duration::from_secs(30),
                budget: Duration::from_secs(115),
            }
        } else {
            Mode {
                name: "full",
                warmup: Duration::from_secs(2),
                measure: Duration::from_secs(10),
                pgbench_secs: 10,
                search_sizes: vec![10_000, 100_000, 1_000_000],
                search_secs: Duration::from_secs(2),
                growth_small: 10_000,
                growth_large: 10_000_000,
                wake_window: Duration::from_secs(4),
                wake_warmup: Duration::from_secs(1),
                wake_rounds: 40,
                wake_pairs_secs: Duration::from_secs(20),
                hot_warmup: Duration::from_secs(2),
                hot_measure: Duration::from_secs(8),
                hot_allowance: Duration::from_secs(200),
                ab_agents: 1000,
                ab_warmup: Duration::from_secs(1),
                ab_measure: Duration::from_secs(4),
                ab_rounds: 3,
                hook_latency: Duration::from_secs(8),
                hook_drain: Duration::from_secs(20),
                hook_allowance: Duration::from_secs(50),
                policy_allowance: Duration::from_secs(50),
                quota_allowance: Duration::from_secs(60),
                budget: Duration::from_secs(570),
            }
        }
    }
}

pub(crate) const CONCURRENCY: [usize; 2] = [16, 64];
pub(crate) const REPLICAS: [usize; 2] = [1, 3];
/// Run before each measured run of the mix database (server or pgbench).
pub(crate) const SETTLE: &str = "VACUUM (ANALYZE) messages, agents";
/// pg_stat_activity sampling during the send-rate windows.
pub(crate) const WAIT_SAMPLE_EVERY: Duration = Duration::from_millis(50);
