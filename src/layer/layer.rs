//! [`RateLimitLayer`]: the tower layer, and its builder.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{Response, StatusCode};
use tower_layer::Layer;

use super::config::{Config, CostFn, MissingKey, SkipFn};
use super::headers::HeaderStyle;
use super::resolver::QuotaResolver;
use super::service::RateLimit;
use super::settle::Settle;
use crate::algorithm::Algorithm;
use crate::block::BlockFor;
use crate::core::{is_name, ConfigError, Limiter, PolicyLabel, Shadow};
use crate::key::KeyExtractor;
use crate::quota::{Quota, Quotas};

/// Rate-limits requests per key across every instance sharing the limiter's store.
///
/// Each request: the extractor finds its key, the limiter decides (one Lua script in Redis), and
/// the request either reaches the inner service, its response carrying the `RateLimit` headers,
/// or is answered **429** with `Retry-After` (gRPC: `RESOURCE_EXHAUSTED`). See the
/// [crate docs](crate) for a complete example.
///
/// **Hot keys: leases.** A key with a large share of the traffic (a global key, a big tenant)
/// costs one store call per request. Token leases answer most of its requests in process, and
/// are set on the limiter the layer wraps:
/// [`LimiterBuilder::leases`](crate::limiter::LimiterBuilder::leases) (see
/// [the layer's module docs](crate::layer#hot-keys-leases) for an example).
///
/// ```
/// use redlimit::{key::PeerIp, store::MemoryStore, Limiter, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::new(
///     Limiter::new(MemoryStore::new()),
///     Quota::per_minute(60).unwrap(),
///     PeerIp::new(),
/// );
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "ok" }))
///     .layer(layer);
/// ```
pub struct RateLimitLayer<K> {
    config: Arc<Config<K>>,
}

impl<K> Clone for RateLimitLayer<K> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: self.config.clone(),
        }
    }
}

impl<K: fmt::Debug> fmt::Debug for RateLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl<K: KeyExtractor> RateLimitLayer<K> {
    /// A layer applying `quotas` per key from `extractor`, with the defaults: policy name
    /// `default`, cost 1, keyless requests share the key `unkeyed`, and a scope of its own
    /// derived from the quotas (see [`RateLimitLayerBuilder::scope`]): layers with different
    /// quotas never share state.
    ///
    /// `quotas` is one [`Quota`] or several ([`Quotas`], e.g. 10 a second *and* 500 a minute),
    /// checked together in one store call, all or none: a request denied by one tier consumes
    /// from none. The headers list every tier (see the [module docs](crate::layer)).
    ///
    /// ```
    /// use redlimit::{key::PeerIp, store::MemoryStore, Limiter, Quota, Quotas, RateLimitLayer};
    ///
    /// let tiers = Quotas::new([Quota::per_second(10)?, Quota::per_minute(500)?])?;
    /// let layer = RateLimitLayer::new(Limiter::new(MemoryStore::new()), tiers, PeerIp::new());
    /// assert_eq!(layer.scope(), "default:token-bucket:10/1s+500/60s");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Panics
    ///
    /// When the limiter's algorithm cannot serve `quota` (a sliding log with a burst above
    /// 100 000, see [`Algorithm::supports`](crate::Algorithm::supports)): such a layer would deny
    /// every request forever. [`builder`](Self::builder)`(..).build()` returns that error
    /// instead.
    ///
    /// ```should_panic
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Algorithm, Limiter, Quota};
    /// use redlimit::RateLimitLayer;
    ///
    /// let log = Limiter::builder(MemoryStore::new())
    ///     .algorithm(Algorithm::SlidingLog)
    ///     .build()
    ///     .unwrap();
    /// // Panics: the sliding log keeps one entry per request, and refuses a burst of a million.
    /// RateLimitLayer::new(log, Quota::per_second(1_000_000).unwrap(), GlobalKey::new("g"));
    /// ```
    #[track_caller]
    pub fn new(limiter: Limiter, quotas: impl Into<Quotas>, extractor: K) -> Self {
        match Self::builder(limiter, quotas, extractor).build() {
            Ok(layer) => layer,
            Err(error) => panic!("RateLimitLayer::new: {error}"),
        }
    }

    /// The scope of this layer's keys in the store: the storage key of `key` is
    /// [`Limiter::storage_key`]`(Target::scoped(scope, key))`.
    ///
    /// ```
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
    ///
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let login = RateLimitLayer::new(limiter.clone(), Quota::per_minute(5)?, GlobalKey::new("g"));
    /// assert_eq!(login.scope(), "default:token-bucket:5/60s");
    /// let shared = RateLimitLayer::builder(limiter, Quota::per_minute(5)?, GlobalKey::new("g"))
    ///     .scope("auth")
    ///     .build()?;
    /// assert_eq!(shared.scope(), "auth");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scope(&self) -> &str {
        &self.config.scope
    }

    /// The policy name of the `RateLimit` headers (`default` unless
    /// [set](RateLimitLayerBuilder::policy_name)): an operator names the route by it (it is the
    /// scope of a named layer).
    pub fn policy_name(&self) -> &str {
        &self.config.policy_name
    }

    /// The layer's quotas (with a [resolver](RateLimitLayerBuilder::resolver): its default).
    ///
    /// ```
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
    ///
    /// let quota = Quota::per_minute(5)?;
    /// let layer = RateLimitLayer::new(Limiter::new(MemoryStore::new()), quota, GlobalKey::new("g"));
    /// assert_eq!(layer.quotas().as_slice(), [quota]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn quotas(&self) -> &Quotas {
        &self.config.quotas
    }

    /// Starts a builder for the options; `quotas` as in [`new`](Self::new).
    pub fn builder(
        limiter: Limiter,
        quotas: impl Into<Quotas>,
        extractor: K,
    ) -> RateLimitLayerBuilder<K> {
        RateLimitLayerBuilder {
            limiter,
            quotas: quotas.into(),
            resolver: None,
            retry_after_jitter: Duration::ZERO,
            extractor,
            missing_key: MissingKey::default(),
            policy_name: "default".to_owned(),
            named: false,
            scope: None,
            legacy_headers: false,
            cost: None,
            skip: None,
            modes: Default::default(),
        }
    }
}

