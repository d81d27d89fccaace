//! The axum and tonic examples' command line, the store it picks and the layer on it.
//!
//! Without `--redis` / `--redis-cluster` / `--redis-sentinel` the server uses the Redis at
//! `REDIS_URL` (or `redis://127.0.0.1:6379`) when one answers, otherwise an in-memory store, and
//! says which. A client is its IP address; `--key api-key` keys on the `x-api-key` header (gRPC:
//! metadata) instead, only behind a layer that has authenticated it: unchecked, any client could
//! send a fresh key with each request and get a fresh quota with it.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::Duration;

use http::request::Parts;
use redlimit::failure_policy::{FailClosed, FailOpen, LocalFallback};
use redlimit::key::{HeaderKey, KeyExtractor, PeerIp};
use redlimit::store::{MemoryStore, RedisStore, RedisStoreBuilder};
use redlimit::{quota::QuotaError, Algorithm, Limiter, Quota, RateLimitLayer};

use super::flags::{self, invalid, redacted, CliError};

/// The help, and the flags it declares (`flags::read`); `METRICS` is `--metrics-bind` where the
/// example serves metrics.
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

/// `--metrics-bind`'s lines of the help.
const METRICS: &str =
    "  --metrics-bind ADDR           serve Prometheus metrics at http://ADDR/metrics
                                [default: no metrics]
";

/// What differs between the examples that share this command line.
pub struct Program {
    pub name: &'static str,
    pub default_bind: &'static str,
    /// A rejection while Redis fails, for `--on-redis-error`'s help ("503", "UNAVAILABLE").
    pub closed_answer: &'static str,
    pub serves_metrics: bool,
}

/// The parsed command line.
pub struct Options {
    pub bind: SocketAddr,
    #[allow(dead_code)] // read by the axum example only
    pub metrics_bind: Option<SocketAddr>,
    store: Option<Redis>,
    quota: Quota,
    algorithm: Algorithm,
    /// `--on-redis-error` as printed (`local (instances 3)`), and `--instances`.
    policy: (String, u64),
    api_key: bool,
    shadow: bool,
}

impl Program {
    /// The `--help` text, with this build's algorithms.
    pub fn usage(&self) -> String {
        let names: Vec<&str> = Algorithm::ALL.iter().map(Algorithm::name).collect();
        USAGE
            .replace("--example NAME", &format!("--example {}", self.name))
            .replace("BIND", self.default_bind)
            .replace("CLOSED", self.closed_answer)
            .replace("METRICS", if self.serves_metrics { METRICS } else { "" })
            .replace("ALGORITHMS", &names.join(", "))
    }

    /// The options from the process's arguments, or what to exit with.
    pub fn options(&self) -> Result<Options, std::process::ExitCode> {
        let usage = self.usage();
        flags::or_exit(self.parse(&usage, std::env::args().skip(1)), &usage)
    }

