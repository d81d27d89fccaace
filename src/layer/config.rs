//! [`Config`]: what every clone of a [`RateLimit`](super::RateLimit) service shares, and the
//! [`MissingKey`] rule it applies.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use http::request::Parts;
use http::StatusCode;

use super::resolver::QuotaResolver;
use super::response::HeaderStyle;
use crate::key::KeyExtractor;
use crate::limiter::{KeyScope, Limiter, PolicyLabel};
use crate::quota::Quotas;

/// What happens to a request whose key cannot be extracted (no API-key header, no peer address).
///
/// Never a silent bypass: the rule is explicit, and the default counts all such requests
/// against one shared key. Set it with
/// [`RateLimitLayerBuilder::on_missing_key`](super::RateLimitLayerBuilder::on_missing_key).
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use redlimit::{key::HeaderKey, store::MemoryStore, Limiter, MissingKey, Quota, RateLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// assert_eq!(MissingKey::default(), MissingKey::Shared("unkeyed".to_owned()));
///
/// let layer = RateLimitLayer::builder(
///     Limiter::new(MemoryStore::new()),
///     Quota::per_minute(100)?,
///     HeaderKey::named("x-api-key")?,
/// )
/// .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
/// .build()?;
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_: Request<String>| async {
///         Ok::<_, Infallible>(Response::new(String::new()))
///     });
///
/// // No `x-api-key`: answered by the layer, the service is never called.
/// let response = svc.oneshot(Request::new(String::new())).await?;
/// assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Count them all against one shared key (the default, `unkeyed`): anonymous traffic gets one
    /// quota between it.
    Shared(String),
    /// Answer with this status (e.g. 400 or 401) without calling the service.
    Reject(StatusCode),
    /// Let them through unlimited: an explicit, logged (at debug level) bypass.
    Allow,
}

impl Default for MissingKey {
    fn default() -> Self {
        MissingKey::Shared("unkeyed".to_owned())
    }
}

pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
pub(crate) type SkipFn = dyn Fn(&Parts) -> bool + Send + Sync;

/// Everything a [`RateLimit`](super::RateLimit) service needs, shared by all its clones.
pub(crate) struct Config<K> {
    pub limiter: Limiter,
    /// The layer's own quotas (a resolver's default).
    pub quotas: Quotas,
    /// Chooses each request's quotas, when set.
    pub resolver: Option<Box<dyn QuotaResolver>>,
    pub extractor: K,
    pub missing_key: MissingKey,
    /// The name in the headers.
    pub policy_name: String,
    /// The policy name as the `metrics` feature's label.
    pub metrics_label: PolicyLabel,
    /// The scope of this layer's keys in the store.
    pub scope: String,
    /// The constant parts of this layer's storage keys.
    pub keys: KeyScope,
    /// The headers for `quotas`.
    pub headers: HeaderStyle,
    /// The headers for the other lists of quotas a resolver chose.
    pub resolved_headers: StyleCache,
    pub cost: Option<Box<CostFn>>,
    pub skip: Option<Box<SkipFn>>,
    /// Whether the first request counted against the shared key was logged.
    pub unkeyed_logged: AtomicBool,
}

impl<K: KeyExtractor> Config<K> {
    /// Counts a request without a key checked against the shared one, and logs the first.
    pub fn note_unkeyed(&self, shared: &str) {
        self.limiter.count_unkeyed(&self.metrics_label);
        if !self.unkeyed_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                policy = %self.policy_name,
                shared_key = shared,
                cause = self.extractor.missing_key_hint(),
                "requests without a rate limit key share one key (MissingKey::Shared): all such \
                 clients count against one quota; counted in LimiterStats::unkeyed, logged once"
            );
        }
    }
}

impl<K> Config<K> {
    /// The headers for `quotas`, chosen by the resolver: `None` when they are the layer's own
    /// (its `headers`).
    pub fn resolved_style(&self, quotas: &Quotas) -> Option<Arc<HeaderStyle>> {
        (*quotas != self.quotas).then(|| self.style_for(quotas))
    }

    /// The headers for `quotas` (chosen by the resolver), built once per distinct list while
    /// the cache has room.
    fn style_for(&self, quotas: &Quotas) -> Arc<HeaderStyle> {
        let cache = &self.resolved_headers;
        if let Some(style) = cache
            .styles
            .read()
            .ok()
            .and_then(|s| s.get(quotas).cloned())
        {
            return style;
        }
        let style = Arc::new(self.headers.for_quotas(quotas));
        if let Ok(mut styles) = cache.styles.write() {
            if styles.len() < StyleCache::CAPACITY {
                styles.insert(*quotas, style.clone());
            }
        }
        style
    }
}

/// The header styles of the lists of quotas a resolver chose: a handful of tiers in practice;
/// past [`StyleCache::CAPACITY`] distinct lists (quotas computed per key, say) the rest are
/// built per request.
#[derive(Debug, Default)]
pub(crate) struct StyleCache {
    styles: RwLock<HashMap<Quotas, Arc<HeaderStyle>>>,
}

impl StyleCache {
    const CAPACITY: usize = 256;
}

impl<K: fmt::Debug> fmt::Debug for Config<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("limiter", &self.limiter)
            .field("quotas", &self.quotas)
            .field("resolver", &self.resolver.is_some())
            .field("extractor", &self.extractor)
            .field("missing_key", &self.missing_key)
            .field("policy_name", &self.policy_name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}
