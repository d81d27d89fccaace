//! A fleet of worker processes sharing one third-party quota through Redis, against a mock
//! upstream that enforces the same quota in fixed windows aligned to the Unix epoch.
//!
//! ```text
//! cargo run --example fleet -- [--redis URL] [--workers N] [--limit N] [--period DURATION]
//!     [--seconds S] [--upstream-limit N] [--announce ietf|x-ratelimit] [--learn]
//! ```
//!
//! Each worker (this program again, `--worker ...`) calls the upstream through an
//! `OutboundLayer` with one key for the whole fleet (printed at start: `redlimit suspend KEY 2s`
//! pauses every worker), as fast as the shared fixed-window limiter on Redis's clock admits, and
//! never in the last 5 % of a window. The last line on stdout is the summary:
//! `upstream: T requests in S s, W max in any aligned window, X answered 429`. Why this never
//! trips the upstream, and what `--announce` and `--learn` do: docs/examples.md.

#[path = "common/flags.rs"]
mod flags;

use std::collections::BTreeMap;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use flags::{invalid, redacted, CliError};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use redlimit::outbound::{OutboundError, OutboundLayer};
use redlimit::{failure_policy::FailClosed, quota::QuotaError, store::RedisStore};
use redlimit::{Algorithm, Limiter, Quota};
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpListener;
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

struct Options {
    redis: Option<String>,
    workers: u64,
    quota: Quota,
    seconds: u64,
    upstream: Quota,
    announce: Option<String>,
    learn: bool,
}

type Error = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let done = match args.first().map(String::as_str) {
        Some("--worker") => runtime
            .block_on(worker(&args[1..]))
            .map(|()| ExitCode::SUCCESS),
        _ => match flags::or_exit(parse(args), USAGE) {
            Ok(options) => runtime.block_on(run(options)),
            Err(code) => Ok(code),
        },
    };
    done.unwrap_or_else(|error| {
        eprintln!("error: {error}");
        ExitCode::FAILURE
    })
}

fn parse(args: Vec<String>) -> Result<Options, CliError> {
    let given = flags::read(USAGE, args)?;
    if let Some(plain) = given.plain.first() {
        return Err(invalid(format!(
            "unexpected argument {plain:?} (see --help)"
        )));
    }
    if let Some(url) = given.get("--redis") {
        let shown = redacted(url);
        redis::Client::open(url)
            .map_err(|e| invalid(format!("--redis: invalid URL {shown}: {e}")))?;
    }
    let period = given.duration("--period", Duration::from_secs(1))?;
    let quota = Quota::new(given.count("--limit", 20)?, period).map_err(|e| match e {
        QuotaError::ZeroPeriod | QuotaError::PeriodTooLong => invalid(format!("--period: {e}")),
        _ => invalid(format!("--limit: {e}")),
    })?;
    let upstream = Quota::new(given.count("--upstream-limit", quota.limit())?, period);
    let options = Options {
        redis: given.get("--redis").map(str::to_owned),
        workers: given.count("--workers", 4)?,
        quota,
        seconds: given.count("--seconds", 5)?,
        upstream: upstream.map_err(|e| invalid(format!("--upstream-limit: {e}")))?,
        announce: given.get("--announce").map(str::to_owned),
        learn: given.has("--learn"),
    };
    let supported = Algorithm::FixedWindow.supports(&quota);
    let refused = match options.announce.as_deref() {
        _ if options.workers > 64 => "--workers: at most 64".to_owned(),
        _ if options.seconds > 3600 => "--seconds: at most 3600".to_owned(),
        _ if period < Duration::from_millis(1) => "--period: at least 1ms".to_owned(),
        _ if supported.is_err() => format!("--limit: {}", supported.unwrap_err()),
        None => return Ok(options),
        Some("ietf" | "x-ratelimit") if period.subsec_nanos() == 0 => return Ok(options),
        // Both dialects count in whole seconds.
        Some("ietf" | "x-ratelimit") => "--announce: --period must be whole seconds".to_owned(),
        Some(other) => format!("--announce: {other:?} is neither ietf nor x-ratelimit"),
    };
    Err(invalid(refused))
}

