//! Cost settled after the response: a request reserves its cost at admission and the
//! settlement, from the response, gives back (or charges) the difference, in a task of its own.
//! See the [modes guide](crate::guide::modes).

use std::sync::Arc;

use http::{Response, StatusCode};

use crate::core::{Limiter, PolicyLabel, Shadow};
use crate::quota::Quotas;
use crate::settle::Reserved;

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
