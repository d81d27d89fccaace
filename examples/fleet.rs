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
//! calling the upstream through an [`OutboundLayer`] as fast as the limiter they share in Redis
//! allows, for `--seconds`. The layer has one fixed key for the whole fleet, so it waits for the
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
//! # Why the upstream is never tripped
//!
//! The upstream counts in fixed windows of `period` aligned to the Unix epoch (window `k` is
//! `[k × period, (k + 1) × period)` of its system clock), as many real APIs do. A token bucket (or
//! GCRA) with a burst of `limit` would not do: it admits `limit` at the end of one window and,
//! refilled, `limit` more at the start of the next, up to `2 × limit` in one upstream window
//! whenever the boundaries do not line up. GCRA with a burst of 1 admits at most `limit` in any
//! `period` at the admission times, but spaces requests evenly, so every upstream boundary has
//! requests right next to it, and a millisecond of network jitter moves one across.
//!
//! So the workers use the **fixed-window** algorithm on the **same windows**: the same epoch
//! alignment, on Redis's clock (the default, [`Clock::Server`](redlimit::clock::Clock::Server)): one
//! clock for every worker, so no skew between them, and the upstream's clock too when Redis runs
//! on this machine, as the mock upstream does (a Redis elsewhere may be a little off: leave the
//! margin below). The limiter admits at most `limit` per window, and a saturated fleet spends
//! each window's quota in its first few
//! tens of milliseconds: a denial's `retry_after` is the time to the window's end, so waiters
//! wake just after a boundary (plus `acquire`'s jitter, at most 5 % of the wait). Requests are
//! then almost a whole window away from the next boundary. A fleet that
//! does not saturate the quota could be admitted just before a boundary and arrive just after
//! it: a worker never starts a call in the last [`guard`] of a window (5 % of the period, at most
//! 50 ms), so a request would have to take longer than that between admission and arrival to be
//! counted in the wrong window. Against a real API, whose clock is not yours, leave a margin
//! (a limit a little under the provider's).
//!
//! The workers start together at a window boundary (when the run covers whole windows, i.e.
//! `period` ≤ `seconds`), so `T` is `limit × seconds / period` when the fleet keeps up.
//! A store error never admits: the limiter fails closed, so a Redis outage pauses the fleet
//! rather than flooding the upstream.
//!
//! # A provider that announces its limit
//!
//! `--upstream-limit N` gives the upstream a quota of its own (by default `--limit`), and
//! `--announce ietf|x-ratelimit` makes it announce that quota and what is left in each response:
//! `RateLimit-Policy: "fleet";q=N;w=SECONDS` with `RateLimit: "fleet";r=LEFT;t=SECONDS_TO_RESET`,
//! or `X-RateLimit-Limit`, `-Remaining` and `-Reset` (the window's end in Unix epoch seconds,
//! GitHub's style). The workers read it: a response saying nothing is left suspends the key
//! until the reset for the whole fleet (pacing), and with `--learn` the first announcement sets
//! the upstream's quota as the key's fleet-wide override (never faster than `--limit`, the
//! ceiling). The example then prints, before the summary:
//!
//! ```text
//! learned quota: 20/1s after N responses
//! ```
//!
//! `N`: the responses the upstream had sent when the first worker learned.
//! `--workers 4 --limit 50 --upstream-limit 20 --period 1s --seconds 5 --announce ietf --learn`
//! converges on 20 a second and draws (almost) no `429`: the workers' limiter counts the same
//! windows as the upstream from the first response on.

#[allow(dead_code)] // the fleet uses the parsing helpers, not the servers' layer
mod common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::cli::{self, CliError};
use common::flags::{set_once, Arg, Args};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use redlimit::outbound::{OutboundError, OutboundLayer};
use redlimit::store::RedisStore;
use redlimit::{failure_policy::FailClosed, Algorithm, Limiter, Quota};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

const USAGE: &str = "\
usage: cargo run --example fleet -- [OPTIONS]

Worker processes share one quota through Redis against a mock upstream that enforces it too.
Ends with: upstream: T requests in S s, W max in any aligned window, X answered 429

