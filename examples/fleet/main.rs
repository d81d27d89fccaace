//! A fleet of worker processes sharing one third-party quota through Redis, against a mock
//! upstream that enforces the same quota itself.
//!
//! ```text
//! cargo run --example fleet -- [--redis URL] [--workers N] [--limit N] [--period DURATION]
//!     [--seconds S] [--upstream-limit N] [--announce ietf|x-ratelimit] [--learn]
//! ```
//!
//! The example starts a mock upstream (a hyper server on a free local port) that allows `--limit`
//! requests per fixed window of `--period` and answers `429` with `Retry-After` beyond that. Then
//! it starts `--workers` worker **processes** (itself, re-executed in a hidden worker mode), each
//! calling the upstream through an [`OutboundLayer`](redlimit::outbound::OutboundLayer) as fast
//! as the limiter they share in Redis allows, for `--seconds`. The layer has one fixed key for the whole fleet, so it waits for the
//! quota in `poll_ready` (`client.ready().await`), and an upstream `429` or `503` with
//! `Retry-After` would suspend that key for every worker (auto-suspend). The key is printed at the
//! start (`fleet-PORT`): `redlimit --redis URL suspend fleet-PORT 2s` (the `cli/` command) pauses
//! the running fleet. When the workers are done the example prints one line, the last on stdout:
//!
//! ```text
//! upstream: T requests in S s, W max in any aligned window, X answered 429
//! ```
//!
//! `T` is every request the upstream received, `W` the most it received in one of its windows,
//! `X` how many it refused. The defaults (`--workers 4 --limit 20 --period 1s --seconds 5`) use
//! the quota fully and never trip the upstream: `upstream: 100 requests in 5 s, 20 max in any
//! aligned window, 0 answered 429`. Progress goes to stderr.
//!
//! Without `--redis` the fleet uses the Redis at `REDIS_URL` (or `redis://127.0.0.1:6379`) when
//! one answers, like the axum example. Worker processes cannot share a quota in memory, so without
//! a Redis that answers it says so and exits with status 2 (as for a bad flag).
//!
//! Why the fleet never trips the upstream (fixed windows on Redis's clock, and a guard before
//! each window's end) is in `worker.rs`; the upstream's `--announce` and the workers' `--learn`
//! in `upstream.rs`.

#[path = "../common/mod.rs"]
#[allow(dead_code)] // the fleet uses the parsing helpers, not the servers' layer
mod common;

mod args;
mod client;
mod clock;
mod parent;
mod upstream;
mod worker;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::cli::{self, CliError};
use tokio::time::Instant;

use args::{parse_args, Options, USAGE};
use clock::{schedule, show_period, until_unix};
use parent::Learned;
use upstream::Upstream;
use worker::worker;

/// The hidden first argument of a worker process.
const WORKER_MODE: &str = "--worker";

/// How long the workers get to start before the first window of the run.
const STARTUP: Duration = Duration::from_millis(1_500);

/// How long after the run the parent waits for a worker before killing it.
const WORKER_GRACE: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    if args.first().map(String::as_str) == Some(WORKER_MODE) {
        return match runtime.block_on(worker(&args[1..])) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let options = match parse_args(args) {
        Ok(options) => options,
        Err(CliError::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(CliError::Invalid(message)) => {
            eprintln!("error: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(run(options))
}

/// The parent: Redis, the upstream, the workers, the summary.
async fn run(options: Options) -> ExitCode {
    let url = options.redis.clone().unwrap_or_else(cli::default_redis_url);
    if !cli::redis_answers(&url).await {
        eprintln!(
            "error: no Redis answers at {}: the fleet cannot share a quota across processes \
             without one (give --redis URL or set REDIS_URL)",
            cli::redacted(&url)
        );
        return ExitCode::from(2);
    }
    let quota = options.quota;
    let upstream = match Upstream::start(options.provider).await {
        Ok(upstream) => upstream,
        Err(error) => {
            eprintln!("error: cannot start the mock upstream: {error}");
            return ExitCode::FAILURE;
        }
    };
    // One key per run: another fleet on the same Redis has an upstream of its own.
    let key = format!("fleet-{}", upstream.addr.port());
    let (start, stop) = schedule(quota.period(), options.seconds);
    eprintln!(
        "fleet: {} worker processes share {} per {:?} (fixed window, key {key:?}) in Redis at {}, \
         against the upstream at http://{}, for {} s",
        options.workers,
        quota.limit(),
        quota.period(),
        cli::redacted(&url),
        upstream.addr,
        options.seconds,
    );

    // Each worker's arguments after its id (see `worker`).
    let worker_args = [
        upstream.addr.to_string(),
        url.clone(),
        key.clone(),
        quota.limit().to_string(),
        clock::micros(quota.period()).to_string(),
        start.to_string(),
        stop.to_string(),
        u8::from(options.provider.learn).to_string(),
    ];
    let learned = Arc::new(Mutex::new(None));
    let children =
        match parent::spawn_workers(options.workers, &worker_args, &upstream.tally, &learned) {
            Ok(children) => children,
            Err(code) => return code,
        };
    let failed = parent::wait_all(children, Instant::now() + until_unix(stop) + WORKER_GRACE).await;

    let tally = upstream.tally.lock().expect("the tally lock").clone();
    let windows: Vec<String> = tally.per_window.values().map(u64::to_string).collect();
    eprintln!("upstream windows: [{}]", windows.join(", "));
    if options.provider.learn {
        match *learned.lock().expect("the learned lock") {
            Some(Learned {
                limit,
                period,
                after,
            }) => println!(
                "learned quota: {limit}/{} after {after} responses",
                show_period(period)
            ),
            None => eprintln!("no worker learned a quota (did the upstream announce one?)"),
        }
    }
    println!(
        "upstream: {} requests in {} s, {} max in any aligned window, {} answered 429",
        tally.total,
        options.seconds,
        tally.per_window.values().max().copied().unwrap_or(0),
        tally.too_many,
    );
    if failed > 0 {
        eprintln!("error: {failed} of {} workers failed", options.workers);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
