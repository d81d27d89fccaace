//! The limiter's core: [`Limiter`], a store, an algorithm, keys, a clock, a failure policy and
//! its counters; a check (`check.rs`), the wait mode (`acquire.rs`), the builder. The features
//! that extend it (`crate::control`, `crate::block`, `crate::settle`) stand above it and import it; it names
//! none of them. Users see it through [`crate::limiter`], which re-exports it with what the
//! features add.

use std::fmt;
use std::sync::Arc;

use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::decision::{Decision, Verdict};
use crate::failure_policy::{FailOpen, FailurePolicy};
use crate::quota::{Quota, Quotas};
use crate::store::{Store, StoreError};

mod acquire;
mod builder;
mod check;
mod delegate;
mod error;
mod features;
mod keys;
mod stats;

pub use self::acquire::AcquireError;
use self::acquire::Waiters;
pub use self::builder::LimiterBuilder;
pub(crate) use self::check::{Answer, Ask, Later, Origin, Renewal, StoreCall, Taken};
pub(crate) use self::delegate::{Delegate, DelegateConfig};
pub use self::error::{ControlError, LeaseError, MAX_SUSPENSION};
use self::features::FeatureStates;
pub(crate) use self::keys::{KeyScope, StorageKey};
pub use self::keys::{StoredKey, Target};
use self::stats::Counters;
pub use self::stats::{LimiterStats, DIRECT_POLICY_LABEL};
pub(crate) use self::stats::{PolicyLabel, Shadow, StoreTimer};
use crate::deny_cache::DenyCache;

/// The default prefix of every Redis key.
pub const DEFAULT_PREFIX: &str = "redlimit";

/// Checks keys against quotas. Cheap to clone: clones share the store and counters.
///
/// ```
/// use redlimit::{store::MemoryStore, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = Limiter::new(MemoryStore::new());
/// let quota = Quota::per_second(10).unwrap();
/// let verdict = limiter.check("tenant-42", &quota).await;
/// assert!(verdict.is_allowed());
/// assert_eq!(verdict.decision().unwrap().remaining, 9);
/// // A heavy call costs 5 units.
/// assert!(limiter.check_quotas("tenant-42", &quota.into(), 5).await.is_allowed());
/// # }
/// ```
#[derive(Clone)]
pub struct Limiter {
    pub(in crate::core) inner: Arc<Inner>,
}

/// A [`Limiter`] that does not keep it alive ([`Limiter::downgrade`]).
#[derive(Clone)]
pub(crate) struct WeakLimiter(std::sync::Weak<Inner>);

impl WeakLimiter {
    /// The limiter, while any clone of it lives.
    pub(crate) fn upgrade(&self) -> Option<Limiter> {
        self.0.upgrade().map(|inner| Limiter { inner })
    }
}

/// What every clone of a [`Limiter`] shares. Private to the core: the features above it read
/// the store, clock, policy and counters through `Limiter`'s accessors.
pub(crate) struct Inner {
    store: Arc<dyn Store>,
    algorithm: Algorithm,
    prefix: String,
    clock: Clock,
    policy: Arc<dyn FailurePolicy>,
    stats: Counters,
    deny_cache: Option<DenyCache>,
    /// The constant parts of unscoped storage keys.
    unscoped: KeyScope,
    /// The lines of [`acquire`](Limiter::acquire)'s waiters, per key.
    waiters: Waiters,
    /// The feature that answers checks in the store's place, when on (leases,
    /// [`LimiterBuilder::leases`]).
    delegate: Option<Arc<dyn Delegate>>,
    /// What the features above the core keep per limiter, each its own type (the controls'
    /// writes in flight, `crate::control`; the settlements running, `crate::settle`).
    features: FeatureStates,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.inner.store)
            .field("algorithm", &self.inner.algorithm)
            .field("prefix", &self.inner.prefix)
            .field("clock", &self.inner.clock)
            .field("policy", &self.inner.policy)
            .field("deny_cache", &self.inner.deny_cache)
            .field("delegate", &self.inner.delegate)
            .finish()
    }
}

impl Limiter {
    /// A limiter with the defaults: token bucket, prefix `redlimit`, Redis server time, fail open.
    pub fn new(store: impl Store) -> Self {
        Self::builder(store)
            .build()
            .expect("the default configuration is valid")
    }

