//! The example servers' command line and store selection.
//!
//! Flags take their value as the next argument or after `=` (`--limit 5`, `--limit=5`), once
//! each: a flag given twice is refused, never "the last one wins". Without
//! `--redis` / `--redis-cluster` / `--redis-sentinel` the server uses the Redis at `REDIS_URL` (or
//! `redis://127.0.0.1:6379`) when one answers, otherwise an in-memory store, and says which.
//!
//! A client is its IP address. `--key api-key` keys on the `x-api-key` header (gRPC: metadata)
//! instead, for a server behind a layer that has authenticated that header: unchecked, any
//! client could send a fresh key with each request and get a fresh quota with it.

use std::borrow::Cow;
use std::collections::HashSet;
use std::env;
use std::fmt;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use http::request::Parts;
use redlimit::key::{HeaderKey, KeyExtractor, PeerIp};
use redlimit::store::{MemoryStore, RedisStore, RedisStoreBuilder};
use redlimit::{
    failure_policy::{FailClosed, FailOpen, LocalFallback},
    quota::QuotaError,
    Algorithm, Limiter, Quota, RateLimitLayer,
};

/// What differs between the examples that share this command line.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// The example's name, as in `cargo run --example NAME`.
    pub name: &'static str,
    /// `--bind`'s default.
    pub default_bind: &'static str,
    /// What a rejection looks like, for `--on-redis-error`'s help ("503", "UNAVAILABLE").
    pub closed_answer: &'static str,
    /// Whether the example takes `--metrics-bind ADDR`.
    pub serves_metrics: bool,
}

const USAGE: &str = "\
usage: cargo run --example NAME -- [OPTIONS]

options:
  --bind ADDR                   address to listen on [default: BIND]
  --redis URL                   use this Redis, never the in-memory store
                                [default: $REDIS_URL or redis://127.0.0.1:6379 if it answers,
                                otherwise the in-memory store]
  --redis-cluster URL,URL,...   use this Redis Cluster (any of its nodes), never the
                                in-memory store
  --redis-sentinel URL,URL,...  use the primary these Redis Sentinels name (with
                                --sentinel-master), never the in-memory store
  --sentinel-master NAME        the name the sentinels monitor the primary under
                                (`sentinel monitor NAME ...`); needs --redis-sentinel
  --redis-ca FILE               trust this CA (PEM) for rediss:// URLs instead of the
                                system's roots
  --limit N                     requests per period and client [default: 10]
  --period DURATION             e.g. 500ms, 1s, 60s, 1m, 1h [default: 60s]
  --burst N                     requests allowed at once [default: the limit]
  --algorithm NAME              one of: ALGORITHMS [default: token-bucket]
  --on-redis-error POLICY       when Redis fails: open (admit), closed (answer CLOSED) or
                                local (an in-memory limiter with 1/N of each quota)
                                [default: open]
  --instances N                 with --on-redis-error local: how many instances share the
                                quota [default: 1]
  --key ip|api-key              who a client is: ip, its IP address; api-key, its x-api-key
                                header (gRPC: metadata), else its IP address. Use api-key only
                                behind a layer that has authenticated the key: unchecked, a
                                client sending a fresh key per request gets a fresh quota
                                [default: ip]
  --shadow                      shadow mode: decide and count every request, deny none (a
                                would-be denial is counted as shadow_limited; no RateLimit
                                headers)
METRICS  -h, --help                    print this help

A client is its IP address (--key ip), or its authenticated x-api-key (--key api-key).
Each flag is given at most once.";

/// The `--metrics-bind` line of the usage, for the examples that serve metrics.
const METRICS_USAGE: &str = concat!(
    "  --metrics-bind ADDR           serve Prometheus metrics at http://ADDR/metrics\n",
    "                                [default: no metrics]\n",
);

