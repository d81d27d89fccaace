//! [`OutboundLayer`] and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::config::{Config, KeySource, Limits};
use super::learn::{
    Bounds, OutboundStats, Provider, DEFAULT_LEARNED_TTL, DEFAULT_LEARN_PERIOD,
    DEFAULT_MAX_LEARNED_WINDOW,
};
use super::service::Outbound;
use crate::core::{is_name, ConfigError, Limiter};
use crate::key::{GlobalKey, KeyExtractor};
use crate::quota::{Quota, Quotas};

/// How long a request waits for the limiter by default: 10 seconds.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

/// The longest suspension an upstream's `Retry-After` sets by default: 5 minutes (see
/// [`OutboundLayerBuilder::max_auto_suspension`]).
pub const DEFAULT_MAX_AUTO_SUSPENSION: Duration = Duration::from_secs(5 * 60);

/// Makes a client [`Service`](tower_service::Service) (an HTTP client) wait for a fleet-wide
/// quota instead of failing: see the [module docs](super) for the whole story and an example.
///
/// With a fixed key ([`builder`](Self::builder)) the wait happens in `poll_ready`; with a key
/// taken from each request ([`builder_with_extractor`](Self::builder_with_extractor)), in the
/// response future.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
///
/// let layer = OutboundLayer::new(Limiter::new(MemoryStore::new()), Quota::per_second(20)?, "github");
/// let patient = OutboundLayer::builder(Limiter::new(MemoryStore::new()), Quota::per_second(20)?, "github")
///     .max_wait(Duration::from_secs(30))
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct OutboundLayer<K = GlobalKey> {
    config: Arc<Config<K>>,
}

impl<K> Clone for OutboundLayer<K> {
    fn clone(&self) -> Self {
        OutboundLayer {
            config: self.config.clone(),
        }
    }
}

impl<K: fmt::Debug> fmt::Debug for OutboundLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboundLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl OutboundLayer {
    /// A layer with the defaults (wait at most [`DEFAULT_MAX_WAIT`], auto-suspend on,
    /// unscoped) that acquires every request against the fixed `key`, in `poll_ready`.
    ///
    /// # Panics
    ///
    /// When the limiter's algorithm cannot serve one of the quotas (see
    /// [`Algorithm::supports`](crate::Algorithm::supports));
    /// [`builder`](Self::builder)`(..).build()` returns that error instead.
    ///
    /// ```
    /// use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
    ///
    /// let layer = OutboundLayer::new(Limiter::new(MemoryStore::new()), Quota::per_second(5)?, "maps-api");
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    #[track_caller]
    pub fn new(limiter: Limiter, quotas: impl Into<Quotas>, key: impl Into<String>) -> Self {
        match Self::builder(limiter, quotas, key).build() {
            Ok(layer) => layer,
            Err(error) => panic!("OutboundLayer::new: {error}"),
        }
    }

    /// Starts a builder for a layer that acquires every request against the fixed `key` (the
    /// same storage key as [`Limiter::acquire`]`(key, ..)` and
    /// [`Limiter::check_quotas`]`(key, ..)` without a scope), in `poll_ready`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota, Quotas};
    ///
    /// let quotas = Quotas::new([Quota::per_second(10)?, Quota::per_minute(500)?])?;
    /// let layer = OutboundLayer::builder(Limiter::new(MemoryStore::new()), quotas, "maps-api")
    ///     .max_wait(Duration::from_secs(2))
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(
        limiter: Limiter,
        quotas: impl Into<Quotas>,
        key: impl Into<String>,
    ) -> OutboundLayerBuilder<GlobalKey> {
        let key: String = key.into();
        OutboundLayerBuilder::with_key(limiter, quotas.into(), KeySource::Fixed(key.into()))
    }
}

impl<K: KeyExtractor> OutboundLayer<K> {
    /// Starts a builder for a layer that acquires each request against the key `extractor`
    /// finds in it (one quota per upstream host, say), in the response future. A request
    /// without a key fails with [`OutboundError::MissingKey`](super::OutboundError::MissingKey).
    ///
    /// ```
    /// use redlimit::{key::FnKey, outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
    ///
    /// // Each upstream host has its own quota.
    /// let per_host = FnKey::new(|parts| parts.uri.host().map(str::to_owned));
    /// let layer = OutboundLayer::builder_with_extractor(
    ///     Limiter::new(MemoryStore::new()),
    ///     Quota::per_second(10)?,
    ///     per_host,
    /// )
    /// .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder_with_extractor(
        limiter: Limiter,
        quotas: impl Into<Quotas>,
        extractor: K,
    ) -> OutboundLayerBuilder<K> {
        OutboundLayerBuilder::with_key(limiter, quotas.into(), KeySource::PerRequest(extractor))
    }
}

