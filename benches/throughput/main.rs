//! Decisions a second, latency and cost of redlimit against the floor: a raw redis-rs `EVALSHA`
//! of a reference script that does only what any limiter must (`TIME`, one `GET`, one
//! `SET key value PX ttl`).
//!
//! ```text
//! cargo bench --bench throughput                # full run (a few minutes)
//! cargo bench --bench throughput -- --quick     # under 2 minutes
//! cargo bench --bench throughput -- --quick lease   # only the lease scenario (lease.rs)
//! cargo bench --bench throughput -- --quick learning   # only the learning scenario (learning.rs)
//! cargo bench --bench throughput -- --quick batch   # only the batch scenario (batch.rs)
//! cargo bench --bench throughput -- --quick http   # only the http rounds (http_cost.rs)
//! REDIS_URL=redis://10.0.0.5:6379/ cargo bench --bench throughput -- --quick
//! ```
//!
//! Redis is a private `redis-server` this bench starts on a free loopback port, or the one at
//! `REDIS_URL` when set (keys under `redlimit-bench*`, which expire; `CONFIG RESETSTAT` is sent
//! before each run, so use a Redis of your own).
//!
//! Every scenario runs at concurrency 1, 64 and 256 (tasks, each with one operation in flight),
//! on one hot key and over 10 000 keys:
//!
//! - `raw`: redis-rs `EVALSHA` of the reference script on one multiplexed connection;
//! - `check/<algorithm>`: `Limiter::check` through a `RedisStore` (one connection);
//! - `layer`: the `RateLimitLayer` in process (`ready` + `call` on a trivial `service_fn`), and
//!   `service` the same service without the layer (what the bench itself costs);
//! - `http`, `http+layer`: the axum example's router served on 127.0.0.1:0, driven by hyper
//!   clients over keep-alive connections (one per task); at concurrency 64 (hot key and 10 000
//!   keys) the two are interleaved round by round (http_cost.rs), and the `http cost` line
//!   after the table gives what the layer adds per request (medians of the rounds);
//! - `denied/<algorithm>`: `Limiter::check` on keys whose quota is already spent;
//! - `deny-cache/<algorithm>`: a hot over-limit key makes 90 % of the traffic, the rest is spread
//!   over other keys, with and without the limiter's deny cache;
//! - `fleet <case>`: what the fleet features cost Redis, token bucket, concurrency 64, hot key, in
//!   the compared rounds: `override` (a quota set with `Limiter::set_quota`), `two tiers`
//!   (`Limiter::check_quotas` with a per-second and a per-minute quota), `suspended` (a key under
//!   `Limiter::suspend`: the denied path). A limiter that uses none of them is the
//!   `check token-bucket` row itself.
//! - `connections`: token-bucket `Limiter::check` at concurrency 256, hot key and 10 000 keys,
//!   over 1, 2 and 4 connections taken round robin per call (`RoundRobin` below: what a
//!   `connections(n)` store option would do), interleaved round by round; one summary line per
//!   shape.
//! - `batch` (batch.rs): token-bucket `Limiter::check` over 10 000 keys through a store that
//!   batches (the default `max_batch`: decisions that queue behind a call in flight go out
//!   together in one `EVALSHA`) against one with `max_batch(1)`, at concurrency 64 and 1, and
//!   the leanest peer's script (`INCR` + `PEXPIRE`, no clock) by raw `EVALSHA` at concurrency
//!   64, interleaved round by round: Redis time per decision, decisions per call, decisions a
//!   second at c = 64 and p50 at c = 1, batched over unbatched.
//!
//! Allowed runs use a quota that admits everything (10^9 a second; the sliding log 100 000 per
//! 100 ms, its burst cap); a run that saw a denial, an error or a non-200 answer fails: the bench
//! stops with `throughput bench failed: …` on stderr and exit status 1 (failure.rs). Each run
//! is warmed up first. Redis time per decision is the `usec` total of `EVALSHA` in
//! `INFO commandstats` after a `CONFIG RESETSTAT`, divided by the run's decisions: the store
//! batches decisions that queue up (at concurrency 64, one call carries many), so
//! `usec_per_call` would be per call. The table's `redis µs/dec` column and the cost lines
//! (which keep the name `usec_per_call`) give this figure; for the raw reference, one call a
//! decision, it is its `usec_per_call`. Allocations per decision come from the counting global
//! allocator below. The ratios at the end come from the compared runs interleaved round by
//! round in this process, so a noisy machine moves both sides of each ratio alike: the
//! throughput ratios are the medians of the per-round ratios; the Redis cost ratios compare each
//! side's least-disturbed round (preemption of Redis mid-script only ever adds to its time).
//! Redis CPU per decision (`/proc/<pid>/schedstat` of the private server) and this process's CPU
//! per decision are shown too: waiting for a CPU does not inflate them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::{routing::get, Router};
use bytes::Bytes;
use futures::future::BoxFuture;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use redis::aio::MultiplexedConnection;
use redlimit::key::HeaderKey;
use redlimit::store::{CheckRequest, RedisStore, Store, StoreError};
use redlimit::{
    limiter::{LimiterBuilder, LimiterStats},
    Algorithm, Decision, Limiter, Quota, Quotas, RateLimitLayer, Verdict,
};
use tower::{Layer, Service, ServiceExt};