/// The Redis used when neither `--redis` nor `REDIS_URL` is given.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// How long the start-up probe waits for a Redis to answer PING.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// The parsed command line.
#[derive(Debug)]
pub struct Options {
    pub bind: SocketAddr,
    pub backend: Backend,
    /// `--redis-ca`: a private CA (PEM) for `rediss://`.
    pub redis_ca: Option<Vec<u8>>,
    /// `--metrics-bind`: where to serve `/metrics` (only examples with `serves_metrics`).
    #[allow(dead_code)] // read by the axum example only
    pub metrics_bind: Option<SocketAddr>,
    pub quota: Quota,
    pub algorithm: Algorithm,
    pub on_redis_error: OnRedisError,
    /// `--key`: who a client is.
    pub key: KeyChoice,
    /// `--shadow`: decide and count, never deny.
    pub shadow: bool,
}

/// `--key`: what the layer counts a client by.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum KeyChoice {
    /// `ip` (the default): the client's IP address, which a client cannot choose.
    #[default]
    Ip,
    /// `api-key`: the `x-api-key` header (hashed), else the IP address. Only for a server
    /// behind a layer that has authenticated the header.
    ApiKey,
}

/// Where decisions are made. A new Redis topology is one more variant here, its flag in
/// [`parse_args`] (through [`Backend::set`]) and its store in [`limiter`].
#[derive(Debug, PartialEq)]
pub enum Backend {
    /// No store flag: the Redis at `REDIS_URL` or the default URL if it answers, else memory.
    Auto,
    /// `--redis URL`: this Redis, whatever happens.
    Redis(String),
    /// `--redis-cluster URL,URL,...`: this Redis Cluster, whatever happens.
    Cluster(Vec<String>),
    /// `--redis-sentinel URL,URL,... --sentinel-master NAME`: the primary these sentinels name
    /// `master`, whatever happens.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

impl Backend {
    /// Sets the store flag's backend: only one store flag, given once.
    fn set(&mut self, backend: Backend) -> Result<(), CliError> {
        if *self != Backend::Auto {
            return Err(invalid(
                "give one of --redis, --redis-cluster and --redis-sentinel, once",
            ));
        }
        *self = backend;
        Ok(())
    }
}

/// `--on-redis-error`: the limiter's failure policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OnRedisError {
    /// `FailOpen`: admit.
    Open,
    /// `FailClosed`: reject (503, gRPC UNAVAILABLE).
    Closed,
    /// `LocalFallback::new(instances)`: an in-memory limiter with `1/instances` of each quota.
    Local { instances: u64 },
}

impl fmt::Display for OnRedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OnRedisError::Open => f.write_str("open"),
            OnRedisError::Closed => f.write_str("closed"),
            OnRedisError::Local { instances } => write!(f, "local (instances {instances})"),
        }
    }
}

