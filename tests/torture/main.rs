//! The torture test: random schedules of a fleet of limiter instances, an operator, cancelled
//! futures and injected faults, against a private `redis-server` (and `MemoryStore`), each run
//! checked by oracles that restate the docs' promises.
//!
//! - `cargo test --test torture -- --nocapture`: schedules from a printed base seed for
//!   `TORTURE_SECS` seconds (45 by default), then stops: the schedule running at the budget's
//!   end is cut there (its oracles judge the prefix that ran), and shrinking a failure gets
//!   [`SHRINK_SECS`] at most, so the default run, Redis's startup and a failure's report
//!   included, ends well under 80 s; `TORTURE_BASE=<n>` repeats a run's seed sequence.
//! - `TORTURE_SEED=<seed>`: replays one schedule.
//! - `TORTURE_FAMILY=<rate|settle|concurrency|outbound|batching>` runs one family alone,
//!   `TORTURE_BACKEND=<redis|memory|cluster>` one backend, `TORTURE_VERBOSE=1` prints a line
//!   per schedule, one per violation and a violating schedule's operations. The 3-master Cluster starts the first time a schedule draws it.
//! - `TORTURE_KEEP_GOING=1`: does not stop at the first violation; prints each distinct oracle
//!   that fired with its first seed and the seconds it took to find.
//!
//! It prints, last, `torture: schedules N, operations N, faults N, cancellations N,
//! violations N`, and fails when a violation was found, after printing each with its oracle,
//! seed, configuration and shrunk schedule.
//!
//! Modules: `generator` (seed to configuration and operations), `fleet` (builds the instances
//! and runs the operations, recording every decision), `faults` (what can happen to Redis),
//! `oracles` (one per promise) and `shrink` (the shortest failing prefix).

#[path = "../support/mod.rs"]
mod support;

mod batching;
mod faults;
mod fleet;
mod generator;
mod health;
mod oracles;
mod shrink;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet::Fixture;

/// The loop's default budget: with the cut schedule's tail (its background work, the outbound
/// recovery check, at most ~20 s) and [`SHRINK_SECS`], a default run stays under 80 s.
const DEFAULT_SECS: u64 = 45;
/// The most time shrinking one failure may take (its reruns are cut at it as well).
const SHRINK_SECS: u64 = 10;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Between schedules: the server (and the cluster, once started) is up and empty (a schedule
/// may have killed it).
async fn clean(fixture: &Fixture) {
    let fixture = fixture.clone();
    tokio::task::spawn_blocking(move || {
        let mut redis = fixture.redis.lock().unwrap();
        if !redis.is_running() {
            redis.restart();
        }
        // A `DEBUG SLEEP` may still run: FLUSHALL waits for it.
        redis.flushall();
        drop(redis);
        if fixture.has_cluster() {
            // A migration still running holds the lock until it is over.
            let mut cluster = fixture.cluster.lock().unwrap();
            let cluster = cluster.as_mut().expect("the cluster runs");
            for node in 0..cluster.nodes().len() {
                if !cluster.node_mut(node).is_running() {
                    cluster.restart_node(node);
                }
            }
            cluster.flushall();
        }
    })
    .await
    .expect("clean");
}

#[test]
fn torture() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(torture_run());
}