    fn parse(
        &self,
        usage: &str,
        args: impl IntoIterator<Item = String>,
    ) -> Result<Options, CliError> {
        let given = flags::read(usage, args)?;
        if let Some(plain) = given.plain.first() {
            return Err(invalid(format!("unknown argument {plain:?} (see --help)")));
        }
        let limit = given.count("--limit", 10)?;
        let period = given.duration("--period", Duration::from_secs(60))?;
        let quota = Quota::new(limit, period).map_err(|e| match e {
            QuotaError::ZeroPeriod | QuotaError::PeriodTooLong => invalid(format!("--period: {e}")),
            _ => invalid(format!("--limit: {e}")),
        })?;
        let burst = given.count("--burst", limit)?;
        let quota = quota
            .with_burst(burst)
            .map_err(|e| invalid(format!("--burst: {e}")))?;
        let algorithm: Algorithm = given.parsed("--algorithm", "token-bucket")?;
        // A quota the algorithm refuses would make the layer deny every request.
        let supported = algorithm.supports(&quota);
        supported
            .map_err(|e| invalid(format!("--limit/--burst for --algorithm {algorithm}: {e}")))?;
        let instances = given.count("--instances", 1)?;
        let policy = match given.get("--on-redis-error").unwrap_or("open") {
            "local" => (format!("local (instances {instances})"), instances),
            _ if given.has("--instances") => {
                return Err(invalid(
                    "--instances applies only to --on-redis-error local",
                ))
            }
            policy @ ("open" | "closed") => (policy.to_owned(), 0),
            other => Err(invalid(format!(
                "--on-redis-error: expected open, closed or local, got {other:?}"
            )))?,
        };
        let api_key = match given.get("--key").unwrap_or("ip") {
            "ip" => false,
            "api-key" => true,
            other => Err(invalid(format!(
                "--key: expected ip or api-key, got {other:?}"
            )))?,
        };
        let metrics_bind = given
            .get("--metrics-bind")
            .map(|_| given.parsed("--metrics-bind", ""));
        Ok(Options {
            bind: given.parsed("--bind", self.default_bind)?,
            metrics_bind: metrics_bind.transpose()?,
            store: store(&given, &policy.0)?,
            quota,
            algorithm,
            policy,
            api_key,
            shadow: given.has("--shadow"),
        })
    }
}

/// The Redis the store flags name.
struct Redis {
    flag: &'static str,
    urls: Vec<String>,
    master: String,
    ca: Option<Vec<u8>>,
    /// What `store: ...` says: `KIND URLS` without passwords.
    shown: String,
    /// What to warn while it does not answer.
    warning: Option<String>,
}

impl Redis {
    /// The store's builder; built twice: checked at parse time, then built for the layer after
    /// the metrics recorder is installed (the store records its circuit's state when built).
    fn builder(&self) -> RedisStoreBuilder {
        let urls = self.urls.iter().map(String::as_str);
        let builder = match self.flag {
            "--redis" => RedisStore::builder(self.urls[0].as_str()),
            "--redis-cluster" => RedisStore::cluster_builder(urls),
            _ => RedisStore::sentinel_builder(urls, self.master.as_str()),
        };
        match &self.ca {
            Some(pem) => builder.tls_ca_pem(pem.clone()),
            None => builder,
        }
    }
}