impl<S, K> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_config(inner, self.config.clone())
    }
}

/// Builds a [`RateLimitLayer`]; see [`RateLimitLayer::builder`].
///
/// Token leases for hot keys are not a layer option: they are set on the limiter it wraps
/// ([`LimiterBuilder::leases`](crate::limiter::LimiterBuilder::leases); see
/// [hot keys](crate::layer#hot-keys-leases)).
///
/// ```
/// use http::StatusCode;
/// use redlimit::{key::HeaderKey, layer::MissingKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder(
///     Limiter::new(MemoryStore::new()),
///     Quota::per_second(100).unwrap(),
///     HeaderKey::named("x-api-key").unwrap(),
/// )
/// .policy_name("api")
/// .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
/// .cost(|parts| if parts.uri.path().starts_with("/export") { 10 } else { 1 })
/// .skip(|parts| parts.uri.path() == "/health")
/// .legacy_headers(true)
/// .build()
/// .unwrap();
/// ```
pub struct RateLimitLayerBuilder<K> {
    limiter: Limiter,
    quotas: Quotas,
    resolver: Option<Box<dyn QuotaResolver>>,
    retry_after_jitter: Duration,
    extractor: K,
    missing_key: MissingKey,
    policy_name: String,
    /// Whether the policy name was given: it is then the scope.
    named: bool,
    scope: Option<String>,
    legacy_headers: bool,
    cost: Option<Box<CostFn>>,
    skip: Option<Box<SkipFn>>,
    /// Shadow, settlement, block on abuse (`config.rs`: `Modes`; `shadow.rs`, `settle.rs`).
    pub(super) modes: super::config::Modes,
}

impl<K: fmt::Debug> fmt::Debug for RateLimitLayerBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("quotas", &self.quotas)
            .field("extractor", &self.extractor)
            .field("policy_name", &self.policy_name)
            .field("resolver", &self.resolver.is_some())
            .finish_non_exhaustive()
    }
}

impl<K: KeyExtractor> RateLimitLayerBuilder<K> {
    /// The rule for requests without a key ([`MissingKey::Shared`]`("unkeyed")` by default).
    pub fn on_missing_key(mut self, rule: MissingKey) -> Self {
        self.missing_key = rule;
        self
    }

