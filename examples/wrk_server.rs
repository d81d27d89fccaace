//! The server `scripts/wrk.sh` loads with wrk: an axum hello-world behind one middleware, with a
//! quota that never binds, so that what wrk measures is what the middleware costs the server.
//!
//! ```text
//! cargo run --release --example wrk_server -- MIDDLEWARE [--bind ADDR] [--redis URL]
//! ```
//!
//! `GET /` answers `200 ok`. Every limiter counts requests by their `x-api-key` header: wrk sends
//! one fixed value for a hot key, or 10 000 values in turn (`scripts/wrk-keys.lua`). MIDDLEWARE:
//!
//! - `none`: the hello-world alone;
//! - `governor`: tower_governor's `GovernorLayer`, in memory;
//! - `memory`: `RateLimitLayer` over a `MemoryStore`;
//! - `redis-lease`: `RateLimitLayer` over a `RedisStore`, with leases on the limiter
//!   (`LimiterBuilder::leases`);
//! - `redis`: `RateLimitLayer` over a `RedisStore` as it comes (decisions batched);
//! - `redis-keys`: the same server as `redis`, for wrk's 10 000 keys.
//!
//! The Redis is `--redis URL`, or `REDIS_URL`, or `redis://127.0.0.1:6379`; the server checks it
//! answers (`RedisStore::verify`) before it listens. It prints `listening on http://ADDR` once it
//! accepts connections (`--bind 127.0.0.1:0` picks a free port), and serves until Ctrl-C.

#[path = "common/flags.rs"]
mod flags;

use std::process::ExitCode;

use axum::http::{HeaderValue, Request};
use axum::{routing::get, Router};
use flags::{invalid, redacted, CliError};
use redlimit::key::HeaderKey;
use redlimit::limiter::Leases;
use redlimit::store::{MemoryStore, RedisStore};
use redlimit::{Limiter, Quota, RateLimitLayer};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::{key_extractor::KeyExtractor, GovernorError, GovernorLayer};

const USAGE: &str = "\
usage: cargo run --release --example wrk_server -- MIDDLEWARE [--bind ADDR] [--redis URL]
  MIDDLEWARE  none, governor, memory, redis-lease, redis or redis-keys
  --bind ADDR  the address to listen on (default 127.0.0.1:3000; port 0 picks one)
  --redis URL  the Redis of the redis* middlewares (default REDIS_URL, or redis://127.0.0.1:6379)";

const MIDDLEWARES: [&str; 6] = [
    "none",
    "governor",
    "memory",
    "redis-lease",
    "redis",
    "redis-keys",
];

/// The header every limiter counts requests by.
const API_KEY: &str = "x-api-key";

/// What the command line asked for.
struct Options {
    middleware: String,
    bind: String,
    redis: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    flags::main(USAGE, parse_args(std::env::args().skip(1)), run).await
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Options, CliError> {
    let given = flags::read(USAGE, args)?;
    let middleware = match &given.plain[..] {
        [one] if MIDDLEWARES.contains(&one.as_str()) => one.clone(),
        [one] => Err(invalid(format!(
            "unknown middleware {one:?}: expected one of {}",
            MIDDLEWARES.join(", ")
        )))?,
        _ => Err(invalid("give one MIDDLEWARE (see --help)"))?,
    };
    Ok(Options {
        middleware,
        bind: given.get("--bind").unwrap_or("127.0.0.1:3000").to_owned(),
        redis: given
            .get("--redis")
            .map_or_else(flags::default_redis_url, str::to_owned),
    })
}

async fn run(options: Options) -> Result<(), String> {
    let app = Router::new().route("/", get(|| async { "ok" }));
    let app = match options.middleware.as_str() {
        "none" => app,
        "governor" => governor(app),
        "memory" => app.layer(redlimit(Limiter::new(MemoryStore::new()))),
        "redis-lease" => {
            let store = redis(&options.redis).await?;
            let limiter = Limiter::builder(store).leases(Leases::default()).build();
            app.layer(redlimit(limiter.map_err(|e| e.to_string())?))
        }
        _ => app.layer(redlimit(Limiter::new(redis(&options.redis).await?))),
    };
    let listener = tokio::net::TcpListener::bind(&options.bind)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", options.bind))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!("{}: listening on http://{local}", options.middleware);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| e.to_string())
}

/// A `RedisStore` on `url` with its defaults, once Redis answers: a wrong URL stops the server
/// here instead of failing open on every request.
async fn redis(url: &str) -> Result<RedisStore, String> {
    let store = RedisStore::new(url).map_err(|e| format!("--redis {}: {e}", redacted(url)))?;
    store
        .verify()
        .await
        .map_err(|e| format!("no Redis answers at {}: {e}", redacted(url)))?;
    Ok(store)
}

/// `RateLimitLayer` keyed by the `x-api-key` header, with a quota that never binds.
fn redlimit(limiter: Limiter) -> RateLimitLayer<HeaderKey> {
    let quota = Quota::per_second(1_000_000_000).expect("a valid quota");
    let key = HeaderKey::named(API_KEY).expect("a valid header name");
    RateLimitLayer::new(limiter, quota, key)
}

/// `app` behind tower_governor keyed by the same header, with a quota that never binds and its
/// `x-ratelimit-*` headers, as `RateLimitLayer` writes its own.
fn governor(app: Router) -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .key_extractor(ApiKey)
        .use_headers()
        .finish()
        .expect("a valid governor configuration");
    app.layer(GovernorLayer::new(config))
}

/// tower_governor's key: the `x-api-key` header.
#[derive(Clone)]
struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = HeaderValue;

    fn extract<T>(&self, request: &Request<T>) -> Result<HeaderValue, GovernorError> {
        request
            .headers()
            .get(API_KEY)
            .cloned()
            .ok_or(GovernorError::UnableToExtractKey)
    }
}
