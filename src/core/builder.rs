//! [`LimiterBuilder`]: the options of a [`Limiter`].

use std::fmt;
use std::sync::Arc;

use super::keys::KeyScope;
use super::stats::Counters;
use super::DelegateConfig;
use super::{ConfigError, Inner, Limiter};
use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::deny_cache::DenyCache;
use crate::failure_policy::FailurePolicy;
use crate::store::Store;

/// Builds a [`Limiter`]; see [`Limiter::builder`].
///
/// Every option has a default: token bucket, prefix [`DEFAULT_PREFIX`](super::DEFAULT_PREFIX),
/// Redis server time, [`FailOpen`](crate::failure_policy::FailOpen), no deny cache.
///
/// ```
/// use redlimit::failure_policy::LocalFallback;
/// use redlimit::store::RedisStore;
/// use redlimit::{clock::Clock, Algorithm, Limiter};
///
/// let limiter = Limiter::builder(RedisStore::new("redis://127.0.0.1:6379")?)
///     .algorithm(Algorithm::SlidingWindow)
///     .prefix("api")
///     .clock(Clock::Server)
///     .failure_policy(LocalFallback::new(3))
///     .build()?;
/// assert_eq!(limiter.algorithm(), Algorithm::SlidingWindow);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Algorithm and prefix
///
/// Give limiters that share a Redis different prefixes, so their keys never meet. A prefix is
/// 1 to 64 printable ASCII characters, without `{` or `}`.
///
/// ```
/// use redlimit::{limiter::ConfigError, store::MemoryStore, Algorithm, Limiter};
///
/// let limiter = Limiter::builder(MemoryStore::new())
///     .algorithm("fixed-window".parse().unwrap())
///     .build()
///     .unwrap();
/// assert_eq!(limiter.algorithm(), Algorithm::FixedWindow);
///
/// let search = Limiter::builder(MemoryStore::new()).prefix("rl:search").build().unwrap();
/// assert_eq!(search.storage_key("u1"), "rl:search:{u1}");
///
/// let bad = Limiter::builder(MemoryStore::new()).prefix("has space").build();
/// assert_eq!(bad.err(), Some(ConfigError::InvalidPrefix));
/// let braces = Limiter::builder(MemoryStore::new()).prefix("a{b}").build();
/// assert_eq!(braces.err(), Some(ConfigError::InvalidPrefix));
/// ```
///
/// # A manual clock
///
/// A [`ManualClock`](crate::clock::ManualClock) makes refills deterministic in tests:
///
/// ```
/// use std::time::Duration;
/// use redlimit::{clock::{Clock, ManualClock}, store::MemoryStore, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let clock = ManualClock::new(Duration::from_secs(1_000));
/// let limiter = Limiter::builder(MemoryStore::new())
///     .clock(Clock::Manual(clock.clone()))
///     .build()
///     .unwrap();
/// let quota = Quota::per_second(1).unwrap();
/// assert!(limiter.check("k", &quota).await.is_allowed());
/// assert!(!limiter.check("k", &quota).await.is_allowed());
/// clock.advance(Duration::from_secs(1)); // one token refills
/// assert!(limiter.check("k", &quota).await.is_allowed());
/// # }
/// ```
///
/// # A failure policy
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
/// use redlimit::{failure_policy::FailClosed, Limiter, Quota, Verdict};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // `Down` is a store whose every call times out (see the `policy` module docs).
/// let limiter = Limiter::builder(Down)
///     .failure_policy(FailClosed { retry_after: Duration::from_secs(2) })
///     .build()
///     .unwrap();
/// let verdict = limiter.check("k", &Quota::per_second(1).unwrap()).await;
/// assert_eq!(verdict, Verdict::FailedClosed { retry_after: Duration::from_secs(2) });
/// # }
/// ```
///
/// # The deny cache
///
/// A denial with `retry_after` r is answered in this process, without the store, until r has
/// passed: a client hammering an over-limit key costs Redis nothing until it may pass again.
/// It caches denials only, so it never admits more than the store would; it answers only
/// requests of the same quota and the same cost as the denied one (so its `retry_after` is
/// exact for them), and never caches a denial that can never pass (cost above the capacity).
/// Other instances are unaffected: they admit nothing the store would not either. A control
/// this limiter makes ([`Limiter::set_quota`], [`Limiter::suspend`], [`Limiter::resume`],
/// [`Limiter::reset`], ...) drops its tenant's entries on every scope before it returns, and a
/// denial whose check started before the control returned is never cached; any other change
/// this process makes to a key drops its entry ([`Limiter::forget`]). A control made elsewhere
/// is seen when the cached denial ends, or within one lease interval on a leasing limiter (its
/// entries answer one interval at most).
///
/// Memory: about 210 bytes per entry with storage keys of about 30 bytes (measured as the
/// growth of the process's RSS over a full cache: 211 bytes per entry at 10 000 keys, 194 at
/// 1 000 000 with a 112-byte slot; the slot is 120 bytes, so expect 8 more), plus a longer
/// key's extra length, plus 32 bytes per quota beyond the first when checks pass several. A
/// full cache makes room for a new denial in constant time (it evicts an ended entry, or the
/// one that ends first, among a few), so keys minted to be denied once each cost no more when
/// it is full.
///
/// Denials from the cache are counted in
/// [`LimiterStats::deny_cached`](super::LimiterStats::deny_cached) (and `denied`).
///
/// ```
/// use std::time::Duration;
/// use redlimit::{clock::{Clock, ManualClock}, store::MemoryStore, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let clock = ManualClock::new(Duration::from_secs(1_000));
/// let limiter = Limiter::builder(MemoryStore::new())
///     .clock(Clock::Manual(clock.clone()))
///     .deny_cache(10_000)
///     .build()
///     .unwrap();
/// let quota = Quota::per_second(1).unwrap();
/// assert!(limiter.check("k", &quota).await.is_allowed());
/// for _ in 0..100 {
///     assert!(!limiter.check("k", &quota).await.is_allowed());
/// }
/// // One denial came from the store, 99 from the cache.
/// assert_eq!(limiter.stats().deny_cached, 99);
/// clock.advance(Duration::from_secs(1)); // retry_after has passed
/// assert!(limiter.check("k", &quota).await.is_allowed());
/// # }
/// ```
pub struct LimiterBuilder {
    pub(super) store: Arc<dyn Store>,
    pub(super) algorithm: Algorithm,
    pub(super) prefix: String,
    pub(super) clock: Clock,
    pub(super) policy: Arc<dyn FailurePolicy>,
    pub(super) deny_cache: Option<usize>,
    /// The feature that answers checks in the store's place (`crate::lease`'s
    /// `LimiterBuilder::leases` sets it).
    pub(crate) delegate: Option<Box<dyn DelegateConfig>>,
}