    /// The policy name in the `RateLimit` headers (`default` by default): 1 to 64 characters of
    /// `[A-Za-z0-9._-]`. It is also the layer's scope, its route (see [`scope`](Self::scope)).
    /// Example in the [module docs](crate::layer#builder-options).
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        self.policy_name = name.into();
        self.named = true;
        self
    }

    /// Counts in exactly this scope (1 to 64 characters of `[A-Za-z0-9._-]`), shared with every
    /// layer and check of the same limiter prefix that names it; see [Scopes](crate::layer#scopes).
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Chooses each request's quotas with `resolver`; the builder's quotas are the default. See
    /// [Tiers per request](crate::layer#tiers-per-request).
    pub fn resolver(mut self, resolver: impl QuotaResolver) -> Self {
        self.resolver = Some(Box::new(resolver));
        self
    }

    /// Adds a random amount up to `max` to each denial's `Retry-After` (off by default); see
    /// [Builder options](crate::layer#builder-options).
    pub fn retry_after_jitter(mut self, max: Duration) -> Self {
        self.retry_after_jitter = max;
        self
    }

    /// Also send `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`.
    /// Example in the [module docs](crate::layer#builder-options).
    pub fn legacy_headers(mut self, enabled: bool) -> Self {
        self.legacy_headers = enabled;
        self
    }

    /// Weighs requests: the closure gives each request's cost (1 by default).
    /// Example in the [module docs](crate::layer#builder-options).
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Box::new(cost));
        self
    }

    /// Exempts requests (health checks, say): those for which the closure is true pass
    /// unchecked, without rate-limit headers. Example in the
    /// [module docs](crate::layer#builder-options).
    pub fn skip(mut self, skip: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.skip = Some(Box::new(skip));
        self
    }

    /// Builds the layer, validating the policy name, the scope, and that the limiter's algorithm
    /// can serve the quota (the fallible form of [`RateLimitLayer::new`]).
    ///
    /// ```
    /// use redlimit::{key::GlobalKey, limiter::ConfigError, store::MemoryStore, Algorithm, Limiter};
    /// use redlimit::{quota::QuotaError, Quota, RateLimitLayer};
    ///
    /// let log = Limiter::builder(MemoryStore::new())
    ///     .algorithm(Algorithm::SlidingLog)
    ///     .build()
    ///     .unwrap();
    /// let huge = Quota::per_second(1_000_000).unwrap();
    /// let built = RateLimitLayer::builder(log, huge, GlobalKey::new("g")).build();
    /// assert_eq!(built.err(), Some(ConfigError::Quota(QuotaError::BurstTooLargeForSlidingLog)));
    /// ```
    pub fn build(self) -> Result<RateLimitLayer<K>, ConfigError> {
        if !is_name(&self.policy_name) {
            return Err(ConfigError::InvalidPolicyName);
        }
        if self.scope.as_deref().is_some_and(|scope| !is_name(scope)) {
            return Err(ConfigError::InvalidScope);
        }
        self.limiter
            .supports(&self.quotas)
            .map_err(|(_, error)| error)?;
        if let Some(shadow) = &self.modes.shadow_tiers {
            self.limiter.supports(shadow).map_err(|(_, error)| error)?;
        }
        let algorithm = self.limiter.algorithm();
        let headers = HeaderStyle::new(
            &self.policy_name,
            &self.quotas,
            algorithm,
            self.legacy_headers,
            self.retry_after_jitter,
        )
        .with_constant_policy();
        // A named policy is its route: its scope holds no quota, so a deploy that changes the
        // quota keeps the usage (capped to the new quota) and the route's override.
        let scope = match self.scope {
            Some(scope) => scope,
            None if self.named => self.policy_name.clone(),
            None => default_scope(&self.policy_name, algorithm, &self.quotas),
        };
        let keys = self.limiter.key_scope(Some(&scope));
        Ok(RateLimitLayer {
            config: Arc::new(Config {
                limiter: self.limiter,
                quotas: self.quotas,
                resolver: self.resolver,
                resolved_headers: Default::default(),
                extractor: self.extractor,
                missing_key: self.missing_key,
                metrics_label: match self.modes.shadow {
                    true => PolicyLabel::new(&self.policy_name).shadowed(Shadow::Layer),
                    false => PolicyLabel::new(&self.policy_name),
                },
                policy_name: self.policy_name,
                scope,
                keys,
                headers,
                cost: self.cost,
                skip: self.skip,
                unkeyed_logged: AtomicBool::new(false),
                plain: self.modes.none(),
                modes: self.modes,
            }),
        })
    }
}