options:
  --redis URL          the Redis the workers share [default: $REDIS_URL or
                       redis://127.0.0.1:6379 if it answers; without one, exit 2]
  --workers N          worker processes [default: 4, at most 64]
  --limit N            requests per period, for the whole fleet [default: 20]
  --period DURATION    e.g. 500ms, 1s, 1m: the upstream's fixed windows [default: 1s]
  --seconds S          how long the workers call the upstream [default: 5, at most 3600]
  --upstream-limit N   the upstream's own quota per period [default: --limit]
  --announce DIALECT   the upstream announces its quota and what is left: ietf (RateLimit-Policy,
                       RateLimit) or x-ratelimit (X-RateLimit-*) [default: it does not]
  --learn              the workers learn the announced quota fleet-wide (at most --limit); prints
                       learned quota: L/PERIOD after N responses
  -h, --help           print this help";

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

/// The parsed command line.
#[derive(Debug)]
struct Options {
    redis: Option<String>,
    workers: u64,
    quota: Quota,
    seconds: u64,
    provider: ProviderOptions,
}

/// What the upstream enforces and announces, and whether the workers learn from it.
#[derive(Debug, Clone, Copy)]
struct ProviderOptions {
    /// The upstream's own quota (`--upstream-limit` per `--period`).
    quota: Quota,
    announce: Option<Dialect>,
    learn: bool,
}

/// The headers the upstream announces its quota in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dialect {
    Ietf,
    XRateLimit,
}

