//! [`Decision`]: what the limiter answered for one request, and [`Verdict`]: a decision or what
//! the failure policy chose when the store failed.

use std::time::Duration;

use crate::quota::Quota;

/// The answer for one request: admitted or not, and what the client should know.
///
/// All durations are whole milliseconds, rounded **up**: a client told to come back after
/// `retry_after` is never early.
///
/// ```
/// use redlimit::{Decision, Quota};
/// use std::time::Duration;
///
/// let denied = Decision {
///     allowed: false,
///     limit: 10,
///     remaining: 0,
///     retry_after: Duration::from_millis(5_500),
///     reset_after: Duration::from_secs(60),
///     suspended: false,
///     quota: Quota::per_minute(10).unwrap(),
///     overridden: false,
/// };
/// assert_eq!(denied.retry_after_secs(), 6);
/// assert!(!denied.never_allowed());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request was admitted (and its cost consumed).
    pub allowed: bool,
    /// The quota's limit: requests per period.
    pub limit: u64,
    /// Requests of cost 1 that would still be admitted right now, after this one.
    pub remaining: u64,
    /// Zero when allowed; otherwise how long until a request of this cost would be admitted.
    /// [`Decision::NEVER`] when the cost exceeds what the quota can ever hold.
    pub retry_after: Duration,
    /// How long until the key is back to its full capacity in every quota (idle keys expire
    /// then).
    pub reset_after: Duration,
    /// The key is suspended ([`Limiter::suspend`](crate::Limiter::suspend)): denied whatever
    /// its quotas hold, `retry_after` being the time the suspension has left.
    pub suspended: bool,
    /// The quota that decided: the only one, or of several ([`Quotas`](crate::Quotas)) on a
    /// denial the one that denied with the longest wait, on an admission the one with the least
    /// `remaining`. When an override set with [`Limiter::set_quota`](crate::Limiter::set_quota)
    /// is in force, one of the override's quotas.
    pub quota: Quota,
    /// An override set with [`Limiter::set_quota`](crate::Limiter::set_quota) decided: `quota`
    /// is one of the override's quotas, not of the caller's, even when it equals one of them
    /// (the layer's headers then describe the override alone).
    pub overridden: bool,
}

impl Decision {
    /// `retry_after` of a request whose cost exceeds the quota's capacity: it can never pass.
    pub const NEVER: Duration = Duration::MAX;

    /// True when the request's cost is larger than the quota can ever admit.
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let quota = Quota::per_minute(10).unwrap();
    /// let too_big = limiter.check_quotas("k", &quota.into(), 11).await;
    /// assert!(too_big.decision().unwrap().never_allowed());
    /// let fits = limiter.check_quotas("k", &quota.into(), 10).await;
    /// assert!(!fits.decision().unwrap().never_allowed());
    /// # }
    /// ```
    pub fn never_allowed(&self) -> bool {
        self.retry_after == Self::NEVER
    }

    /// `retry_after` in whole seconds, rounded up: the HTTP `Retry-After` value (at least 1 for a
    /// denied request).
    ///
    /// ```
    /// use redlimit::{Decision, Quota};
    /// use std::time::Duration;
    ///
    /// let denied = Decision {
    ///     allowed: false,
    ///     limit: 10,
    ///     remaining: 0,
    ///     retry_after: Duration::from_millis(1),
    ///     reset_after: Duration::from_secs(6),
    ///     suspended: false,
    ///     quota: Quota::per_minute(10).unwrap(),
    ///     overridden: false,
    /// };
    /// assert_eq!(denied.retry_after_secs(), 1); // never "come back in 0 seconds"
    /// let allowed = Decision { allowed: true, retry_after: Duration::ZERO, ..denied };
    /// assert_eq!(allowed.retry_after_secs(), 0);
    /// ```
    pub fn retry_after_secs(&self) -> u64 {
        if self.allowed {
            0
        } else {
            secs_rounded_up(self.retry_after).max(1)
        }
    }

    /// `reset_after` in whole seconds, rounded up.
    ///
    /// ```
    /// use redlimit::{Decision, Quota};
    /// use std::time::Duration;
    ///
    /// let decision = Decision {
    ///     allowed: true,
    ///     limit: 10,
    ///     remaining: 9,
    ///     retry_after: Duration::ZERO,
    ///     reset_after: Duration::from_millis(6_001),
    ///     suspended: false,
    ///     quota: Quota::per_minute(10).unwrap(),
    ///     overridden: false,
    /// };
    /// assert_eq!(decision.reset_after_secs(), 7);
    /// ```
    pub fn reset_after_secs(&self) -> u64 {
        secs_rounded_up(self.reset_after)
    }
}

/// The outcome of a check: a real decision, or what the failure policy chose when the store
/// failed.
///
/// ```
/// use redlimit::{store::MemoryStore, Limiter, Quota, Verdict};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let limiter = Limiter::new(MemoryStore::new());
/// let quota = Quota::per_minute(1).unwrap();
/// assert!(limiter.check("k", &quota).await.is_allowed());
/// match limiter.check("k", &quota).await {
///     Verdict::Decided(decision) => {
///         assert!(!decision.allowed);
///         assert_eq!(decision.retry_after_secs(), 60); // one request a minute
///     }
///     other => panic!("the memory store never fails, got {other:?}"),
/// }
/// # }
/// ```
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
    ///
    /// ```
    /// use redlimit::Verdict;
    /// use std::time::Duration;
    ///
    /// assert!(Verdict::FailedOpen.is_allowed());
    /// assert!(!Verdict::FailedClosed { retry_after: Duration::from_secs(1) }.is_allowed());
    /// ```
    pub fn is_allowed(&self) -> bool {
        match self {
            Verdict::Decided(decision) => decision.allowed,
            Verdict::FailedOpen => true,
            Verdict::FailedClosed { .. } => false,
        }
    }

    /// The decision, when there is one.
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter, Quota, Verdict};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let verdict = limiter.check("k", &Quota::per_second(5).unwrap()).await;
    /// assert_eq!(verdict.decision().map(|d| d.remaining), Some(4));
    /// assert_eq!(Verdict::FailedOpen.decision(), None);
    /// # }
    /// ```
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Verdict::Decided(decision) => Some(decision),
            _ => None,
        }
    }
}

/// Whole seconds, rounded up; saturates for [`Decision::NEVER`].
pub(crate) fn secs_rounded_up(d: Duration) -> u64 {
    let secs = d.as_secs();
    if d.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    }
}
