//! The fault suite (`make chaos`): real `phone` processes against the suite's
//! own durable PostgreSQL, under a steady send + poll load, while replicas
//! are killed, PostgreSQL crashes, the network to PostgreSQL is cut, the
//! pool is exhausted and slow clients hold connections.
//!
//! Every test is `#[ignore]`d so `make test` skips it; `scripts/chaos.sh`
//! starts PostgreSQL (data/chaos-pg, port 25433) and runs them one at a time
//! with `--run-ignored only`. Each test appends a row to
//! `target/chaos/results.md` (docs/RELIABILITY.md holds a copy of a run).
//!
//! Guarantees checked in every load test (they fail the test): nothing
//! acknowledged is lost, nothing is delivered or stored twice, nothing is
//! invented, no replica panics. Known weaknesses of the server (timeouts it
//! does not have) are measured and written to `target/chaos/findings.md`;
//! `PHONE_CHAOS_STRICT=1` turns them into failures.

mod abuse;
mod client;
mod failover;
mod harness;
mod slow;
mod vanish;
mod webhooks;
mod workload;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use client::{Mcp, Outcome};
use harness::{Link, Proxy, Replica};
use serde_json::json;
use workload::{
    Load, LoadConfig, Row, check, failures, first_success_after, kinds_text, longest_gap,
};

const IGNORE: &str = "chaos suite: run with `make chaos`";

fn secs(env: &str, default: f64) -> f64 {
    std::env::var(env)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Fails the test on a broken guarantee; prints the verdict either way.
fn assert_guarantees(label: &str, load: &Load, v: &workload::Verdict, replicas: &[&Replica]) {
    println!("{label}: {}", v.summary());
    for line in workload::explain_unseen(load, v) {
        println!("{label}: read but never returned by a poll: {line}");
    }
    let mut problems = v.violations();
    let panics = harness::panics_in_logs(replicas);
    if !panics.is_empty() {
        problems.push(format!("panics in replica logs: {panics:?}"));
    }
    assert!(
        v.acknowledged > 0,
        "{label}: nothing was acknowledged; the load did not run"
    );
    assert!(problems.is_empty(), "{label}: {}", problems.join("; "));
}

/// Records a weakness: a failure in strict mode, a finding otherwise.
fn finding(ok: bool, text: String) {
    if ok {
        return;
    }
    workload::write_finding(&format!("- FINDING: {text}"));
    assert!(!harness::strict(), "{text}");
}

// ---------------------------------------------------------------------------
// Health sampling: what each replica's /health said, and when.

/// (seconds since the load started, replica, status or None when unreachable)
type Sample = (f64, usize, Option<u16>);

struct HealthLog {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl HealthLog {
    fn start(t0: Instant, bases: &[String], every: Duration) -> Self {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = bases
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, base)| {
                let (samples, stop) = (samples.clone(), stop.clone());
                tokio::spawn(async move {
                    for _ in 0..100_000 {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let status = harness::health(&base).await;
                        // When the answer was known.
                        let at = t0.elapsed().as_secs_f64();
                        samples.lock().unwrap().push((at, i, status));
                        tokio::time::sleep(every).await;
                    }
                })
            })
            .collect();
        Self {
            samples,
            stop,
            tasks,
        }
    }

    async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            let _ = t.await;
        }
        let mut s = self.samples.lock().unwrap().clone();
        s.sort_by(|a, b| a.0.total_cmp(&b.0));
        s
    }
}

/// The first sample of `replica` taken at or after `t` that satisfies `pred`.
fn first_health(
    samples: &[Sample],
    replica: usize,
    t: f64,
    pred: impl Fn(Option<u16>) -> bool,
) -> Option<f64> {
    samples
        .iter()
        .find(|(at, r, s)| *r == replica && *at >= t && pred(*s))
        .map(|(at, _, _)| *at)
}

/// When every replica has answered 200 again, at or after `t`.
fn all_healthy_after(samples: &[Sample], replicas: usize, t: f64) -> Option<f64> {
    (0..replicas)
        .map(|r| first_health(samples, r, t, |s| s == Some(200)))
        .try_fold(0.0f64, |m, x| x.map(|x| m.max(x)))
}

