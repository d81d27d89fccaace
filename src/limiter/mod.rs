//! [`Limiter`]: a store, an algorithm, a key prefix, a clock and a failure policy — usable
//! without tower.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::decision::{Decision, Verdict};
use crate::failure_policy::{FailOpen, FailureContext, FailurePolicy};
use crate::quota::{Quota, Quotas};
use crate::store::{CheckRequest, Store, StoreError};

mod acquire;
mod block;
mod builder;
mod control;
mod deny_cache;
mod keys;
mod lease;
mod settle;
mod stats;

pub use self::acquire::AcquireError;
use self::acquire::Waiters;
pub use self::block::BlockFor;
pub use self::builder::LimiterBuilder;
pub use self::control::{
    ControlError, KeyStatus, OverrideSource, TierState, MAX_SUSPENSION, OVERRIDE_IDLE_TTL,
};
pub(crate) use self::control::{WriteKind, WriteTicket};
use self::deny_cache::DenyCache;
pub(crate) use self::keys::{KeyScope, StorageKey};
pub use self::keys::{StoredKey, Target};
pub use self::lease::{
    LeaseError, LeaseStats, Leases, DEFAULT_MAX_LEASE_KEYS, DEFAULT_MAX_LEASE_UNITS,
    MAX_LEASE_INTERVAL,
};
pub(crate) use self::settle::Origin;
pub use self::settle::Reserved;
use self::stats::{Counters, StoreTimer};
pub use self::stats::{LimiterStats, DIRECT_POLICY_LABEL};
pub(crate) use self::stats::{PolicyLabel, Shadow};

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
    pub(crate) inner: Arc<Inner>,
}

