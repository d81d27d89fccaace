//! An axum server rate-limited by redlimit: the first thing to run.
//!
//! ```text
//! cargo run --example axum -- [--bind ADDR] [--redis URL] [--limit N] [--period DURATION]
//!     [--burst N] [--algorithm NAME] [--on-redis-error open|closed]
//!     [--redis-cluster URL,URL,...] [--redis-ca FILE]
//! ```
//!
//! Each client gets `--limit` requests per `--period`: a client is its `x-api-key` header when it
//! sends one (hashed before it reaches Redis), else its IP address. `GET /` answers `200 ok`, or
//! `429` with `Retry-After` and the `RateLimit` headers once the client is over its quota.
//!
//! Without `--redis` the server uses the Redis at `REDIS_URL` (or `redis://127.0.0.1:6379`) when
//! one answers, otherwise an in-memory store, and says which. With `--redis` it always uses that
//! Redis: if it is down, `--on-redis-error` decides (`open` admits, `closed` answers 503).
//! `--redis-cluster` does the same on a Redis Cluster reached through any of its nodes.
//! `rediss://` URLs use TLS; `--redis-ca FILE` trusts a private CA (PEM) instead of the system's.
//! At start the server verifies the store (connect, `PING`, script load) and prints
//! `store: redis URL (Redis 7.0.15)`, or `store: redis URL (not reachable yet: ...)` and starts
//! anyway.
//!
//! ```text
//! $ cargo run --example axum -- --limit 3 --period 1m
//! $ for i in 1 2 3 4; do curl -si localhost:3000/ | head -1; done
//! ```

use std::borrow::Cow;
use std::env;
use std::fmt;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::{routing::get, Router};
use http::request::Parts;
use redlimit::key::{HeaderKey, KeyExtractor, PeerIp};
use redlimit::store::{MemoryStore, RedisStore, RedisStoreBuilder};
use redlimit::{Algorithm, FailClosed, FailOpen, Limiter, Quota, QuotaError, RateLimitLayer};

const USAGE: &str = "\
usage: cargo run --example axum -- [OPTIONS]

options:
  --bind ADDR                   address to listen on [default: 127.0.0.1:3000]
  --redis URL                   use this Redis, never the in-memory store
                                [default: $REDIS_URL or redis://127.0.0.1:6379 if it answers,
                                otherwise the in-memory store]
  --redis-cluster URL,URL,...   use this Redis Cluster (any of its nodes), never the
                                in-memory store
  --redis-ca FILE               trust this CA (PEM) for rediss:// URLs instead of the
                                system's roots
  --limit N                     requests per period and client [default: 10]
  --period DURATION             e.g. 500ms, 1s, 60s, 1m, 1h [default: 60s]
  --burst N                     requests allowed at once [default: the limit]
  --algorithm NAME              one of: ALGORITHMS [default: token-bucket]
  --on-redis-error open|closed  when Redis fails: admit (open) or answer 503 (closed)
                                [default: open]
  -h, --help                    print this help

A client is its x-api-key header when present, else its IP address.";

/// The Redis the example falls back on when neither `--redis` nor `REDIS_URL` is given.
const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// How long the start-up probe waits for a Redis to answer PING.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// The parsed command line.
#[derive(Debug)]
struct Options {
    bind: SocketAddr,
    backend: Backend,
    /// `--redis-ca`: a private CA (PEM) for `rediss://`.
    redis_ca: Option<Vec<u8>>,
    quota: Quota,
    algorithm: Algorithm,
    fail_closed: bool,
}

/// Where decisions are made.
#[derive(Debug, PartialEq)]
enum Backend {
    /// No store flag: the Redis at `REDIS_URL` or the default URL if it answers, else memory.
    Auto,
    /// `--redis URL`: this Redis, whatever happens.
    Redis(String),
    /// `--redis-cluster URL,URL,...`: this Redis Cluster, whatever happens.
    Cluster(Vec<String>),
}

/// What the command line asked for instead of running.
#[derive(Debug)]
enum CliError {
    Help,
    Invalid(String),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Help => f.write_str("help requested"),
            CliError::Invalid(message) => f.write_str(message),
        }
    }
}

fn invalid(message: impl Into<String>) -> CliError {
    CliError::Invalid(message.into())
}