/// The Redis the flags name, checked the way the store checks it (nothing connected yet).
fn store(given: &flags::Given, policy: &str) -> Result<Option<Redis>, CliError> {
    let named = ["--redis", "--redis-cluster", "--redis-sentinel"].map(|f| given.get(f));
    let (flag, list) = match (named, given.get("--sentinel-master")) {
        ([None, None, None], None) if given.has("--redis-ca") => Err(invalid(
            "--redis-ca needs --redis rediss://..., --redis-cluster rediss://... or \
             --redis-sentinel rediss://...",
        ))?,
        ([None, None, None], None) => return Ok(None),
        ([Some(url), None, None], None) => ("--redis", url),
        ([None, Some(urls), None], None) => ("--redis-cluster", urls),
        ([None, None, Some(urls)], Some(_)) => ("--redis-sentinel", urls),
        ([None, None, Some(_)], None) => Err(invalid(
            "--redis-sentinel needs --sentinel-master NAME (the name the sentinels monitor the \
             primary under)",
        ))?,
        ([None, None, None], Some(_)) => Err(invalid(
            "--sentinel-master needs --redis-sentinel URL,URL,... (the sentinels)",
        ))?,
        _ => Err(invalid(
            "give one of --redis, --redis-cluster and --redis-sentinel, once",
        ))?,
    };
    let urls: Vec<String> = match flag {
        "--redis" => vec![list.to_owned()],
        _ => list
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect(),
    };
    if urls.is_empty() {
        return Err(invalid(format!("{flag} needs at least one URL")));
    }
    let shown = urls
        .iter()
        .map(|u| redacted(u))
        .collect::<Vec<_>>()
        .join(",");
    let master = given
        .get("--sentinel-master")
        .unwrap_or_default()
        .to_owned();
    let warning = match flag {
        "--redis" => Some(format!(
            "Redis at {shown} does not answer yet; --on-redis-error {policy} decides until it does"
        )),
        "--redis-cluster" => None,
        _ => Some(format!(
            "no primary named {master} reachable through the sentinels {shown} yet; \
             --on-redis-error {policy} decides until there is"
        )),
    };
    let ca = given.get("--redis-ca").map(read_ca).transpose()?;
    let shown = match master.as_str() {
        "" => format!("{} {shown}", &flag[2..]),
        master => format!("{} {shown} master {master}", &flag[2..]),
    };
    let redis = Redis {
        flag,
        urls,
        master,
        ca,
        shown,
        warning,
    };
    let checked = redis.builder().build();
    checked.map_err(|e| invalid(format!("{flag}: invalid {}: {e}", redis.shown)))?;
    Ok(Some(redis))
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

/// The layer the example puts in front of its service: prints `store: ...` and `quota: ...`.
pub async fn layer(options: &Options) -> Result<RateLimitLayer<ExampleKey>, String> {
    let builder = match &options.store {
        Some(redis) => {
            let store = redis.builder().build().map_err(|e| e.to_string())?;
            if !announce(&redis.shown, &store).await {
                redis
                    .warning
                    .iter()
                    .for_each(|warning| eprintln!("warning: {warning}"));
            }
            Limiter::builder(store)
        }
        None => {
            let url = flags::default_redis_url();
            if flags::redis_answers(&url).await {
                let store = RedisStore::new(url.as_str()).map_err(|e| e.to_string())?;
                announce(&format!("redis {}", redacted(&url)), &store).await;
                Limiter::builder(store)
            } else {
                println!("store: memory (no Redis reachable at {})", redacted(&url));
                Limiter::builder(MemoryStore::new())
            }
        }
    };
    let builder = builder.algorithm(options.algorithm);
    let limiter = match (options.policy.0.as_str(), options.policy.1) {
        ("open", _) => builder.failure_policy(FailOpen).build(),
        ("closed", _) => builder.failure_policy(FailClosed::default()).build(),
        (_, instances) => builder
            .failure_policy(LocalFallback::new(instances))
            .build(),
    };
    let (quota, algorithm, policy) = (options.quota, options.algorithm, &options.policy.0);
    println!(
        "quota: {} per {:?} (burst {}), algorithm {algorithm}, on-redis-error {policy}",
        quota.limit(),
        quota.period(),
        quota.burst(),
    );
    if options.shadow {
        println!("shadow: on (every request is decided and counted, none is denied)");
    }
    let key = ExampleKey {
        api_key: options
            .api_key
            .then(|| HeaderKey::named("x-api-key").expect("a header name")),
        ip: PeerIp::new(),
    };
    let layer = RateLimitLayer::builder(limiter.map_err(|e| e.to_string())?, quota, key);
    layer
        .shadow(options.shadow)
        .build()
        .map_err(|e| e.to_string())
}

/// Verifies the store (connect, PING, script load) and prints `store: SHOWN (Redis 7.0.15)` or
/// `store: SHOWN (not reachable yet: ...)`. Whether it answered.
async fn announce(shown: &str, store: &RedisStore) -> bool {
    let verified = store.verify().await;
    match &verified {
        Ok(server) => println!("store: {shown} ({server})"),
        Err(error) => println!("store: {shown} (not reachable yet: {error})"),
    }
    verified.is_ok()
}

/// `--key`: the `x-api-key` header (hashed) when chosen and sent, else the client's IP address.
#[derive(Debug, Clone)]
pub struct ExampleKey {
    api_key: Option<HeaderKey>,
    ip: PeerIp,
}

impl KeyExtractor for ExampleKey {
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        let api_key = self.api_key.as_ref().and_then(|key| key.extract(parts));
        api_key.or_else(|| self.ip.extract(parts))
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), coloured only on a terminal.
pub fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
