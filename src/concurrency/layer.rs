//! [`ConcurrencyLimitLayer`], the middleware's [`Layer`].

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;
use tower_layer::Layer;

use super::config::Shared;
use super::service::ConcurrencyLimit;
use super::ConcurrencyLimiter;
use crate::core::{is_name, ConfigError};
use crate::key::KeyExtractor;
use crate::layer::headers::MAX_INTEGER;

/// A [`Layer`] that allows at most [`ConcurrencyLimiter::limit`] requests in flight per key,
/// fleet-wide. A request that finds every slot taken is answered `429 Too Many Requests` with
/// `Retry-After` (1 s: a slot usually frees sooner than any lease ends) and the IETF headers
/// with the quota unit of the draft, `RateLimit-Policy: "<name>";q=<N>;qu="concurrent-requests"`
/// and `RateLimit: "<name>";r=0;t=1`; an admitted one gets `RateLimit: "<name>";r=<left>` on
/// its response. A gRPC request gets a trailers-only `RESOURCE_EXHAUSTED` instead of the 429,
/// as [`RateLimitLayer`](crate::RateLimitLayer) answers it. Requests without a key share one.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use redlimit::concurrency::ConcurrencyLimitLayer;
/// use redlimit::concurrency::ConcurrencyLimiter;
/// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter};
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let slots = ConcurrencyLimiter::new(Limiter::new(MemoryStore::new()), 5)?;
/// let layer = ConcurrencyLimitLayer::new(slots, GlobalKey::new("exports"), "exports")?;
/// let mut svc = ServiceBuilder::new().layer(layer).service_fn(|_: Request<String>| async {
///     Ok::<_, Infallible>(Response::new(String::from("done")))
/// });
/// let response = svc.ready().await?.call(Request::new(String::new())).await?;
/// assert_eq!(response.status(), StatusCode::OK);
/// assert_eq!(response.headers()["ratelimit"], "\"exports\";r=4");
/// assert_eq!(
///     response.headers()["ratelimit-policy"],
///     "\"exports\";q=5;qu=\"concurrent-requests\""
/// );
/// # Ok(())
/// # }
/// ```
pub struct ConcurrencyLimitLayer<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for ConcurrencyLimitLayer<K> {
    fn clone(&self) -> Self {
        ConcurrencyLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K: fmt::Debug> fmt::Debug for ConcurrencyLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("slots", &self.shared.slots)
            .field("extractor", &self.shared.extractor)
            .field("name", &self.shared.name)
            .finish()
    }
}

impl<K: KeyExtractor> ConcurrencyLimitLayer<K> {
    /// Limits requests in flight per key of `extractor` with `slots`; `name` (1 to 64 of
    /// `[A-Za-z0-9._-]`) names the policy in the headers.
    pub fn new(
        slots: ConcurrencyLimiter,
        extractor: K,
        name: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        let name = name.into();
        if !is_name(&name) {
            return Err(ConfigError::InvalidPolicyName);
        }
        // `q` is a structured-field Integer: at most 15 digits (a limit of 10^15 is written as
        // the largest Integer, as the rate limit's headers write theirs).
        let q = slots.limit().min(MAX_INTEGER);
        let policy = format!("\"{name}\";q={q};qu=\"concurrent-requests\"");
        let policy = HeaderValue::from_str(&policy).map_err(|_| ConfigError::InvalidPolicyName)?;
        Ok(ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                slots,
                extractor,
                name,
                policy,
            }),
        })
    }
}

impl<S, K> Layer<S> for ConcurrencyLimitLayer<K> {
    type Service = ConcurrencyLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http::{Request, Response};
    use tower::{Service, ServiceExt};

    use super::*;
    use crate::concurrency::ConcurrencyLimiter;
    use crate::core::Limiter;
    use crate::key::GlobalKey;
    use crate::quota::{QuotaError, MAX_COUNT};
    use crate::store::MemoryStore;

    /// The largest limit accepted (10^15) is written as the largest structured-field Integer
    /// (15 digits); one above it is refused as too large, not as zero.
    #[tokio::test]
    async fn the_policy_header_of_the_largest_limit_is_a_15_digit_integer() {
        let limiter = Limiter::new(MemoryStore::new());
        let refused = ConcurrencyLimiter::new(limiter.clone(), MAX_COUNT + 1).unwrap_err();
        assert_eq!(refused, ConfigError::Quota(QuotaError::CountTooLarge));
        let slots = ConcurrencyLimiter::new(limiter, MAX_COUNT).unwrap();
        let layer = ConcurrencyLimitLayer::new(slots, GlobalKey::new("all"), "big").unwrap();
        let mut svc = layer.layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(()))
        }));
        let response = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        assert_eq!(
            response.headers()["ratelimit-policy"],
            "\"big\";q=999999999999999;qu=\"concurrent-requests\""
        );
        assert_eq!(response.headers()["ratelimit"], "\"big\";r=999999999999999");
    }
}
