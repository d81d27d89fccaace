//! The lease scenario (`LimiterBuilder::leases`): one hot key, 3 limiter instances (each on a
//! store of its own), concurrency 64 each, with and without leases, interleaved round by
//! round.
//!
//! - admitting (token bucket, 10^9 a second): decisions a second both ways, their ratio (the
//!   median of the per-round ratios, `lease speedup`), and the leased side's Redis script calls
//!   per decision from `INFO commandstats` (`EVALSHA` + `EVAL`, renewals and give-backs alike);
//! - binding (fixed window, [`BINDING`] a second): each round runs inside one window on a key
//!   of its own and counts what the 3 instances admitted: never above the quota, and at most
//!   the documented stranding bound (instances × k, k at most a tenth of the capacity) below
//!   when the window was spent (a check was denied) and every store call answered in time, as
//!   docs/leases.md promises. Answers are counted by the system clock's window they came in; a
//!   window below the bound that a busy machine left unspent, or with an answer after its end
//!   or a store error, is excused with a note on stderr that says which.
//!
//! `cargo bench --bench throughput -- --quick lease` runs only this scenario.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redlimit::algorithm::Algorithm;
use redlimit::limiter::Leases;
use redlimit::store::RedisStore;
use redlimit::{Limiter, Quota, Verdict};

use crate::failure::{ensure, failure, Checked};
use crate::scenarios::median;
use crate::server::Admin;
use crate::settings::{Settings, TIMEOUT};

/// Instances, and tasks per instance.
const INSTANCES: usize = 3;
const CONCURRENCY: usize = 64;
/// The lease interval.
const INTERVAL: Duration = Duration::from_millis(50);
/// The binding quota: units per one-second fixed window.
const BINDING: u64 = 20_000;

/// One instance: a limiter on a store of its own.
fn instance(url: &str, algorithm: Algorithm, leases: bool) -> Limiter {
    let store = RedisStore::builder(url)
        .timeout(TIMEOUT)
        .build()
        .expect("a valid Redis URL");
    let builder = Limiter::builder(store)
        .algorithm(algorithm)
        .prefix(if leases {
            "redlimit-bench-leased"
        } else {
            "redlimit-bench-plain"
        });
    let builder = if leases {
        builder.leases(Leases::new(INTERVAL))
    } else {
        builder
    };
    builder.build().expect("a valid limiter")
}

/// Checks `key` from `CONCURRENCY` tasks per instance until `until`: (decisions, admitted).
async fn drive(
    instances: &[Limiter],
    key: &str,
    quota: Quota,
    until: Instant,
) -> Checked<(u64, u64)> {
    let decisions = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for limiter in instances {
        for _ in 0..CONCURRENCY {
            let (limiter, key) = (limiter.clone(), key.to_owned());
            let (decisions, admitted) = (decisions.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                let (mut n, mut ok) = (0, 0);
                while Instant::now() < until {
                    ok += u64::from(limiter.check(&key, &quota).await.is_allowed());
                    n += 1;
                    // A check from a lease never waits: the other tasks get their turn, as a
                    // server's I/O would give it (both sides alike).
                    tokio::task::yield_now().await;
                }
                decisions.fetch_add(n, Ordering::Relaxed);
                admitted.fetch_add(ok, Ordering::Relaxed);
            }));
        }
    }
    for task in tasks {
        task.await
            .map_err(|e| failure!("a lease bench task failed: {e}"))?;
    }
    Ok((
        decisions.load(Ordering::Relaxed),
        admitted.load(Ordering::Relaxed),
    ))
}

/// What the instances did in one fixed window.
#[derive(Debug, Default)]
struct Window {
    /// Admissions and denials whose answer came before the window's end.
    admitted: u64,
    denied: u64,
    /// Checks whose answer came after the window's end: Redis may have counted them in either
    /// window, so they are not counted in this one.
    late: u64,
    /// Checks the failure policy answered (a store error): admitted without Redis, so not
    /// counted against the quota.
    failed: u64,
}