#[path = "../support/mod.rs"]
mod support;
use support::{admitting, PrivateRedis, ServerTls};
// The TLS tests' certificates (a private CA, a server certificate for 127.0.0.1).
#[allow(dead_code)]
#[path = "../../tests/support/tls.rs"]
mod tls;

mod alloc;
// The batch scenario (`batched redis usec per decision / unbatched` and its two companions).
mod batch;
mod connections;
mod failure;
mod fleet;
mod histogram;
// The `http cost` line: `http + layer` against `http (no layer)` in interleaved rounds.
mod http_cost;
// The lease scenario (`lease speedup`, `lease redis calls per decision`).
mod lease;
// The learning scenario (`learning redis calls per upstream call`).
mod learning;
mod memory;
mod ops;
mod output;
mod runner;
mod scenarios;
mod server;
mod settings;
mod tls_overhead;

use alloc::*;
use connections::*;
use failure::*;
use histogram::*;
use http_cost::*;
use ops::*;
use output::*;
use runner::*;
use scenarios::*;
use server::*;
use settings::*;
use tls_overhead::*;

fn main() -> std::process::ExitCode {
    let settings = Settings::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let only = |name: &str| std::env::args().any(|arg| arg == name);
    let result = if only("lease") {
        runtime.block_on(lease::only(settings))
    } else if only("learning") {
        runtime.block_on(learning::only(settings))
    } else if only("batch") {
        runtime.block_on(batch::only(settings))
    } else if only("http") {
        runtime.block_on(http_cost::only(settings))
    } else if only("memory") {
        runtime.block_on(memory::only(settings))
    } else {
        runtime.block_on(bench(settings))
    };
    // The servers are stopped by now (each is dropped with the future that started it).
    drop(runtime);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => {
            // A store that timed out on a busy machine reads differently from one on an idle one.
            eprintln!(
                "throughput bench failed: {failure} (load average {})",
                load_average()
            );
            std::process::ExitCode::FAILURE
        }
    }
}

