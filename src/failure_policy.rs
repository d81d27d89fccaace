//! [`FailurePolicy`]: what a store failure means for the request.
//!
//! Every store error (Redis down, a timeout, an open circuit) goes through the limiter's policy,
//! which is logged with `tracing` (never with the key: it may be a secret) and counted in
//! [`LimiterStats`](crate::limiter::LimiterStats).
//!
//! ```
//! use redlimit::{failure_policy::FailClosed, store::RedisStore, Limiter};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder(RedisStore::new("redis://127.0.0.1:6379")?)
//!     .failure_policy(FailClosed::default())
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! # Examples
//!
//! What each policy answers while the store is down:
//!
//! ```
//! use std::time::Duration;
//! use futures::future::BoxFuture;
//! use redlimit::{failure_policy::{FailClosed, LocalFallback}, Verdict};
//! use redlimit::store::{CheckRequest, Store, StoreError};
//! use redlimit::{Decision, Limiter, Quota};
//!
//! /// A store whose every call times out, as a dead Redis would.
//! #[derive(Debug)]
//! struct Down;
//!
//! impl Store for Down {
//!     fn check<'a>(&'a self, _: CheckRequest<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
//!         Box::pin(async { Err(StoreError::Timeout(Duration::from_millis(100))) })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let quota = Quota::per_minute(100)?;
//!
//! // The default fails open: the request passes unchecked.
//! let open = Limiter::new(Down);
//! assert_eq!(open.check("k", &quota).await, Verdict::FailedOpen);
//!
//! // Fail closed: the layer answers 503 with `Retry-After: 1`.
//! let closed = Limiter::builder(Down).failure_policy(FailClosed::default()).build()?;
//! let retry_after = Duration::from_secs(1);
//! assert_eq!(closed.check("k", &quota).await, Verdict::FailedClosed { retry_after });
//!
//! // Local fallback: one of 4 instances admits a quarter of the quota on its own.
//! let local = Limiter::builder(Down).failure_policy(LocalFallback::new(4)).build()?;
//! let decision = *local.check("k", &quota).await.decision().unwrap();
//! assert_eq!((decision.allowed, decision.limit, decision.remaining), (true, 25, 24));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::time::Duration;

use crate::decision::Verdict;
use crate::quota::{Quota, Quotas};
use crate::store::{CheckRequest, MemoryStore, StoreError};

/// What the policy knows about a failed check.
///
/// The limiter builds it; a test can build one to call a policy directly.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{failure_policy::{FailureContext, FailurePolicy}, Verdict};
/// use redlimit::store::{CheckRequest, StoreError};
/// use redlimit::{Algorithm, Quota};
///
/// /// Fails closed while Redis is slow (it may be overloaded), open on any other failure.
/// #[derive(Debug)]
/// struct ClosedOnTimeout;
///
/// impl FailurePolicy for ClosedOnTimeout {
///     fn on_store_error(&self, ctx: &FailureContext<'_>) -> Verdict {
///         match ctx.error {
///             StoreError::Timeout(after) => Verdict::FailedClosed { retry_after: *after },
///             _ => Verdict::FailedOpen,
///         }
///     }
/// }
///
/// let quota = Quota::per_second(10).unwrap();
/// let ctx = FailureContext {
///     error: &StoreError::Timeout(Duration::from_millis(100)),
///     request: CheckRequest {
///         key: "redlimit:{tenant-42}",
///         algorithm: Algorithm::TokenBucket,
///         quotas: &quota.into(),
///         cost: 1,
///         now_micros: None,
///     },
/// };
/// let retry_after = Duration::from_millis(100);
/// assert_eq!(ClosedOnTimeout.on_store_error(&ctx), Verdict::FailedClosed { retry_after });
/// ```
#[derive(Debug)]
pub struct FailureContext<'a> {
    /// Why the store failed.
    pub error: &'a StoreError,
    /// The check that failed (its key is the bounded storage key, never a raw secret).
    pub request: CheckRequest<'a>,
}

/// Decides what a store failure means. Implement it for custom behaviour (e.g. fail closed only
/// for expensive endpoints).
///
/// ```
/// use redlimit::{failure_policy::{FailureContext, FailurePolicy}, Verdict};
///
/// /// Admits cheap requests, rejects the rest, while Redis is away.
/// #[derive(Debug)]
/// struct CheapOnly;
///
/// impl FailurePolicy for CheapOnly {
///     fn on_store_error(&self, ctx: &FailureContext<'_>) -> Verdict {
///         if ctx.request.cost <= 1 {
///             Verdict::FailedOpen
///         } else {
///             Verdict::FailedClosed { retry_after: std::time::Duration::from_secs(1) }
///         }
///     }
/// }
/// ```
pub trait FailurePolicy: Send + Sync + fmt::Debug + 'static {
    /// The outcome for a request whose check failed.
    fn on_store_error(&self, ctx: &FailureContext<'_>) -> Verdict;
}