impl<K> OutboundLayer<K> {
    /// The scope the layer's keys are counted in (see [`OutboundLayerBuilder::scope`]); `None`
    /// when unscoped.
    ///
    /// ```
    /// use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
    ///
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let plain = OutboundLayer::new(limiter.clone(), Quota::per_second(5)?, "api");
    /// assert_eq!(plain.scope(), None);
    /// let search = OutboundLayer::builder(limiter, Quota::per_second(5)?, "api").scope("search").build()?;
    /// assert_eq!(search.scope(), Some("search"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scope(&self) -> Option<&str> {
        self.config.limits.scope.as_deref()
    }

    /// What the layer (every service and clone built from it, in this process) made of the
    /// upstream's announcements: see the [module docs](super#provider-announcements).
    ///
    /// ```
    /// use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
    ///
    /// let layer = OutboundLayer::new(Limiter::new(MemoryStore::new()), Quota::per_second(5)?, "api");
    /// assert_eq!(layer.stats().learned, 0);
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn stats(&self) -> OutboundStats {
        self.config.limits.provider.stats()
    }

    /// Waits until no pacing write or learning round of this layer is in flight: each runs in a
    /// task of its own after a response (see the [module docs](super#after-the-response)). For a
    /// graceful shutdown, or to read the store right after a response.
    pub async fn settled(&self) {
        for pending in self.config.limits.provider.all_pending() {
            pending.await;
        }
    }

    #[cfg(test)]
    pub(crate) fn limits(&self) -> Arc<Limits> {
        self.config.limits.clone()
    }
}

impl<S, K> Layer<S> for OutboundLayer<K> {
    type Service = Outbound<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Outbound::from_config(inner, self.config.clone())
    }
}

/// Builds an [`OutboundLayer`]; see [`OutboundLayer::builder`] and
/// [`OutboundLayer::builder_with_extractor`].
///
/// ```
/// use std::time::Duration;
/// use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
///
/// let layer = OutboundLayer::builder(Limiter::new(MemoryStore::new()), Quota::per_second(5)?, "api")
///     .max_wait(Duration::from_secs(3))
///     .auto_suspend(false)
///     .scope("reports")
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct OutboundLayerBuilder<K> {
    limiter: Limiter,
    quotas: Quotas,
    key: KeySource<K>,
    max_wait: Duration,
    auto_suspend: bool,
    max_auto_suspension: Duration,
    scope: Option<String>,
    learn: Option<Quota>,
    max_learned_window: Duration,
    learned_ttl: Duration,
    learn_period: Duration,
}

impl<K: fmt::Debug> fmt::Debug for OutboundLayerBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboundLayerBuilder")
            .field("quotas", &self.quotas)
            .field("max_wait", &self.max_wait)
            .field("auto_suspend", &self.auto_suspend)
            .field("max_auto_suspension", &self.max_auto_suspension)
            .field("scope", &self.scope)
            .field("learn", &self.learn)
            .field("max_learned_window", &self.max_learned_window)
            .field("learned_ttl", &self.learned_ttl)
            .field("learn_period", &self.learn_period)
            .finish_non_exhaustive()
    }
}

impl<K> OutboundLayerBuilder<K> {
    fn with_key(limiter: Limiter, quotas: Quotas, key: KeySource<K>) -> Self {
        OutboundLayerBuilder {
            limiter,
            quotas,
            key,
            max_wait: DEFAULT_MAX_WAIT,
            auto_suspend: true,
            max_auto_suspension: DEFAULT_MAX_AUTO_SUSPENSION,
            scope: None,
            learn: None,
            max_learned_window: DEFAULT_MAX_LEARNED_WINDOW,
            learned_ttl: DEFAULT_LEARNED_TTL,
            learn_period: DEFAULT_LEARN_PERIOD,
        }
    }

    /// How long one request may wait for the limiter, from the moment it starts waiting
    /// ([`DEFAULT_MAX_WAIT`], 10 s, by default). When the next admission would come later, the
    /// request fails at once with [`AcquireError::DeadlineExceeded`](crate::limiter::AcquireError::DeadlineExceeded) and consumes nothing.
    /// Zero: never wait.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Whether an upstream answer `429` or `503` with `Retry-After` suspends the key fleet-wide
    /// for that long, and an announcement of nothing left until a reset suspends it until then
    /// (on by default; see the [module docs](super#auto-suspend)).
    pub fn auto_suspend(mut self, enabled: bool) -> Self {
        self.auto_suspend = enabled;
        self
    }

    /// Learns the upstream's quota from its responses, at most `ceiling` (off by default): when
    /// the upstream announces (`RateLimit-Policy`, or `X-RateLimit-Limit` per the ceiling's
    /// period) a quota other than the one in force, the layer sets it as the key's fleet-wide
    /// override ([`Limiter::set_quota`]), so every worker obeys it on its next call. A provider
    /// can lower the rate freely; a quota faster than `ceiling` is learned as `ceiling`, and the
    /// override always keeps `ceiling` and every configured tier as caps. Never over an
    /// operator's override. See the [module docs](super#provider-announcements) for every bound.
    ///
    /// ```
    /// use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
    ///
    /// let configured = Quota::per_second(50)?;
    /// let layer = OutboundLayer::builder(Limiter::new(MemoryStore::new()), configured, "api")
    ///     .learn_quota(configured) // never faster than we were told
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn learn_quota(mut self, ceiling: Quota) -> Self {
        self.learn = Some(ceiling);
        self
    }

