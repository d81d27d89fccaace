//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower_service::Service;

use super::body::ResponseBody;
use super::config::{Config, MissingKey};
use super::future::{self, Check, ResponseFuture};
use super::resolver::Resolved;
use super::response::Wire;
use crate::core::{Ask, Later, StorageKey, StoreCall};
use crate::decision::Verdict;
use crate::key::KeyExtractor;

/// The service [`RateLimitLayer`](crate::RateLimitLayer) wraps around an inner service.
///
/// See the [crate docs](crate) for a server. Allowed responses carry the `RateLimit` headers;
/// denied requests are answered `429` with `Retry-After`, without calling the inner service:
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::new(
///     Limiter::new(MemoryStore::new()),
///     Quota::per_minute(2)?,
///     GlobalKey::new("all"),
/// );
/// let mut svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_: Request<String>| async {
///         Ok::<_, Infallible>(Response::new(String::new()))
///     });
///
/// let first = svc.ready().await?.call(Request::new(String::new())).await?;
/// assert_eq!(first.status(), StatusCode::OK);
/// assert_eq!(first.headers()["ratelimit-policy"], r#""default";q=2;w=60"#);
/// assert_eq!(first.headers()["ratelimit"], r#""default";r=1;t=30"#);
///
/// svc.ready().await?.call(Request::new(String::new())).await?;
/// let third = svc.ready().await?.call(Request::new(String::new())).await?;
/// assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(third.headers()["retry-after"], "30");
/// # Ok(())
/// # }
/// ```
///
/// # The numbers in the headers
///
/// The numbers never contradict each other: `r ≤ q` and `t ≤ w` on every response (property-tested
/// for every algorithm, with and without an override; a suspended key, whose `t` is the
/// suspension's time left, is the one exception).
///
/// - `q` is the capacity `r` counts against: the quota's burst, for every algorithm (a token
///   bucket of 10 a minute with a burst of 50 sends `q=50`, `r` counting down from 49).
/// - `w` is the longest a key takes from empty back to that full capacity, in whole seconds
///   rounded up: `burst × period / limit` for the token bucket and GCRA (10 a minute with a
///   burst of 50: `w=300`; without a burst, the period), the period for the fixed window and
///   the sliding log, two periods for the sliding window counter (its previous window still
///   weighs during the current one). A window under a second is scaled to one second
///   (`q` per second).
/// - `t` on an admission is [`Decision::reset_after`](crate::Decision::reset_after), at most
///   `w`: with several tiers the decision's reset is the longest of all tiers, so the binding
///   tier's `t` is capped at its own `w` (its own reset is never longer). On a denial `t` is
///   the exact wait (`w` for a cost the quota can never hold).
/// - `X-RateLimit-Limit` is the same `q`, `X-RateLimit-Remaining` the same `r`.
/// - Each is at most 999 999 999 999 999, the largest structured-field Integer: the few quotas
///   whose numbers would be larger are written within it, never as more than they give (see
///   the [headers guide](crate::guide::headers)).
///
/// # Stacking limits
///
/// "2 a second inside 100 a minute" is one layer with [`Quotas`](crate::Quotas): both tiers are
/// checked in one store call, all or none, so a request the per-second tier denies takes
/// nothing from the minute (30 requests at once: 2 admitted, the minute down by exactly 2).
/// Two layers stacked around each other cost more: the outer layer decides first and counts
/// every request that reaches it, including those the inner layer then denies (the same 30
/// requests: 2 admitted, the minute down by 30), and each layer is a store call of its own.
/// Stack layers only for limits on different keys (per IP outside, per tenant inside), where
/// no single call can hold both.
pub struct RateLimit<S, K> {
    inner: S,
    config: Arc<Config<K>>,
}

impl<S, K> RateLimit<S, K> {
    pub(crate) fn from_config(inner: S, config: Arc<Config<K>>) -> Self {
        RateLimit { inner, config }
    }

    /// The inner service.
    ///
    /// ```
    /// use axum::routing::get;
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
    /// use tower::Layer;
    ///
    /// let layer = RateLimitLayer::new(
    ///     Limiter::new(MemoryStore::new()),
    ///     Quota::per_second(10).unwrap(),
    ///     GlobalKey::new("all"),
    /// );
    /// let app: axum::Router = axum::Router::new().route("/", get(|| async { "ok" }));
    /// let svc = layer.layer(app);
    /// assert!(svc.get_ref().has_routes());
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably. Calls made through it skip the limiter.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response, StatusCode};
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
    /// use tower::{Service, ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::new(
    ///     Limiter::new(MemoryStore::new()),
    ///     Quota::per_minute(1)?,
    ///     GlobalKey::new("all"),
    /// );
    /// let mut svc = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|_: Request<String>| async {
    ///         Ok::<_, Infallible>(Response::new(String::new()))
    ///     });
    /// svc.ready().await?.call(Request::new(String::new())).await?;
    /// let limited = svc.ready().await?.call(Request::new(String::new())).await?;
    /// assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    ///
    /// let inner = svc.get_mut();
    /// let direct = inner.ready().await?.call(Request::new(String::new())).await?;
    /// assert_eq!(direct.status(), StatusCode::OK);
    /// # Ok(())
    /// # }
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    ///
    /// ```
    /// use axum::routing::get;
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
    /// use tower::Layer;
    ///
    /// let layer = RateLimitLayer::new(
    ///     Limiter::new(MemoryStore::new()),
    ///     Quota::per_second(10).unwrap(),
    ///     GlobalKey::new("all"),
    /// );
    /// let app: axum::Router = axum::Router::new().route("/", get(|| async { "ok" }));
    /// let app = layer.layer(app).into_inner(); // the router alone: unlimited again
    /// assert!(app.has_routes());
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K> Clone for RateLimit<S, K> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug> fmt::Debug for RateLimit<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

/// The service made ready in `poll_ready`, which is the one that must be called: taken, with a
/// clone left behind for the next call.
/// <https://docs.rs/tower/latest/tower/trait.Service.html#be-careful-when-cloning-inner-services>
pub(crate) fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, K>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let mut inner = take_ready(&mut self.inner);
        let config = &self.config;

        let (parts, body) = request.into_parts();
        if config.skip.as_ref().is_some_and(|skip| skip(&parts)) {
            let future = inner.call(Request::from_parts(parts, body));
            return ResponseFuture::pass_through(future);
        }
        // The key is only read here, so an extractor that builds it (a hash) builds it on the
        // stack; the storage key is built inline too, and used where it is built.
        let keyed = config.extractor.with_key(&parts, |key| {
            let (key, shared) = match (key, &config.missing_key) {
                (Some(key), _) => (key, false),
                (None, MissingKey::Shared(shared)) => {
                    config.note_unkeyed(shared);
                    (shared.as_str(), true)
                }
                (None, MissingKey::Reject(status)) => return Keyed::Reject(*status),
                (None, MissingKey::Allow) => return Keyed::Allow,
            };
            // The quotas of this request: a resolver's choice, or the layer's own.
            let resolved = match &config.resolver {
                Some(resolver) => resolver.resolve(&parts, key),
                None => Resolved::Default,
            };
            // The layer's scope (its policy name and quotas) keeps layers with different quotas
            // on the same key apart; its constant parts are precomputed.
            // The shared key's storage key is one no extracted key can have.
            let storage_key = if shared {
                config.keys.shared_storage_key(key)
            } else {
                config.keys.recent_storage_key(key)
            };
            let cost = config.cost.as_ref().map_or(1, |cost| cost(&parts));
            // A verdict that needs no waiting (a lease that holds enough, the deny cache, a
            // store in this process) is acted on at once: no future to box. What is left of
            // the check goes on in the future (a layer with a production mode on takes the
            // whole check there, which runs the modes).
            let mut later = None;
            if matches!(resolved, Resolved::Default) && config.plain {
                let ask = Ask::new(
                    storage_key.as_str(),
                    &config.quotas,
                    cost,
                    &config.metrics_label,
                );
                match config.limiter.answer_now(ask) {
                    Ok(answer) => return Keyed::Decided(answer.verdict),
                    // Queued by the store: the response future waits for it, with no box.
                    Err(Later::Store(call)) if call.is_queued() => {
                        return Keyed::Queued(call, storage_key, cost)
                    }
                    Err(rest) => later = Some(rest),
                }
            }
            Keyed::Check(checking(config, storage_key, resolved, cost, later))
        });
        let check = match keyed {
            Keyed::Decided(verdict) => {
                let headers = future::Headers {
                    config: config.clone(),
                    style: None,
                };
                let request = Request::from_parts(parts, body);
                return ResponseFuture::decided(verdict, headers, request, inner);
            }
            Keyed::Check(check) => check,
            Keyed::Queued(call, storage_key, cost) => {
                let request = Request::from_parts(parts, body);
                let config = config.clone();
                return ResponseFuture::queued(call, storage_key, cost, config, request, inner);
            }
            Keyed::Reject(status) => {
                return ResponseFuture::missing_key(status, Wire::of(&parts.headers))
            }
            Keyed::Allow => {
                tracing::debug!("request has no rate limit key; allowed by MissingKey::Allow");
                let future = inner.call(Request::from_parts(parts, body));
                return ResponseFuture::pass_through(future);
            }
        };
        ResponseFuture::checking(check, Request::from_parts(parts, body), inner)
    }
}