/// Admit every request while the store fails (the default): an outage shows in logs and
/// metrics, not in customers' error rates.
///
/// ```
/// # use std::time::Duration;
/// # use futures::future::BoxFuture;
/// # use redlimit::{store::{CheckRequest, Store, StoreError}, Decision};
/// # #[derive(Debug)]
/// # struct Down;
/// # impl Store for Down {
/// #     fn check<'a>(
/// #         &'a self,
/// #         _: CheckRequest<'a>,
/// #     ) -> BoxFuture<'a, Result<Decision, StoreError>> {
/// #         Box::pin(async { Err(StoreError::Timeout(Duration::from_millis(100))) })
/// #     }
/// # }
/// use redlimit::{failure_policy::FailOpen, Limiter, Quota, Verdict};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // `Down` is a store whose every call times out (see the module docs).
/// let limiter = Limiter::builder(Down).failure_policy(FailOpen).build().unwrap();
/// let verdict = limiter.check("k", &Quota::per_second(1).unwrap()).await;
/// assert_eq!(verdict, Verdict::FailedOpen);
/// assert_eq!(limiter.stats().failed_open, 1);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FailOpen;

impl FailurePolicy for FailOpen {
    fn on_store_error(&self, _ctx: &FailureContext<'_>) -> Verdict {
        Verdict::FailedOpen
    }
}

/// Reject every request while the store fails: HTTP 503 with `Retry-After`.
///
/// ```
/// # use std::time::Duration;
/// # use futures::future::BoxFuture;
/// # use redlimit::{store::{CheckRequest, Store, StoreError}, Decision};
/// # #[derive(Debug)]
/// # struct Down;
/// # impl Store for Down {
/// #     fn check<'a>(
/// #         &'a self,
/// #         _: CheckRequest<'a>,
/// #     ) -> BoxFuture<'a, Result<Decision, StoreError>> {
/// #         Box::pin(async { Err(StoreError::Timeout(Duration::from_millis(100))) })
/// #     }
/// # }
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use redlimit::{key::GlobalKey, failure_policy::FailClosed, Limiter, Quota, RateLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // `Down` is a store whose every call times out (see the module docs).
/// let limiter = Limiter::builder(Down)
///     .failure_policy(FailClosed { retry_after: Duration::from_secs(5) })
///     .build()?;
/// let svc = ServiceBuilder::new()
///     .layer(RateLimitLayer::new(limiter, Quota::per_second(10)?, GlobalKey::new("all")))
///     .service_fn(|_: Request<String>| async {
///         Ok::<_, Infallible>(Response::new(String::new()))
///     });
///
/// let response = svc.oneshot(Request::new(String::new())).await?;
/// assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(response.headers()["retry-after"], "5");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct FailClosed {
    /// The `Retry-After` sent with the 503 (1 s by default).
    pub retry_after: Duration,
}

impl Default for FailClosed {
    fn default() -> Self {
        FailClosed {
            retry_after: Duration::from_secs(1),
        }
    }
}

impl FailurePolicy for FailClosed {
    fn on_store_error(&self, _ctx: &FailureContext<'_>) -> Verdict {
        Verdict::FailedClosed {
            retry_after: self.retry_after,
        }
    }
}

/// While the store fails, decide with an in-process [`MemoryStore`] holding a share of each
/// quota: with `instances` instances behind the balancer, each one admits `1/instances` of the
/// limit and burst (at least 1), so the fleet as a whole stays near the quota.
///
/// The local state is separate from Redis: when Redis comes back, its state is used again as
/// it was.
///
/// ```
/// use redlimit::{failure_policy::LocalFallback, store::RedisStore, Limiter};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Four instances share the quota while Redis is away.
/// let limiter = Limiter::builder(RedisStore::new("redis://127.0.0.1:6379")?)
///     .failure_policy(LocalFallback::new(4))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LocalFallback {
    store: MemoryStore,
    instances: u64,
}

impl LocalFallback {
    /// A fallback giving this instance `1/instances` of each quota (`instances` of 0 counts as 1).
    pub fn new(instances: u64) -> Self {
        LocalFallback {
            store: MemoryStore::new(),
            instances: instances.max(1),
        }
    }

    /// The same with a given memory store (to bound its keys differently).
    pub fn with_store(instances: u64, store: MemoryStore) -> Self {
        LocalFallback {
            store,
            instances: instances.max(1),
        }
    }

    /// This instance's share of `quota`.
    ///
    /// ```
    /// use redlimit::{failure_policy::LocalFallback, Quota};
    ///
    /// let quota = Quota::per_minute(100)?.with_burst(10)?;
    /// let share = LocalFallback::new(4).share(&quota);
    /// assert_eq!((share.limit(), share.burst(), share.period()), (25, 2, quota.period()));
    /// // Never less than one request.
    /// assert_eq!(LocalFallback::new(1_000).share(&quota).limit(), 1);
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn share(&self, quota: &Quota) -> Quota {
        let limit = (quota.limit() / self.instances).max(1);
        let burst = (quota.burst() / self.instances).max(1);
        // Both stay within the bounds the original quota was validated against.
        Quota::new(limit, quota.period())
            .and_then(|q| q.with_burst(burst))
            .unwrap_or(*quota)
    }
}

impl FailurePolicy for LocalFallback {
    fn on_store_error(&self, ctx: &FailureContext<'_>) -> Verdict {
        let quotas = ctx.request.quotas;
        let share = Quotas::new(quotas.iter().map(|quota| self.share(quota))).unwrap_or(*quotas);
        let request = CheckRequest {
            quotas: &share,
            ..ctx.request
        };
        Verdict::Decided(self.store.check_now(request))
    }
}
