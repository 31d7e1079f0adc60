//! Latency samples, error tallies, and CPU / memory readings from /proc.

use std::{collections::BTreeMap, time::Duration};

/// Every latency sample, in microseconds. A run of minutes at a few
/// thousand calls a second is a few MB: sorting beats a histogram's
/// bucketing error here.
#[derive(Default, Clone, Debug)]
pub struct Lat {
    us: Vec<u32>,
}

#[derive(Default, Clone, Copy, Debug)]
pub struct Summary {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Lat {
    pub fn record(&mut self, d: Duration) {
        self.us.push(d.as_micros().min(u128::from(u32::MAX)) as u32);
    }

    pub fn merge(&mut self, other: Lat) {
        self.us.extend(other.us);
    }

    pub fn len(&self) -> usize {
        self.us.len()
    }

    /// Percentiles in milliseconds (nearest rank).
    pub fn summary(&self) -> Summary {
        if self.us.is_empty() {
            return Summary::default();
        }
        let mut v = self.us.clone();
        v.sort_unstable();
        let at = |q: f64| {
            let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
            f64::from(v[rank - 1]) / 1000.0
        };
        Summary {
            count: v.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p999: at(0.999),
            max: f64::from(*v.last().unwrap()) / 1000.0,
        }
    }
}

#[derive(Default, Clone, Debug)]
pub struct Errors {
    pub by_kind: BTreeMap<String, u64>,
    pub examples: Vec<String>,
}

impl Errors {
    pub fn add(&mut self, what: &str, kind: &str, detail: &str) {
        *self.by_kind.entry(format!("{what}:{kind}")).or_default() += 1;
        if self.examples.len() < 5 {
            self.examples.push(format!("{what}: {detail}"));
        }
    }

    pub fn merge(&mut self, other: Errors) {
        for (k, v) in other.by_kind {
            *self.by_kind.entry(k).or_default() += v;
        }
        for e in other.examples {
            if self.examples.len() < 5 {
                self.examples.push(e);
            }
        }
    }

    pub fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }

    pub fn describe(&self) -> String {
        if self.by_kind.is_empty() {
            return "0".into();
        }
        let kinds: Vec<String> = self
            .by_kind
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        format!("{} ({})", self.total(), kinds.join(", "))
    }
}

/// Resident memory of a process, in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mem {
    pub rss_kb: u64,
    pub hwm_kb: u64,
}

pub fn mem(pid: u32) -> Option<Mem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    Some(Mem {
        rss_kb: field("VmRSS:")?,
        hwm_kb: field("VmHWM:")?,
    })
}

/// (own utime+stime, reaped children's cutime+cstime) in clock ticks.
pub fn proc_ticks(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
    Some((n(11)? + n(12)?, n(13)? + n(14)?))
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// CPU ticks of a whole process tree rooted at `root` one level deep (the
/// postmaster and its backends), including exited, reaped backends.
pub fn tree_ticks(root: u32) -> u64 {
    let mut total = proc_ticks(root).map_or(0, |(own, children)| own + children);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if ppid(pid) == Some(root) {
                total += proc_ticks(pid).map_or(0, |(own, _)| own);
            }
        }
    }
    total
}

/// (busy, total) ticks of the whole machine, from /proc/stat.
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    if v.len() < 8 {
        return (0, 0);
    }
    // user nice system idle iowait irq softirq steal
    let idle = v[3] + v[4];
    let total: u64 = v[..8].iter().sum();
    (total - idle, total)
}

pub fn clock_ticks_per_sec() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// CPU seconds used over an interval by the parties of a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuUse {
    pub wall: f64,
    pub server: f64,
    pub postgres: f64,
    pub loadgen: f64,
    pub machine_busy: f64,
}

impl CpuUse {
    /// What neither the server, Postgres nor the load generator used: other
    /// engineers' compilers, the kernel's own work, and so on.
    pub fn other(&self) -> f64 {
        (self.machine_busy - self.server - self.postgres - self.loadgen).max(0.0)
    }
}

#[derive(Clone, Debug)]
pub struct CpuProbe {
    at: std::time::Instant,
    server: u64,
    postgres: u64,
    loadgen: u64,
    machine: u64,
}

impl CpuProbe {
    /// `loadgen`: the processes generating load (empty: this process).
    pub fn take(server_pids: &[u32], postmaster: u32, loadgen: &[u32]) -> Self {
        let own = |pids: &[u32]| -> u64 {
            pids.iter()
                .filter_map(|&p| proc_ticks(p))
                .map(|(own, _)| own)
                .sum()
        };
        Self {
            at: std::time::Instant::now(),
            server: own(server_pids),
            postgres: tree_ticks(postmaster),
            loadgen: if loadgen.is_empty() {
                own(&[std::process::id()])
            } else {
                own(loadgen)
            },
            machine: machine_ticks().0,
        }
    }

    pub fn since(&self, earlier: &CpuProbe, hz: f64) -> CpuUse {
        let d = |a: u64, b: u64| a.saturating_sub(b) as f64 / hz;
        CpuUse {
            wall: (self.at - earlier.at).as_secs_f64(),
            server: d(self.server, earlier.server),
            postgres: d(self.postgres, earlier.postgres),
            loadgen: d(self.loadgen, earlier.loadgen),
            machine_busy: d(self.machine, earlier.machine),
        }
    }
}

/// This process's soft limit on open files (`Max open files` in
/// /proc/self/limits); `None` when unlimited or unreadable.
pub fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
