//! [`QuotaResolver`]: the quotas of one request chosen at run time (tiers such as FREE and PRO),
//! by a closure ([`resolver_fn`]) or a type of your own that looks them up in your store.

use std::fmt;
use std::future::Future;

use futures::future::BoxFuture;
use http::request::Parts;

use crate::quota::{Quota, Quotas};

/// Chooses the quotas of each request: its tier.
///
/// The layer calls [`resolve`](Self::resolve) once per limited request, after the key was
/// extracted (skipped requests and keyless requests that are allowed or rejected by
/// [`MissingKey`](crate::layer::MissingKey) never reach it), and checks the quotas it returns in one
/// store call, all or none. Set it with
/// [`RateLimitLayerBuilder::resolver`](crate::layer::RateLimitLayerBuilder::resolver); the quotas given
/// to the builder are the layer's default, the ones [`Resolved::Default`] stands for.
///
/// **Overrides win.** A quota set for a key with [`Limiter::set_quota`](crate::Limiter::set_quota)
/// replaces whatever the resolver chose, inside the store's script, on every instance.
///
/// **Scope.** A resolver does not change where a key's state lives: every tier of a layer counts
/// in the layer's one scope ([`RateLimitLayer::scope`](crate::RateLimitLayer::scope), derived
/// from the policy name and the *default* quotas, or named with
/// [`scope`](crate::layer::RateLimitLayerBuilder::scope)). So the admin operations address a key the same
/// way whatever its tier (`Target::scoped(layer.scope(), key)`), and a key that changes tier
/// keeps its suspension, its override and its count (a FREE client upgraded to PRO starts from
/// what it had left, refilled at the PRO rate; a downgrade caps it at the FREE capacity; the
/// store matches quotas by position, so a list that changes length starts the moved quotas
/// fresh, see the [guide](crate::guide::fleet)). Tiers
/// are meant to be chosen per key (per API key, per user); when the tier depends on something
/// else in the request, make it part of the key so two tiers never meet on one key.
///
/// Implement it for a lookup of your own; for a plain function of the request use
/// [`resolver_fn`]. A lookup that waits (a database, a cache over the network) returns
/// [`Resolved::Pending`]:
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Arc;
/// use http::request::Parts;
/// use redlimit::{layer::{QuotaResolver, Resolved}, Quota, Quotas};
///
/// /// Plans by API key, as the billing service knows them.
/// struct Plans {
///     pro: Quotas,
///     billing: Arc<HashMap<String, &'static str>>,
/// }
///
/// impl QuotaResolver for Plans {
///     fn resolve(&self, parts: &Parts, _key: &str) -> Resolved {
///         let Some(api_key) = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()) else {
///             return Resolved::Default;
///         };
///         let (pro, billing, key) = (self.pro, self.billing.clone(), api_key.to_owned());
///         Resolved::pending(async move {
///             // e.g. a query to the billing database; `None`: the layer's default quotas.
///             match billing.get(&key).copied() {
///                 Some("pro") => Some(pro),
///                 _ => None,
///             }
///         })
///     }
/// }
/// # let _ = Plans { pro: Quota::per_minute(1000).unwrap().into(), billing: Arc::default() };
/// ```
pub trait QuotaResolver: Send + Sync + 'static {
    /// The quotas of the request with these `parts` and this `key`: the key as the extractor
    /// yields it (or the shared key of [`MissingKey::Shared`](crate::layer::MissingKey::Shared)). A
    /// [`HeaderKey`](crate::key::HeaderKey) yields a hash of the header, so to look up an API
    /// key's plan read the header from `parts`.
    fn resolve(&self, parts: &Parts, key: &str) -> Resolved;
}