    /// Starts a builder; see [`LimiterBuilder`] for the options.
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Algorithm, Limiter};
    ///
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .algorithm(Algorithm::Gcra)
    ///     .prefix("checkout")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(limiter.algorithm(), Algorithm::Gcra);
    /// assert_eq!(limiter.storage_key("tenant-42"), "checkout:{tenant-42}");
    /// ```
    pub fn builder(store: impl Store) -> LimiterBuilder {
        LimiterBuilder {
            store: Arc::new(store),
            algorithm: Algorithm::default(),
            prefix: DEFAULT_PREFIX.to_owned(),
            clock: Clock::default(),
            policy: Arc::new(FailOpen),
            deny_cache: None,
            delegate: None,
        }
    }

    /// Checks one request of cost 1 for `key` against `quota`: the quick start's check. For a
    /// cost, a scope or several quotas at once, see [`check_quotas`](Self::check_quotas).
    ///
    /// The state of a key belongs to its quotas: checking the same key under two different
    /// quotas would mix their counts. To apply several quotas to one key (2 a second and 100 a
    /// minute), check them together with [`check_quotas`](Self::check_quotas) (one store call,
    /// all or none), or each in its own scope ([`Target::scoped`]), as a
    /// [`RateLimitLayer`](crate::RateLimitLayer) does with its scope.
    pub async fn check(&self, key: &str, quota: &Quota) -> Verdict {
        self.check_quotas(key, &Quotas::from(quota), 1).await
    }

    /// Checks one request of `cost` units (0 peeks: reports the state without consuming) for
    /// `target` (a key, or a key within a scope: [`Target`]) against several quotas at once, in
    /// **one** store call, all or none: a request denied by one quota consumes from none. The
    /// decision is the most restrictive: on a denial the longest `retry_after`, on an admission
    /// the least `remaining` ([`Decision::quota`] names the quota that decided). Store failures
    /// go through the failure policy.
    ///
    /// A quota the algorithm cannot serve (see [`Algorithm::supports`]) is a programming error:
    /// it is logged and the request denied as never allowed, never waved through.
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter, Quota, Quotas, Target};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlimit::quota::QuotaError> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let per_second = Quota::per_second(5)?;
    /// let per_minute = Quota::per_minute(3)?;
    /// let tiers = Quotas::new([per_second, per_minute])?;
    /// let first = *limiter.check_quotas("t", &tiers, 1).await.decision().unwrap();
    /// // Both admit; the per-minute quota has the least left (2, the per-second one 4).
    /// assert_eq!((first.quota, first.remaining), (per_minute, 2));
    /// assert!(limiter.check_quotas("t", &tiers, 1).await.is_allowed());
    /// assert!(limiter.check_quotas("t", &tiers, 1).await.is_allowed());
    /// // The per-minute quota is spent: denied, and the per-second one is not charged.
    /// let fourth = *limiter.check_quotas("t", &tiers, 1).await.decision().unwrap();
    /// assert!(!fourth.allowed);
    /// assert_eq!(fourth.quota, per_minute);
    ///
    /// // One quota, a cost: an export costs 8 of the 10 requests a minute.
    /// let quota = Quotas::from(Quota::per_minute(10)?);
    /// assert!(limiter.check_quotas("tenant-42", &quota, 8).await.is_allowed());
    /// // Cost 0 peeks: what is left, without consuming it.
    /// let peek = limiter.check_quotas("tenant-42", &quota, 0).await;
    /// assert_eq!(peek.decision().unwrap().remaining, 2);
    /// // A cost above the burst can never pass.
    /// let never = limiter.check_quotas("tenant-42", &quota, 11).await;
    /// assert!(never.decision().unwrap().never_allowed());
    ///
    /// // Within a scope the key keeps a state of its own.
    /// let login = Target::scoped("login", "tenant-42");
    /// assert_eq!(limiter.check_quotas(login, &quota, 1).await.decision().unwrap().remaining, 9);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check_quotas<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
        cost: u64,
    ) -> Verdict {
        let storage_key = self.target_key(target.into());
        let label = PolicyLabel::direct();
        let ask = Ask::new(storage_key.as_str(), quotas, cost, &label);
        self.answer(ask).await.verdict
    }

    /// The constant parts of the storage keys of `scope` (`None`: unscoped), computed once, so
    /// that a caller checking many keys in one scope builds each storage key with one
    /// allocation and no formatting.
    pub(crate) fn key_scope(&self, scope: Option<&str>) -> KeyScope {
        KeyScope::new(&self.inner.prefix, scope)
    }

    /// Counts a request that had no key and was checked against a shared one.
    pub(crate) fn count_unkeyed(&self, label: &PolicyLabel) {
        self.inner.stats.count_unkeyed(label);
    }

    /// Drops what this process remembers about `target` in its deny cache (see
    /// [`LimiterBuilder::deny_cache`]), so its next check goes to the store.
    ///
    /// Every operation of this limiter that changes a key's state or quota drops what it
    /// changed (a control: every scope of the tenant); call it yourself after changing a key in
    /// the store by other means (e.g. deleting it by hand in Redis). It ends the key's lease
    /// too (see [`LimiterBuilder::leases`]). Without a deny cache or leases it does nothing.
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = MemoryStore::new();
    /// let limiter = Limiter::builder(store).deny_cache(1_000).build().unwrap();
    /// let quota = Quota::per_minute(1).unwrap();
    /// limiter.check("k", &quota).await;
    /// assert!(!limiter.check("k", &quota).await.is_allowed()); // the store denies
    /// assert!(!limiter.check("k", &quota).await.is_allowed()); // the cache denies
    /// assert_eq!(limiter.stats().deny_cached, 1);
    /// limiter.forget("k");
    /// assert!(!limiter.check("k", &quota).await.is_allowed()); // the store again
    /// assert_eq!(limiter.stats().deny_cached, 1);
    /// # }
    /// ```
    pub fn forget<'a>(&self, target: impl Into<Target<'a>>) {
        self.forget_storage_key(self.target_key(target.into()).as_str());
    }

    /// The hook every state or quota change of a storage key goes through.
    pub(crate) fn forget_storage_key(&self, storage_key: &str) {
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget(storage_key);
        }
        self.inner.waiters.forget(storage_key);
        if let Some(delegate) = &self.inner.delegate {
            delegate.forget(self, storage_key);
        }
    }

    /// The hook every control goes through, once its store call returned: drops what this
    /// limiter holds of the tenant of `storage_key`, on every scope (its deny cache's entries,
    /// what its waiters learned, its leases, whose units go back unless `reset`), and keeps any
    /// denial decided before out of the deny cache.
    pub(crate) fn forget_tenant(&self, storage_key: &str, reset: bool) {
        let tenant = crate::store::wire::layout::tenant_route(storage_key);
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget_tenant(tenant);
        }
        self.inner.waiters.forget(tenant);
        if let Some(delegate) = &self.inner.delegate {
            delegate.forget_tenant(self, tenant, !reset);
        }
    }

    /// [`check_quotas`](Self::check_quotas) without the failure policy: the store's decision or
    /// its error.
    ///
    /// Unlike [`check_quotas`](Self::check_quotas), a quota the algorithm cannot serve is an
    /// error here ([`StoreError::InvalidQuota`]).
    ///
    /// ```
    /// use redlimit::store::{MemoryStore, StoreError};
    /// use redlimit::{quota::QuotaError, Algorithm, Limiter, Quota, Quotas};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .algorithm(Algorithm::SlidingLog)
    ///     .build()?;
    /// let tiers = Quotas::new([Quota::per_second(10)?, Quota::per_minute(500)?])?;
    /// let decision = limiter.try_check_quotas("k", &tiers, 1).await?;
    /// assert_eq!(decision.remaining, 9);
    ///
    /// // The sliding log keeps one entry per request: a burst of a million is refused.
    /// let huge = Quotas::from(Quota::per_second(1_000_000)?);
    /// assert!(matches!(
    ///     limiter.try_check_quotas("k", &huge, 1).await,
    ///     Err(StoreError::InvalidQuota(QuotaError::BurstTooLargeForSlidingLog))
    /// ));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_check_quotas<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.supports(quotas).map_err(|(_, error)| error)?;
        let storage_key = self.target_key(target.into());
        let request = self.request(storage_key.as_str(), quotas, cost);
        self.decide_without_policy(request, &PolicyLabel::direct())
            .await
    }

    /// The algorithm that decides.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// The store, for the features above the core.
    pub(crate) fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The clock, for the features above the core.
    pub(crate) fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The failure policy, for the features above the core.
    pub(crate) fn policy(&self) -> &dyn FailurePolicy {
        &*self.inner.policy
    }

    /// The counters, for the features above the core.
    pub(crate) fn counters(&self) -> &Counters {
        &self.inner.stats
    }

    /// The deny cache, when on, for the features above the core.
    pub(crate) fn deny_cache(&self) -> Option<&DenyCache> {
        self.inner.deny_cache.as_ref()
    }

    /// A handle that does not keep the limiter alive (a feature's background task holds it).
    pub(crate) fn downgrade(&self) -> WeakLimiter {
        WeakLimiter(Arc::downgrade(&self.inner))
    }

    /// Counts of what this limiter (and its clones) decided so far.
    ///
    /// ```
    /// use redlimit::{limiter::LimiterStats, store::MemoryStore, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let quota = Quota::per_minute(1).unwrap();
    /// limiter.check("k", &quota).await;
    /// limiter.clone().check("k", &quota).await; // clones share the counters
    /// let stats = limiter.stats();
    /// assert_eq!((stats.allowed, stats.denied), (1, 1));
    /// assert_eq!(stats, LimiterStats { allowed: 1, denied: 1, ..LimiterStats::default() });
    /// # }
    /// ```
    pub fn stats(&self) -> LimiterStats {
        self.inner.stats.snapshot()
    }
}

