//! The store the options chose, the limiter on it and the layer: the library calls.

use std::env;
use std::time::Duration;

use redlimit::store::{MemoryStore, RedisStore, RedisStoreBuilder};
use redlimit::{
    failure_policy::{FailClosed, FailOpen, LocalFallback},
    Limiter, RateLimitLayer,
};

use super::values::{redacted, shown_urls};
use super::{Backend, ExampleKey, OnRedisError, Options};

/// The Redis used when neither `--redis` nor `REDIS_URL` is given.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// How long the start-up probe waits for a Redis to answer PING.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

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
            let shown = shown_urls(urls);
            let store = with_ca(
                RedisStore::cluster_builder(urls.iter().map(String::as_str)),
                ca,
            )
            .build()
            .map_err(|e| format!("invalid Redis Cluster URLs {shown}: {e}"))?;
            announce("redis-cluster", &shown, &store).await;
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