/// What a [`QuotaResolver`] answers: the quotas now, or a future that finds them.
///
/// An enum rather than an associated future type: an associated type would put the resolver's
/// type into [`RateLimitLayer`](crate::RateLimitLayer), [`RateLimit`](crate::layer::RateLimit) and
/// [`ResponseFuture`](crate::layer::ResponseFuture) (a new generic parameter on each) and every lookup
/// would still need boxing to be stored behind the layer's shared config. With the enum the
/// resolver is a trait object, the common case (a choice made from a header or the key:
/// [`Ready`](Self::Ready) or [`Default`](Self::Default)) allocates no future at all, and only a
/// lookup that really waits pays for one box. ([`Quotas`] holds its tiers inline, so `Ready`
/// allocates nothing either: the sync path is allocation-free.)
///
/// ```
/// use redlimit::{layer::Resolved, Quota, Quotas};
///
/// let free: Resolved = Quota::per_minute(10).unwrap().into(); // one tier
/// assert!(matches!(free, Resolved::Ready(_)));
/// let lookup = Resolved::pending(async { None::<Quotas> });
/// assert!(matches!(lookup, Resolved::Pending(_)));
/// ```
// `Ready` is large (the quotas inline, ~260 bytes) and `Pending` a pointer: boxing `Ready` to
// even them out would cost an allocation per request, which is what the enum exists to avoid;
// a `Resolved` only lives between the resolver and the check future.
#[allow(clippy::large_enum_variant)]
#[non_exhaustive]
pub enum Resolved {
    /// The layer's own quotas (those given to the builder).
    Default,
    /// These quotas.
    Ready(Quotas),
    /// Found by this future; `None` means the layer's own quotas (e.g. a failed lookup).
    Pending(BoxFuture<'static, Option<Quotas>>),
}

impl Resolved {
    /// [`Resolved::Pending`] with `lookup`, boxed.
    ///
    /// ```
    /// use redlimit::{layer::Resolved, Quota};
    ///
    /// let pro = Quota::per_minute(1000).unwrap();
    /// let lookup = Resolved::pending(async move { Some(pro.into()) });
    /// assert!(matches!(lookup, Resolved::Pending(_)));
    /// ```
    pub fn pending(lookup: impl Future<Output = Option<Quotas>> + Send + 'static) -> Resolved {
        Resolved::Pending(Box::pin(lookup))
    }
}

impl From<Quotas> for Resolved {
    fn from(quotas: Quotas) -> Self {
        Resolved::Ready(quotas)
    }
}

impl From<Quota> for Resolved {
    fn from(quota: Quota) -> Self {
        Resolved::Ready(quota.into())
    }
}

impl From<Option<Quotas>> for Resolved {
    /// `None`: the layer's own quotas.
    fn from(quotas: Option<Quotas>) -> Self {
        quotas.map_or(Resolved::Default, Resolved::Ready)
    }
}

impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resolved::Default => f.write_str("Default"),
            Resolved::Ready(quotas) => f.debug_tuple("Ready").field(quotas).finish(),
            Resolved::Pending(_) => f.write_str("Pending(..)"),
        }
    }
}

/// A [`QuotaResolver`] made of a closure; see [`resolver_fn`].
#[derive(Clone)]
pub struct FnResolver<F> {
    f: F,
}

impl<F> fmt::Debug for FnResolver<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnResolver").finish_non_exhaustive()
    }
}

/// A [`QuotaResolver`] from a closure over the request parts and the key, returning anything
/// that converts into [`Resolved`]: a [`Quota`], [`Quotas`], `Option<Quotas>` (`None`: the
/// layer's own quotas) or a [`Resolved`].
///
/// FREE clients get 10 requests a minute, those sending `x-plan: pro` 1000:
///
/// ```
/// # use std::convert::Infallible;
/// # use http::{Request, Response, StatusCode};
/// # use tower::{ServiceBuilder, ServiceExt};
/// use redlimit::{key::HeaderKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
/// use redlimit::layer::{Resolved, resolver_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let free = Quota::per_minute(10)?;
/// let pro = Quota::per_minute(1000)?;
/// let layer = RateLimitLayer::builder(
///     Limiter::new(MemoryStore::new()),
///     free,
///     HeaderKey::named("x-api-key")?,
/// )
/// .resolver(resolver_fn(move |parts, _key| match parts.headers.get("x-plan") {
///     Some(plan) if plan == "pro" => Resolved::Ready(pro.into()),
///     _ => Resolved::Default,
/// }))
/// .build()?;
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
///
/// let pro_request = Request::get("/")
///     .header("x-api-key", "k-1")
///     .header("x-plan", "pro")
///     .body(String::new())?;
/// let response = svc.oneshot(pro_request).await?;
/// assert_eq!(response.headers()["ratelimit-policy"], r#""default";q=1000;w=60"#);
/// # Ok(())
/// # }
/// ```
pub fn resolver_fn<F, R>(f: F) -> FnResolver<F>
where
    F: Fn(&Parts, &str) -> R + Send + Sync + 'static,
    R: Into<Resolved>,
{
    FnResolver { f }
}

impl<F, R> QuotaResolver for FnResolver<F>
where
    F: Fn(&Parts, &str) -> R + Send + Sync + 'static,
    R: Into<Resolved>,
{
    fn resolve(&self, parts: &Parts, key: &str) -> Resolved {
        (self.f)(parts, key).into()
    }
}
