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
    store: Store,
    redis_ca: Option<Vec<u8>>,
    quota: Quota,
    algorithm: Algorithm,
    on_error: (&'static str, u64),
    api_key: bool,
    shadow: bool,
}

impl Options {
    /// `--on-redis-error` as printed: `open`, `closed`, `local (instances N)`.
    fn policy(&self) -> String {
        match self.on_error {
            ("local", instances) => format!("local (instances {instances})"),
            (policy, _) => policy.to_owned(),
        }
    }
}

/// Which Redis, if any, the flags named: kind (as printed), URLs, sentinel master.
type Store = Option<(&'static str, Vec<String>, String)>;

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
        algorithm
            .supports(&quota)
            .map_err(|e| invalid(format!("--limit/--burst for --algorithm {algorithm}: {e}")))?;
        let on_error = match (
            given.get("--on-redis-error").unwrap_or("open"),
            given.has("--instances"),
        ) {
            ("local", _) => ("local", given.count("--instances", 1)?),
            ("open" | "closed", true) => {
                return Err(invalid(
                    "--instances applies only to --on-redis-error local",
                ))
            }
            (policy @ ("open" | "closed"), false) => {
                (if policy == "open" { "open" } else { "closed" }, 0)
            }
            (other, _) => {
                return Err(invalid(format!(
                    "--on-redis-error: expected open, closed or local, got {other:?}"
                )))
            }
        };
        let api_key = match given.get("--key").unwrap_or("ip") {
            "ip" => false,
            "api-key" => true,
            other => {
                return Err(invalid(format!(
                    "--key: expected ip or api-key, got {other:?}"
                )))
            }
        };
        let store = store(&given)?;
        let redis_ca = match given.get("--redis-ca") {
            None => None,
            Some(_) if store.is_none() => return Err(invalid("--redis-ca needs --redis rediss://..., --redis-cluster rediss://... or --redis-sentinel rediss://...")),
            Some(path) => Some(read_ca(path)?),
        };
        let metrics_bind = given
            .get("--metrics-bind")
            .map(|_| given.parsed("--metrics-bind", ""))
            .transpose()?;
        Ok(Options {
            bind: given.parsed("--bind", self.default_bind)?,
            metrics_bind,
            store,
            redis_ca,
            quota,
            algorithm,
            on_error,
            api_key,
            shadow: given.has("--shadow"),
        })
    }
}

/// The store flags, checked the way the store builders check them.
fn store(given: &flags::Given) -> Result<Store, CliError> {
    let named = ["--redis", "--redis-cluster", "--redis-sentinel"].map(|f| given.get(f));
    let master = given.get("--sentinel-master");
    let urls = |flag: &str, value: &str| {
        let urls: Vec<String> = value
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        match urls.is_empty() {
            true => Err(invalid(format!("{flag} needs at least one URL"))),
            false => Ok(urls),
        }
    };
    let check = |flag: &str, builder: RedisStoreBuilder, urls: &[String]| {
        builder
            .build()
            .map(|_| ())
            .map_err(|e| invalid(format!("{flag}: invalid URL {}: {e}", shown(urls))))
    };
    let store = match (named, master) {
        ([None, None, None], None) => return Ok(None),
        ([Some(url), None, None], None) => {
            let urls = vec![url.to_owned()];
            check("--redis", RedisStore::builder(url), &urls)?;
            ("redis", urls, String::new())
        }
        ([None, Some(list), None], None) => {
            let urls = urls("--redis-cluster", list)?;
            check("--redis-cluster", RedisStore::cluster_builder(urls.iter().map(String::as_str)), &urls)?;
            ("redis-cluster", urls, String::new())
        }
        ([None, None, Some(list)], Some(master)) => {
            let urls = urls("--redis-sentinel", list)?;
            check("--redis-sentinel", RedisStore::sentinel_builder(urls.iter().map(String::as_str), master), &urls)?;
            ("redis-sentinel", urls, master.to_owned())
        }
        ([None, None, Some(_)], None) => return Err(invalid("--redis-sentinel needs --sentinel-master NAME (the name the sentinels monitor the primary under)")),
        ([None, None, None], Some(_)) => return Err(invalid("--sentinel-master needs --redis-sentinel URL,URL,... (the sentinels)")),
        _ => return Err(invalid("give one of --redis, --redis-cluster and --redis-sentinel, once")),
    };
    Ok(Some(store))
}