async fn torture_run() {
    // The budget counts from here: Redis's startup is inside it.
    let started = Instant::now();
    // The cluster starts the first time a schedule draws it.
    let redis = Fixture::new(
        tokio::task::spawn_blocking(support::RedisServer::start)
            .await
            .expect("redis"),
    );
    let replay = env_u64("TORTURE_SEED");
    let keep_going = std::env::var("TORTURE_KEEP_GOING").is_ok_and(|v| v != "0" && !v.is_empty());
    // A family (`rate`, `settle`, `concurrency`, `outbound`) to run alone, and a line per schedule.
    let family = std::env::var("TORTURE_FAMILY").ok();
    // A backend (`redis`, `memory`, `cluster`) to run alone.
    let backend = std::env::var("TORTURE_BACKEND").ok();
    let verbose = std::env::var("TORTURE_VERBOSE").is_ok();
    let budget = Duration::from_secs(env_u64("TORTURE_SECS").unwrap_or(DEFAULT_SECS));
    let base = env_u64("TORTURE_BASE").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 1_000_000
            * 1_000
    });
    match replay {
        Some(seed) => println!("torture: replaying seed {seed}"),
        None => println!(
            "torture: base seed {base} (TORTURE_BASE={base} repeats this run), budget {budget:?}"
        ),
    }
    let deadline = started + budget;
    let (mut schedules, mut operations, mut faults, mut cancellations) = (0u64, 0, 0, 0);
    let mut violations = 0u64;
    // Oracle and family -> (first seed, seconds to find, detail).
    let mut found: BTreeMap<String, (u64, f64, String)> = BTreeMap::new();
    let mut reports = Vec::new();
    for n in 0.. {
        let seed = match replay {
            Some(seed) if n == 0 => seed,
            Some(_) => break,
            None if Instant::now() >= deadline => break,
            None => base + n,
        };
        let schedule = generator::schedule(seed);
        if family
            .as_ref()
            .is_some_and(|f| *f != format!("{:?}", schedule.config.family).to_lowercase())
            || backend
                .as_ref()
                .is_some_and(|b| *b != format!("{:?}", schedule.config.backend).to_lowercase())
        {
            continue;
        }
        clean(&redis).await;
        let run = fleet::run(&schedule, &schedule.ops, &redis, deadline).await;
        schedules += 1;
        operations += run.operations;
        faults += run.faults.len() as u64;
        cancellations += run.cancellations;
        let found_here = oracles::check(&schedule, &run);
        if verbose {
            let allowed = run
                .events
                .iter()
                .filter(|e| e.outcome == fleet::Outcome::Allowed)
                .count();
            let by_policy = run
                .events
                .iter()
                .filter(|e| e.outcome == fleet::Outcome::Policy { allowed: true })
                .count();
            let timed_by_policy = run
                .timed
                .iter()
                .filter(|t| matches!(t.outcome, fleet::Outcome::Policy { .. }))
                .count();
            println!(
                "torture: seed {seed} {:?}: {} events, {allowed} allowed, {by_policy} allowed by the policy, {} overrides, {} decisions timed ({timed_by_policy} answered by the policy), {} violations",
                schedule.config,
                run.events.len(),
                run.overrides.len(),
                run.timed.len(),
                found_here.len()
            );
        }
        if found_here.is_empty() {
            continue;
        }
        violations += found_here.len() as u64;
        if verbose {
            for v in &found_here {
                println!("torture: seed {seed} violation: {}: {}", v.oracle, v.detail);
            }
            print!("{schedule}");
        }
        if keep_going {
            for v in &found_here {
                let name = match v.class.as_str() {
                    "" => format!("{} ({:?})", v.oracle, schedule.config.family),
                    class => format!("{} ({:?}, {class})", v.oracle, schedule.config.family),
                };
                let secs = started.elapsed().as_secs_f64();
                found
                    .entry(name)
                    .or_insert_with(|| (seed, secs, v.detail.clone()));
            }
            continue;
        }
        let first = &found_here[0];
        let shrink_deadline = Instant::now() + Duration::from_secs(SHRINK_SECS);
        let shrunk = shrink::shrink(&schedule, first.oracle, &redis, shrink_deadline).await;
        let mut distinct: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for v in &found_here {
            *distinct.entry((v.oracle, v.detail.as_str())).or_default() += 1;
        }
        for ((oracle, detail), times) in distinct {
            reports.push(format!(
                "violation: {oracle} (seed {seed}, {times}x): {detail}"
            ));
        }
        reports.push(format!(
            "shortest failing prefix for {} ({} of {} operations; TORTURE_SEED={seed} replays the whole):\n{shrunk}",
            first.oracle,
            shrunk.ops.len(),
            schedule.ops.len()
        ));
        break;
    }
    for report in &reports {
        println!("{report}");
    }
    if keep_going {
        println!("torture: findings (oracle (family), first seed, seconds to find, detail)");
        for (name, (seed, secs, detail)) in &found {
            println!("  {name}: seed {seed}, {secs:.1} s: {detail}");
        }
    }
    println!(
        "torture: schedules {schedules}, operations {operations}, faults {faults}, cancellations {cancellations}, violations {violations}"
    );
    assert_eq!(violations, 0, "the torture test found violations (above)");
}