fn parse_args(args: Vec<String>) -> Result<Options, CliError> {
    let (mut redis, mut workers, mut limit, mut period, mut seconds) =
        (None, None, None, None, None);
    let (mut upstream_limit, mut announce, mut learn) = (None, None, None);
    let mut args = Args::new(args);
    while let Some(arg) = args.next_arg() {
        let (name, inline) = match arg {
            Arg::Flag { name, .. } if name == "-h" || name == "--help" => {
                return Err(CliError::Help)
            }
            Arg::Flag { name, inline } => (name, inline),
            Arg::Plain(other) => {
                return Err(CliError::Invalid(format!(
                    "unexpected argument {other:?} (see --help)"
                )))
            }
        };
        let has_value = inline.is_some();
        let value = || args.value(&name, inline);
        match name.as_str() {
            "--redis" => {
                let url = value()?;
                redis::Client::open(url.as_str()).map_err(|e| {
                    CliError::Invalid(format!("--redis: invalid URL {}: {e}", cli::redacted(&url)))
                })?;
                set_once(&mut redis, &name, url)?
            }
            "--workers" => set_once(&mut workers, &name, cli::parse_count(&name, &value()?)?)?,
            "--limit" => set_once(&mut limit, &name, cli::parse_count(&name, &value()?)?)?,
            "--period" => set_once(
                &mut period,
                &name,
                cli::parse_duration_of(&name, &value()?)?,
            )?,
            "--seconds" => set_once(&mut seconds, &name, cli::parse_count(&name, &value()?)?)?,
            "--upstream-limit" => set_once(
                &mut upstream_limit,
                &name,
                cli::parse_count(&name, &value()?)?,
            )?,
            "--announce" => {
                let dialect = match value()?.as_str() {
                    "ietf" => Dialect::Ietf,
                    "x-ratelimit" => Dialect::XRateLimit,
                    other => {
                        return Err(CliError::Invalid(format!(
                            "--announce: {other:?} is neither ietf nor x-ratelimit"
                        )))
                    }
                };
                set_once(&mut announce, &name, dialect)?
            }
            "--learn" => {
                if has_value {
                    return Err(CliError::Invalid("--learn takes no value".into()));
                }
                set_once(&mut learn, &name, true)?
            }
            other => {
                return Err(CliError::Invalid(format!(
                    "unknown argument {other:?} (see --help)"
                )))
            }
        }
    }
    let workers = workers.unwrap_or(4);
    if workers > 64 {
        return Err(CliError::Invalid("--workers: at most 64".into()));
    }
    let seconds = seconds.unwrap_or(5);
    if seconds > 3600 {
        return Err(CliError::Invalid("--seconds: at most 3600".into()));
    }
    let period = period.unwrap_or(Duration::from_secs(1));
    let quota = Quota::new(limit.unwrap_or(20), period).map_err(|e| {
        let flag = if period.is_zero() || period > redlimit::quota::MAX_PERIOD {
            "--period"
        } else {
            "--limit"
        };
        CliError::Invalid(format!("{flag}: {e}"))
    })?;
    if quota.period() < Duration::from_millis(1) {
        return Err(CliError::Invalid("--period: at least 1ms".into()));
    }
    Algorithm::FixedWindow
        .supports(&quota)
        .map_err(|e| CliError::Invalid(format!("--limit: {e}")))?;
    let upstream = Quota::new(upstream_limit.unwrap_or(quota.limit()), period)
        .map_err(|e| CliError::Invalid(format!("--upstream-limit: {e}")))?;
    if announce.is_some() && period.subsec_nanos() != 0 {
        // Both dialects count in whole seconds.
        return Err(CliError::Invalid(
            "--announce: --period must be whole seconds (the headers count seconds)".into(),
        ));
    }
    Ok(Options {
        redis,
        workers,
        quota,
        seconds,
        provider: ProviderOptions {
            quota: upstream,
            announce,
            learn: learn.unwrap_or(false),
        },
    })
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

    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => {
            eprintln!("error: cannot find this program to start the workers: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut children = Vec::new();
    let learned = Arc::new(Mutex::new(None));
    for id in 1..=options.workers {
        let spawned = tokio::process::Command::new(&exe)
            .arg(WORKER_MODE)
            .args([
                id.to_string(),
                upstream.addr.to_string(),
                url.clone(),
                key.clone(),
                quota.limit().to_string(),
                micros(quota.period()).to_string(),
                start.to_string(),
                stop.to_string(),
                u8::from(options.provider.learn).to_string(),
            ])
            .stdin(Stdio::null())
            // A worker that learns a quota says so on its stdout (see `watch_learning`).
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn();
        match spawned {
            Ok(mut child) => {
                watch_learning(&mut child, &upstream.tally, &learned);
                children.push((id, child))
            }
            Err(error) => {
                eprintln!("error: cannot start worker {id}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }

    let mut failed = 0;
    let give_up = Instant::now() + until_unix(stop) + WORKER_GRACE;
    for (id, mut child) in children {
        match tokio::time::timeout_at(give_up, child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => {
                eprintln!("error: worker {id} exited with {status}");
                failed += 1;
            }
            Ok(Err(error)) => {
                eprintln!("error: cannot wait for worker {id}: {error}");
                failed += 1;
            }
            Err(_) => {
                eprintln!("error: worker {id} did not finish in time; killed");
                let _ = child.kill().await;
                failed += 1;
            }
        }
    }

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

/// When the workers start and stop calling, in µs since the Unix epoch: after [`STARTUP`], at a
/// window boundary when the run covers whole windows, for `seconds`.
fn schedule(period: Duration, seconds: u64) -> (u64, u64) {
    let earliest = unix_micros() + micros(STARTUP);
    let start = if period <= Duration::from_secs(seconds) {
        earliest.div_ceil(micros(period)) * micros(period)
    } else {
        earliest
    };
    (start, start + seconds * 1_000_000)
}

/// What a worker learned, and how many responses the upstream had sent when the parent heard.
#[derive(Debug, Clone, Copy)]
struct Learned {
    limit: u64,
    period: Duration,
    after: u64,
}

/// Reads a worker's stdout: its line `learned LIMIT PERIOD_US` (see `worker`) is recorded with
/// the upstream's count of responses at that moment, the first one only.
fn watch_learning(
    child: &mut tokio::process::Child,
    tally: &Arc<Mutex<Tally>>,
    learned: &Arc<Mutex<Option<Learned>>>,
) {
    let Some(stdout) = child.stdout.take() else {
        return;
    };
    let (tally, learned) = (tally.clone(), learned.clone());
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut words = line.split(' ');
            let (Some("learned"), Some(limit), Some(period)) =
                (words.next(), words.next(), words.next())
            else {
                continue;
            };
            let (Ok(limit), Ok(period)) = (limit.parse(), period.parse()) else {
                continue;
            };
            let after = tally.lock().expect("the tally lock").total;
            learned
                .lock()
                .expect("the learned lock")
                .get_or_insert(Learned {
                    limit,
                    period: Duration::from_micros(period),
                    after,
                });
        }
    });
}

/// `1s`, `500ms`, `1500us`: a period as the flags write it.
fn show_period(period: Duration) -> String {
    let micros = micros(period);
    if micros.is_multiple_of(1_000_000) {
        format!("{}s", micros / 1_000_000)
    } else if micros.is_multiple_of(1_000) {
        format!("{}ms", micros / 1_000)
    } else {
        format!("{micros}us")
    }
}

/// The mock upstream: `limit` per fixed window of `period` aligned to the Unix epoch, by this
/// machine's clock; `429` with `Retry-After` (the window's end, whole seconds rounded up) beyond.
/// With `--announce` every answer carries the quota and what is left in that window.
struct Upstream {
    addr: SocketAddr,
    tally: Arc<Mutex<Tally>>,
}

/// What the upstream received.
#[derive(Debug, Clone, Default)]
struct Tally {
    /// Requests received per window (the window's index since the epoch), refused ones included.
    per_window: BTreeMap<u64, u64>,
    total: u64,
    too_many: u64,
}

impl Upstream {
    async fn start(provider: ProviderOptions) -> std::io::Result<Upstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tally = Arc::new(Mutex::new(Tally::default()));
        let shared = tally.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let tally = shared.clone();
                let service = hyper::service::service_fn(move |_request: Request<Incoming>| {
                    std::future::ready(Ok::<_, Infallible>(answer(&tally, provider)))
                });
                tokio::spawn(async move {
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    let _ = connection.await;
                });
            }
        });
        Ok(Upstream { addr, tally })
    }
}

