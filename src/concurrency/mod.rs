//! The concurrency limit: at most N requests in flight per key across the fleet.
//!
//! [`ConcurrencyLimiter`] holds the slots (one atomic script call to take one, `lua/slots.lua`,
//! leases renewed in the background, lost slots put back); [`ConcurrencyLimitLayer`] is its
//! middleware, laid out as tower-http lays out one: the [`Layer`](tower_layer::Layer)
//! (`layer.rs`), the service [`ConcurrencyLimit`] (`service.rs`), its response future
//! [`ConcurrencyFuture`] (`future.rs`) and the body that holds the slot until it ends,
//! [`ConcurrencyBody`] (`body.rs`). Each request holds a slot from admission until its
//! response body ends (or its future or body is dropped).
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use redlimit::concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter};
//! use redlimit::{key::GlobalKey, store::MemoryStore, Limiter};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let slots = ConcurrencyLimiter::new(Limiter::new(MemoryStore::new()), 5)?;
//! let layer = ConcurrencyLimitLayer::new(slots, GlobalKey::new("exports"), "exports")?;
//! let mut svc = ServiceBuilder::new().layer(layer).service_fn(|_: Request<String>| async {
//!     Ok::<_, Infallible>(Response::new(String::from("done")))
//! });
//! let response = svc.ready().await?.call(Request::new(String::new())).await?;
//! assert_eq!(response.status(), StatusCode::OK);
//! assert_eq!(response.headers()["ratelimit"], "\"exports\";r=4");
//! # Ok(())
//! # }
//! ```

mod body;
mod config;
mod future;
mod layer;
mod limiter;
mod service;

pub use self::body::ConcurrencyBody;
pub use self::future::ConcurrencyFuture;
pub use self::layer::ConcurrencyLimitLayer;
pub use self::limiter::{
    ConcurrencyLimiter, Slot, SlotOutcome, DEFAULT_SLOT_LEASE, MIN_SLOT_LEASE,
};
pub use self::service::ConcurrencyLimit;