/// What the command line asked for instead of running.
#[derive(Debug)]
pub enum CliError {
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

/// The options from the process's arguments; on `--help` or a bad flag, what to exit with
/// (after printing the usage, or the error on stderr).
pub fn options_or_exit(program: &Program) -> Result<Options, ExitCode> {
    match parse_args(program, env::args().skip(1)) {
        Ok(options) => Ok(options),
        Err(CliError::Help) => {
            println!("{}", usage(program));
            Err(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("error: {error}");
            Err(ExitCode::from(2))
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), without colour codes unless stderr
/// is a terminal.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Parses `args` (without the program name).
pub fn parse_args(
    program: &Program,
    args: impl IntoIterator<Item = String>,
) -> Result<Options, CliError> {
    let mut bind = program.default_bind.to_owned();
    let mut backend = Backend::Auto;
    let mut limit = 10;
    let mut period = Duration::from_secs(60);
    let mut burst = None;
    let mut algorithm = Algorithm::default();
    let mut policy = "open".to_owned();
    let mut instances = None;
    let mut redis_ca = None;
    let mut metrics_bind = None;
    let mut sentinel_master: Option<String> = None;
    let mut key = KeyChoice::default();
    let mut shadow = false;
    // A flag given twice is a mistake, not "the last one wins" (as in the fleet
    // example).
    let mut seen = HashSet::new();

    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Err(CliError::Help);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value.into())),
            _ => (arg, None),
        };
        if flag.starts_with("--") && !seen.insert(flag.clone()) {
            return Err(invalid(format!("give {flag} once")));
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| invalid(format!("{flag} needs a value (see --help)")))
        };
        match flag.as_str() {
            "--bind" => bind = value()?,
            "--shadow" if inline.is_none() => shadow = true,
            "--shadow" => return Err(invalid("--shadow takes no value")),
            "--redis-cluster" => backend.set(Backend::Cluster(parse_cluster_urls(&value()?)?))?,
            "--redis-sentinel" => {
                let sentinels = parse_url_list(&flag, &value()?)?;
                // The master name comes with its own flag; it is filled in after the loop.
                backend.set(Backend::Sentinel {
                    sentinels,
                    master: String::new(),
                })?;
            }
            "--sentinel-master" => {
                if sentinel_master.is_some() {
                    return Err(invalid("give --sentinel-master once"));
                }
                sentinel_master = Some(value()?);
            }
            "--redis" => {
                let url = value()?;
                redis::Client::open(url.as_str()).map_err(|e| {
                    invalid(format!("--redis: invalid URL {}: {e}", redacted(&url)))
                })?;
                backend.set(Backend::Redis(url))?;
            }
            "--redis-ca" => redis_ca = Some(read_ca(&value()?)?),
            "--metrics-bind" if program.serves_metrics => {
                metrics_bind = Some(parse_addr(&flag, &value()?)?)
            }
            "--limit" => limit = parse_count(&flag, &value()?)?,
            "--period" => period = parse_duration(&value()?)?,
            "--burst" => burst = Some(parse_count(&flag, &value()?)?),
            "--algorithm" => {
                algorithm = value()?
                    .parse()
                    .map_err(|e| invalid(format!("--algorithm: {e}")))?;
            }
            "--on-redis-error" => policy = value()?,
            "--instances" => instances = Some(parse_count(&flag, &value()?)?),
            "--key" => {
                key = match value()?.as_str() {
                    "ip" => KeyChoice::Ip,
                    "api-key" => KeyChoice::ApiKey,
                    other => {
                        return Err(invalid(format!(
                            "--key: expected ip or api-key, got {other:?}"
                        )))
                    }
                }
            }
            other => return Err(invalid(format!("unknown argument {other:?} (see --help)"))),
        }
    }

    let on_redis_error = match (policy.as_str(), instances) {
        ("local", instances) => OnRedisError::Local {
            instances: instances.unwrap_or(1),
        },
        ("open" | "closed", Some(_)) => {
            return Err(invalid(
                "--instances applies only to --on-redis-error local",
            ))
        }
        ("open", None) => OnRedisError::Open,
        ("closed", None) => OnRedisError::Closed,
        (other, _) => {
            return Err(invalid(format!(
                "--on-redis-error: expected open, closed or local, got {other:?}"
            )))
        }
    };
    let bind = parse_addr("--bind", &bind)?;
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
    match (&mut backend, sentinel_master) {
        (Backend::Sentinel { sentinels, master }, Some(name)) => {
            check_sentinel(sentinels, &name)?;
            *master = name;
        }
        (Backend::Sentinel { .. }, None) => {
            return Err(invalid(
                "--redis-sentinel needs --sentinel-master NAME (the name the sentinels monitor \
                 the primary under)",
            ))
        }
        (_, Some(_)) => {
            return Err(invalid(
                "--sentinel-master needs --redis-sentinel URL,URL,... (the sentinels)",
            ))
        }
        (_, None) => {}
    }
    if redis_ca.is_some() && backend == Backend::Auto {
        return Err(invalid(
            "--redis-ca needs --redis rediss://..., --redis-cluster rediss://... or \
             --redis-sentinel rediss://...",
        ));
    }
    Ok(Options {
        bind,
        backend,
        redis_ca,
        metrics_bind,
        quota,
        algorithm,
        on_redis_error,
        key,
        shadow,
    })
}

