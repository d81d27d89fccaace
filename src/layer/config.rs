//! [`Config`]: what every clone of a [`RateLimit`](super::RateLimit) service shares, and the
//! [`MissingKey`] rule it applies.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use http::request::Parts;
use http::StatusCode;

use super::response::HeaderStyle;
use crate::key::KeyExtractor;
use crate::limiter::{KeyScope, Limiter, PolicyLabel};
use crate::quota::Quota;

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
    pub quota: Quota,
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
    pub headers: HeaderStyle,
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

impl<K: fmt::Debug> fmt::Debug for Config<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("limiter", &self.limiter)
            .field("quota", &self.quota)
            .field("extractor", &self.extractor)
            .field("missing_key", &self.missing_key)
            .field("policy_name", &self.policy_name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}
