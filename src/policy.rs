//! [`FailurePolicy`]: what a store failure means for the request.
//!
//! Every store error (Redis down, a timeout, an open circuit) goes through the limiter's policy,
//! which is logged with `tracing` (never with the key: it may be a secret) and counted in
//! [`LimiterStats`](crate::LimiterStats).
//!
//! ```
//! use redlimit::{policy::FailClosed, store::RedisStore, Limiter};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder(RedisStore::new("redis://127.0.0.1:6379")?)
//!     .failure_policy(FailClosed::default())
//!     .build()?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use crate::store::{CheckRequest, MemoryStore, StoreError};
use crate::{Decision, Quota};

/// The outcome of a check: a real decision, or what the failure policy chose when the store
/// failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A decision: from the store, or from a local fallback limiter.
    Decided(Decision),
    /// The store failed and the policy admits the request unchecked.
    FailedOpen,
    /// The store failed and the policy rejects the request (HTTP 503, gRPC `UNAVAILABLE`).
    FailedClosed {
        /// How long the client should wait before retrying.
        retry_after: Duration,
    },
}

impl Verdict {
    /// Whether the request may proceed.
    pub fn is_allowed(&self) -> bool {
        match self {
            Verdict::Decided(decision) => decision.allowed,
            Verdict::FailedOpen => true,
            Verdict::FailedClosed { .. } => false,
        }
    }

    /// The decision, when there is one.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Verdict::Decided(decision) => Some(decision),
            _ => None,
        }
    }
}

/// What the policy knows about a failed check.
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
/// use redlimit::policy::{FailureContext, FailurePolicy, Verdict};
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
#[derive(Debug, Clone, Copy, Default)]
pub struct FailOpen;

impl FailurePolicy for FailOpen {
    fn on_store_error(&self, _ctx: &FailureContext<'_>) -> Verdict {
        Verdict::FailedOpen
    }
}

/// Reject every request while the store fails: HTTP 503 with `Retry-After`.
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
/// use redlimit::{policy::LocalFallback, store::RedisStore, Limiter};
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
        let share = self.share(ctx.request.quota);
        let request = CheckRequest {
            quota: &share,
            ..ctx.request
        };
        Verdict::Decided(self.store.check_now(request))
    }
}