impl fmt::Debug for LimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("algorithm", &self.algorithm)
            .field("prefix", &self.prefix)
            .field("deny_cache", &self.deny_cache)
            .field("delegate", &self.delegate)
            .finish_non_exhaustive()
    }
}

impl LimiterBuilder {
    /// The algorithm (token bucket by default); see [the examples](Self#algorithm-and-prefix).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The prefix of every Redis key (`redlimit` by default): 1 to 64 printable ASCII
    /// characters, without `{` or `}`; see [the examples](Self#algorithm-and-prefix).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Whose clock decides (Redis server time by default); see [a manual
    /// clock](Self#a-manual-clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// What a store failure means ([`FailOpen`](crate::failure_policy::FailOpen) by default); see [a
    /// failure policy](Self#a-failure-policy).
    pub fn failure_policy(mut self, policy: impl FailurePolicy) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// Turns on the local deny cache, holding at most `max_keys` keys (off by default); see
    /// [the deny cache](Self#the-deny-cache).
    pub fn deny_cache(mut self, max_keys: usize) -> Self {
        self.deny_cache = Some(max_keys);
        self
    }

    /// Builds the limiter, validating the prefix ([`ConfigError::InvalidPrefix`]).
    pub fn build(self) -> Result<Limiter, ConfigError> {
        let valid = (1..=64).contains(&self.prefix.len())
            && self
                .prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
        if !valid {
            return Err(ConfigError::InvalidPrefix);
        }
        if let Some(delegate) = &self.delegate {
            delegate.validate(self.algorithm)?;
        }
        // A delegate's deny cache: on unless asked otherwise, and its entries answer for as
        // long as it says at most (a lease interval: a control made elsewhere reaches a
        // leasing limiter within it, even on a denied key).
        let needs = self.delegate.as_ref().map(|delegate| delegate.deny_cache());
        let deny_cache = self.deny_cache.or(needs.map(|(keys, _)| keys));
        let delegate =
            (self.delegate.as_ref()).map(|config| config.build(self.algorithm, &self.clock));
        let unscoped = KeyScope::new(&self.prefix, None);
        Ok(Limiter {
            inner: Arc::new(Inner {
                store: self.store,
                algorithm: self.algorithm,
                prefix: self.prefix,
                clock: self.clock,
                policy: self.policy,
                stats: Counters::default(),
                deny_cache: deny_cache
                    .map(|keys| DenyCache::new(keys, needs.map(|(_, max_age)| max_age))),
                unscoped,
                waiters: Default::default(),
                delegate,
                features: Default::default(),
            }),
        })
    }
}