/// Checks `key` from `CONCURRENCY` tasks per instance, starting new checks until `deadline`,
/// and sorts the answers by whether they came before `end` (the window's end on the system
/// clock, which Redis on this machine shares). A deadline from the window's end (not from when
/// the drive began, which a busy machine may delay) keeps every check in the window; a check
/// slowed past its end is counted as late rather than in either window.
async fn drive_window(
    instances: &[Limiter],
    key: &str,
    quota: Quota,
    deadline: SystemTime,
    end: SystemTime,
) -> Checked<Window> {
    let mut tasks = Vec::new();
    for limiter in instances {
        for _ in 0..CONCURRENCY {
            let (limiter, key) = (limiter.clone(), key.to_owned());
            tasks.push(tokio::spawn(async move {
                let mut window = Window::default();
                while SystemTime::now() < deadline {
                    let verdict = limiter.check(&key, &quota).await;
                    match verdict {
                        _ if SystemTime::now() >= end => window.late += 1,
                        Verdict::Decided(decision) if decision.allowed => window.admitted += 1,
                        Verdict::Decided(_) => window.denied += 1,
                        Verdict::FailedOpen | Verdict::FailedClosed { .. } => window.failed += 1,
                    }
                    tokio::task::yield_now().await;
                }
                window
            }));
        }
    }
    let mut all = Window::default();
    for task in tasks {
        let window = task
            .await
            .map_err(|e| failure!("a lease bench task failed: {e}"))?;
        all.admitted += window.admitted;
        all.denied += window.denied;
        all.late += window.late;
        all.failed += window.failed;
    }
    Ok(all)
}

/// Sleeps until just after the next whole second of the system clock (Redis on this machine
/// shares it), the start of a one-second fixed window, and gives that window's end.
async fn next_window() -> SystemTime {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let start = UNIX_EPOCH + Duration::from_secs(now.as_secs() + 1);
    let into = Duration::from_nanos(u64::from(now.subsec_nanos()));
    let wait = Duration::from_secs(1) - into + Duration::from_millis(5);
    tokio::time::sleep(wait).await;
    start + Duration::from_secs(1)
}