/// Whether `name` is 1 to 64 characters of `[A-Za-z0-9._-]`: the rule of policy names and
/// scopes, in every builder.
pub(crate) fn is_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A configuration the builders refuse.
///
/// ```
/// use redlimit::key::GlobalKey;
/// use redlimit::store::MemoryStore;
/// use redlimit::{limiter::ConfigError, quota::QuotaError, Algorithm, Limiter, Quota, RateLimitLayer};
///
/// let empty_prefix = Limiter::builder(MemoryStore::new()).prefix("").build();
/// assert_eq!(empty_prefix.err(), Some(ConfigError::InvalidPrefix));
///
/// let limiter = Limiter::new(MemoryStore::new());
/// let quota = Quota::per_minute(10).unwrap();
/// let bad_name = RateLimitLayer::builder(limiter, quota, GlobalKey::new("g"))
///     .policy_name("no spaces")
///     .build();
/// assert_eq!(bad_name.err(), Some(ConfigError::InvalidPolicyName));
///
/// let log = Limiter::builder(MemoryStore::new())
///     .algorithm(Algorithm::SlidingLog)
///     .build()
///     .unwrap();
/// let huge = Quota::per_second(1_000_000).unwrap();
/// let error = RateLimitLayer::builder(log, huge, GlobalKey::new("g")).build().unwrap_err();
/// assert_eq!(error, ConfigError::Quota(QuotaError::BurstTooLargeForSlidingLog));
/// // The message says what to do.
/// assert!(error.to_string().contains("use sliding-window"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The key prefix is empty, longer than 64 bytes, not printable ASCII, or has `{` / `}`.
    #[error("key prefix must be 1 to 64 printable ASCII characters without '{{' or '}}'")]
    InvalidPrefix,
    /// The policy name for the `RateLimit` headers is empty, longer than 64 bytes, or has
    /// characters other than ASCII letters, digits, `-`, `_` and `.`.
    #[error("policy name must be 1 to 64 characters of [A-Za-z0-9._-]")]
    InvalidPolicyName,
    /// The scope given to [`RateLimitLayerBuilder::scope`](crate::layer::RateLimitLayerBuilder::scope)
    /// is empty, longer than 64 bytes, or has characters other than ASCII letters, digits, `-`,
    /// `_` and `.`.
    #[error("scope must be 1 to 64 characters of [A-Za-z0-9._-]")]
    InvalidScope,
    /// The limiter's algorithm cannot serve the layer's quota.
    #[error(transparent)]
    Quota(#[from] crate::quota::QuotaError),
    /// The lease configuration is refused ([`LimiterBuilder::leases`]).
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// A concurrency slot's lease shorter than [`MIN_SLOT_LEASE`](crate::concurrency::MIN_SLOT_LEASE) (300 ms) or longer than 30
    /// days.
    #[error("a concurrency slot's lease must last from 300 ms to 30 days")]
    InvalidLease,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::QuotaError;
    use crate::store::MemoryStore;

    fn sliding_log() -> Limiter {
        Limiter::builder(MemoryStore::new())
            .algorithm(Algorithm::SlidingLog)
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn a_quota_the_algorithm_cannot_serve_is_refused_not_waved_through() {
        let huge = Quota::per_second(1_000_000).unwrap();
        let limiter = sliding_log();
        let verdict = limiter.check("k", &huge).await;
        assert!(!verdict.is_allowed());
        assert!(verdict.decision().unwrap().never_allowed());
        assert!(matches!(
            limiter.try_check_quotas("k", &huge.into(), 1).await,
            Err(StoreError::InvalidQuota(
                QuotaError::BurstTooLargeForSlidingLog
            ))
        ));
    }

    #[test]
    fn prefixes_are_validated() {
        for bad in ["", "a{b", "a}b", "with space", &"p".repeat(65)] {
            let built = Limiter::builder(MemoryStore::new()).prefix(bad).build();
            assert_eq!(built.err(), Some(ConfigError::InvalidPrefix), "{bad:?}");
        }
        let limiter = Limiter::builder(MemoryStore::new())
            .prefix("app:rl")
            .build()
            .unwrap();
        assert_eq!(limiter.storage_key("tenant-1"), "app:rl:{tenant-1}");
    }
}