/// `--redis-ca`'s file: a PEM certificate.
fn read_ca(path: &str) -> Result<Vec<u8>, CliError> {
    let pem =
        std::fs::read(path).map_err(|e| invalid(format!("--redis-ca: cannot read {path}: {e}")))?;
    match String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        true => Ok(pem),
        false => Err(invalid(format!(
            "--redis-ca: {path} holds no PEM certificate"
        ))),
    }
}

/// URLs without their passwords, comma-separated, for printing.
fn shown(urls: &[String]) -> String {
    urls.iter()
        .map(|u| redacted(u))
        .collect::<Vec<_>>()
        .join(",")
}

/// The layer the example puts in front of its service: prints `store: ...` and `quota: ...`.
pub async fn layer(options: &Options) -> Result<RateLimitLayer<ExampleKey>, String> {
    let builder = match &options.store {
        Some((kind, urls, master)) => {
            let builder = match *kind {
                "redis" => RedisStore::builder(urls[0].as_str()),
                "redis-cluster" => RedisStore::cluster_builder(urls.iter().map(String::as_str)),
                _ => RedisStore::sentinel_builder(urls.iter().map(String::as_str), master.as_str()),
            };
            let builder = match &options.redis_ca {
                Some(pem) => builder.tls_ca_pem(pem.clone()),
                None => builder,
            };
            let store = builder.build().map_err(|e| e.to_string())?;
            let shown = match master.as_str() {
                "" => shown(urls),
                master => format!("{} master {master}", shown(urls)),
            };
            let policy = options.policy();
            match (announce(kind, &shown, &store).await, *kind) {
                (false, "redis") => eprintln!(
                    "warning: Redis at {shown} does not answer yet; --on-redis-error {policy} \
                     decides until it does"
                ),
                (false, "redis-sentinel") => eprintln!(
                    "warning: no primary named {master} reachable through the sentinels {} yet; \
                     --on-redis-error {policy} decides until there is",
                    self::shown(urls)
                ),
                _ => {}
            }
            Limiter::builder(store)
        }
        None => {
            let url = flags::default_redis_url();
            if flags::redis_answers(&url).await {
                let store = RedisStore::new(url.as_str()).map_err(|e| e.to_string())?;
                announce("redis", &redacted(&url), &store).await;
                Limiter::builder(store)
            } else {
                println!("store: memory (no Redis reachable at {})", redacted(&url));
                Limiter::builder(MemoryStore::new())
            }
        }
    };
    let builder = builder.algorithm(options.algorithm);
    let limiter = match options.on_error {
        ("open", _) => builder.failure_policy(FailOpen).build(),
        ("closed", _) => builder.failure_policy(FailClosed::default()).build(),
        (_, instances) => builder
            .failure_policy(LocalFallback::new(instances))
            .build(),
    }
    .map_err(|e| e.to_string())?;
    let quota = options.quota;
    println!(
        "quota: {} per {:?} (burst {}), algorithm {}, on-redis-error {}",
        quota.limit(),
        quota.period(),
        quota.burst(),
        options.algorithm,
        options.policy(),
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
    RateLimitLayer::builder(limiter, quota, key)
        .shadow(options.shadow)
        .build()
        .map_err(|e| e.to_string())
}

/// Verifies the store (connect, PING, script load) and prints `store: KIND SHOWN (Redis 7.0.15)`
/// or `store: KIND SHOWN (not reachable yet: ...)`. Whether it answered.
async fn announce(kind: &str, shown: &str, store: &RedisStore) -> bool {
    let verified = store.verify().await;
    match &verified {
        Ok(server) => println!("store: {kind} {shown} ({server})"),
        Err(error) => println!("store: {kind} {shown} (not reachable yet: {error})"),
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
