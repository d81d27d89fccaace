//! The layer's production modes: shadow rollout (the layer's, or shadow tiers beside enforced
//! ones), cost settled after the response, and block on abuse. See the
//! [modes guide](crate::guide::modes) for what each does, and when Redis fails.

use std::sync::Arc;

use http::{Response, StatusCode};

use super::config::Config;
use super::layer::RateLimitLayerBuilder;
use crate::decision::Decision;
use crate::limiter::{BlockFor, Limiter, PolicyLabel, Shadow};
use crate::quota::Quotas;

/// In the request extensions when a check made in shadow would have denied the request: the
/// layer's own in [`shadow`](RateLimitLayerBuilder::shadow) mode (then the [`Decision`] beside
/// it is that denial too), or its [shadow tiers](RateLimitLayerBuilder::shadow_quotas) (then
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

impl<K> RateLimitLayerBuilder<K> {
    /// Shadow mode (dark launch): every request is decided and recorded exactly as it would
    /// be, and always goes on to the service. A denial is counted (in
    /// [`LimiterStats::denied`](crate::limiter::LimiterStats) and
    /// [`shadow_limited`](crate::limiter::LimiterStats::shadow_limited); the `metrics` feature's
    /// outcome `shadow_limited` instead of `limited`), logged at a bounded rate (one line a
    /// second at most, saying how many it left out), and marked in the request extensions:
    /// the [`Decision`] there is the denial, with a [`ShadowLimited`] beside it. A denied
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
    /// and a [`ShadowLimited`] with their denial is in its extensions (counted as in
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
    /// charge then goes to the failure policy (a [`LocalFallback`](crate::policy::LocalFallback)
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
    pub settle: Arc<Settle>,
    pub label: PolicyLabel,
    /// The shadow tiers' storage key and quotas, when they admitted (and so reserved) too.
    pub shadow: Option<(String, Quotas)>,
}

impl Settlement {
    /// Settles against `response`, as a task of its own (never delaying the response).
    pub(crate) fn settle<B>(self, response: Response<B>) -> Response<B> {
        let (parts, body) = response.into_parts();
        let probe = Response::from_parts(parts, ());
        let settled = self.settle.settled(&probe, self.reserved);
        let (parts, ()) = probe.into_parts();
        let (refund, charge) = settle_units(self.reserved, settled);
        if refund > 0 || charge > 0 {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        let limiter = &self.limiter;
                        limiter
                            .settle_storage_key(
                                &self.storage_key,
                                &self.quotas,
                                refund,
                                charge,
                                &self.label,
                            )
                            .await;
                        if let Some((key, quotas)) = &self.shadow {
                            let label = self.label.shadowed(Shadow::Tiers);
                            limiter
                                .settle_storage_key(key, quotas, refund, charge, &label)
                                .await;
                        }
                    });
                }
                Err(_) => self.limiter.count_settle_failure("no tokio runtime"),
            }
        }
        Response::from_parts(parts, body)
    }
}

/// The label for checks of `config`'s shadow tiers.
pub(crate) fn shadow_label<K>(config: &Config<K>) -> PolicyLabel {
    config.metrics_label.shadowed(Shadow::Tiers)
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
