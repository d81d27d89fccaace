//! The axum and tonic examples' command line, the store it picks and the layer on it.
//!
//! Without `--redis` / `--redis-cluster` / `--redis-sentinel` the server uses the Redis at
//! `REDIS_URL` (or `redis://127.0.0.1:6379`) when one answers, otherwise an in-memory store, and
//! says which. A client is its IP address; `--key api-key` keys on the `x-api-key` header (gRPC:
//! metadata) instead, only behind a layer that has authenticated it: unchecked, any client could
//! send a fresh key with each request and get a fresh quota with it.

use std::borrow::Cow;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use http::request::Parts;
use redlimit::failure_policy::{FailClosed, FailOpen, LocalFallback};
use redlimit::key::{FnKey, HeaderKey, KeyExtractor, PeerIp};
use redlimit::store::{MemoryStore, RedisStore};
use redlimit::{Algorithm, Limiter, Quota, RateLimitLayer};

use super::flags::{self, invalid, redacted, CliError, Given};
use super::store;

/// The help, and the flags it declares (`flags::read`); `METRICS` is `--metrics-bind` where the
/// example serves metrics.
const USAGE: &str = include_str!("server_usage.txt");

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
    /// The flags as given: the store is built from them again for the layer, after the metrics
    /// recorder is installed (a store records its circuit's state when built).
    given: Given,
    quota: Quota,
    algorithm: Algorithm,
    /// `--on-redis-error` as printed: `open`, `closed` or `local (instances N)`.
    policy: String,
    instances: u64,
    api_key: bool,
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

    /// The example's `main`: logging on, then `run` with the options from the process's
    /// arguments; the status to exit with.
    pub async fn main<F>(&self, run: impl FnOnce(Options) -> F) -> ExitCode
    where
        F: Future<Output = Result<(), String>>,
    {
        init_tracing();
        let usage = self.usage();
        flags::main(&usage, self.parse(&usage), run).await
    }

    fn parse(&self, usage: &str) -> Result<Options, CliError> {
        let given = flags::read(usage, std::env::args().skip(1))?;
        given.no_plain()?;
        let quota = given.quota(10, Duration::from_secs(60))?;
        let burst = given.count("--burst", quota.limit())?;
        let quota = quota
            .with_burst(burst)
            .map_err(|e| invalid(format!("--burst: {e}")))?;
        let algorithm: Algorithm = given.parsed("--algorithm", "token-bucket")?;
        // A quota the algorithm refuses would make the layer deny every request.
        let supported = algorithm.supports(&quota);
        supported
            .map_err(|e| invalid(format!("--limit/--burst for --algorithm {algorithm}: {e}")))?;
        let instances = given.count("--instances", 1)?;
        let policy = match given.one_of("--on-redis-error", &["open", "closed", "local"])? {
            "local" => format!("local (instances {instances})"),
            _ if given.has("--instances") => Err(invalid(
                "--instances applies only to --on-redis-error local",
            ))?,
            policy => policy.to_owned(),
        };
        let api_key = given.one_of("--key", &["ip", "api-key"])? == "api-key";
        let metrics_bind = given
            .get("--metrics-bind")
            .map(|_| given.parsed("--metrics-bind", ""));
        // Checked the way the store checks it, nothing connected yet.
        if let Some((builder, shown)) = store::redis(&given)? {
            builder
                .build()
                .map_err(|e| invalid(format!("invalid --{shown}: {e}")))?;
        }
        Ok(Options {
            bind: given.parsed("--bind", self.default_bind)?,
            metrics_bind: metrics_bind.transpose()?,
            quota,
            algorithm,
            policy,
            instances,
            api_key,
            given,
        })
    }
}

/// Listens on `bind` and says where (`listening on ADDR`, flushed: the tests wait for it).
pub async fn listen(bind: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| format!("cannot listen on {bind}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on {local}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    Ok(listener)
}

/// The layer the example puts in front of its service: prints `store: ...` and `quota: ...`.
pub async fn layer(
    options: &Options,
) -> Result<RateLimitLayer<impl KeyExtractor + Clone + 'static>, String> {
    let policy = &options.policy;
    let builder = match store::redis(&options.given).map_err(|e| format!("{e:?}"))? {
        Some((builder, shown)) => {
            let store = builder.build().map_err(|e| e.to_string())?;
            if !announce(&shown, &store).await {
                eprintln!(
                    "warning: {shown} does not answer yet; --on-redis-error {policy} decides \
                     until it does"
                );
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
    let limiter = match policy.as_str() {
        "open" => builder.failure_policy(FailOpen),
        "closed" => builder.failure_policy(FailClosed::default()),
        _ => builder.failure_policy(LocalFallback::new(options.instances)),
    };
    let (quota, algorithm) = (options.quota, options.algorithm);
    println!(
        "quota: {} per {:?} (burst {}), algorithm {algorithm}, on-redis-error {policy}",
        quota.limit(),
        quota.period(),
        quota.burst(),
    );
    let shadow = options.given.has("--shadow");
    if shadow {
        println!("shadow: on (every request is decided and counted, none is denied)");
    }
    // `--key api-key`: the `x-api-key` header (hashed) when sent, else the client's IP address.
    let api_key = options
        .api_key
        .then(|| HeaderKey::named("x-api-key").expect("a header name"));
    let ip = PeerIp::new();
    let key = FnKey::new(move |parts: &Parts| {
        let key = api_key.as_ref().and_then(|key| key.extract(parts));
        key.or_else(|| ip.extract(parts)).map(Cow::into_owned)
    });
    let limiter = limiter.build().map_err(|e| e.to_string())?;
    let layer = RateLimitLayer::builder(limiter, quota, key).shadow(shadow);
    layer.build().map_err(|e| e.to_string())
}

/// Verifies the store (connect, PING, script load) and prints `store: SHOWN (Redis 7.0.15)` or
/// `store: SHOWN (not reachable yet: ...)`. Whether it answered.
///
/// `verify()` is how a service fails fast on a wrong URL at start-up (`store.verify().await?`
/// before serving, as in the quick start): the store connects lazily and the default policy
/// fails open. The example only warns, so that it can start before Redis.
async fn announce(shown: &str, store: &RedisStore) -> bool {
    let verified = store.verify().await;
    match &verified {
        Ok(server) => println!("store: {shown} ({server})"),
        Err(error) => println!("store: {shown} (not reachable yet: {error})"),
    }
    verified.is_ok()
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), coloured only on a terminal.
fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