/// Parses `args` (without the program name). Flags take their value as the next argument or
/// after `=` (`--limit 5`, `--limit=5`).
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Options, CliError> {
    let mut bind = "127.0.0.1:3000".to_owned();
    let mut backend = Backend::Auto;
    let mut limit = 10;
    let mut period = Duration::from_secs(60);
    let mut burst = None;
    let mut algorithm = Algorithm::default();
    let mut fail_closed = false;
    let mut redis_ca = None;

    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Err(CliError::Help);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value.into())),
            _ => (arg, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| invalid(format!("{flag} needs a value (see --help)")))
        };
        match flag.as_str() {
            "--bind" => bind = value()?,
            "--redis-cluster" => {
                if backend != Backend::Auto {
                    return Err(invalid("give one of --redis and --redis-cluster, once"));
                }
                let urls: Vec<String> = value()?
                    .split(',')
                    .map(str::trim)
                    .filter(|url| !url.is_empty())
                    .map(str::to_owned)
                    .collect();
                if urls.is_empty() {
                    return Err(invalid("--redis-cluster needs at least one URL"));
                }
                RedisStore::cluster_builder(urls.iter().map(String::as_str))
                    .build()
                    .map_err(|e| {
                        let shown: Vec<String> = urls.iter().map(|u| redacted(u)).collect();
                        invalid(format!(
                            "--redis-cluster: invalid URLs {}: {e}",
                            shown.join(",")
                        ))
                    })?;
                backend = Backend::Cluster(urls);
            }
            "--redis" => {
                if backend != Backend::Auto {
                    return Err(invalid("give one of --redis and --redis-cluster, once"));
                }
                let url = value()?;
                redis::Client::open(url.as_str()).map_err(|e| {
                    invalid(format!("--redis: invalid URL {}: {e}", redacted(&url)))
                })?;
                backend = Backend::Redis(url);
            }
            "--redis-ca" => {
                let path = value()?;
                let pem = std::fs::read(&path)
                    .map_err(|e| invalid(format!("--redis-ca: cannot read {path}: {e}")))?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err(invalid(format!(
                        "--redis-ca: {path} holds no PEM certificate"
                    )));
                }
                redis_ca = Some(pem);
            }
            "--limit" => limit = parse_count(&flag, &value()?)?,
            "--period" => period = parse_duration(&value()?)?,
            "--burst" => burst = Some(parse_count(&flag, &value()?)?),
            "--algorithm" => {
                algorithm = value()?
                    .parse()
                    .map_err(|e| invalid(format!("--algorithm: {e}")))?;
            }
            "--on-redis-error" => {
                fail_closed = match value()?.as_str() {
                    "open" => false,
                    "closed" => true,
                    other => {
                        return Err(invalid(format!(
                            "--on-redis-error: expected open or closed, got {other:?}"
                        )))
                    }
                };
            }
            other => return Err(invalid(format!("unknown argument {other:?} (see --help)"))),
        }
    }

    let bind = bind.parse().map_err(|_| {
        invalid(format!(
            "--bind: {bind:?} is not an address like 127.0.0.1:3000"
        ))
    })?;
    let quota = Quota::new(limit, period).map_err(|e| match e {
        QuotaError::ZeroPeriod | QuotaError::PeriodTooLong => invalid(format!("--period: {e}")),
        _ => invalid(format!("--limit: {e}")),
    })?;
    let quota = match burst {
        Some(burst) => quota
            .with_burst(burst)
            .map_err(|e| invalid(format!("--burst: {e}")))?,
        None => quota,
    };
    // A quota the algorithm refuses would make the layer deny every request: a usage error.
    algorithm
        .supports(&quota)
        .map_err(|e| invalid(format!("--limit/--burst for --algorithm {algorithm}: {e}")))?;
    if redis_ca.is_some() && backend == Backend::Auto {
        return Err(invalid(
            "--redis-ca needs --redis rediss://... or --redis-cluster rediss://...",
        ));
    }
    Ok(Options {
        bind,
        backend,
        redis_ca,
        quota,
        algorithm,
        fail_closed,
    })
}

/// A count of at least 1.
fn parse_count(flag: &str, value: &str) -> Result<u64, CliError> {
    match value.parse::<u64>() {
        Ok(0) => Err(invalid(format!("{flag} must be at least 1"))),
        Ok(n) => Ok(n),
        Err(_) => Err(invalid(format!(
            "{flag}: {value:?} is not a whole number of requests"
        ))),
    }
}

/// `500ms`, `1s`, `60s`, `1m`, `1h`: a whole number and a unit.
fn parse_duration(value: &str) -> Result<Duration, CliError> {
    let bad = || {
        invalid(format!(
            "--period: {value:?} is not a duration like 500ms, 1s, 60s, 1m or 1h"
        ))
    };
    let digits = value.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = value.split_at(digits);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let millis_per_unit = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    let millis = number.checked_mul(millis_per_unit).ok_or_else(bad)?;
    Ok(Duration::from_millis(millis))
}