/// `<policy name>:<algorithm>:<tier>[+<tier>…]`, each tier `<limit>/<period>[:b<burst>]`, the
/// period in whole seconds (`60s`) or else microseconds (`1500000us`), the burst only when it
/// differs from the limit: two lists of quotas that decide differently never get the same
/// scope (e.g. `default:token-bucket:10/1s+500/60s`).
fn default_scope(policy_name: &str, algorithm: Algorithm, quotas: &[Quota]) -> String {
    let mut scope = format!("{policy_name}:{algorithm}:");
    for (i, quota) in quotas.iter().enumerate() {
        if i > 0 {
            scope.push('+');
        }
        let micros = quota.period().as_micros();
        if micros.is_multiple_of(1_000_000) {
            scope.push_str(&format!("{}/{}s", quota.limit(), micros / 1_000_000));
        } else {
            scope.push_str(&format!("{}/{micros}us", quota.limit()));
        }
        if quota.burst() != quota.limit() {
            scope.push_str(&format!(":b{}", quota.burst()));
        }
    }
    scope
}

/// The algorithm and quotas that a scope derived by a layer names (see
/// [`RateLimitLayer::scope`]), read back from the scope: `None` for a scope that names none,
/// such as one [set](RateLimitLayerBuilder::scope) by hand or a named layer's policy name.
/// A tool that finds a scope in the store learns from it what quotas its layer checks.
///
/// ```
/// use redlimit::{key::GlobalKey, store::MemoryStore, Algorithm, Limiter, Quota, RateLimitLayer};
/// use redlimit::layer::scope_quotas;
///
/// let quota = Quota::per_minute(5)?.with_burst(10)?;
/// let layer = RateLimitLayer::new(Limiter::new(MemoryStore::new()), quota, GlobalKey::new("g"));
/// assert_eq!(layer.scope(), "default:token-bucket:5/60s:b10");
/// let (algorithm, quotas) = scope_quotas(layer.scope()).expect("a derived scope");
/// assert_eq!(algorithm, Algorithm::TokenBucket);
/// assert_eq!(quotas.as_slice(), [quota]);
/// assert_eq!(scope_quotas("login"), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn scope_quotas(scope: &str) -> Option<(Algorithm, Quotas)> {
    // The policy name may not hold a `:` (see `is_name`): the first two split it off exactly.
    let mut parts = scope.splitn(3, ':');
    let (_, algorithm, tiers) = (parts.next()?, parts.next()?, parts.next()?);
    let algorithm: Algorithm = algorithm.parse().ok()?;
    let quotas = tiers
        .split('+')
        .map(|tier| {
            let (tier, burst) = match tier.split_once(":b") {
                Some((tier, burst)) => (tier, Some(burst.parse().ok()?)),
                None => (tier, None),
            };
            let (limit, period) = tier.split_once('/')?;
            let limit: u64 = limit.parse().ok()?;
            let micros: u64 = match period.strip_suffix("us") {
                Some(us) => us.parse().ok()?,
                None => period
                    .strip_suffix('s')?
                    .parse::<u64>()
                    .ok()?
                    .checked_mul(1_000_000)?,
            };
            Quota::new(limit, Duration::from_micros(micros))
                .and_then(|quota| quota.with_burst(burst.unwrap_or(limit)))
                .ok()
        })
        .collect::<Option<Vec<_>>>()?;
    Some((algorithm, Quotas::new(quotas).ok()?))
}

