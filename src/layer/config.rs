//! [`Config`]: what every clone of a [`RateLimit`](super::RateLimit) service shares, and the
//! [`MissingKey`] rule it applies.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use http::request::Parts;
use http::StatusCode;

use super::headers::HeaderStyle;
use super::resolver::QuotaResolver;
use super::settle::Settle;
use crate::block::BlockFor;
use crate::core::{KeyScope, Limiter, PolicyLabel, Shadow};
use crate::key::KeyExtractor;
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
/// use redlimit::{key::HeaderKey, layer::MissingKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
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
    /// quota between it. The name is only a label: its storage key is one no extractor can
    /// produce (`<prefix>:{#:unkeyed}:<scope>`), so a real key `unkeyed` (a header's value, an
    /// `FnKey`'s) is a key of its own and never shares the anonymous bucket.
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
    /// Shadow, settlement, block on abuse (`config.rs`: `Modes`; `shadow.rs`, `settle.rs`).
    pub modes: Modes,
    /// No mode is on ([`Modes::none`], read once at build): a check's verdict is all a
    /// request needs, so `call` answers what it can at once.
    pub plain: bool,
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

impl<K> Config<K> {
    /// The label for checks of the layer's shadow tiers.
    pub(crate) fn shadow_label(&self) -> PolicyLabel {
        self.metrics_label.shadowed(Shadow::Tiers)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http::{Request, Response};
    use tower::{Layer, ServiceExt};

    use crate::key::{storage_id, FnKey, SHARED_ID_PREFIX};
    use crate::layer::RateLimitLayer;
    use crate::quota::Quota;
    use crate::store::MemoryStore;

    /// `MissingKey::Shared("unkeyed")` and a real key `"unkeyed"` from an `FnKey` are two keys:
    /// a client whose key is `unkeyed` spends its own quota, and requests without a key still
    /// have theirs (were both counted against `redlimit:{unkeyed}:<scope>`, the third keyless
    /// request here would be denied). Their storage keys differ.
    #[tokio::test]
    async fn the_shared_key_is_no_key_an_extractor_can_produce() {
        let store = MemoryStore::new();
        let limiter = crate::core::Limiter::new(store.clone());
        let by_user = FnKey::new(|parts: &http::request::Parts| {
            let user = parts.headers.get("x-user")?.to_str().ok()?;
            Some(user.to_owned())
        });
        let layer = RateLimitLayer::new(limiter.clone(), Quota::per_minute(2).unwrap(), by_user);
        let svc = layer.layer(tower::service_fn(|_: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
        let status = |user: Option<&str>| {
            let svc = svc.clone();
            let mut request = Request::builder();
            if let Some(user) = user {
                request = request.header("x-user", user);
            }
            let request = request.body(String::new()).unwrap();
            async move { svc.oneshot(request).await.unwrap().status().as_u16() }
        };
        let mut statuses = Vec::new();
        for user in [
            Some("unkeyed"),
            Some("unkeyed"),
            Some("unkeyed"),
            None,
            None,
            None,
        ] {
            statuses.push(status(user).await);
        }
        assert_eq!(statuses, [200, 200, 429, 200, 200, 429]);

        // Two keys in the store, under the layer's scope: the real one and the shared one.
        let keys = limiter.key_scope(Some("default:token-bucket:2/60s"));
        let (real, shared) = (
            keys.storage_key("unkeyed"),
            keys.shared_storage_key("unkeyed"),
        );
        assert_eq!(
            shared.as_str(),
            "redlimit:{#:unkeyed}:default:token-bucket:2/60s"
        );
        assert_ne!(real.as_str(), shared.as_str());
        let now = crate::clock::system_now_micros();
        assert!(store.stored_state(real.as_str(), now).is_some());
        assert!(store.stored_state(shared.as_str(), now).is_some());
        assert_eq!(store.len(), 2);
    }

    /// No key, however chosen, gets an id that starts like the shared key's.
    #[test]
    fn no_storage_id_starts_like_the_shared_one() {
        let long = "#:".repeat(200);
        for key in [
            "#:unkeyed",
            "#:",
            "#",
            ":unkeyed",
            "unkeyed",
            "#unkeyed",
            "#:{x}",
            &long,
        ] {
            let id = storage_id(key);
            assert!(!id.starts_with(SHARED_ID_PREFIX), "{key:?} -> {id}");
        }
    }
}

/// The modes a layer runs in; all off by default.
#[derive(Default)]
pub(crate) struct Modes {
    /// Decide and record, always forward.
    pub shadow: bool,
    /// The `RateLimit` headers in shadow (off by default).
    pub shadow_headers: bool,
    /// Tiers checked in shadow after the enforced ones admitted, in a scope of their own.
    pub shadow_tiers: Option<Quotas>,
    /// The cost taken from the response; the request's cost is the reservation.
    pub settle: Option<Arc<Settle>>,
    /// A denial suspends the key's tenant for this long.
    pub block: Option<BlockFor>,
}

impl Modes {
    /// No mode is on: a check's verdict is all a request needs (so a lease may answer it in
    /// `call`, see `service.rs`).
    pub(crate) fn none(&self) -> bool {
        !self.shadow && self.shadow_tiers.is_none() && self.settle.is_none() && self.block.is_none()
    }
}

impl std::fmt::Debug for Modes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Modes")
            .field("shadow", &self.shadow)
            .field("shadow_headers", &self.shadow_headers)
            .field("shadow_tiers", &self.shadow_tiers)
            .field("settle", &self.settle.is_some())
            .field("block", &self.block)
            .finish()
    }
}