/// What every clone of a [`Limiter`] shares; the feature modules beside `limiter` (the
/// concurrency limit) read its store, clock, policy and counters.
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) algorithm: Algorithm,
    prefix: String,
    pub(crate) clock: Clock,
    pub(crate) policy: Arc<dyn FailurePolicy>,
    pub(crate) stats: Counters,
    deny_cache: Option<DenyCache>,
    /// The constant parts of unscoped storage keys.
    unscoped: KeyScope,
    /// The lines of [`acquire`](Limiter::acquire)'s waiters, per key.
    waiters: Waiters,
    /// Token leases for hot keys, when on ([`LimiterBuilder::leases`]).
    leases: Option<self::lease::LeaseTable>,
    /// The layer's settlements still running (`settle.rs`).
    settlements: self::settle::Settlements,
    /// The outbound layers' writes in flight, which a later control wins over (`control.rs`).
    writes: self::control::Writes,
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
            .field("leases", &self.inner.leases)
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
            leases: None,
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
        self.check_storage_key(storage_key.as_str(), quotas, cost, &PolicyLabel::direct())
            .await
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
        self.end_lease(storage_key);
    }

    /// The hook every control goes through, once its store call returned: drops what this
    /// limiter holds of the tenant of `storage_key`, on every scope (its deny cache's entries,
    /// what its waiters learned, its leases, whose units go back unless `reset`), and keeps any
    /// denial decided before out of the deny cache.
    pub(crate) fn forget_tenant(&self, storage_key: &str, reset: bool) {
        let tenant = self::keys::tenant_route(storage_key);
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget_tenant(tenant);
        }
        self.inner.waiters.forget(tenant);
        self.end_tenant_leases(tenant, !reset);
    }

    /// Checks the request of `cost` on a storage key built by [`KeyScope::storage_key`] (or
    /// [`Target`]'s); `label` names the layer's policy in metrics.
    pub(crate) async fn check_storage_key(
        &self,
        storage_key: &str,
        quotas: &Quotas,
        cost: u64,
        label: &PolicyLabel,
    ) -> Verdict {
        self.check_storage_key_with(storage_key, quotas, cost, label, None)
            .await
    }

    /// [`check_storage_key`](Self::check_storage_key) when its verdict needs no waiting: from a
    /// lease (leases on), or from a store that decides at once ([`Store::decide_now`]). `None`
    /// when the check must be awaited.
    pub(crate) fn check_storage_key_now(
        &self,
        storage_key: &str,
        quotas: &Quotas,
        cost: u64,
        label: &PolicyLabel,
    ) -> Option<Verdict> {
        if self.inner.leases.is_some() {
            return self.check_leased_now(storage_key, quotas, cost, label);
        }
        // The deny cache's steps around the store call, and the logged denial of a quota the
        // algorithm cannot serve, are the awaited path's.
        if self.inner.deny_cache.is_some() || self.supports(quotas).is_err() {
            return None;
        }
        let request = self.request(storage_key, quotas, cost);
        // No latency recorded: a decision made in this process has no round trip to watch
        // (docs/using.md, the metrics' table).
        let result = self.inner.store.decide_now(request)?;
        Some(match result {
            Ok(decision) => {
                self.inner.stats.count_decision(&decision, label);
                Verdict::Decided(decision)
            }
            Err(error) => {
                self.inner.stats.count_store_error();
                self.fail(error, request, label)
            }
        })
    }

    /// [`check_storage_key`](Self::check_storage_key), blocking the key on a denial when
    /// `block` is given (`block.rs`).
    async fn check_storage_key_with(
        &self,
        storage_key: &str,
        quotas: &Quotas,
        cost: u64,
        label: &PolicyLabel,
        block: Option<crate::store::Block>,
    ) -> Verdict {
        if let Err((quota, error)) = self.supports(quotas) {
            tracing::error!(%error, algorithm = %self.inner.algorithm, "quota refused; request denied");
            let decision = Decision {
                allowed: false,
                limit: quota.limit(),
                remaining: 0,
                retry_after: Decision::NEVER,
                reset_after: Duration::ZERO,
                suspended: false,
                quota,
                overridden: false,
            };
            self.inner.stats.count_decision(&decision, label);
            return Verdict::Decided(decision);
        }
        // A check that blocks on a denial is one store call: the block is the script's.
        if let (Some(leases), None) = (&self.inner.leases, block) {
            return self
                .decide_leased(leases, storage_key, quotas, cost, label)
                .await;
        }
        let request = self.request(storage_key, quotas, cost);
        self.decide_direct(request, label, block).await
    }

    /// [`check_storage_key`](Self::check_storage_key) by one store call (no lease), its
    /// failure to the policy.
    async fn decide_direct(
        &self,
        request: CheckRequest<'_>,
        label: &PolicyLabel,
        block: Option<crate::store::Block>,
    ) -> Verdict {
        match self.ask_with(request, label, block).await {
            Ok(decision) => Verdict::Decided(decision),
            Err(error) => {
                self.inner.stats.count_store_error();
                self.fail(error, request, label)
            }
        }
    }

    /// The failure policy's verdict for `request`, whose store call failed with `error`
    /// (counted already), counted and logged.
    fn fail(&self, error: StoreError, request: CheckRequest<'_>, label: &PolicyLabel) -> Verdict {
        let stats = &self.inner.stats;
        let verdict = self.inner.policy.on_store_error(&FailureContext {
            error: &error,
            request,
        });
        self::settle::Origin::policy_answered();
        stats.count_failure(&verdict, label);
        // The key is never logged: it may be a secret. While the circuit breaker is open
        // every request lands here; the breaker itself logs its state changes, so those
        // are debug-level to keep an outage from flooding the logs.
        if matches!(error, StoreError::Unavailable(_)) {
            tracing::debug!(%error, allowed = verdict.is_allowed(), "rate limit store skipped; the failure policy decided");
        } else if let Some(suppressed) = crate::store::failure_log_gate() {
            // One line a second at most: a poisoned key hammered must not flood.
            tracing::warn!(
                %error,
                transport = error.is_transport(),
                algorithm = %self.inner.algorithm,
                policy = ?self.inner.policy,
                allowed = verdict.is_allowed(),
                suppressed,
                "rate limit store failed; the failure policy decided"
            );
        }
        verdict
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
        self.ask(
            self.request(storage_key.as_str(), quotas, cost),
            &PolicyLabel::direct(),
        )
        .await
    }

    /// Whether the algorithm serves every quota; else the first it cannot.
    pub(crate) fn supports(
        &self,
        quotas: &Quotas,
    ) -> Result<(), (Quota, crate::quota::QuotaError)> {
        for quota in quotas {
            self.inner
                .algorithm
                .supports(quota)
                .map_err(|error| (*quota, error))?;
        }
        Ok(())
    }

    /// The decision for `request`: from the deny cache when it holds one, else from the store
    /// (a denial that will end is then remembered). Counts the decision; errors are the
    /// caller's.
    async fn ask(
        &self,
        request: CheckRequest<'_>,
        label: &PolicyLabel,
    ) -> Result<Decision, StoreError> {
        self.ask_with(request, label, None).await
    }

    /// [`ask`](Self::ask), blocking the key on a denial when `block` is given.
    async fn ask_with(
        &self,
        request: CheckRequest<'_>,
        label: &PolicyLabel,
        block: Option<crate::store::Block>,
    ) -> Result<Decision, StoreError> {
        let stats = &self.inner.stats;
        let cache = self.inner.deny_cache.as_ref();
        let CheckRequest {
            key, quotas, cost, ..
        } = request;
        if let Some(cache) = cache {
            let now = cache.now(request.now_micros);
            if let Some(decision) = cache.lookup(key, quotas, cost, now) {
                stats.count_cached_denial(label);
                return Ok(decision);
            }
        }
        // Taken before the store call: a control that returns while it is in flight keeps its
        // denial out of the cache.
        let started = cache.map(|cache| cache.start(key, cache.now(request.now_micros)));
        // A decision the store makes at once records no latency (as in `check_storage_key_now`);
        // a blocking check always waits for the store.
        // A reservation on the store's clock asks the store when it admits (`Reserved::during`).
        let timed = request.now_micros.is_none() && Reserved::asked();
        let decided_now = match block {
            Some(_) => None,
            None if timed => None,
            None => self.inner.store.decide_now(request),
        };
        let result = match decided_now {
            Some(result) => result,
            None => {
                let timer = StoreTimer::start();
                let result = match block {
                    _ if timed => (self.inner.store.check_timed(request, block).await).map(
                        |(decision, at)| {
                            Reserved::decided(at);
                            decision
                        },
                    ),
                    Some(block) => self.inner.store.check_blocking(request, block).await,
                    None => self.inner.store.check(request).await,
                };
                timer.stop(label);
                result
            }
        };
        let decision = result?;
        stats.count_decision(&decision, label);
        if let (Some(cache), Some(started)) = (cache, started) {
            if !decision.allowed {
                // The store decided at `now_micros` (client clock), or before its reply came.
                let now = cache.now(request.now_micros);
                cache.remember(key, quotas, cost, &decision, now, started);
            } else if cost > 0 {
                // An admission consumed: a cached wait for another cost may now be too short.
                cache.admitted(key, quotas, cost);
            }
        }
        Ok(decision)
    }

    /// The algorithm that decides.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
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

    fn request<'a>(&self, storage_key: &'a str, quotas: &'a Quotas, cost: u64) -> CheckRequest<'a> {
        CheckRequest {
            key: storage_key,
            algorithm: self.inner.algorithm,
            quotas,
            cost,
            now_micros: self.inner.clock.now_micros(),
        }
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