    /// The longest window a learned quota may have ([`DEFAULT_MAX_LEARNED_WINDOW`], 5 minutes,
    /// by default; never more than [`max_auto_suspension`](Self::max_auto_suspension)): an
    /// announced quota over a longer window is not learned, so a learned quota never stops a
    /// key for longer than that.
    pub fn max_learned_window(mut self, max: Duration) -> Self {
        self.max_learned_window = max;
        self
    }

    /// How long a learned quota lasts without an answer that confirms it
    /// ([`DEFAULT_LEARNED_TTL`], 10 minutes, by default; at most
    /// [`MAX_SUSPENSION`](crate::limiter::MAX_SUSPENSION), 30 days: a longer one is taken as
    /// that); then the key is back to its own tiers. Instances of one fleet should agree on
    /// it: a learned quota with more time left than this layer's `learned_ttl` (set by an
    /// instance with a longer one) is treated by this layer as expired, so this layer replaces,
    /// renews or clears it at its next round.
    pub fn learned_ttl(mut self, ttl: Duration) -> Self {
        self.learned_ttl = ttl;
        self
    }

    /// How often one instance runs a learning round on one key ([`DEFAULT_LEARN_PERIOD`], 30
    /// seconds, by default; at most half the [`learned_ttl`](Self::learned_ttl)): at most one
    /// change of a key's learned quota per period, whatever the upstream announces in between.
    /// Zero: a round after every response.
    pub fn learn_period(mut self, period: Duration) -> Self {
        self.learn_period = period;
        self
    }

    /// The longest suspension one upstream answer sets ([`DEFAULT_MAX_AUTO_SUSPENSION`], 5
    /// minutes, by default): a `Retry-After` beyond it (a misbehaving upstream, a CDN's error
    /// page) suspends the fleet for this long only. An automatic suspension only ever extends
    /// one in force (an operator's included), never cuts it.
    pub fn max_auto_suspension(mut self, max: Duration) -> Self {
        self.max_auto_suspension = max;
        self
    }

    /// Counts the layer's keys in `scope` (1 to 64 characters of `[A-Za-z0-9._-]`), as
    /// [`Limiter::acquire_cost`] does with a [`Target::scoped`](crate::Target::scoped): apart from the same keys used unscoped or in other
    /// scopes. Unscoped by default, so a layer shares its key's quota with direct
    /// [`Limiter::acquire`] calls.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// The layer, or why the configuration is refused: an invalid scope
    /// ([`ConfigError::InvalidScope`]), or a quota the limiter's algorithm cannot serve
    /// ([`ConfigError::Quota`]).
    ///
    /// ```
    /// use redlimit::{limiter::ConfigError, outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
    ///
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let built = OutboundLayer::builder(limiter, Quota::per_second(5)?, "api").scope("no spaces").build();
    /// assert_eq!(built.err(), Some(ConfigError::InvalidScope));
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn build(self) -> Result<OutboundLayer<K>, ConfigError> {
        if self.scope.as_deref().is_some_and(|scope| !is_name(scope)) {
            return Err(ConfigError::InvalidScope);
        }
        self.limiter
            .supports(&self.quotas)
            .map_err(|(_, error)| error)?;
        if let Some(ceiling) = self.learn {
            self.limiter
                .supports(&Quotas::from(ceiling))
                .map_err(|(_, error)| error)?;
        }
        // The longest time a learning write sets (the store's record never says more).
        let learned_ttl = self.learned_ttl.min(crate::core::MAX_SUSPENSION);
        Ok(OutboundLayer {
            config: Arc::new(Config {
                limits: Arc::new(Limits {
                    limiter: self.limiter,
                    quotas: self.quotas,
                    scope: self.scope,
                    max_wait: self.max_wait,
                    auto_suspend: self.auto_suspend,
                    provider: Provider::new(self.learn.map(|ceiling| Bounds {
                        ceiling,
                        configured: self.quotas,
                        max_window: self.max_learned_window.min(self.max_auto_suspension),
                        ttl: learned_ttl,
                        period: self.learn_period.min(learned_ttl / 2),
                    })),
                    max_auto_suspension: self.max_auto_suspension,
                }),
                key: self.key,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::quota::{Quota, QuotaError};
    use crate::store::MemoryStore;

    #[test]
    fn bad_configurations_are_typed_errors() {
        let limiter = Limiter::new(MemoryStore::new());
        let quota = Quota::per_second(5).unwrap();
        for bad in ["", "a b", "a:b", "{x}", &"s".repeat(65)] {
            let built = OutboundLayer::builder(limiter.clone(), quota, "k")
                .scope(bad)
                .build();
            assert_eq!(built.err(), Some(ConfigError::InvalidScope), "{bad:?}");
        }
        let log = Limiter::builder(MemoryStore::new())
            .algorithm(Algorithm::SlidingLog)
            .build()
            .unwrap();
        let huge = Quota::per_second(1_000_000).unwrap();
        let built = OutboundLayer::builder(log, huge, "k").build();
        assert_eq!(
            built.err(),
            Some(ConfigError::Quota(QuotaError::BurstTooLargeForSlidingLog))
        );
    }
}
