//! The tower adapter: [`RateLimitLayer`] wraps a service in [`RateLimit`], which asks the
//! [`Limiter`](crate::Limiter) about each request before calling the inner service.
//!
//! Per request: the [`KeyExtractor`](crate::key::KeyExtractor) finds the key (or the
//! [`MissingKey`] rule applies), the limiter decides, and the [`ResponseFuture`] either calls the
//! inner service, adding the `RateLimit-Policy` / `RateLimit` headers to its response, or answers
//! by itself: **429** with `Retry-After` when the key is over its quota, **503** when the store
//! failed and the failure policy rejects (gRPC requests get `RESOURCE_EXHAUSTED` /
//! `UNAVAILABLE`). The response body is a [`ResponseBody`]: the inner body or the rejection's
//! short text.
//!
//! A request is counted when its decision is made, and a response future dropped after that
//! (a client that disconnects) keeps it counted. Where the decision needs no waiting (a
//! [`MemoryStore`](crate::store::MemoryStore), a key whose [lease](crate::guide::leases) holds units)
//! it is made in `call`, so even a future dropped before its first poll was counted; a
//! decision in Redis is sent at the first poll, so a future dropped before it counts nothing,
//! and one dropped while Redis decides counts at most once.
//!
//! | file | holds |
//! |---|---|
//! | `layer.rs` | [`RateLimitLayer`] and its [`RateLimitLayerBuilder`] |
//! | `config.rs` | what every clone of the service shares; [`MissingKey`] |
//! | `service.rs` | [`RateLimit`], the service |
//! | `future.rs` | [`ResponseFuture`], the state machine of one request |
//! | `resolver.rs` | [`QuotaResolver`]: the quotas chosen per request (tiers) |
//! | `body.rs` | [`ResponseBody`] |
//! | `headers.rs` | the `RateLimit` / `RateLimit-Policy` / `X-RateLimit-*` headers and their format |
//! | `response.rs` | the 429 / 503 / gRPC answers |
//!
//! # Example
//!
//! Two routes with their own limits, from one limiter and one key: each layer counts in a scope
//! derived from its quota (see [`RateLimitLayerBuilder::scope`]), so the login attempts and the
//! API calls of one client are counted apart. The policy names tell them apart in the headers.
//!
//! ```
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(MemoryStore::new());
//! let login = RateLimitLayer::builder(limiter.clone(), Quota::per_minute(5)?, GlobalKey::new("c"))
//!     .policy_name("login")
//!     .build()?;
//! let api = RateLimitLayer::builder(limiter, Quota::per_minute(1000)?, GlobalKey::new("c"))
//!     .policy_name("api")
//!     .build()?;
//! let app = Router::new()
//!     .route("/login", get(|| async { "welcome" }).layer(login))
//!     .route("/api", get(|| async { "data" }).layer(api));
//!
//! let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
//! for _ in 0..5 {
//!     assert_eq!(app.clone().oneshot(get("/login")).await?.status(), StatusCode::OK);
//! }
//! let limited = app.clone().oneshot(get("/login")).await?;
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(limited.headers()["ratelimit-policy"], r#""login";q=5;w=60"#);
//! // The API's quota is its own.
//! let api = app.oneshot(get("/api")).await?;
//! assert_eq!(api.status(), StatusCode::OK);
//! assert_eq!(api.headers()["ratelimit"], r#""api";r=999;t=1"#);
//! # Ok(())
//! # }
//! ```
//!
//! # Hot keys: leases
//!
//! A key that takes a large share of the traffic (a global key, a big tenant, one upstream's
//! quota) costs one store call per request, and Redis decides one key's calls one at a time.
//! **Token leases** take that off Redis: each instance takes several units of a busy key's
//! quota in one call and answers from them in process, never more than the quota fleet-wide.
//! They are set on the limiter the layer wraps, with
//! [`LimiterBuilder::leases`](crate::limiter::LimiterBuilder::leases) and
//! [`Leases`](crate::limiter::Leases), not on the layer; the layer, its headers and its
//! answers stay the same. The bounds are on the guide's [leases](crate::guide::leases) page.
//!
//! ```
//! use std::time::Duration;
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use redlimit::{key::GlobalKey, limiter::Leases, store::MemoryStore, Limiter, Quota};
//! use redlimit::RateLimitLayer;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder(MemoryStore::new()) // a RedisStore in a fleet
//!     .leases(Leases::new(Duration::from_millis(50)))
//!     .build()?;
//! let quota = Quota::per_second(100_000)?;
//! let layer = RateLimitLayer::new(limiter.clone(), quota, GlobalKey::new("upstream"));
//! let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
//! for _ in 0..2_000 {
//!     let response = app.clone().oneshot(Request::get("/").body(Body::empty())?).await?;
//!     assert_eq!(response.status(), StatusCode::OK);
//! }
//! let leases = limiter.lease_stats();
//! assert!(leases.renewals < 100, "{leases:?}"); // most requests never reached the store
//! # Ok(())
//! # }
//! ```
//!
//! # Several quotas, tiers and suspension
//!
//! A layer takes one [`Quota`](crate::Quota) or several ([`Quotas`](crate::Quotas): 10 a second
//! *and* 500 a minute), checked in one store call, all or none: a request denied by one tier
//! consumes from none. `RateLimit-Policy` lists every tier, named `"<policy>-1"`,
//! `"<policy>-2"`… in order (a single tier keeps the bare `"<policy>"`), and `RateLimit`
//! describes the binding one ([`Decision::quota`](crate::Decision::quota): on a denial the tier
//! with the longest wait, on an admission the one with the least left; its `t` is the wait on a
//! denial, and on an admission the time until the key is full again,
//! [`Decision::reset_after`](crate::Decision::reset_after), at most that tier's `w`; see
//! [`RateLimit`] for what each number means). When an override set
//! with [`Limiter::set_quota`](crate::Limiter::set_quota) is in force, both headers show its
//! binding quota alone, as `"<policy>"`, never the layer's tiers. A
//! [`QuotaResolver`] chooses the quotas per request (FREE and PRO plans, see
//! [`RateLimitLayerBuilder::resolver`]).
//!
//! A key suspended with [`Limiter::suspend`](crate::Limiter::suspend) is answered **429** with
//! `Retry-After` = the time left, `RateLimit` with `r=0`, and the body
//! `rate limit: suspended, retry later` (gRPC: `RESOURCE_EXHAUSTED`, the same `grpc-message`).
//!
//! ```
//! use std::time::Duration;
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, Quotas, RateLimitLayer};
//! use redlimit::Target;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(MemoryStore::new());
//! let tiers = Quotas::new([Quota::per_second(2)?, Quota::per_minute(100)?])?;
//! let layer = RateLimitLayer::new(limiter.clone(), tiers, GlobalKey::new("client"));
//! let scope = layer.scope().to_owned();
//! let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
//! let get = || Request::get("/").body(Body::empty()).unwrap();
//!
//! let ok = app.clone().oneshot(get()).await?;
//! let policy = ok.headers()["ratelimit-policy"].to_str()?;
//! assert_eq!(policy, r#""default-1";q=2;w=1, "default-2";q=100;w=60"#);
//! // One left this second, 99 this minute: the per-second tier binds.
//! assert_eq!(ok.headers()["ratelimit"], r#""default-1";r=1;t=1"#);
//!
//! limiter.suspend(Target::scoped(&scope, "client"), Duration::from_secs(300)).await?;
//! let suspended = app.oneshot(get()).await?;
//! assert_eq!(suspended.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(suspended.headers()["retry-after"], "300");
//! # Ok(())
//! # }
//! ```
//!
//! # Builder options
//!
//! [`RateLimitLayer::builder`] takes the same limiter, quotas and extractor as
//! [`RateLimitLayer::new`], then:
//!
//! - [`policy_name`](RateLimitLayerBuilder::policy_name) names the policy in the headers;
//! - [`legacy_headers`](RateLimitLayerBuilder::legacy_headers) adds `X-RateLimit-Limit`,
//!   `X-RateLimit-Remaining` and `X-RateLimit-Reset`;
//! - [`cost`](RateLimitLayerBuilder::cost) weighs each request (1 by default);
//! - [`skip`](RateLimitLayerBuilder::skip) exempts requests (health checks), which pass
//!   unchecked and carry no rate-limit headers;
//! - [`retry_after_jitter`](RateLimitLayerBuilder::retry_after_jitter) adds up to a given time
//!   to each denial's `Retry-After`, so clients denied together do not come back together; the
//!   `RateLimit` header keeps the exact `t`. Only that hint moves, and only later:
//!   `Retry-After` is at least the true wait (it is rounded up after the jitter is added),
//!   never more than the true wait plus the jitter, and the [`Decision`](crate::Decision) keeps
//!   the exact values; a cost the quota can never hold gets none;
//! - [`on_missing_key`](RateLimitLayerBuilder::on_missing_key) sets the [`MissingKey`] rule.
//!
//! ```
//! # use std::convert::Infallible;
//! # use std::time::Duration;
//! # use http::{Request, Response, StatusCode};
//! # use tower::{ServiceBuilder, ServiceExt};
//! use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let ok = |_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) };
//! # let get = |path: &str| Request::get(path).body(String::new()).unwrap();
//! let layer = RateLimitLayer::builder(
//!     Limiter::new(MemoryStore::new()),
//!     Quota::per_minute(10)?,
//!     GlobalKey::new("all"),
//! )
//! .policy_name("api")
//! .legacy_headers(true)
//! .cost(|parts| if parts.uri.path() == "/export" { 10 } else { 1 })
//! .skip(|parts| parts.uri.path() == "/health")
//! .retry_after_jitter(Duration::from_secs(5))
//! .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
//!
//! // The export costs the minute's whole quota.
//! let export = svc.clone().oneshot(get("/export")).await?;
//! assert_eq!(export.headers()["ratelimit-policy"], r#""api";q=10;w=60"#);
//! assert_eq!(export.headers()["x-ratelimit-limit"], "10");
//! assert_eq!(export.headers()["x-ratelimit-remaining"], "0");
//! assert_eq!(export.headers()["x-ratelimit-reset"], "60"); // full again in 60 s
//!
//! let denied = svc.clone().oneshot(get("/items")).await?;
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! let retry: u64 = denied.headers()["retry-after"].to_str()?.parse()?;
//! assert!((6..=11).contains(&retry)); // the true wait is 6 s, plus up to 5 s of jitter
//! assert_eq!(denied.headers()["ratelimit"], r#""api";r=0;t=6"#);
//!
//! // Health checks still pass, and carry no rate-limit headers.
//! let health = svc.oneshot(get("/health")).await?;
//! assert_eq!(health.status(), StatusCode::OK);
//! assert!(!health.headers().contains_key("ratelimit"));
//! # Ok(())
//! # }
//! ```
//!
//! ## Scopes
//!
//! Without [`scope`](RateLimitLayerBuilder::scope) a layer's scope is derived from its policy
//! name, the limiter's algorithm and the quota, e.g. `default:token-bucket:5/60s` (storage key
//! `redlimit:{ip:203.0.113.7}:default:token-bucket:5/60s`): layers with different quotas
//! (per-route limits: `/login` 5 a minute, `/api` 1000 a minute) never share state, and layers
//! with the same name and quota (one quota applied to several routes) do. A changed quota
//! therefore starts from a fresh count; the old keys expire on their own. Several tiers are
//! joined with `+` (`default:token-bucket:10/1s+500/60s`). With a resolver the scope comes from
//! the default quotas: every tier of a key counts in it.
//!
//! A layer with a [policy name](RateLimitLayerBuilder::policy_name) counts in a scope of that
//! name: its route. A deploy that changes the route's quota keeps the usage, capped to the new
//! quota, and the route's override; one that changes the algorithm starts the usage afresh
//! (another algorithm's state reads as a fresh key, replaced on the first admission).
//!
//! Name a scope only to share one count between layers on purpose, e.g. several routes that
//! together get 2 requests a minute:
//!
//! ```
//! # use std::convert::Infallible;
//! # use http::{Request, Response, StatusCode};
//! # use tower::{ServiceBuilder, ServiceExt};
//! use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let ok = |_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) };
//! let limiter = Limiter::new(MemoryStore::new());
//! let shared = |quota| {
//!     RateLimitLayer::builder(limiter.clone(), quota, GlobalKey::new("all")).scope("writes")
//! };
//! let orders = ServiceBuilder::new().layer(shared(Quota::per_minute(2)?).build()?).service_fn(ok);
//! let refunds = ServiceBuilder::new().layer(shared(Quota::per_minute(2)?).build()?).service_fn(ok);
//! assert_eq!(orders.clone().oneshot(Request::default()).await?.status(), StatusCode::OK);
//! assert_eq!(refunds.clone().oneshot(Request::default()).await?.status(), StatusCode::OK);
//! // Two of two spent between them.
//! let third = orders.oneshot(Request::default()).await?;
//! assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
//! # Ok(())
//! # }
//! ```
//!
//! ## Tiers per request
//!
//! [`resolver`](RateLimitLayerBuilder::resolver) chooses each request's quotas: FREE 10 a
//! minute, PRO 1000, chosen from a header or looked up in your own store. The layer's scope
//! does not change (see [`QuotaResolver`] for why), so `Target::scoped(layer.scope(), key)`
//! addresses the key whatever its tier, and an override set with
//! [`Limiter::set_quota`](crate::Limiter::set_quota) wins over the resolver. The headers
//! describe the resolved quotas.
//!
//! ```
//! # use std::convert::Infallible;
//! # use http::{Request, Response, StatusCode};
//! # use tower::{ServiceBuilder, ServiceExt};
//! use redlimit::{key::HeaderKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
//! use redlimit::layer::resolver_fn;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (free, pro) = (Quota::per_minute(1)?, Quota::per_minute(1000)?);
//! let layer = RateLimitLayer::builder(
//!     Limiter::new(MemoryStore::new()),
//!     free,
//!     HeaderKey::named("x-api-key")?,
//! )
//! .resolver(resolver_fn(move |parts, _key| {
//!     // The key reaches the resolver hashed (`HeaderKey`): read the raw header instead.
//!     let api_key = parts.headers.get("x-api-key").map(|v| v.as_bytes());
//!     if api_key.is_some_and(|k| k.starts_with(b"pro-")) { pro } else { free }
//! }))
//! .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
//! let call = |key: &str| {
//!     let request = Request::get("/").header("x-api-key", key).body(String::new()).unwrap();
//!     svc.clone().oneshot(request)
//! };
//! assert_eq!(call("free-1").await?.status(), StatusCode::OK);
//! assert_eq!(call("free-1").await?.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(call("pro-1").await?.status(), StatusCode::OK);
//! assert_eq!(call("pro-1").await?.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```

mod body;
mod config;
mod future;
pub(crate) mod headers;
#[allow(clippy::module_inception)] // the layer of the `layer` module, as tower-http names it
mod layer;
mod resolver;
pub(crate) mod response;
mod service;
mod settle;
mod shadow;

pub use self::body::ResponseBody;
pub use self::config::MissingKey;
pub use self::future::ResponseFuture;
pub use self::layer::{scope_quotas, RateLimitLayer, RateLimitLayerBuilder};
pub use self::resolver::{resolver_fn, FnResolver, QuotaResolver, Resolved};
pub(crate) use self::service::take_ready;
pub use self::service::RateLimit;
pub use self::shadow::ShadowLimited;
