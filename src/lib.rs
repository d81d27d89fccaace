//! # redlimit
//!
//! Distributed rate limiting for [Tower](https://docs.rs/tower) services. Every decision is one
//! atomic Lua script in Redis, so a limit holds across any number of instances without locks.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use redlimit::{key::PeerIp, store::RedisStore, Limiter, Quota, RateLimitLayer};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // The store connects in the background and never hangs a request (100 ms timeout).
//!     let store = RedisStore::new("redis://127.0.0.1:6379")?;
//!     // Fail fast at start-up: with a wrong URL the default policy would let every request pass.
//!     store.verify().await?;
//!     // 100 requests a minute per client address, across the whole fleet.
//!     let layer = RateLimitLayer::new(Limiter::new(store), Quota::per_minute(100)?, PeerIp::new());
//!     let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
//!
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! ```
//!
//! A denied request gets `429 Too Many Requests` with `Retry-After` and the IETF
//! `RateLimit-Policy` / `RateLimit` headers (which allowed responses carry too); a gRPC request
//! gets `RESOURCE_EXHAUSTED`. When Redis fails, the [`FailurePolicy`](failure_policy::FailurePolicy) decides: fail open (the
//! default), fail closed, or a local in-process limiter.
//!
//! Without tower, use the [`Limiter`] directly:
//!
//! ```
//! use redlimit::{store::MemoryStore, Limiter, Quota};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let limiter = Limiter::new(MemoryStore::new());
//! let quota = Quota::per_second(5).unwrap();
//! let verdict = limiter.check("outbound-api", &quota).await;
//! if let Some(decision) = verdict.decision() {
//!     println!("allowed={} remaining={}", decision.allowed, decision.remaining);
//! }
//! # }
//! ```
//!
//! # A fleet
//!
//! Several quotas checked in one atomic call, limits changed at run time and fleet-wide
//! suspensions (obeyed by every instance on its next call), and a wait mode for outbound calls
//! (see [`outbound`]):
//!
//! ```
//! use std::time::{Duration, Instant};
//! use redlimit::{store::MemoryStore, Limiter, Quota, Quotas};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(MemoryStore::new()); // a RedisStore in a fleet
//! let tiers = Quotas::new([Quota::per_second(10)?, Quota::per_minute(500)?])?;
//! assert!(limiter.check_quotas("tenant-42", &tiers, 1).await.is_allowed());
//! limiter.set_quota("tenant-42", &Quotas::from(Quota::per_minute(60)?)).await?;
//! limiter.suspend("upstream", Duration::from_secs(30)).await?;
//! let decision = *limiter.check_quotas("upstream", &tiers, 1).await.decision().unwrap();
//! assert!(decision.suspended);
//! // Wait mode: sleep until admitted, or give up at the deadline with a typed error.
//! let deadline = Instant::now() + Duration::from_millis(10);
//! assert!(limiter.acquire("upstream", &tiers, deadline).await.is_err());
//! # Ok(())
//! # }
//! ```
//!
//! # Crate features
//!
//! All off by default.
//!
//! | Feature | What it adds |
//! |---|---|
//! | `axum` | [`PeerIp`](key::PeerIp) reads axum 0.8's `ConnectInfo<SocketAddr>` |
//! | `tonic` | [`PeerIp`](key::PeerIp) reads tonic 0.14's `TcpConnectInfo` |
//! | `tls` | `rediss://` through rustls, with a private CA and client certificates on the store builders |
//! | `metrics` | the metrics below, through the [`metrics`](https://docs.rs/metrics) facade |
//! | `test-hooks` | nothing for users: hidden functions the crate's own tests call, with no stability promise |
//!
//! # Metrics
//!
//! With the `metrics` feature the limiter records decisions, store latency and errors, the
//! circuit breaker's state and unkeyed requests, labelled by the layer's policy name (or
//! [`DIRECT_POLICY_LABEL`](limiter::DIRECT_POLICY_LABEL), `direct`, for [`Limiter::check`] and
//! its siblings outside a layer), never by key; every metric and its labels are in the
//! [metrics table](guide::using#metrics-and-logs).
//!
//! Without the feature none of it is compiled; [`Limiter::stats`] counts the same outcomes
//! either way. `tracing` logs a warning when the circuit opens (Redis keeps failing) and an info
//! event when it closes again.
//!
//! # Guide
//!
//! The long form, one page per topic (algorithms, failure, production Redis, keys, fleet
//! features, wait mode, headers, the examples), is the [`guide`] module.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
mod block;
pub mod clock;
pub mod concurrency;
mod control;
mod core;
pub mod decision;
mod deny_cache;
pub mod failure_policy;
pub mod guide;
mod intern;
pub mod key;
pub mod layer;
mod lease;
pub mod limiter;
pub mod outbound;
pub mod quota;
mod settle;
pub mod store;
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub use crate::store::wire::test_hooks;

// The quick start's and the common paths' names; everything else lives in its module.
pub use crate::algorithm::Algorithm;
pub use crate::decision::{Decision, Verdict};
pub use crate::layer::RateLimitLayer;
pub use crate::limiter::{Limiter, Target};
pub use crate::quota::{Quota, Quotas};