/// What the upstream received: requests per window (its index since the epoch), total, refused.
#[derive(Default)]
struct Tally {
    per_window: BTreeMap<u64, u64>,
    total: u64,
    too_many: u64,
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    tokio::spawn(upstream(listener, tally.clone(), o.upstream, o.announce));
    // One key per run: another fleet on the same Redis has an upstream of its own.
    let key = format!("fleet-{}", addr.port());
    let (period, limit) = (micros(o.quota.period()), o.quota.limit());
    // The workers start together on a window boundary when the run covers whole windows.
    let mut start = now_micros() + 1_500_000;
    if period <= o.seconds * 1_000_000 {
        start = start.div_ceil(period) * period;
    }
    let stop = start + o.seconds * 1_000_000;
    let (workers, seconds, shown) = (o.workers, o.seconds, redacted(&url));
    eprintln!(
        "fleet: {workers} worker processes share {limit} per {:?} (fixed window, key {key:?}) in \
         Redis at {shown}, against the upstream at http://{addr}, for {seconds} s",
        o.quota.period()
    );
    let learned = Arc::new(Mutex::new(None));
    let mut children = Vec::new();
    for id in 1..=workers {
        let numbers = [id, limit, period, start, stop, u64::from(o.learn)].map(|n| n.to_string());
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(["--worker", &addr.to_string(), &url, &key])
            .args(numbers)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        // A worker that learns a quota prints `learned LIMIT PERIOD_US`: the first one counts.
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        let (tally, learned) = (tally.clone(), learned.clone());
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let words: Vec<&str> = line.split(' ').collect();
                if let ["learned", limit, period] = words[..] {
                    let after = tally.lock().unwrap().total;
                    let learned = &mut *learned.lock().unwrap();
                    learned.get_or_insert((limit.to_owned(), period.parse::<u64>(), after));
                }
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
    let tally = tally.lock().unwrap();
    eprintln!("upstream windows: {:?}", tally.per_window.values());
    match learned.lock().unwrap().take() {
        Some((limit, Ok(period), after)) => {
            let (s, ms) = (period / 1_000_000, period / 1_000);
            let shown = match period {
                p if p % 1_000_000 == 0 => format!("{s}s"),
                p if p % 1_000 == 0 => format!("{ms}ms"),
                p => format!("{p}us"),
            };
            println!("learned quota: {limit}/{shown} after {after} responses")
        }
        _ if o.learn => eprintln!("no worker learned a quota (did the upstream announce one?)"),
        _ => {}
    }
    let most = tally.per_window.values().max().unwrap_or(&0);
    let (total, too_many) = (tally.total, tally.too_many);
    println!(
        "upstream: {total} requests in {seconds} s, {most} max in any aligned window, {too_many} \
         answered 429"
    );
    if failed > 0 {
        eprintln!("error: {failed} of {workers} workers failed");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The mock upstream: `quota` per fixed window aligned to the Unix epoch on this machine's clock,
/// `429` with `Retry-After` (the window's end, whole seconds rounded up) beyond; with
/// `--announce`, the quota and what is left in every answer.
async fn upstream(
    listener: TcpListener,
    tally: Arc<Mutex<Tally>>,
    quota: Quota,
    announce: Option<String>,
) {
    while let Ok((stream, _)) = listener.accept().await {
        let (tally, announce) = (tally.clone(), announce.clone());
        let answer = hyper::service::service_fn(move |_: Request<Incoming>| {
            let (now, period) = (now_micros(), micros(quota.period()));
            let (window, limit) = (now / period, quota.limit());
            let mut tally = tally.lock().unwrap();
            tally.total += 1;
            let count = *tally
                .per_window
                .entry(window)
                .and_modify(|n| *n += 1)
                .or_insert(1);
            let left = limit.saturating_sub(count);
            let reset = ((window + 1) * period - now).div_ceil(1_000_000);
            let mut response = Response::builder();
            if announce.as_deref() == Some("ietf") {
                let policy = format!("\"fleet\";q={limit};w={}", quota.period().as_secs());
                response = response.header("ratelimit-policy", policy);
                response = response.header("ratelimit", format!("\"fleet\";r={left};t={reset}"));
            } else if announce.is_some() {
                let end = ((window + 1) * period).div_ceil(1_000_000);
                let headers = [("limit", limit), ("remaining", left), ("reset", end)];
                for (name, value) in headers {
                    response = response.header(format!("x-ratelimit-{name}"), value);
                }
            }
            if count > limit {
                tally.too_many += 1;
                response = response
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header("retry-after", reset.max(1));
            }
            std::future::ready(response.body(Full::new(Bytes::from_static(b"ok"))))
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), answer);
        tokio::spawn(connection);
    }
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
    // The upstream's windows on Redis's clock, one clock for the whole fleet; never an
    // admission the store did not make.
    let store = RedisStore::new(url.as_str())?;
    // Connected, and the script loaded, before the run starts.
    let verified = store.verify().await;
    verified.map_err(|e| format!("worker {id}: Redis at {}: {e}", redacted(url)))?;
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
    let stream = tokio::net::TcpStream::connect(addr.as_str()).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    // The layer clones its service into each call: the one kept-alive connection sits behind a lock.
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let send = tower::service_fn(move |request: Request<Empty<Bytes>>| {
        let sender = sender.clone();
        async move {
            let mut sender = sender.lock().await;
            sender.ready().await?; // the previous response read to its end
            sender.send_request(request).await
        }
    });
    let mut client = ServiceBuilder::new().layer(layer.clone()).service(send);
    tokio::time::sleep(until(start)).await;
    let (stop_at, mut sent, mut refused, mut learned) =
        (tokio::time::Instant::now() + until(stop), 0, 0, 0);
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
                let (limit, period) = (quotas[0].limit(), micros(quotas[0].period()));
                println!("learned {limit} {period}");
            }
        }
    }
    // One write: the workers share the parent's stderr, and a line must not be split.
    let line = format!("worker {id}: {sent} requests, {refused} answered 429\n");
    std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes())?;
    Ok(())
}

fn now_micros() -> u64 {
    micros(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// How long until `at` (µs since the Unix epoch); zero if it has passed.
fn until(at: u64) -> Duration {
    Duration::from_micros(at.saturating_sub(now_micros()))
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