impl<K> RateLimitLayerBuilder<K> {
    /// Shadow mode (dark launch): every request is decided and recorded exactly as it would
    /// be, and always goes on to the service. A denial is counted (in
    /// [`LimiterStats::denied`](crate::limiter::LimiterStats) and
    /// [`shadow_limited`](crate::limiter::LimiterStats::shadow_limited); the `metrics` feature's
    /// outcome `shadow_limited` instead of `limited`), logged at a bounded rate (one line a
    /// second at most, saying how many it left out), and marked in the request extensions:
    /// the [`Decision`](crate::Decision) there is the denial, with a [`ShadowLimited`](super::ShadowLimited) beside it. A denied
    /// request consumes nothing, as always. No `RateLimit` headers are sent, so that clients
    /// do not react to a limit that is not enforced; [`shadow_headers`](Self::shadow_headers)
    /// turns them on. A store failure that the policy would answer with 503 is forwarded too.
    pub fn shadow(mut self, enabled: bool) -> Self {
        self.modes.shadow = enabled;
        self
    }

    /// Sends the `RateLimit` headers in [`shadow`](Self::shadow) mode too (off by default).
    pub fn shadow_headers(mut self, enabled: bool) -> Self {
        self.modes.shadow_headers = enabled;
        self
    }

    /// Tiers checked in shadow beside the enforced quotas, e.g. a new, stricter quota tried on
    /// live traffic. After the enforced tiers admit a request, these are checked (one more
    /// store call, in the scope `<scope>.shadow` of their own): they admit and consume as a
    /// real check would, and when they would deny, they consume nothing, the request goes on,
    /// and a [`ShadowLimited`](super::ShadowLimited) with their denial is in its extensions (counted as in
    /// [`shadow`](Self::shadow)). A request the enforced tiers deny never reaches them. They
    /// never block the enforced tiers, and they send no headers.
    pub fn shadow_quotas(mut self, quotas: impl Into<Quotas>) -> Self {
        self.modes.shadow_tiers = Some(quotas.into());
        self
    }

    /// Settles the request's cost after its response: the cost of the request (1, or the
    /// [`cost`](Self::cost) function's) is reserved when it is admitted, and once the inner
    /// service has answered, `settle` tells what it really cost. Less is given back with
    /// [`Limiter::refund`] (never above a tier's capacity); more is charged, down to an empty
    /// tier at most (see the [modes guide](crate::guide::modes) for what that delays, per
    /// algorithm). The settlement runs as a task of its own: it never delays nor fails the
    /// response. A settlement that fails (Redis down) is counted in
    /// [`LimiterStats::settle_failures`](crate::limiter::LimiterStats::settle_failures) and logged; a
    /// charge then goes to the failure policy (a [`LocalFallback`](crate::failure_policy::LocalFallback)
    /// charges its local share), a refund is lost (the units stay spent: the safe side).
    ///
    /// Exact under concurrency, as the reservation is taken at admission: a login limiter of 5
    /// a minute that counts only failures reserves 1 per attempt and gives back the successes,
    /// so at most 5 failures pass, fleet-wide.
    ///
    /// ```
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // An LLM gateway: reserve 1 000 tokens, settle to what the response says it used.
    /// let layer = RateLimitLayer::builder(
    ///     Limiter::new(MemoryStore::new()),
    ///     Quota::per_minute(100_000)?,
    ///     GlobalKey::new("llm"),
    /// )
    /// .cost(|_| 1_000)
    /// .cost_from_response(|response| {
    ///     response
    ///         .headers()
    ///         .get("x-tokens-used")
    ///         .and_then(|v| v.to_str().ok()?.parse().ok())
    ///         .unwrap_or(1_000)
    /// })
    /// .build()?;
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cost_from_response(
        mut self,
        settle: impl Fn(&Response<()>) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.modes.settle = Some(Arc::new(Settle::Cost(Box::new(settle))));
        self
    }

