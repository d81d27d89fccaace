//! The layer's production modes: shadow rollout (the layer's, or shadow tiers beside enforced
//! ones), cost settled after the response, and block on abuse. See the
//! [modes guide](crate::guide::modes) for what each does, and when Redis fails.

use std::sync::Arc;

use http::{Response, StatusCode};

use crate::decision::Decision;
use crate::limiter::{BlockFor, Limiter, PolicyLabel, Reserved, Shadow};
use crate::quota::Quotas;

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

/// What settles a request's cost from its response.
pub(crate) type SettleFn = dyn Fn(&Response<()>) -> u64 + Send + Sync;

/// How a request's cost is settled from its response.
pub(crate) enum Settle {
    /// The cost a function reads from the response.
    Cost(Box<SettleFn>),
    /// The reservation for these statuses, nothing for the others.
    Statuses(Vec<StatusCode>),
}

impl Settle {
    /// What a request that reserved `reserved` really cost, from its `response`.
    fn settled(&self, response: &Response<()>, reserved: u64) -> u64 {
        match self {
            Settle::Cost(cost) => cost(response),
            Settle::Statuses(statuses) if statuses.contains(&response.status()) => reserved,
            Settle::Statuses(_) => 0,
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

/// The suffix of the scope of a layer's shadow tiers: `<scope>.shadow`, so promoting a tier
/// from shadow to enforced starts it fresh and the enforced tiers never share its state.
pub(crate) const SHADOW_SCOPE_SUFFIX: &str = ".shadow";

/// The units a settlement moves: `(refund, charge)` from the reservation and the settled cost.
fn settle_units(reserved: u64, settled: u64) -> (u64, u64) {
    (
        reserved.saturating_sub(settled),
        settled.saturating_sub(reserved),
    )
}

/// What a request's settlement needs once its response is there.
pub(crate) struct Settlement {
    pub limiter: Limiter,
    pub storage_key: String,
    pub quotas: Quotas,
    pub reserved: u64,
    /// When the store reserved them (the settlement gives back to that window only).
    pub reserved_at: Reserved,
    pub settle: Arc<Settle>,
    pub label: PolicyLabel,
    /// The shadow tiers' storage key, quotas and reservation time, when the store admitted
    /// (and so reserved) there too.
    pub shadow: Option<(String, Quotas, Reserved)>,
}

impl Settlement {
    /// Settles against `response`, as a task of its own (never delaying the response), which
    /// [`Limiter::flush_settlements`] waits for; one that never ends (its runtime shut down)
    /// is counted as a failed settlement.
    pub(crate) fn settle<B>(self, response: Response<B>) -> Response<B> {
        let (parts, body) = response.into_parts();
        let probe = Response::from_parts(parts, ());
        let settled = self.settle.settled(&probe, self.reserved);
        let (parts, ()) = probe.into_parts();
        let (refund, charge) = settle_units(self.reserved, settled);
        if refund > 0 || charge > 0 {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let pending = self.limiter.settlement_started();
                    runtime.spawn(async move {
                        let limiter = &self.limiter;
                        let units = (refund, charge);
                        limiter
                            .settle_storage_key(
                                &self.storage_key,
                                &self.quotas,
                                units,
                                self.reserved_at,
                                &self.label,
                            )
                            .await;
                        if let Some((key, quotas, reserved)) = &self.shadow {
                            let label = self.label.shadowed(Shadow::Tiers);
                            limiter
                                .settle_storage_key(key, quotas, units, *reserved, &label)
                                .await;
                        }
                        pending.finish();
                    });
                }
                Err(_) => self.limiter.count_settle_failure("no tokio runtime"),
            }
        }
        Response::from_parts(parts, body)
    }
}

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