/// `flag`'s comma-separated URLs, at least one.
fn parse_url_list(flag: &str, value: &str) -> Result<Vec<String>, CliError> {
    let urls: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(invalid(format!("{flag} needs at least one URL")));
    }
    Ok(urls)
}

/// `--redis-sentinel`'s URLs and `--sentinel-master`'s name, checked the way the store checks
/// them (URLs, same credentials and scheme for every sentinel, a name).
fn check_sentinel(sentinels: &[String], master: &str) -> Result<(), CliError> {
    RedisStore::sentinel_builder(sentinels.iter().map(String::as_str), master)
        .build()
        .map_err(|e| {
            invalid(format!(
                "--redis-sentinel {} --sentinel-master {master:?}: {e}",
                shown_urls(sentinels)
            ))
        })?;
    Ok(())
}

/// URLs without their passwords, comma-separated, for printing.
fn shown_urls(urls: &[String]) -> String {
    let shown: Vec<String> = urls.iter().map(|u| redacted(u)).collect();
    shown.join(",")
}

/// `--redis-cluster`'s comma-separated node URLs, checked.
fn parse_cluster_urls(value: &str) -> Result<Vec<String>, CliError> {
    let urls = parse_url_list("--redis-cluster", value)?;
    RedisStore::cluster_builder(urls.iter().map(String::as_str))
        .build()
        .map_err(|e| {
            let shown: Vec<String> = urls.iter().map(|u| redacted(u)).collect();
            invalid(format!(
                "--redis-cluster: invalid URLs {}: {e}",
                shown.join(",")
            ))
        })?;
    Ok(urls)
}

/// `--redis-ca`'s file: a PEM certificate.
fn read_ca(path: &str) -> Result<Vec<u8>, CliError> {
    let pem =
        std::fs::read(path).map_err(|e| invalid(format!("--redis-ca: cannot read {path}: {e}")))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid(format!(
            "--redis-ca: {path} holds no PEM certificate"
        )));
    }
    Ok(pem)
}

/// An address like `127.0.0.1:3000`.
fn parse_addr(flag: &str, value: &str) -> Result<SocketAddr, CliError> {
    value.parse().map_err(|_| {
        invalid(format!(
            "{flag}: {value:?} is not an address like 127.0.0.1:3000"
        ))
    })
}

/// A count of at least 1.
pub fn parse_count(flag: &str, value: &str) -> Result<u64, CliError> {
    match value.parse::<u64>() {
        Ok(0) => Err(invalid(format!("{flag} must be at least 1"))),
        Ok(n) => Ok(n),
        Err(_) => Err(invalid(format!("{flag}: {value:?} is not a whole number"))),
    }
}

/// `500ms`, `1s`, `60s`, `1m`, `1h`: a whole number and a unit.
fn parse_duration(value: &str) -> Result<Duration, CliError> {
    parse_duration_of("--period", value)
}