async fn bench(settings: Settings) -> Checked {
    let started = Instant::now();
    let load_at_start = load_average();
    let mut bench = Bench::start(settings).await?;
    let version = bench.admin.version().await;
    let cores = std::thread::available_parallelism().map_or(0, usize::from);

    // The compared runs, interleaved: round r runs each in turn, starting at a rotating place.
    let rounds = bench.settings.rounds;
    let (mut check_raw, mut layer_check) = (Vec::new(), Vec::new());
    // What the layer adds per decision in each round: this process's CPU, and Redis's.
    let (mut layer_own_cpu, mut layer_redis_cpu) = (Vec::new(), Vec::new());
    // Token-bucket `check`'s own per decision in each round: this process's CPU, and Redis's.
    let mut check_cpu = (Vec::new(), Vec::new());
    // Per algorithm, then the reference last: Redis's EVALSHA µs and CPU per decision by round.
    let mut cost: Vec<(Option<Algorithm>, Costs)> = Algorithm::ALL
        .iter()
        .map(|&a| Some(a))
        .chain([None])
        .map(|a| (a, Costs::default()))
        .collect();
    // The fleet features, measured in the same rounds: EVALSHA µs and CPU per decision by round.
    let mut fleet_cost: Vec<(Fleet, Costs)> =
        Fleet::ALL.iter().map(|&f| (f, Costs::default())).collect();
    let compared = 2 + Algorithm::ALL.len() + Fleet::ALL.len();
    for round in 0..rounds {
        let (mut raw, mut layer) = (None, None);
        let mut checks: Vec<(Algorithm, Run)> = Vec::new();
        for step in 0..compared {
            match (step + round) % compared {
                0 => raw = Some(bench.raw(Shape::RATIO).await?),
                1 => layer = Some(bench.layer(Shape::RATIO).await?),
                i if i < 2 + Algorithm::ALL.len() => {
                    let algorithm = Algorithm::ALL[i - 2];
                    checks.push((algorithm, bench.check(algorithm, Shape::RATIO).await?));
                }
                i => {
                    let (fleet, costs) = &mut fleet_cost[i - 2 - Algorithm::ALL.len()];
                    let run = bench.fleet(*fleet).await?;
                    costs.usec.push(run.usec_per_decision());
                    costs.cpu.push(run.redis_cpu_us());
                }
            }
        }
        let (raw, layer) = (raw.expect("ran"), layer.expect("ran"));
        let token_bucket = &checks
            .iter()
            .find(|(a, _)| *a == Algorithm::TokenBucket)
            .expect("ran")
            .1;
        check_raw.push(token_bucket.rate() / raw.rate());
        check_cpu.0.push(token_bucket.own_cpu_us());
        check_cpu.1.push(token_bucket.redis_cpu_us());
        layer_check.push(layer.rate() / token_bucket.rate());
        layer_own_cpu.push(layer.own_cpu_us() - token_bucket.own_cpu_us());
        layer_redis_cpu.push(layer.redis_cpu_us() - token_bucket.redis_cpu_us());
        let runs = checks.iter().map(|(a, run)| (Some(*a), run));
        for (algorithm, run) in runs.chain([(None, &raw)]) {
            let slot = cost
                .iter_mut()
                .find(|(a, _)| *a == algorithm)
                .expect("listed");
            slot.1.usec.push(run.usec_per_decision());
            slot.1.cpu.push(run.redis_cpu_us());
        }
    }
    bench.service_alone(Shape::RATIO).await?;
    let memory_cost = bench.memory_cost().await?;

    // Every other shape once.
    for shape in Shape::ALL.into_iter().filter(|&s| s != Shape::RATIO) {
        bench.raw(shape).await?;
        for &algorithm in Algorithm::ALL {
            bench.check(algorithm, shape).await?;
        }
        bench.layer(shape).await?;
        bench.service_alone(shape).await?;
    }
    // The shapes of the `http cost` line in interleaved rounds, every other shape once.
    let http_cost = bench.http_cost().await?;
    for shape in Shape::ALL
        .into_iter()
        .filter(|s| !HTTP_COST_SHAPES.contains(s))
    {
        bench.http(shape, false).await?;
        bench.http(shape, true).await?;
    }
    for &algorithm in Algorithm::ALL {
        bench
            .denied(algorithm, Shape::new(RATIO_CONCURRENCY, Keys::Hot))
            .await?;
        bench
            .denied(algorithm, Shape::new(RATIO_CONCURRENCY, Keys::Spread))
            .await?;
    }

    // The deny cache: interleaved with and without, per algorithm.
    let mut speedups: Vec<(Algorithm, Ratio, f64)> = Vec::new();
    if has_deny_cache() {
        let deny_rounds = bench.settings.deny_rounds;
        for &algorithm in Algorithm::ALL {
            let (mut speedup, mut calls) = (Vec::new(), Vec::new());
            for round in 0..deny_rounds {
                let (with, without) = if round % 2 == 0 {
                    let with = bench.deny_mix(algorithm, true).await?;
                    (with, bench.deny_mix(algorithm, false).await?)
                } else {
                    let without = bench.deny_mix(algorithm, false).await?;
                    (bench.deny_mix(algorithm, true).await?, without)
                };
                speedup.push(with.rate() / without.rate());
                // EVALSHA calls per decision, with the cache over without.
                let per_decision = |run: &Run| {
                    run.redis
                        .map_or(f64::NAN, |s| s.calls as f64 / run.ops as f64)
                };
                calls.push(per_decision(&with) / per_decision(&without));
            }
            speedups.push((algorithm, Ratio::of(speedup), median(calls)));
        }
    }

    let redis_benchmark = redis_benchmark(
        &bench.admin.url,
        &bench.sha,
        bench.settings.redis_benchmark_requests,
    );

    // Sort the table by scenario, then shape.
    let order = |scenario: &str| {
        [
            "raw",
            "check",
            "denied",
            "deny-cache",
            "fleet",
            "service",
            "layer",
            "http (",
            "http +",
        ]
        .iter()
        .position(|p| scenario.starts_with(p))
        .unwrap_or(99)
    };
    let shape_order = |shape: &Shape| {
        Shape::ALL
            .iter()
            .position(|s| s == shape)
            .unwrap_or(Shape::ALL.len())
    };
    bench.rows.sort_by(|a, b| {
        (order(&a.scenario), &a.scenario, shape_order(&a.shape)).cmp(&(
            order(&b.scenario),
            &b.scenario,
            shape_order(&b.shape),
        ))
    });

    println!();
    println!(
        "redlimit throughput bench ({}), {cores} cores, Redis {version} at {}, load average {} \
         at start, {} at end, {:.0} s",
        if bench.settings.quick {
            "--quick"
        } else {
            "full"
        },
        if bench.admin._server.is_some() {
            "a private redis-server on loopback"
        } else {
            "REDIS_URL"
        },
        load_at_start,
        load_average(),
        started.elapsed().as_secs_f64(),
    );
    println!(
        "each run: {:?} warm-up, then {:?}; rows marked (median of N) are the interleaved rounds",
        bench.settings.warm_up, bench.settings.run
    );
    println!();
    print_table(&bench.rows);
    println!();
    println!("{}", http_cost_line(&http_cost));
    println!();
    println!("redis-benchmark -P 16 -c 64 of the reference script:");
    println!("{redis_benchmark}");
    println!();
    if !bench.admin.stats {
        println!("(CONFIG RESETSTAT refused by this Redis: no usec_per_call figures)");
    }
    let check_raw = Ratio::of(check_raw);
    let layer_check = Ratio::of(layer_check);
    println!(
        "check/raw per round: median {:.2}, range {:.2}-{:.2}",
        check_raw.median, check_raw.min, check_raw.max
    );
    println!(
        "layer/check per round: median {:.2}, range {:.2}-{:.2}",
        layer_check.median, layer_check.min, layer_check.max
    );
    println!(
        "layer over check per decision, median of rounds: bench CPU {:+.2} µs, Redis CPU {:+.2} \
         µs (check: {:.2} + {:.2} µs)",
        median(layer_own_cpu),
        median(layer_redis_cpu),
        median(check_cpu.0),
        median(check_cpu.1),
    );
    let (_, reference) = cost.pop().expect("the reference is last");
    let cost: Vec<(Algorithm, f64)> = cost
        .into_iter()
        .map(|(algorithm, costs)| {
            let algorithm = algorithm.expect("an algorithm");
            let per_round = |of: fn(&Costs) -> &Vec<f64>| {
                let pairs = of(&costs).iter().zip(of(&reference));
                Ratio::of(pairs.map(|(a, r)| a / r).collect())
            };
            let (usec, cpu) = (per_round(|c| &c.usec), per_round(|c| &c.cpu));
            let least = Costs::least(&costs.usec) / Costs::least(&reference.usec);
            println!(
                "redis cost/reference {algorithm}: usec_per_call least-disturbed runs {least:.2}, \
                 per round median {:.2} (range {:.2}-{:.2}); Redis CPU per decision per round \
                 median {:.2} (range {:.2}-{:.2})",
                usec.median, usec.min, usec.max, cpu.median, cpu.min, cpu.max
            );
            (algorithm, least)
        })
        .collect();
    println!(
        "reference script: usec_per_call least-disturbed {:.2} µs, Redis CPU per decision median \
         {:.2} µs",
        Costs::least(&reference.usec),
        median(reference.cpu.clone())
    );
    for (algorithm, ratio, calls) in &speedups {
        println!(
            "deny-cache {algorithm}: speedup median {:.2}, range {:.2}-{:.2}; EVALSHA calls per \
             decision with/without {calls:.3}",
            ratio.median, ratio.min, ratio.max
        );
    }
    // The fleet features against the same reference; `plain` is the token bucket's own figure
    // above (a limiter that uses none of them runs exactly that call).
    let plain = cost
        .iter()
        .find(|(algorithm, _)| *algorithm == Algorithm::TokenBucket)
        .map_or(f64::NAN, |(_, ratio)| *ratio);
    let mut fleet_line = vec![format!("plain {plain:.2}")];
    for (fleet, costs) in &fleet_cost {
        let per_round = |of: fn(&Costs) -> &Vec<f64>| {
            let pairs = of(costs).iter().zip(of(&reference));
            Ratio::of(pairs.map(|(a, r)| a / r).collect())
        };
        let (usec, cpu) = (per_round(|c| &c.usec), per_round(|c| &c.cpu));
        let least = Costs::least(&costs.usec) / Costs::least(&reference.usec);
        println!(
            "fleet cost/reference {}: usec_per_call least-disturbed runs {least:.2}, per round \
             median {:.2} (range {:.2}-{:.2}); Redis CPU per decision per round median {:.2} \
             (range {:.2}-{:.2})",
            fleet.name(),
            usec.median,
            usec.min,
            usec.max,
            cpu.median,
            cpu.min,
            cpu.max
        );
        fleet_line.push(format!("{} {least:.2}", fleet.name()));
    }
    println!(
        "fleet cost (usec_per_call / reference): {}",
        fleet_line.join(", ")
    );
    tls_overhead(&bench.settings).await?;
    bench.connections().await?;
    println!("{}", memory::memory_line(&memory_cost));
    println!();
    println!("check/raw ratio: {:.2}", check_raw.median);
    println!("layer/check ratio: {:.2}", layer_check.median);
    // The order the acceptance checks read, whatever the order of `Algorithm::ALL`.
    let costs: Vec<String> = cost_line_order()
        .into_iter()
        .map(|wanted| {
            let ratio = cost
                .iter()
                .find(|(algorithm, _)| *algorithm == wanted)
                .map_or(f64::NAN, |(_, ratio)| *ratio);
            format!("{wanted} {ratio:.2}")
        })
        .collect();
    println!("redis cost/reference: {}", costs.join(", "));
    match speedups
        .iter()
        .map(|(_, ratio, _)| ratio.median)
        .min_by(f64::total_cmp)
    {
        Some(speedup) => println!("deny-cache speedup: {speedup:.2}"),
        None => println!("deny-cache speedup: n/a (this build has no deny cache)"),
    }
    lease::lease_bench(&bench.settings, &bench.admin).await?;
    learning::learning_bench(&bench.settings, &bench.admin).await?;
    batch::batch_bench(&bench.settings, &bench.admin).await
}