// ---------------------------------------------------------------------------
// 1. kill -9 of one replica of three, repeatedly.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn kill9_one_replica_of_three_under_load() {
    let _ = IGNORE;
    let duration = secs("PHONE_CHAOS_KILL_SECS", 30.0);
    let db = harness::fresh_database("kill").await;
    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| Replica::new(&format!("kill-r{i}"), &db, &[]))
        .collect();
    for r in &mut replicas {
        r.start().await;
    }
    let bases: Vec<String> = replicas.iter().map(Replica::base).collect();
    let config = LoadConfig::default();
    let run = Load::start(bases, config.clone(), "k").await;
    let load = run.load.clone();

    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut restarts: Vec<f64> = Vec::new();
    let mut kill_times: Vec<f64> = Vec::new();
    // Bounded by count and by time.
    for i in 0..12 {
        if load.now() > duration {
            break;
        }
        let victim = i % replicas.len();
        kill_times.push(load.now());
        replicas[victim].kill9().await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        restarts.push(replicas[victim].start().await.as_secs_f64());
        tokio::time::sleep(Duration::from_millis(2500 + rand::random::<u64>() % 1000)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let faults_end = load.now();
    let load = run.finish(Duration::from_secs(40)).await;
    let calls = load.calls();
    let verdict = check(&load, &db).await;

    let (kinds, _) = failures(&calls, 0.0, faults_end, None);
    let gap = longest_gap(&calls, "phone_send", 1.0, faults_end);
    let slowest_restart = restarts.iter().cloned().fold(0.0, f64::max);
    let recovery = format!(
        "restarted replica healthy ≤ {slowest_restart:.1} s after spawn; longest stretch with no acknowledged send {gap:.2} s"
    );
    println!(
        "kill -9: example failures: {:?}",
        workload::examples(&calls, "transport", 3)
    );
    let notes = format!(
        "{} kills; failed calls (retried on another replica): {}",
        kill_times.len(),
        kinds_text(&kinds)
    );
    workload::write_row(&Row::from_verdict(
        &format!(
            "kill -9 one replica of three, {} times (down 1 s each)",
            kill_times.len()
        ),
        config.describe(3, faults_end, verdict.acknowledged),
        &verdict,
        recovery,
        notes,
    ));
    assert_guarantees(
        "kill -9",
        &load,
        &verdict,
        &replicas.iter().collect::<Vec<_>>(),
    );
    assert!(kill_times.len() >= 3, "too few kills to mean anything");
    for r in &mut replicas {
        r.stop(Duration::from_secs(5)).await;
    }
}

// ---------------------------------------------------------------------------
// 2. PostgreSQL stopped in immediate mode and restarted under load.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn postgres_crash_and_restart_under_load() {
    let downs = [secs("PHONE_CHAOS_PG_DOWN_SECS", 5.0), 2.0];
    let db = harness::fresh_database("pgcrash").await;
    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| Replica::new(&format!("pg-r{i}"), &db, &[]))
        .collect();
    for r in &mut replicas {
        r.start().await;
    }
    let bases: Vec<String> = replicas.iter().map(Replica::base).collect();
    let config = LoadConfig::default();
    let run = Load::start(bases.clone(), config.clone(), "p").await;
    let load = run.load.clone();
    let health = HealthLog::start(load.t0, &bases, Duration::from_millis(200));

    tokio::time::sleep(Duration::from_secs(4)).await;
    // (stopped, restart began, accepting connections)
    let mut outages: Vec<(f64, f64, f64)> = Vec::new();
    for down in downs {
        harness::pg_crash().await;
        let stopped = load.now();
        tokio::time::sleep(Duration::from_secs_f64(down)).await;
        let restart = load.now();
        harness::pg_start().await;
        let up = load.now();
        outages.push((stopped, restart, up));
        println!("postgres down {stopped:.2}..{restart:.2}, accepting again at {up:.2}");
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    let faults_end = load.now();
    let load = run.finish(Duration::from_secs(40)).await;
    let samples = health.finish().await;
    let calls = load.calls();
    let verdict = check(&load, &db).await;

    let mut recoveries = Vec::new();
    let mut notes = Vec::new();
    for (i, (stopped, restart, up)) in outages.iter().copied().enumerate() {
        let (kinds, slowest) = failures(&calls, stopped + 0.2, restart, None);
        let send_back = first_success_after(&calls, "phone_send", up, None).map(|t| t - up);
        let poll_back = first_success_after(&calls, "phone_inbox", up, None).map(|t| t - up);
        let healthy = all_healthy_after(&samples, bases.len(), up).map(|t| t - up);
        let unhealthy = (0..bases.len())
            .map(|r| first_health(&samples, r, stopped, |s| s != Some(200)).map(|t| t - stopped))
            .collect::<Option<Vec<_>>>()
            .map(|v| v.into_iter().fold(0.0, f64::max));
        let successes_during = calls
            .iter()
            .filter(|c| {
                c.ok() && c.tool == "phone_send" && c.start > stopped + 0.2 && c.end < restart
            })
            .count();
        println!(
            "outage {}: failures {} (slowest {slowest:.2} s); sends ok during {successes_during}; \
             /health 503 on all after {unhealthy:?}; back: send {send_back:?}, poll {poll_back:?}, all /health 200 {healthy:?}",
            i + 1,
            kinds_text(&kinds)
        );
        recoveries.push(format!(
            "{:.0} s outage: sends ok {} s, all /health 200 {} s after Postgres accepted again",
            restart - stopped,
            send_back.map_or("never".into(), |t| format!("{t:.2}")),
            healthy.map_or("never".into(), |t| format!("{t:.2}"))
        ));
        notes.push(format!(
            "outage {}: calls failed with {} in ≤ {slowest:.2} s; /health 503 on every replica within {}",
            i + 1,
            kinds_text(&kinds),
            unhealthy.map_or("never".into(), |t| format!("{t:.1} s"))
        ));
        finding(
            slowest < 3.0,
            format!("PostgreSQL down: the slowest failing call took {slowest:.2} s (not fast)"),
        );
        finding(
            send_back.is_some_and(|t| t < 10.0),
            format!("PostgreSQL back: sends recovered after {send_back:?}"),
        );
        finding(
            healthy.is_some_and(|t| t < 10.0),
            format!("PostgreSQL back: /health on every replica 200 after {healthy:?}"),
        );
        finding(
            unhealthy.is_some(),
            "PostgreSQL down: some replica never reported 503".into(),
        );
    }
    let said = workload::examples(&calls, "busy", 2);
    println!("what clients read during the outages: {said:?}");
    notes.push(format!(
        "clients read: {}",
        said.first().cloned().unwrap_or_default()
    ));
    workload::write_row(&Row::from_verdict(
        &format!(
            "PostgreSQL stopped in immediate mode (crash), restarted; {} outages",
            outages.len()
        ),
        config.describe(3, faults_end, verdict.acknowledged),
        &verdict,
        recoveries.join("; "),
        notes.join("; "),
    ));
    assert_guarantees(
        "postgres crash",
        &load,
        &verdict,
        &replicas.iter().collect::<Vec<_>>(),
    );
    for r in &mut replicas {
        r.stop(Duration::from_secs(5)).await;
    }
}

