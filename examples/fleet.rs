//! A fleet of worker processes sharing one third-party quota through Redis with an
//! `OutboundLayer`, against a mock upstream (`common/upstream.rs`) that enforces it too.
//!
//! ```text
//! cargo run --example fleet -- [--redis URL] [--workers N] [--limit N] [--period DURATION]
//!     [--seconds S] [--upstream-limit N] [--announce ietf|x-ratelimit] [--learn]
//! ```
//!
//! Each worker (this program again, `--worker ...`) calls the upstream with one key for the whole
//! fleet (printed at start: `redlimit suspend KEY 2s` pauses every worker), as fast as the shared
//! fixed-window limiter on Redis's clock admits, never in the last 5 % of a window. Why this
//! never trips the upstream, and what `--announce` and `--learn` do: docs/examples.md.

#[path = "common/flags.rs"]
mod flags;
#[path = "common/fleet_flags.rs"]
mod fleet_flags;
#[path = "common/upstream.rs"]
mod upstream;

use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flags::redacted;
use fleet_flags::{Options, USAGE};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use redlimit::outbound::{OutboundError, OutboundLayer};
use redlimit::{failure_policy::FailClosed, store::RedisStore, Algorithm, Limiter, Quota};
use tokio::io::AsyncBufReadExt;
use tower::{Service, ServiceBuilder, ServiceExt};
use upstream::{micros, now_micros, until, Upstream};

type Error = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let done = match args.first().map(String::as_str) {
        Some("--worker") => runtime
            .block_on(worker(&args[1..]))
            .map(|()| ExitCode::SUCCESS),
        _ => match flags::or_exit(fleet_flags::parse(args), USAGE) {
            Ok(options) => runtime.block_on(run(options)),
            Err(code) => Ok(code),
        },
    };
    done.unwrap_or_else(|error| {
        eprintln!("error: {error}");
        ExitCode::FAILURE
    })
}