/// The check of `storage_key`, boxed: it owns the storage key, and the one clone of the shared
/// config per request, which it hands back with the verdict for the response headers. The
/// quotas a resolver chose are replaced by their (cached) headers, which hold them: the boxed
/// future stays small.
fn checking<K: KeyExtractor>(
    config: &Arc<Config<K>>,
    storage_key: StorageKey,
    resolved: Resolved,
    cost: u64,
    later: Option<Later>,
) -> Check<K> {
    let config = config.clone();
    let style = match &resolved {
        Resolved::Ready(quotas) => config.resolved_style(quotas),
        _ => None,
    };
    if let Resolved::Pending(lookup) = resolved {
        Box::pin(async move {
            let style = lookup
                .await
                .and_then(|quotas| config.resolved_style(&quotas));
            future::check(config, storage_key.as_str(), style, cost, None).await
        })
    } else {
        Box::pin(
            async move { future::check(config, storage_key.as_str(), style, cost, later).await },
        )
    }
}

/// What the key of a request leads to. Large when queued (see `Later`): moved once into the
/// response future.
#[allow(clippy::large_enum_variant)]
enum Keyed<K> {
    /// A verdict reached at once.
    Decided(Verdict),
    /// A check to await.
    Check(Check<K>),
    /// A plain check whose store decision is queued: its call, storage key and cost.
    Queued(StoreCall, StorageKey, u64),
    /// No key, and [`MissingKey::Reject`].
    Reject(StatusCode),
    /// No key, and [`MissingKey::Allow`].
    Allow,
}