// ---------------------------------------------------------------------------
// 3. The network between one replica and PostgreSQL cut and restored.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn network_to_postgres_cut_and_restored() {
    // A refused link is noticed at once; a silent one only by timeouts, so
    // it stays cut longer than replica A's request timeout (4 s here, 30 s
    // by default) to show what happens after that timeout too.
    let (refuse_for, blackhole_for) = (
        secs("PHONE_CHAOS_CUT_SECS", 5.0),
        secs("PHONE_CHAOS_BLACKHOLE_SECS", 10.0),
    );
    let request_timeout_a = 4.0;
    let db = harness::fresh_database("netcut").await;
    let proxy = Proxy::start(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        harness::pg_port(),
    )))
    .await;
    let via_proxy = harness::db_url(&harness::db_name(&db), proxy.port);
    // Settings a server without them ignores: a statement timeout below the
    // request timeout.
    let mut a = Replica::new(
        "net-a-via-proxy",
        &via_proxy,
        &[
            ("PHONE_REQUEST_TIMEOUT_MS", "4000"),
            ("PHONE_STATEMENT_TIMEOUT_MS", "1000"),
            // The workload waits at most 1 s; the longest wait must fit.
            ("PHONE_MAX_WAIT_SECS", "1"),
        ],
    );
    let mut b = Replica::new("net-b-direct", &db, &[]);
    a.start().await;
    b.start().await;
    let bases = vec![a.base(), b.base()];
    let config = LoadConfig {
        senders: 4,
        recipients: 4,
        pollers_per_recipient: 2,
        ..LoadConfig::default()
    };
    let run = Load::start(bases.clone(), config.clone(), "n").await;
    let load = run.load.clone();
    let health = HealthLog::start(load.t0, &bases, Duration::from_millis(200));

    // A probe that calls replica A only and never fails over: what a client
    // pinned to A sees. One call every 250 ms, each on its own task, so a
    // call that hangs does not hide the ones after it.
    let probe_calls: Arc<Mutex<Vec<workload::CallRecord>>> = Arc::default();
    let probe_stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let (calls, stop, base, t0) = (probe_calls.clone(), probe_stop.clone(), a.base(), load.t0);
        tokio::spawn(async move {
            let mcp = Mcp::new(Duration::from_secs(40));
            let mut in_flight = Vec::new();
            for _ in 0..1_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let (mcp, calls, base) = (mcp.clone(), calls.clone(), base.clone());
                in_flight.push(tokio::spawn(async move {
                    let start = t0.elapsed().as_secs_f64();
                    let (out, _) = mcp
                        .call(&base, "phone_search", json!({"query": "chaos", "limit": 1}))
                        .await;
                    calls.lock().unwrap().push(workload::CallRecord {
                        start,
                        end: t0.elapsed().as_secs_f64(),
                        replica: 0,
                        tool: "probe",
                        agent: String::new(),
                        kind: out.kind(),
                        detail: out.detail(),
                    });
                }));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            for call in in_flight {
                let _ = call.await;
            }
        })
    };

    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut phases = Vec::new();
    let mut listener_lost_after = None;
    for (link, cut) in [(Link::Refuse, refuse_for), (Link::Blackhole, blackhole_for)] {
        let t_cut = load.now();
        proxy.set(link);
        // A silent path: how soon does A notice its LISTEN connection is
        // dead (heartbeat), so that its waiters re-check on their own?
        let watch = (link == Link::Blackhole).then(|| {
            let (base, started) = (a.base(), Instant::now());
            tokio::spawn(async move {
                for _ in 0..200 {
                    if harness::listening(&base).await == Some(false) {
                        return Some(started.elapsed().as_secs_f64());
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None
            })
        });
        tokio::time::sleep(Duration::from_secs_f64(cut)).await;
        if let Some(watch) = watch {
            watch.abort();
            listener_lost_after = watch.await.ok().flatten();
        }
        let t_restore = load.now();
        proxy.set(Link::Up);
        println!("link {link:?} cut {t_cut:.2}..{t_restore:.2}");
        phases.push((link, cut, t_cut, t_restore));
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    println!("blackhole: A's LISTEN connection noticed dead after {listener_lost_after:?} s");
    // A guarantee, not a finding: without the heartbeat the kernel's
    // keepalive (10 s idle + 3 × 2 s) notices only after the 10 s cut.
    assert!(
        listener_lost_after.is_some_and(|t| t < 8.0),
        "network cut (blackhole): A's LISTEN connection was noticed dead after {listener_lost_after:?} s \
         (heartbeat every 3 s, 2 s to answer)"
    );
    let listener_back = a_listening_again(&a.base()).await;
    assert!(
        listener_back,
        "A's LISTEN connection did not come back after the link was restored"
    );
    let faults_end = load.now();
    probe_stop.store(true, Ordering::SeqCst);
    let load = run.finish(Duration::from_secs(60)).await;
    probe.await.unwrap();
    let samples = health.finish().await;
    let probes = probe_calls.lock().unwrap().clone();
    let calls = load.calls();
    let verdict = check(&load, &db).await;

    let mut recoveries = Vec::new();
    let mut notes = Vec::new();
    for (link, cut, t_cut, t_restore) in phases {
        let during: Vec<&workload::CallRecord> = probes
            .iter()
            .filter(|c| c.start >= t_cut + 0.3 && c.start < t_restore)
            .collect();
        let (kinds, slowest_failure) = failures(&probes, t_cut + 0.3, t_restore, None);
        let slowest_any = during.iter().map(|c| c.latency()).fold(0.0, f64::max);
        let ok_during = during.iter().filter(|c| c.ok()).count();
        // Waited more than 3 s: not what "fail fast" means.
        let hung = during.iter().filter(|c| c.latency() > 3.0).count();
        let a_503 = first_health(&samples, 0, t_cut, |s| s != Some(200)).map(|t| t - t_cut);
        let b_bad = samples
            .iter()
            .filter(|(at, r, s)| *r == 1 && *at >= t_cut && *at < t_restore && *s != Some(200))
            .count();
        let a_back =
            first_health(&samples, 0, t_restore, |s| s == Some(200)).map(|t| t - t_restore);
        let probe_back =
            first_success_after(&probes, "probe", t_restore, None).map(|t| t - t_restore);
        let send_via_a_back =
            first_success_after(&calls, "phone_send", t_restore, Some(0)).map(|t| t - t_restore);
        println!(
            "{link:?}: probe calls on A during the cut: {} ({} ok), failures {} \
             (slowest failure {slowest_failure:.2} s, slowest call {slowest_any:.2} s, {hung} waited > 3 s); /health A non-200 after {a_503:?}, \
             B non-200 samples {b_bad}; after restore: A /health 200 {a_back:?}, probe ok {probe_back:?}, send via A {send_via_a_back:?}",
            during.len(),
            ok_during,
            kinds_text(&kinds)
        );
        let name = match link {
            Link::Refuse => "refused/reset",
            Link::Blackhole => "blackhole",
            Link::Up => "up",
        };
        recoveries.push(format!(
            "{name}: A answers {} s and /health 200 {} s after restore",
            probe_back.map_or("never".into(), |t| format!("{t:.2}")),
            a_back.map_or("never".into(), |t| format!("{t:.2}"))
        ));
        notes.push(format!(
            "{name} {cut:.0} s: calls pinned to A failed with {} (slowest call {slowest_any:.2} s, {hung} waited > 3 s); \
             A /health 503 after {}; B unaffected ({b_bad} bad samples)",
            kinds_text(&kinds),
            a_503.map_or("never".into(), |t| format!("{t:.1} s"))
        ));
        finding(
            slowest_any < 3.0 && hung == 0,
            format!(
                "network cut ({name}): calls to the cut-off replica did not fail fast: slowest {slowest_any:.2} s, \
                 {hung} of {} waited more than 3 s (failures: {})",
                during.len(),
                kinds_text(&kinds)
            ),
        );
        finding(
            a_503.is_some_and(|t| t < 3.0),
            format!("network cut ({name}): /health on A went non-200 after {a_503:?}"),
        );
        finding(
            a_back.is_some_and(|t| t < 10.0),
            format!("network restored ({name}): /health on A 200 after {a_back:?}"),
        );
        finding(
            probe_back.is_some_and(|t| t < 10.0),
            format!("network restored ({name}): A served again after {probe_back:?}"),
        );
        assert_eq!(
            b_bad, 0,
            "the replica with a healthy link must stay healthy"
        );
    }
    let gap = longest_gap(&calls, "phone_send", 1.0, faults_end);
    workload::write_row(&Row::from_verdict(
        &format!(
            "network replica A↔PostgreSQL cut via a TCP proxy: connections refused for {refuse_for:.0} s, then a silent blackhole \
             for {blackhole_for:.0} s (A's request timeout {request_timeout_a:.0} s); clients fail over to B"
        ),
        config.describe(2, faults_end, verdict.acknowledged),
        &verdict,
        format!(
            "{}; longest stretch with no acknowledged send {gap:.2} s; blackhole: LISTEN noticed dead after {}",
            recoveries.join("; "),
            listener_lost_after.map_or("never".into(), |t| format!("{t:.1} s"))
        ),
        notes.join("; "),
    ));
    assert_guarantees("network cut", &load, &verdict, &[&a, &b]);
    a.stop(Duration::from_secs(5)).await;
    b.stop(Duration::from_secs(5)).await;
}

/// Waits (up to 15 s) until the replica's LISTEN connection is up again.
async fn a_listening_again(base: &str) -> bool {
    for _ in 0..75 {
        if harness::listening(base).await == Some(true) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

// ---------------------------------------------------------------------------
// 4. Pool exhaustion and slow queries (a lock held in another session).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn pool_exhaustion_and_a_lock_held_elsewhere() {
    let hold = secs("PHONE_CHAOS_LOCK_SECS", 6.0);
    let (pool_size, pool_timeout_ms, statement_timeout_ms) = (4usize, 500u64, 1000u64);
    let db = harness::fresh_database("pool").await;
    let mut r = Replica::new(
        "pool-r0",
        &db,
        &[
            ("PHONE_POOL_SIZE", &pool_size.to_string()),
            ("PHONE_POOL_TIMEOUT_MS", &pool_timeout_ms.to_string()),
            // Ignored by a server without a statement timeout.
            (
                "PHONE_STATEMENT_TIMEOUT_MS",
                &statement_timeout_ms.to_string(),
            ),
        ],
    );
    r.start().await;
    let bases = vec![r.base()];
    let config = LoadConfig {
        senders: 16,
        recipients: 2,
        pollers_per_recipient: 2,
        send_interval: Duration::from_millis(10),
        client_timeout: Duration::from_secs(40),
        ..LoadConfig::default()
    };
    let run = Load::start(bases.clone(), config.clone(), "q").await;
    let load = run.load.clone();
    let health = HealthLog::start(load.t0, &bases, Duration::from_millis(250));

    tokio::time::sleep(Duration::from_secs(3)).await;
    // Another session holds a lock every send and poll needs.
    let locker = harness::connect(&db).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("take the lock");
    let t_lock = load.now();
    let watcher = harness::connect(&db).await;
    let mut max_backends = 0i64;
    let until = Instant::now() + Duration::from_secs_f64(hold);
    while Instant::now() < until {
        let n: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'phone' AND datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        max_backends = max_backends.max(n);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    locker
        .batch_execute("COMMIT")
        .await
        .expect("release the lock");
    let t_release = load.now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let faults_end = load.now();
    let load = run.finish(Duration::from_secs(40)).await;
    let samples = health.finish().await;
    let calls = load.calls();
    let verdict = check(&load, &db).await;

    // Every call in flight while the lock was held, also those that began before.
    let during: Vec<&workload::CallRecord> = calls
        .iter()
        .filter(|c| c.start < t_release && c.end > t_lock + 0.1)
        .collect();
    let busy: Vec<f64> = during
        .iter()
        .filter(|c| c.kind == "busy")
        .map(|c| c.latency())
        .collect();
    let busy_max = busy.iter().cloned().fold(0.0, f64::max);
    let slow: Vec<&&workload::CallRecord> = during.iter().filter(|c| c.latency() > 2.0).collect();
    let slowest = during.iter().map(|c| c.latency()).fold(0.0, f64::max);
    let (kinds, _) = failures(&calls, t_lock, t_release, None);
    let back = first_success_after(&calls, "phone_send", t_release, None).map(|t| t - t_release);
    let health_bad = samples
        .iter()
        .filter(|(at, _, s)| *at >= t_lock + 1.0 && *at < t_release && *s != Some(200))
        .count();
    let health_during = samples
        .iter()
        .filter(|(at, _, _)| *at >= t_lock + 1.0 && *at < t_release)
        .count();
    println!(
        "lock {t_lock:.2}..{t_release:.2}: {} calls in flight, failures {}, busy errors in ≤ {busy_max:.2} s, \
         {} calls slower than 2 s (slowest {slowest:.2} s), backends ≤ {max_backends}; /health non-200 {health_bad}/{health_during}; \
         first send after release {back:?}",
        during.len(),
        kinds_text(&kinds),
        slow.len()
    );
    let gap = longest_gap(&calls, "phone_send", 1.0, faults_end);
    workload::write_row(&Row::from_verdict(
        &format!(
            "pool of {pool_size} (wait {pool_timeout_ms} ms) exhausted: another session holds ACCESS EXCLUSIVE on messages for {hold:.0} s"
        ),
        config.describe(1, faults_end, verdict.acknowledged),
        &verdict,
        format!(
            "first send {} s after the lock went; longest stretch with no acknowledged send {gap:.2} s",
            back.map_or("never".into(), |t| format!("{t:.2}"))
        ),
        format!(
            "during the lock: {} ('busy, retry' in ≤ {busy_max:.2} s); {} calls held a connection and waited for the lock \
             (slowest {slowest:.2} s); PostgreSQL backends ≤ {max_backends} (pool {pool_size} + listener); \
             /health non-200 in {health_bad}/{health_during} samples",
            kinds_text(&kinds),
            slow.len()
        ),
    ));
    assert!(
        !busy.is_empty(),
        "an exhausted pool must answer 'busy, retry'"
    );
    // From the pool wait, or (a server with a statement timeout) from the
    // statement timeout after it: bounded either way.
    assert!(
        busy_max < (pool_timeout_ms + statement_timeout_ms) as f64 / 1000.0 + 1.0,
        "'busy, retry' must come within the pool wait plus the statement timeout: {busy_max:.2} s"
    );
    assert!(
        max_backends <= pool_size as i64 + 1,
        "more PostgreSQL connections than the pool allows: {max_backends}"
    );
    finding(
        slowest < 3.0,
        format!(
            "lock held elsewhere for {hold:.0} s: {} calls that got a pooled connection waited for the lock \
             (slowest {slowest:.2} s) — no statement_timeout/lock_timeout, so a slow query holds a request and a connection \
             until it finishes or the 30 s request timeout",
            slow.len()
        ),
    );
    assert_guarantees("pool exhaustion", &load, &verdict, &[&r]);
    r.stop(Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------
// 5. Slow clients and many idle connections.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn slow_clients_and_idle_connections() {
    let watch = Duration::from_secs_f64(secs("PHONE_CHAOS_SLOW_WATCH_SECS", 12.0));
    let request_timeout_ms = 3000u64;
    let db = harness::fresh_database("slow").await;
    let idle_timeout_secs = 4u64;
    let mut r = Replica::new(
        "slow-r0",
        &db,
        &[
            ("PHONE_REQUEST_TIMEOUT_MS", &request_timeout_ms.to_string()),
            // The workload waits at most 1 s; the longest wait must fit.
            ("PHONE_MAX_WAIT_SECS", "1"),
            // Ignored by a server without an idle/header timeout.
            ("PHONE_IDLE_TIMEOUT_SECS", &idle_timeout_secs.to_string()),
        ],
    );
    r.start().await;
    let config = LoadConfig {
        senders: 2,
        recipients: 2,
        pollers_per_recipient: 1,
        ..LoadConfig::default()
    };
    let run = Load::start(vec![r.base()], config.clone(), "w").await;
    let load = run.load.clone();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t_attack = load.now();

    let counts = slow::Counts {
        idle: 400,
        keepalive: 100,
        slow_headers: 50,
        slow_body: 50,
    };
    let attack = slow::attack(r.addr(), counts, watch).await;
    let t_attack_end = load.now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let faults_end = load.now();
    let load = run.finish(Duration::from_secs(30)).await;
    let calls = load.calls();
    let verdict = check(&load, &db).await;

    let during: Vec<&workload::CallRecord> = calls
        .iter()
        .filter(|c| c.start >= t_attack && c.start < t_attack_end)
        .collect();
    let ok_during = during.iter().filter(|c| c.ok()).count();
    let mut lat: Vec<f64> = during
        .iter()
        .filter(|c| c.tool == "phone_send")
        .map(|c| c.latency())
        .collect();
    lat.sort_by(f64::total_cmp);
    let p99 = lat
        .get(lat.len().saturating_sub(1).min(lat.len() * 99 / 100))
        .copied()
        .unwrap_or(0.0);
    println!("{}", attack.describe());
    println!(
        "load during the attack: {} calls, {ok_during} ok, send p99 {p99:.3} s",
        during.len()
    );

    // Descriptor exhaustion: the same idle connections against a replica
    // whose process may open 256 files.
    let fd = slow::exhaust_descriptors(&db, 256, 300).await;
    println!("{}", fd.describe());

    workload::write_row(&Row::from_verdict(
        &format!(
            "slow clients, watched for up to {:.0} s: {} idle, {} idle keep-alive, {} slow-header, {} slow-body connections \
             (request timeout {} s, idle timeout {idle_timeout_secs} s); then 300 idle connections against a replica \
             limited to 256 descriptors",
            watch.as_secs_f64(),
            counts.idle,
            counts.keepalive,
            counts.slow_headers,
            counts.slow_body,
            request_timeout_ms / 1000
        ),
        config.describe(1, faults_end, verdict.acknowledged),
        &verdict,
        fd.recovery_text(),
        format!(
            "{}; load during the attack: {ok_during}/{} calls ok, send p99 {p99:.3} s; {}",
            attack.summary(),
            during.len(),
            fd.summary()
        ),
    ));
    assert!(
        ok_during > 0 && ok_during == during.len(),
        "the server must keep serving others during the attack"
    );
    assert_eq!(
        attack.slow_body.timed_out,
        counts.slow_body,
        "every slow body must get a 408: {}",
        attack.describe()
    );
    assert!(
        attack.slow_body.slowest_close < request_timeout_ms as f64 / 1000.0 + 2.0,
        "slow bodies must be cut at the request timeout: {}",
        attack.describe()
    );
    finding(
        attack.slow_headers.closed == counts.slow_headers,
        format!(
            "slow headers: {} of {} connections that never finish their headers were still open after {:.0} s \
             (no header read timeout)",
            counts.slow_headers - attack.slow_headers.closed,
            counts.slow_headers,
            watch.as_secs_f64()
        ),
    );
    finding(
        attack.idle.closed == counts.idle,
        format!(
            "idle connections: {} of {} connections that sent nothing were still open after {:.0} s (no idle timeout)",
            counts.idle - attack.idle.closed,
            counts.idle,
            watch.as_secs_f64()
        ),
    );
    finding(
        attack.keepalive.closed == counts.keepalive,
        format!(
            "idle keep-alive: {} of {} connections idle after one request were still open after {:.0} s",
            counts.keepalive - attack.keepalive.closed,
            counts.keepalive,
            watch.as_secs_f64()
        ),
    );
    finding(
        fd.served_during,
        format!("descriptor exhaustion: {}", fd.summary()),
    );
    assert!(
        fd.served_after,
        "the replica must serve again once the idle connections go: {}",
        fd.summary()
    );
    assert_guarantees("slow clients", &load, &verdict, &[&r]);
    r.stop(Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------
// 6. Callers that vanish at random points of their requests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn callers_vanish() {
    vanish::callers_vanish().await;
}

// ---------------------------------------------------------------------------
// 7. A replica killed while it delivers webhooks.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn replica_killed_mid_webhook_delivery() {
    webhooks::replica_killed_mid_delivery().await;
}

// ---------------------------------------------------------------------------
// 8. The database fails over (pg_auto_failover pair; tests/chaos/failover.rs).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn database_failover_under_load() {
    failover::failover_under_load().await;
}

// ---------------------------------------------------------------------------
// The abuse suite (tests/chaos/abuse.rs): one outsider, default settings.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn abuse_stranger_floods_an_inbox() {
    abuse::stranger_floods_an_inbox().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn abuse_neighbour_guesses_tokens() {
    abuse::neighbour_guesses_tokens().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn abuse_hanging_webhook_under_a_trickle() {
    abuse::hanging_webhook_under_a_trickle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn abuse_a_million_message_mailbox_in_the_console() {
    abuse::a_million_message_mailbox_in_the_console().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn abuse_a_name_server_that_never_answers() {
    abuse::a_name_server_that_never_answers().await;
}

/// A quick sanity check of the harness itself (also `#[ignore]`d): one
/// replica, one send, one poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: run with `make chaos`"]
async fn harness_smoke() {
    let db = harness::fresh_database("smoke").await;
    let mut r = Replica::new("smoke-r0", &db, &[]);
    r.start().await;
    let mcp = Mcp::new(Duration::from_secs(5));
    let bases = vec![r.base()];
    let a = client::register(&mcp, &bases, "smoke-a").await;
    let (out, _) = mcp
        .call(&r.base(), "phone_send", json!({"name": "smoke-a", "token": a, "to": "smoke-a", "body": "hi", "idempotency_key": "k1"}))
        .await;
    assert!(out.is_ok(), "{out:?}");
    let (out, _) = mcp
        .call(
            &r.base(),
            "phone_inbox",
            json!({"name": "smoke-a", "token": a}),
        )
        .await;
    let Outcome::Ok(v) = out else {
        panic!("{out:?}")
    };
    assert_eq!(v["messages"][0]["body"], "hi");
    r.stop(Duration::from_secs(5)).await;
}