/// Runs the scenario and prints its table and lines.
pub(super) async fn lease_bench(settings: &Settings, admin: &Admin) -> Checked {
    let admitting = Quota::per_second(1_000_000_000).expect("a valid quota");
    let plain: Vec<Limiter> = (0..INSTANCES)
        .map(|_| instance(&admin.url, Algorithm::TokenBucket, false))
        .collect();
    let leased: Vec<Limiter> = (0..INSTANCES)
        .map(|_| instance(&admin.url, Algorithm::TokenBucket, true))
        .collect();
    for side in [&plain, &leased] {
        drive(
            side,
            "warm-up",
            admitting,
            Instant::now() + settings.warm_up,
        )
        .await?;
    }
    let (mut ratios, mut plain_rates, mut leased_rates) = (Vec::new(), Vec::new(), Vec::new());
    let (mut calls, mut leased_decisions, mut plain_calls, mut plain_decisions) = (0, 0, 0, 0);
    for round in 0..settings.rounds {
        let mut rates = [0.0; 2];
        for i in 0..2 {
            // Alternate which side runs first.
            let side = (i + round) % 2;
            let instances = if side == 0 { &plain } else { &leased };
            admin.reset_stats().await;
            let start = Instant::now();
            let (decisions, admitted) =
                drive(instances, "hot", admitting, start + settings.run).await?;
            let elapsed = start.elapsed().as_secs_f64();
            ensure!(
                admitted == decisions,
                "lease scenario: the admitting quota admitted {admitted} of {decisions} checks"
            );
            let script = if admin.stats {
                admin.script_calls().await
            } else {
                0
            };
            if side == 0 {
                plain_calls += script;
                plain_decisions += decisions;
            } else {
                calls += script;
                leased_decisions += decisions;
            }
            rates[side] = decisions as f64 / elapsed;
        }
        plain_rates.push(rates[0]);
        leased_rates.push(rates[1]);
        ratios.push(rates[1] / rates[0]);
    }
    for limiter in &leased {
        limiter.release_leases().await;
    }

    // Binding: a fixed window each round, on a key of its own.
    let binding = Quota::per_second(BINDING).expect("a valid quota");
    let binders: Vec<Limiter> = (0..INSTANCES)
        .map(|_| instance(&admin.url, Algorithm::FixedWindow, true))
        .collect();
    // k is at most a tenth of the capacity (and the default max_units).
    let bound = INSTANCES as u64 * (BINDING / 10).min(redlimit::limiter::DEFAULT_MAX_LEASE_UNITS);
    let windows = settings.deny_rounds.max(3);
    let mut per_window = Vec::new();
    // The windows below the lower bound where it does not apply, and why.
    let mut excused = Vec::new();
    let store_errors = || binders.iter().map(|l| l.stats().store_errors).sum::<u64>();
    for window in 0..windows {
        let end = next_window().await;
        let key = format!("binding-{window}-{}", std::process::id());
        let errors_before = store_errors();
        let deadline = end - Duration::from_millis(100);
        let seen = drive_window(&binders, &key, binding, deadline, end).await?;
        // Renewals that failed count here too, not only checks the failure policy answered.
        let errors = store_errors() - errors_before;
        per_window.push(seen.admitted);
        // A window not spent, an answer after its end, a store error: each can only lower the
        // count, so each excuses a count below the bound, never one above the quota.
        let spent_in_time = seen.denied > 0 && seen.late == 0 && seen.failed == 0 && errors == 0;
        if seen.admitted + bound < BINDING && !spent_in_time {
            excused.push((window, seen, errors));
        }
    }
    let stranded: u64 = binders.iter().map(|l| l.lease_stats().stranded).sum();

    let has_stats = admin.stats;
    println!();
    println!(
        "lease scenario: token bucket, one hot key, {INSTANCES} instances (a store each) x \
         concurrency {CONCURRENCY}, lease interval {INTERVAL:?}, {} interleaved rounds",
        settings.rounds
    );
    println!(
        "{:<16} {:>16} {:>16} {:>22}",
        "side", "decisions/s", "(median of N)", "redis calls/decision"
    );
    let per = |c: u64, d: u64| {
        if has_stats && d > 0 {
            format!("{:.4}", c as f64 / d as f64)
        } else {
            "n/a".to_owned()
        }
    };
    println!(
        "{:<16} {:>16.0} {:>16} {:>22}",
        "without leases",
        median(plain_rates),
        settings.rounds,
        per(plain_calls, plain_decisions)
    );
    println!(
        "{:<16} {:>16.0} {:>16} {:>22}",
        "with leases",
        median(leased_rates),
        settings.rounds,
        per(calls, leased_decisions)
    );
    println!(
        "lease binding: fixed window {BINDING}/s, {INSTANCES} instances, admitted per window {:?} \
         (never above {BINDING}; stranding bound {bound}, so at least {}), stranded units {stranded}",
        per_window,
        BINDING - bound
    );
    for (window, seen, errors) in &excused {
        eprintln!(
            "lease binding window {window}: {} admitted, below {}, but {} denied, {} answered \
             after the window's end, {} by the failure policy, {errors} store errors: the lower \
             bound holds only for a window spent (a denial) with every answer before its end and \
             no store error, so only the upper bound is checked",
            seen.admitted,
            BINDING - bound,
            seen.denied,
            seen.late,
            seen.failed
        );
    }
    let excused_below = |window: usize| excused.iter().any(|(w, _, _)| *w == window);
    let exact = per_window
        .iter()
        .enumerate()
        .all(|(window, &a)| a <= BINDING && (a + bound >= BINDING || excused_below(window)));
    ensure!(
        exact,
        "lease binding: a binding quota over-admitted or stranded more than the bound: \
         {per_window:?}"
    );
    println!("lease speedup: {:.2}", median(ratios));
    if has_stats {
        println!(
            "lease redis calls per decision: {:.4}",
            calls as f64 / leased_decisions.max(1) as f64
        );
    } else {
        println!("lease redis calls per decision: n/a (CONFIG RESETSTAT refused by this Redis)");
    }
    Ok(())
}

/// `cargo bench --bench throughput -- lease`: only this scenario.
pub(super) async fn only(settings: Settings) -> Checked {
    let admin = Admin::connect().await?;
    lease_bench(&settings, &admin).await
}