/// The client's `x-api-key` header (hashed) when it sends one, else its IP address.
#[derive(Debug, Clone)]
struct ApiKeyOrIp {
    api_key: HeaderKey,
    ip: PeerIp,
}

impl KeyExtractor for ApiKeyOrIp {
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        self.api_key
            .extract(parts)
            .or_else(|| self.ip.extract(parts))
    }
}

/// Whether a Redis at `url` answers PING within [`PROBE_TIMEOUT`].
async fn redis_answers(url: &str) -> bool {
    let ping = async {
        let client = redis::Client::open(url)?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
    };
    matches!(tokio::time::timeout(PROBE_TIMEOUT, ping).await, Ok(Ok(_)))
}

/// `url` without its password, for printing.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// Builds the limiter on the chosen store and says which one it is.
async fn limiter(options: &Options) -> Result<Limiter, String> {
    let ca = options.redis_ca.as_deref();
    let builder = match &options.backend {
        Backend::Redis(url) => {
            let store = with_ca(RedisStore::builder(url.as_str()), ca)
                .build()
                .map_err(|e| format!("invalid Redis URL {}: {e}", redacted(url)))?;
            if !announce("redis", &redacted(url), &store).await {
                let policy = if options.fail_closed {
                    "closed"
                } else {
                    "open"
                };
                eprintln!(
                    "warning: Redis at {} does not answer yet; --on-redis-error {policy} decides \
                     until it does",
                    redacted(url)
                );
            }
            Limiter::builder(store)
        }
        Backend::Cluster(urls) => {
            let shown: Vec<String> = urls.iter().map(|u| redacted(u)).collect();
            let store = with_ca(
                RedisStore::cluster_builder(urls.iter().map(String::as_str)),
                ca,
            )
            .build()
            .map_err(|e| format!("invalid Redis Cluster URLs {}: {e}", shown.join(",")))?;
            announce("redis-cluster", &shown.join(","), &store).await;
            Limiter::builder(store)
        }
        Backend::Auto => {
            let url = env::var("REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned());
            if redis_answers(&url).await {
                let store = RedisStore::new(url.as_str())
                    .map_err(|e| format!("invalid Redis URL {}: {e}", redacted(&url)))?;
                announce("redis", &redacted(&url), &store).await;
                Limiter::builder(store)
            } else {
                println!("store: memory (no Redis reachable at {})", redacted(&url));
                Limiter::builder(MemoryStore::new())
            }
        }
    };
    let builder = builder.algorithm(options.algorithm);
    let builder = if options.fail_closed {
        builder.failure_policy(FailClosed::default())
    } else {
        builder.failure_policy(FailOpen)
    };
    builder.build().map_err(|e| e.to_string())
}

/// `builder` trusting `ca` (PEM) for TLS, when given.
fn with_ca(builder: RedisStoreBuilder, ca: Option<&[u8]>) -> RedisStoreBuilder {
    match ca {
        Some(pem) => builder.tls_ca_pem(pem),
        None => builder,
    }
}

/// Verifies the store (connect, PING, script load) and prints
/// `store: KIND SHOWN (Redis 7.0.15)` or `store: KIND SHOWN (not reachable yet: ...)`.
/// Whether it is reachable.
async fn announce(kind: &str, shown: &str, store: &RedisStore) -> bool {
    match store.verify().await {
        Ok(server) => {
            println!("store: {kind} {shown} ({server})");
            true
        }
        Err(error) => {
            println!("store: {kind} {shown} (not reachable yet: {error})");
            false
        }
    }
}

fn usage() -> String {
    let names: Vec<&str> = Algorithm::ALL.iter().map(Algorithm::name).collect();
    USAGE.replace("ALGORITHMS", &names.join(", "))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let options = match parse_args(env::args().skip(1)) {
        Ok(options) => options,
        Err(CliError::Help) => {
            println!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    match run(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: Options) -> Result<(), String> {
    let limiter = limiter(&options).await?;
    let quota = options.quota;
    println!(
        "quota: {} per {:?} (burst {}), algorithm {}, on-redis-error {}",
        quota.limit(),
        quota.period(),
        quota.burst(),
        options.algorithm,
        if options.fail_closed {
            "closed"
        } else {
            "open"
        },
    );
    let extractor = ApiKeyOrIp {
        api_key: HeaderKey::named("x-api-key").expect("a valid header name"),
        ip: PeerIp::new(),
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter, quota, extractor));

    let listener = tokio::net::TcpListener::bind(options.bind)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", options.bind))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on {local}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;

    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| e.to_string())
}
