//! Shadow rollout in the layer: the layer's own shadow mode, or shadow tiers beside enforced
//! ones. A shadow check decides and records, and the request always goes on. See the
//! [modes guide](crate::guide::modes).

use crate::decision::Decision;

/// In the request extensions when a check made in shadow would have denied the request: the
/// layer's own in [`shadow`](crate::layer::RateLimitLayerBuilder::shadow) mode (then the [`Decision`] beside
/// it is that denial too), or its [shadow tiers](crate::layer::RateLimitLayerBuilder::shadow_quotas) (then
/// the [`Decision`] beside it is the enforced tiers' admission, and this one the shadow tiers'
/// denial). The request went on to the service all the same.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use redlimit::layer::ShadowLimited;
/// use redlimit::{key::GlobalKey, store::MemoryStore, Decision, Limiter, Quota, RateLimitLayer};
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder(
///     Limiter::new(MemoryStore::new()),
///     Quota::per_minute(1)?,
///     GlobalKey::new("all"),
/// )
/// .shadow(true)
/// .build()?;
/// let mut svc = ServiceBuilder::new().layer(layer).service_fn(|req: Request<()>| async move {
///     let shadowed = req.extensions().get::<ShadowLimited>().is_some();
///     let allowed = req.extensions().get::<Decision>().unwrap().allowed;
///     Ok::<_, Infallible>(Response::new(format!("{allowed} {shadowed}")))
/// });
/// let first = svc.ready().await?.call(Request::new(())).await?;
/// let second = svc.ready().await?.call(Request::new(())).await?;
/// // Never denied: the second would have been, and says so.
/// assert_eq!(second.status(), StatusCode::OK);
/// assert!(second.headers().get("ratelimit").is_none()); // no headers in shadow
/// # let _ = first;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShadowLimited(pub Decision);

/// The suffix of the scope of a layer's shadow tiers: `<scope>.shadow`, so promoting a tier
/// from shadow to enforced starts it fresh and the enforced tiers never share its state.
pub(crate) const SHADOW_SCOPE_SUFFIX: &str = ".shadow";

/// At most one log line a second for shadow denials, process-wide, each saying how many were
/// left out before it: a shadow limit that would deny much must not flood the log.
pub(crate) fn note_shadow_denial(policy: &str, decision: &Decision, tiers: bool) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::Instant;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    static LAST: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    let now = EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1;
    let last = LAST.load(Ordering::Relaxed);
    if (last == 0 || now >= last + 1_000)
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
        // Never the key: it may be a secret.
        tracing::info!(
            policy,
            shadow_tiers = tiers,
            limit = decision.limit,
            retry_after_ms = decision.retry_after.as_millis() as u64,
            suspended = decision.suspended,
            suppressed,
            "shadow rate limit would have denied a request; it went on (shadow mode)"
        );
    } else {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
    }
}