/// Counts one request in its window and answers it.
fn answer(tally: &Mutex<Tally>, provider: ProviderOptions) -> Response<Full<Bytes>> {
    let quota = provider.quota;
    let now = unix_micros();
    let period = micros(quota.period());
    let window = now / period;
    let mut tally = tally.lock().expect("the tally lock");
    tally.total += 1;
    let count = tally.per_window.entry(window).or_default();
    *count += 1;
    let count = *count;
    let end = (window + 1) * period;
    let builder = announce(Response::builder(), provider, count, end, now);
    if count <= quota.limit() {
        return builder
            .body(Full::new(Bytes::from_static(b"ok")))
            .expect("a valid response");
    }
    tally.too_many += 1;
    let left = end - now;
    builder
        .status(StatusCode::TOO_MANY_REQUESTS)
        .header("retry-after", left.div_ceil(1_000_000).max(1))
        .body(Full::new(Bytes::from_static(b"too many requests")))
        .expect("a valid response")
}

/// The announcement headers of `--announce`, after `count` requests in the window that ends at
/// `end` (µs since the epoch; `now` too).
fn announce(
    builder: http::response::Builder,
    provider: ProviderOptions,
    count: u64,
    end: u64,
    now: u64,
) -> http::response::Builder {
    let limit = provider.quota.limit();
    let remaining = limit.saturating_sub(count);
    match provider.announce {
        None => builder,
        Some(Dialect::Ietf) => builder
            .header(
                "ratelimit-policy",
                format!(
                    "\"fleet\";q={limit};w={}",
                    provider.quota.period().as_secs()
                ),
            )
            .header(
                "ratelimit",
                format!(
                    "\"fleet\";r={remaining};t={}",
                    (end - now).div_ceil(1_000_000)
                ),
            ),
        Some(Dialect::XRateLimit) => builder
            .header("x-ratelimit-limit", limit)
            .header("x-ratelimit-remaining", remaining)
            .header("x-ratelimit-reset", end.div_ceil(1_000_000)),
    }
}

