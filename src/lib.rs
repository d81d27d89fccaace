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
//!     let limiter = Limiter::new(RedisStore::new("redis://127.0.0.1:6379")?);
//!     // 100 requests a minute per client address, across the whole fleet.
//!     let layer = RateLimitLayer::new(limiter, Quota::per_minute(100)?, PeerIp::new());
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
//! gets `RESOURCE_EXHAUSTED`. When Redis fails, the [`FailurePolicy`] decides: fail open (the
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
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
mod clock;
mod decision;
pub mod key;
pub mod layer;
mod limiter;
pub mod policy;
mod quota;
pub mod store;

pub use crate::algorithm::Algorithm;
pub use crate::clock::{Clock, ManualClock};
pub use crate::decision::Decision;
pub use crate::layer::{
    MissingKey, RateLimit, RateLimitLayer, RateLimitLayerBuilder, ResponseBody, ResponseFuture,
};
pub use crate::limiter::{
    ConfigError, Limiter, LimiterBuilder, LimiterStats, DEFAULT_PREFIX, DIRECT_POLICY_LABEL,
};
pub use crate::policy::{FailClosed, FailOpen, FailurePolicy, LocalFallback, Verdict};
pub use crate::quota::{Quota, QuotaError, MAX_COUNT, MAX_PERIOD};
