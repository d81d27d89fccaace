//! [`Decision`]: what the limiter answered for one request.

use std::time::Duration;

/// The answer for one request: admitted or not, and what the client should know.
///
/// All durations are whole milliseconds, rounded **up**: a client told to come back after
/// `retry_after` is never early.
///
/// ```
/// use redlimit::Decision;
/// use std::time::Duration;
///
/// let denied = Decision {
///     allowed: false,
///     limit: 10,
///     remaining: 0,
///     retry_after: Duration::from_millis(5_500),
///     reset_after: Duration::from_secs(60),
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
    /// How long until the key is back to its full capacity (idle keys expire then).
    pub reset_after: Duration,
}

impl Decision {
    /// `retry_after` of a request whose cost exceeds the quota's capacity: it can never pass.
    pub const NEVER: Duration = Duration::MAX;

    /// True when the request's cost is larger than the quota can ever admit.
    pub fn never_allowed(&self) -> bool {
        self.retry_after == Self::NEVER
    }

    /// `retry_after` in whole seconds, rounded up: the HTTP `Retry-After` value (at least 1 for a
    /// denied request).
    pub fn retry_after_secs(&self) -> u64 {
        if self.allowed {
            0
        } else {
            secs_rounded_up(self.retry_after).max(1)
        }
    }

    /// `reset_after` in whole seconds, rounded up.
    pub fn reset_after_secs(&self) -> u64 {
        secs_rounded_up(self.reset_after)
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