    /// Counts only the responses with one of `statuses`: each such response costs the
    /// request's reservation, every other response is free (its reservation is given back).
    /// [`cost_from_response`](Self::cost_from_response) by status, e.g. a login limiter that
    /// counts failed logins (401 and 403) only.
    ///
    /// ```
    /// use http::StatusCode;
    /// use redlimit::{key::HeaderKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let login = RateLimitLayer::builder(
    ///     Limiter::new(MemoryStore::new()),
    ///     Quota::per_minute(5)?,
    ///     HeaderKey::named("x-user")?,
    /// )
    /// .policy_name("login")
    /// .cost_from_status([StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN])
    /// .build()?;
    /// # let _ = login;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cost_from_status(self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        let mut builder = self;
        builder.modes.settle = Some(Arc::new(Settle::Statuses(statuses.into_iter().collect())));
        builder
    }

    /// Blocks abusers: a request denied by a quota suspends the key's tenant, fleet-wide and on
    /// every route, for the block's duration, in the same store call as the decision (see
    /// [`BlockFor`]; repeated offences may double it up to a cap). The suspension shows in
    /// [`Limiter::inspect`] and ends early with [`Limiter::resume`]. A layer in
    /// [`shadow`](Self::shadow) mode blocks nobody (its denials have no effects).
    pub fn block_for(mut self, block: impl Into<BlockFor>) -> Self {
        self.modes.block = Some(block.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The layer's docs: on a `MemoryStore` the decision is made in `call`, so a response
    /// future dropped before its first poll was counted.
    #[tokio::test]
    async fn a_memory_decision_made_in_call_counts_a_future_dropped_unpolled() {
        use tower::{Service, ServiceExt};

        let limiter = Limiter::new(crate::store::MemoryStore::new());
        let quota = Quota::per_minute(2).unwrap();
        let layer = RateLimitLayer::new(limiter.clone(), quota, crate::key::GlobalKey::new("k"));
        let inner = tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        });
        let mut service = tower::Layer::layer(&layer, inner);
        let dropped = service.ready().await.unwrap().call(http::Request::new(()));
        drop(dropped);
        // The unpolled request was counted: 1 of 2 left, then none.
        for expected in [http::StatusCode::OK, http::StatusCode::TOO_MANY_REQUESTS] {
            let ready = service.ready().await.unwrap();
            let response = ready.call(http::Request::new(())).await.unwrap();
            assert_eq!(response.status(), expected);
        }
    }

    #[test]
    fn default_scopes_tell_quotas_apart() {
        let minute = Quota::per_minute(5).unwrap();
        let tb = Algorithm::TokenBucket;
        assert_eq!(
            default_scope("default", tb, &[minute]),
            "default:token-bucket:5/60s"
        );
        let burst = minute.with_burst(10).unwrap();
        assert_eq!(
            default_scope("api", Algorithm::Gcra, &[burst]),
            "api:gcra:5/60s:b10"
        );
        let odd = Quota::new(3, Duration::from_millis(1500)).unwrap();
        assert_eq!(default_scope("x", tb, &[odd]), "x:token-bucket:3/1500000us");
        let second = Quota::per_second(10).unwrap();
        assert_eq!(
            default_scope("default", tb, &[second, burst]),
            "default:token-bucket:10/1s+5/60s:b10"
        );
        let scopes = [
            default_scope("d", tb, &[minute]),
            default_scope("d", tb, &[burst]),
            default_scope("d", tb, &[odd]),
            default_scope("d", Algorithm::FixedWindow, &[minute]),
            default_scope("e", tb, &[minute]),
            default_scope("d", tb, &[minute, second]),
            default_scope("d", tb, &[second, minute]),
            default_scope("d", tb, &[second, burst]),
        ];
        let distinct: std::collections::BTreeSet<_> = scopes.iter().collect();
        assert_eq!(distinct.len(), scopes.len());
    }

    #[test]
    fn scope_quotas_reads_back_every_derived_scope() {
        let minute = Quota::per_minute(5).unwrap();
        let burst = minute.with_burst(10).unwrap();
        let odd = Quota::new(3, Duration::from_millis(1500)).unwrap();
        let second = Quota::per_second(10).unwrap();
        let lists: [&[Quota]; 4] = [&[minute], &[burst], &[odd], &[second, burst, odd]];
        for &algorithm in Algorithm::ALL {
            for quotas in lists {
                let scope = default_scope("api", algorithm, quotas);
                let (read, tiers) = scope_quotas(&scope).unwrap_or_else(|| panic!("{scope}"));
                assert_eq!((read, tiers.as_slice()), (algorithm, quotas), "{scope}");
            }
        }
        for scope in [
            "login",
            "a:b",
            "d:token-bucket:",
            "d:token-bucket:5/60",
            "d:nope:5/60s",
        ] {
            assert_eq!(scope_quotas(scope), None, "{scope}");
        }
    }
}