/// [`parse_duration`]'s format for any flag or argument: `what` names it in the error.
/// Zero is a valid duration here; callers that refuse it say so.
pub fn parse_duration_of(what: &str, value: &str) -> Result<Duration, CliError> {
    let bad = || {
        invalid(format!(
            "{what}: {value:?} is not a duration like 500ms, 1s, 60s, 1m or 1h"
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

/// The usage text, with this build's algorithms.
pub fn usage(program: &Program) -> String {
    let names: Vec<&str> = Algorithm::ALL.iter().map(Algorithm::name).collect();
    USAGE
        .replace("--example NAME", &format!("--example {}", program.name))
        .replace("BIND", program.default_bind)
        .replace("CLOSED", program.closed_answer)
        .replace(
            "METRICS",
            if program.serves_metrics {
                METRICS_USAGE
            } else {
                ""
            },
        )
        .replace("ALGORITHMS", &names.join(", "))
}

/// The client's `x-api-key` header (hashed) when it sends one, else its IP address: for a
/// server behind a layer that has authenticated the header (`--key api-key`).
#[derive(Debug, Clone)]
pub struct ApiKeyOrIp {
    api_key: HeaderKey,
    ip: PeerIp,
}

impl ApiKeyOrIp {
    pub fn new() -> Self {
        ApiKeyOrIp {
            api_key: HeaderKey::named("x-api-key").expect("a valid header name"),
            ip: PeerIp::new(),
        }
    }
}

impl KeyExtractor for ApiKeyOrIp {
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        self.api_key
            .extract(parts)
            .or_else(|| self.ip.extract(parts))
    }
}

/// The key `--key` chose.
#[derive(Debug, Clone)]
pub enum ExampleKey {
    /// `--key ip`.
    Ip(PeerIp),
    /// `--key api-key`.
    ApiKey(ApiKeyOrIp),
}

impl ExampleKey {
    pub fn new(choice: KeyChoice) -> Self {
        match choice {
            KeyChoice::Ip => ExampleKey::Ip(PeerIp::new()),
            KeyChoice::ApiKey => ExampleKey::ApiKey(ApiKeyOrIp::new()),
        }
    }
}

impl KeyExtractor for ExampleKey {
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        match self {
            ExampleKey::Ip(ip) => ip.extract(parts),
            ExampleKey::ApiKey(api_key) => api_key.extract(parts),
        }
    }

    // Forwarded: `PeerIp` builds its key on the stack.
    fn with_key<R>(&self, parts: &Parts, f: impl FnOnce(Option<&str>) -> R) -> R
    where
        Self: Sized,
    {
        match self {
            ExampleKey::Ip(ip) => ip.with_key(parts, f),
            ExampleKey::ApiKey(api_key) => api_key.with_key(parts, f),
        }
    }
}

/// The layer the example puts in front of its service, on the chosen store: prints `store: ...`
/// and `quota: ...`.
pub async fn layer(options: &Options) -> Result<RateLimitLayer<ExampleKey>, String> {
    let limiter = limiter(options).await?;
    let quota = options.quota;
    println!(
        "quota: {} per {:?} (burst {}), algorithm {}, on-redis-error {}",
        quota.limit(),
        quota.period(),
        quota.burst(),
        options.algorithm,
        options.on_redis_error,
    );
    if options.shadow {
        println!("shadow: on (every request is decided and counted, none is denied)");
    }
    RateLimitLayer::builder(limiter, quota, ExampleKey::new(options.key))
        .shadow(options.shadow)
        .build()
        .map_err(|e| e.to_string())
}

/// The Redis to try when no store flag is given: `REDIS_URL`, or [`DEFAULT_REDIS_URL`].
pub fn default_redis_url() -> String {
    env::var("REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned())
}

/// Whether a Redis at `url` answers PING within [`PROBE_TIMEOUT`].
pub async fn redis_answers(url: &str) -> bool {
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
pub fn redacted(url: &str) -> String {
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
                eprintln!(
                    "warning: Redis at {} does not answer yet; --on-redis-error {} decides \
                     until it does",
                    redacted(url),
                    options.on_redis_error
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
        Backend::Sentinel { sentinels, master } => {
            let shown = shown_urls(sentinels);
            let store = with_ca(
                RedisStore::sentinel_builder(sentinels.iter().map(String::as_str), master.as_str()),
                ca,
            )
            .build()
            .map_err(|e| format!("invalid Redis Sentinel setup {shown} master {master}: {e}"))?;
            if !announce(
                "redis-sentinel",
                &format!("{shown} master {master}"),
                &store,
            )
            .await
            {
                eprintln!(
                    "warning: no primary named {master} reachable through the sentinels {shown} \
                     yet; --on-redis-error {} decides until there is",
                    options.on_redis_error
                );
            }
            Limiter::builder(store)
        }
        Backend::Auto => {
            let url = default_redis_url();
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
    let builder = match options.on_redis_error {
        OnRedisError::Open => builder.failure_policy(FailOpen),
        OnRedisError::Closed => builder.failure_policy(FailClosed::default()),
        OnRedisError::Local { instances } => builder.failure_policy(LocalFallback::new(instances)),
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