/// The parent: Redis, the upstream, the workers, the summary.
async fn run(o: Options) -> Result<ExitCode, Error> {
    let url = o.redis.clone().unwrap_or_else(flags::default_redis_url);
    if !flags::redis_answers(&url).await {
        eprintln!(
            "error: no Redis answers at {}: the fleet cannot share a quota across processes \
             without one (give --redis URL or set REDIS_URL)",
            redacted(&url)
        );
        return Ok(ExitCode::from(2));
    }
    let upstream = Arc::new(Upstream::start(o.upstream, o.announce).await?);
    // One key per run: another fleet on the same Redis has an upstream of its own.
    let key = format!("fleet-{}", upstream.addr.port());
    let (period, limit, seconds) = (micros(o.quota.period()), o.quota.limit(), o.seconds);
    // The workers start together on a window boundary when the run covers whole windows.
    let mut start = now_micros() + 1_500_000;
    if period <= seconds * 1_000_000 {
        start = start.div_ceil(period) * period;
    }
    let stop = start + seconds * 1_000_000;
    let (workers, addr, shown) = (o.workers, upstream.addr, redacted(&url));
    eprintln!(
        "fleet: {workers} worker processes share {limit} per {:?} (fixed window, key {key:?}) in \
         Redis at {shown}, against the upstream at http://{addr}, for {seconds} s",
        o.quota.period()
    );
    // A worker that learns a quota prints it (`LIMIT/PERIOD`) on stdout: the first one counts.
    let learned = Arc::new(Mutex::new(None));
    let mut children = Vec::new();
    for id in 1..=o.workers {
        let numbers = [id, limit, period, start, stop, u64::from(o.learn)].map(|n| n.to_string());
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(["--worker", &addr.to_string(), &url, &key])
            .args(numbers)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        let (upstream, learned) = (upstream.clone(), learned.clone());
        tokio::spawn(async move {
            while let Ok(Some(quota)) = lines.next_line().await {
                let line = format!(
                    "learned quota: {quota} after {} responses",
                    upstream.total()
                );
                learned.lock().unwrap().get_or_insert(line);
            }
        });
        children.push((id, child));
    }
    let give_up = tokio::time::Instant::now() + until(stop) + Duration::from_secs(30);
    let mut failed = 0;
    for (id, mut child) in children {
        let done = tokio::time::timeout_at(give_up, child.wait()).await;
        if !matches!(done, Ok(Ok(status)) if status.success()) {
            eprintln!("error: worker {id} failed or did not finish in time: {done:?}");
            failed += 1;
        }
    }
    match learned.lock().unwrap().take() {
        Some(line) => println!("{line}"),
        None if o.learn => eprintln!("no worker learned a quota (did the upstream announce one?)"),
        None => {}
    }
    println!("{}", upstream.summary(seconds));
    if failed > 0 {
        eprintln!("error: {failed} of {workers} workers failed");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// A worker process: `ADDR REDIS_URL KEY ID LIMIT PERIOD_US START_US STOP_US LEARN`.
async fn worker(args: &[String]) -> Result<(), Error> {
    let [addr, url, key, rest @ ..] = args else {
        return Err("--worker: too few arguments".into());
    };
    let numbers: Vec<u64> = rest.iter().map(|n| n.parse()).collect::<Result<_, _>>()?;
    let [id, limit, period, start, stop, learn] = numbers[..] else {
        return Err("--worker: 9 arguments".into());
    };
    let quota = Quota::new(limit, Duration::from_micros(period))?;
    let store = RedisStore::new(url.as_str())?;
    // Connected, and the script loaded, before the run starts.
    let verified = store.verify().await;
    verified.map_err(|e| format!("worker {id}: Redis at {}: {e}", redacted(url)))?;
    // The upstream's windows on Redis's clock, one clock for the whole fleet; never an
    // admission the store did not make.
    let limiter = Limiter::builder(store)
        .algorithm(Algorithm::FixedWindow)
        .failure_policy(FailClosed::default())
        .build()?;
    // One fixed key for the fleet: the layer waits in `poll_ready`, and an upstream 429 with
    // `Retry-After` suspends the key for every worker. A wait past the run fails at once.
    let mut layer = OutboundLayer::builder(limiter.clone(), quota, key.as_str())
        .max_wait(until(stop) + quota.period());
    if learn == 1 {
        layer = layer.learn_quota(quota); // never faster than ours
    }
    let layer = layer.build()?;
    let upstream = upstream::client(addr.parse()?).await?;
    let mut client = ServiceBuilder::new().layer(layer.clone()).service(upstream);
    tokio::time::sleep(until(start)).await;
    let stop_at = tokio::time::Instant::now() + until(stop);
    let (mut sent, mut refused, mut learned) = (0, 0, 0);
    while now_micros() < stop {
        // No call starts in the last 5 % (at most 50 ms) of a window: it must reach the
        // upstream in the window that admitted it.
        let left_in_window = period - now_micros() % period;
        if left_in_window < (period / 20).min(50_000) {
            tokio::time::sleep(Duration::from_micros(left_in_window)).await;
            continue;
        }
        let Ok(ready) = tokio::time::timeout_at(stop_at, client.ready()).await else {
            break;
        };
        if now_micros() >= stop {
            break; // admitted at the run's end, in a window the run does not count
        }
        let request = Request::get("/")
            .header("host", addr.as_str())
            .body(Empty::new())?;
        let response = match ready?.call(request).await {
            Ok(response) => response,
            Err(OutboundError::Acquire(_)) => break, // the next admission comes after the run
            Err(error) => return Err(format!("worker {id}: upstream: {error}").into()),
        };
        sent += 1;
        refused += u64::from(response.status() == StatusCode::TOO_MANY_REQUESTS);
        let _ = response.into_body().collect().await; // keeps the connection reusable
        if layer.stats().learned > learned {
            learned = layer.stats().learned;
            // What is in force now, as the store holds it.
            if let Some(quotas) = limiter.inspect(key.as_str()).await?.quota_override {
                println!("{}/{:?}", quotas[0].limit(), quotas[0].period());
            }
        }
    }
    // One write: the workers share the parent's stderr, and a line must not be split.
    let line = format!("worker {id}: {sent} requests, {refused} answered 429\n");
    std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes())?;
    Ok(())
}
