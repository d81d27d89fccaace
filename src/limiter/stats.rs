//! [`LimiterStats`]: what a limiter decided, counted without locks.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::decision::Decision;
use crate::policy::Verdict;

/// What a limiter has decided since it was built; see [`Limiter::stats`](super::Limiter::stats).
///
/// Export it to your metrics: a rising `store_errors` means Redis is in trouble while the
/// failure policy keeps requests flowing; a rising `unkeyed` means requests reach the layer
/// without a key (see [`MissingKey`](crate::MissingKey)).
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
/// use redlimit::{Limiter, LimiterStats, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // `Down` is a store whose every call times out (see the `policy` module docs).
/// let limiter = Limiter::new(Down);
/// assert!(limiter.check("k", &Quota::per_second(1).unwrap()).await.is_allowed());
/// let stats = limiter.stats();
/// assert_eq!(stats, LimiterStats { store_errors: 1, failed_open: 1, ..LimiterStats::default() });
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimiterStats {
    /// Requests the store admitted.
    pub allowed: u64,
    /// Requests denied: by the store, or by the deny cache without asking the store (those are
    /// also counted in `deny_cached`).
    pub denied: u64,
    /// Denials answered by the local deny cache, without the store (see
    /// [`LimiterBuilder::deny_cache`](super::LimiterBuilder::deny_cache)); included in `denied`.
    pub deny_cached: u64,
    /// Store calls that failed (each then went through the failure policy).
    pub store_errors: u64,
    /// Failures the policy admitted unchecked.
    pub failed_open: u64,
    /// Failures the policy rejected.
    pub failed_closed: u64,
    /// Failures the policy decided locally (e.g. [`LocalFallback`](crate::policy::LocalFallback)).
    pub fallback_decisions: u64,
    /// Requests a [`RateLimitLayer`](crate::RateLimitLayer) found no key for and counted against
    /// the shared key of [`MissingKey::Shared`](crate::MissingKey::Shared). Usually a
    /// misconfiguration: `PeerIp` without a peer address.
    pub unkeyed: u64,
}

/// One counter on a cache line of its own (128 bytes: x86-64 prefetches lines in pairs), so
/// that cores counting different outcomes do not contend for one line.
#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl Padded {
    #[inline]
    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn load(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The live counters behind [`LimiterStats`].
#[derive(Default)]
pub(crate) struct Counters {
    allowed: Padded,
    denied: Padded,
    deny_cached: Padded,
    store_errors: Padded,
    failed_open: Padded,
    failed_closed: Padded,
    fallback_decisions: Padded,
    unkeyed: Padded,
}

impl Counters {
    pub(crate) fn count_decision(&self, decision: &Decision) {
        if decision.allowed {
            self.allowed.add();
        } else {
            self.denied.add();
        }
    }

    /// A denial answered from the deny cache.
    pub(crate) fn count_cached_denial(&self) {
        self.denied.add();
        self.deny_cached.add();
    }

    pub(crate) fn count_store_error(&self) {
        self.store_errors.add();
    }

    pub(crate) fn count_failure(&self, verdict: &Verdict) {
        match verdict {
            Verdict::Decided(_) => self.fallback_decisions.add(),
            Verdict::FailedOpen => self.failed_open.add(),
            Verdict::FailedClosed { .. } => self.failed_closed.add(),
        }
    }

    pub(crate) fn count_unkeyed(&self) {
        self.unkeyed.add();
    }

    pub(crate) fn snapshot(&self) -> LimiterStats {
        LimiterStats {
            allowed: self.allowed.load(),
            denied: self.denied.load(),
            deny_cached: self.deny_cached.load(),
            store_errors: self.store_errors.load(),
            failed_open: self.failed_open.load(),
            failed_closed: self.failed_closed.load(),
            fallback_decisions: self.fallback_decisions.load(),
            unkeyed: self.unkeyed.load(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_sit_on_their_own_cache_lines() {
        assert_eq!(std::mem::align_of::<Padded>(), 128);
        assert!(std::mem::size_of::<Counters>() >= 8 * 128);
    }
}
