//! Settlement's refund in memory: the mirror of `lua/refund.lua`, under the key's shard lock.

use std::sync::PoisonError;

use super::{KeyState, MemoryStore, Stored};
use crate::clock::system_now_micros;
use crate::store::ops::refund::{log_refund, refund, reserved_before_reset};
use crate::store::refund::{RefundRequest, ReservedAt};
use crate::store::wire::layout::{log_controls_key, Controls};

impl MemoryStore {
    /// A refund (`lua/refund.lua`), synchronously.
    pub(super) fn refund_now(&self, request: RefundRequest<'_>) -> u64 {
        let (now, reserved, client) = match request.reserved {
            ReservedAt::Client(at) => (at, at as f64, true),
            ReservedAt::Store(at) => (system_now_micros(), at as f64, false),
            ReservedAt::Ago(age) => {
                let now = system_now_micros();
                let age = crate::store::wire::layout::capped_cost(age) as f64;
                (now, now as f64 - age, false)
            }
        };
        let units = crate::store::wire::layout::capped_cost(request.units) as f64;
        let log = request.algorithm.spec().is_log();
        let mut guard = self
            .shard(request.key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shard = &mut *guard;
        let tenant = shard.tenant(request.key, now);
        let route_key = if log {
            log_controls_key(request.key)
        } else {
            request.key.to_owned()
        };
        let (held, live) = shard.find(&route_key, now);
        let route = live.and_then(|slot| shard.bytes(slot)).map(<[u8]>::to_vec);
        if log {
            // Only the controls' string: its stamp against the tenant's reset.
            let stale = stale(route.as_deref(), tenant.as_deref());
            if stale {
                return 0;
            }
            let (_, live) = shard.find(request.key, now);
            let Some(slot) = live else { return 0 };
            let KeyState::Log(entries) = &mut shard.slots[slot].stored.state else {
                return 0;
            };
            let reset = tenant_reset_us(tenant.as_deref());
            if reset > 0.0 && reserved_before_reset(reserved, reset, client) {
                return 0; // reserved before the tenant's reset
            }
            return log_refund(entries, units, reserved);
        }
        let Some((bytes, changed)) = refund(
            route.as_deref(),
            tenant.as_deref(),
            request.algorithm.tag(),
            units,
            (reserved, client),
            request.quotas,
        ) else {
            return 0;
        };
        let (Some(slot), Some(_)) = (held, live) else {
            return 0;
        };
        let expires_at = shard.slots[slot].stored.expires_at;
        let stored = Stored {
            state: KeyState::Bytes(bytes),
            expires_at,
        };
        // The key keeps its expiry, as `SET … PX <its PTTL>` does.
        shard.put(held, &route_key, stored, now, self.max_keys_per_shard);
        changed
    }
}

/// The tenant's reset in µs (0: none).
fn tenant_reset_us(tenant: Option<&[u8]>) -> f64 {
    match tenant.map(Controls::parse) {
        Some(Controls::Some { n, .. }) => {
            Controls::tenant_reset(tenant.unwrap_or_default(), Controls::len(n))
        }
        _ => 0.0,
    }
}

/// Whether the states under `route`'s controls were written before its tenant's reset.
fn stale(route: Option<&[u8]>, tenant: Option<&[u8]>) -> bool {
    let reset = tenant_reset_us(tenant);
    if reset <= 0.0 {
        return false;
    }
    let stamp = match route.map(|s| (s, Controls::parse(s))) {
        Some((s, Controls::Some { n, .. })) => Controls::stamp(s, Controls::len(n)).0,
        _ => 0.0,
    };
    stamp < reset
}
