//! Wait mode for outbound calls: [`OutboundLayer`] makes a client [`Service`] (an HTTP client)
//! wait for a quota the whole fleet shares, instead of failing, and stops the whole fleet when
//! the upstream says it is overloaded.
//!
//! A fleet of workers calling a third-party API must stay under the API's limit together. Wrap
//! the client in an `OutboundLayer`: each request waits until the [`Limiter`](crate::Limiter)
//! admits it ([`Limiter::acquire`](crate::Limiter::acquire): sleep the `retry_after`, plus a
//! small jitter, and try again), at most `max_wait`; past that it fails with
//! [`OutboundError::Acquire`] and consumes nothing.
//!
//! - **Fixed key** ([`OutboundLayer::builder`]): the wait happens in `poll_ready`, so it is real
//!   tower backpressure: `tower::buffer::Buffer`, `Balance` or a `ServiceBuilder` stack in
//!   front see a service that is not ready until the quota admits the next request.
//! - **Per-request key** ([`OutboundLayer::builder_with_extractor`], any
//!   [`KeyExtractor`](crate::key::KeyExtractor)): `poll_ready` is the inner service's; the wait
//!   happens in the response future.
//!
//! # Auto-suspend
//!
//! When the upstream answers **429** or **503** with a `Retry-After` (delay-seconds or an
//! HTTP-date), the layer suspends the key with
//! [`Limiter::suspend`](crate::Limiter::suspend) for that long (at most
//! [`MAX_SUSPENSION`](crate::MAX_SUSPENSION)) before handing the answer back: every worker of
//! the fleet sharing the key stops, not just the one that got the answer, and resumes when the
//! upstream said it could. The answer itself is returned unchanged. It is logged at warn level
//! (status, duration and scope; never the key). Turn it off with
//! [`auto_suspend(false)`](OutboundLayerBuilder::auto_suspend).
//!
//! # Example
//!
//! A client limited to 10 calls a second across the fleet, one at a time; with a Redis store
//! (see the README) every worker shares the limit.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::{Duration, Instant};
//! use http::{Request, Response, StatusCode};
//! use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(MemoryStore::new());
//! let quota = Quota::per_second(10)?.with_burst(1)?;
//! let layer = OutboundLayer::builder(limiter, quota, "maps-api")
//!     .max_wait(Duration::from_secs(5))
//!     .build()?;
//! // Stands in for an HTTP client (hyper-util's, reqwest's tower service, ...).
//! let mut client = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
//!
//! let started = Instant::now();
//! for _ in 0..3 {
//!     // `ready()` waits for the quota; `call` goes straight out.
//!     let response = client.ready().await?.call(Request::new(String::new())).await?;
//!     assert_eq!(response.status(), StatusCode::OK);
//! }
//! // One call every 100 ms: the third went out 200 ms after the first.
//! assert!(started.elapsed() >= Duration::from_millis(200));
//! # Ok(())
//! # }
//! ```
//!
//! | file | holds |
//! |---|---|
//! | `layer.rs` | [`OutboundLayer`], [`OutboundLayerBuilder`] |
//! | `service.rs` | [`Outbound`], the service (the `poll_ready` acquisition) |
//! | `future.rs` | [`ResponseFuture`] (the per-request acquisition, auto-suspend) |
//! | `error.rs` | [`OutboundError`] |
//! | `retry_after.rs` | `Retry-After` and HTTP-date parsing |
//!
//! [`Service`]: tower_service::Service

mod error;
mod future;
mod layer;
mod retry_after;
mod service;

pub use self::error::OutboundError;
pub use self::future::ResponseFuture;
pub use self::layer::{OutboundLayer, OutboundLayerBuilder, DEFAULT_MAX_WAIT};
pub use self::service::Outbound;