/// A worker process: `ID UPSTREAM REDIS_URL KEY LIMIT PERIOD_US START_US STOP_US LEARN`.
async fn worker(args: &[String]) -> Result<(), String> {
    let [id, upstream, url, key, limit, period, start, stop, learn] = args else {
        return Err(format!("{WORKER_MODE}: expected 9 arguments, got {args:?}"));
    };
    let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let (limit, period, start, stop) = (
        number(limit)?,
        Duration::from_micros(number(period)?),
        number(start)?,
        number(stop)?,
    );
    let quota = Quota::new(limit, period).map_err(|e| e.to_string())?;
    let store = RedisStore::new(url.as_str()).map_err(|e| e.to_string())?;
    store
        .verify()
        .await
        .map_err(|e| format!("worker {id}: Redis at {}: {e}", cli::redacted(url)))?;
    // The upstream's windows, on Redis's clock: one clock for the whole fleet (see the module
    // docs); and never an admission the store did not make.
    let limiter = Limiter::builder(store)
        .algorithm(Algorithm::FixedWindow)
        .failure_policy(FailClosed::default())
        .build()
        .map_err(|e| e.to_string())?;
    // One fixed key for the whole fleet: the layer waits in `poll_ready` (backpressure), and an
    // upstream 429 or 503 with `Retry-After` would suspend the key for every worker.
    let inspector = limiter.clone();
    let layer = OutboundLayer::builder(limiter, quota, key.as_str())
        // Waits are cut at `stop` below; one that would end after the run (a long suspension)
        // fails at once, and the worker is done.
        .max_wait(until_unix(stop) + period);
    // `--learn`: the upstream's announced quota becomes the fleet's, never faster than ours.
    let layer = if learn == "1" {
        layer.learn_quota(quota)
    } else {
        layer
    };
    let layer = layer.build().map_err(|e| e.to_string())?;
    let stats = layer.clone();
    let mut learned = 0;
    let upstream: SocketAddr = upstream.parse().map_err(|e| format!("{upstream}: {e}"))?;
    let connection = UpstreamClient::connect(upstream)
        .await
        .map_err(|e| format!("worker {id}: cannot connect to the upstream: {e}"))?;
    let mut client = ServiceBuilder::new().layer(layer).service(connection);

    tokio::time::sleep(until_unix(start)).await;
    let stop_at = Instant::now() + until_unix(stop);
    let (mut sent, mut refused) = (0u64, 0u64);
    loop {
        let now = unix_micros();
        if now >= stop {
            break;
        }
        let left_in_window = micros(period) - now % micros(period);
        if left_in_window < micros(guard(period)) {
            tokio::time::sleep(Duration::from_micros(left_in_window)).await;
            continue;
        }
        // `ready()` waits until the fleet's quota admits this worker's next call; at `stop` the
        // worker gives up waiting rather than call after the run.
        let Ok(ready) = tokio::time::timeout_at(stop_at, client.ready()).await else {
            break;
        };
        let ready = ready.map_err(|e| format!("worker {id}: {e}"))?;
        let request = Request::get("/")
            .header("host", upstream.to_string())
            .body(Empty::new())
            .expect("a valid request");
        let response = match ready.call(request).await {
            Ok(response) => response,
            // The next admission comes after the run: nothing was sent.
            Err(OutboundError::Acquire(_)) => break,
            Err(error) => return Err(format!("worker {id}: upstream: {error}")),
        };
        let status = response.status();
        // Read the body to the end: the connection is kept alive for the next request.
        let _ = response.into_body().collect().await;
        sent += 1;
        if status == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
        // This worker set a learned quota: tell the parent (its `watch_learning`).
        if stats.stats().learned > learned {
            learned = stats.stats().learned;
            // What is in force now, as the store holds it.
            if let Ok(status) = inspector.inspect(key.as_str()).await {
                if let Some(quotas) = status.quota_override {
                    let quota = quotas[0];
                    println!("learned {} {}", quota.limit(), micros(quota.period()));
                }
            }
        }
    }
    // One write for the whole line: the workers share the parent's stderr, and `eprintln!` may
    // write a line in pieces that another worker's line would split.
    let line = format!("worker {id}: {sent} requests, {refused} answered 429\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    Ok(())
}

/// A call never starts this close to a window's end: a request admitted in one window must reach
/// the upstream before the next begins (see the module docs).
fn guard(period: Duration) -> Duration {
    (period / 20).min(Duration::from_millis(50))
}

/// The upstream as a client `tower::Service`: one kept-alive HTTP/1.1 connection. The outbound
/// layer clones its inner service into each response future (tower's advice for a ready service),
/// so the connection sits behind a lock; a worker makes one call at a time, never waiting on it.
#[derive(Clone)]
struct UpstreamClient {
    sender: Arc<tokio::sync::Mutex<http1::SendRequest<Empty<Bytes>>>>,
}

impl UpstreamClient {
    async fn connect(addr: SocketAddr) -> Result<UpstreamClient, Box<dyn std::error::Error>> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(UpstreamClient {
            sender: Arc::new(tokio::sync::Mutex::new(sender)),
        })
    }
}

impl Service<Request<Empty<Bytes>>> for UpstreamClient {
    type Response = Response<Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        // The connection's readiness is awaited in `call`, under the lock.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Empty<Bytes>>) -> Self::Future {
        let sender = self.sender.clone();
        Box::pin(async move {
            let mut sender = sender.lock().await;
            sender.ready().await?;
            sender.send_request(request).await
        })
    }
}

/// Now, in µs since the Unix epoch (this machine's clock, the mock upstream's).
fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(micros)
        .unwrap_or(0)
}

/// How long until `at` (µs since the Unix epoch); zero if it has passed.
fn until_unix(at: u64) -> Duration {
    Duration::from_micros(at.saturating_sub(unix_micros()))
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
