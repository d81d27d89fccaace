//! The production modes in memory: the mirrors of their scripts, under the key's shard lock.

use std::sync::PoisonError;

use std::time::Duration;

use super::{expiry, KeyState, MemoryStore, Stored};
use crate::algorithm::{
    block_us, log_controls_key, log_refund, offences_key, refund, slots_step, tenant_key,
    Algorithm, Controls, ACQUIRE, RELEASE, RENEW, STAMP,
};
use crate::clock::system_now_micros;
use crate::decision::Decision;
use crate::store::{
    micros, Block, CheckRequest, Control, ControlRequest, RefundRequest, SlotReply, SlotRequest,
};

impl MemoryStore {
    /// A slot call (`lua/slots.lua`), synchronously.
    pub(super) fn slots_now(&self, request: SlotRequest<'_>) -> SlotReply {
        let now = request.now_micros.unwrap_or_else(system_now_micros);
        let (op, limit) = crate::store::modes::slot_op(request.op);
        let lease_us = micros(request.lease);
        let ids: Vec<u64> = request
            .ids
            .iter()
            .map(|id| {
                use std::hash::{BuildHasher, Hasher};
                let mut hasher = self.hasher.build_hasher();
                hasher.write(id.as_bytes());
                hasher.finish()
            })
            .collect();
        let mut guard = self
            .shard(request.key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shard = &mut *guard;
        let (held, live) = shard.find(request.key, now);
        let bytes = live.and_then(|slot| shard.bytes(slot)).unwrap_or_default();
        if live.is_none() && op == RELEASE {
            return SlotReply::of(request.op, false, 0, Duration::ZERO);
        }
        let ((ok, n, wait_us), after) = slots_step(bytes, op, limit, lease_us, &ids, now);
        let changed = op != ACQUIRE || ok;
        match after {
            Some(bytes) if changed => {
                // The set expires one lease after the lease it last began or renewed.
                let expires_at = match op {
                    ACQUIRE | RENEW => now + lease_us.div_ceil(1000) * 1000,
                    _ => live.map_or(now, |slot| shard.slots[slot].stored.expires_at),
                };
                let stored = Stored {
                    state: KeyState::Bytes(bytes),
                    expires_at,
                };
                shard.put(held, request.key, stored, now, self.max_keys_per_shard);
            }
            None => {
                if let Some(slot) = held {
                    shard.remove_slot(slot);
                }
            }
            Some(_) => {}
        }
        SlotReply::of(
            request.op,
            ok,
            n,
            Duration::from_millis(wait_us.div_ceil(1000)),
        )
    }

    /// A decision that blocks on a denial (`lua/block.lua`), synchronously: the decision, then
    /// the block at the same time (a memory store serves one process: nothing comes between
    /// that could tell the two apart).
    pub(super) fn check_blocking_now(&self, request: CheckRequest<'_>, block: Block) -> Decision {
        let now = request.now_micros.unwrap_or_else(system_now_micros);
        let mut decision = self.check_now(CheckRequest {
            now_micros: Some(now),
            ..request
        });
        if decision.allowed || decision.suspended {
            return decision;
        }
        let (base, max) = (micros(block.duration), micros(block.max));
        let okey = offences_key(request.key);
        let offences = if max > base {
            let guard = self
                .shard(request.key)
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (_, live) = guard.find(&okey, now);
            live.and_then(|slot| guard.bytes(slot))
                .and_then(|b| std::str::from_utf8(b).ok()?.parse::<f64>().ok())
                .unwrap_or(0.0)
        } else {
            0.0
        };
        let d = block_us(base, max, offences);
        let tenant = tenant_key(request.key);
        let reply = self.control_now(ControlRequest {
            key: &tenant,
            algorithm: request.algorithm,
            control: Control::Extend(Duration::from_micros(d as u64)),
            now_micros: Some(now),
        });
        if max > base {
            let mut guard = self
                .shard(request.key)
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (held, _) = guard.find(&okey, now);
            let stored = Stored {
                state: KeyState::Bytes(format!("{}", offences as u64 + 1).into_bytes()),
                expires_at: expiry(now, ((d + max as f64) / 1000.0).ceil() as u64),
            };
            guard.put(held, &okey, stored, now, self.max_keys_per_shard);
        }
        if let Controls::Some { until_us, .. } =
            Controls::parse(reply.stored.as_deref().unwrap_or_default())
        {
            let left = ((until_us - now as f64) / 1000.0).ceil().max(0.0);
            decision.retry_after = Duration::from_millis(left as u64);
        }
        decision
    }

    /// A refund (`lua/refund.lua`), synchronously.
    pub(super) fn refund_now(&self, request: RefundRequest<'_>) -> u64 {
        let now = request.now_micros.unwrap_or_else(system_now_micros);
        let units = crate::algorithm::capped_cost(request.units) as f64;
        let reserved = now as f64 - crate::algorithm::capped_cost(request.age_micros) as f64;
        let log = request.algorithm == Algorithm::SlidingLog;
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
            if reset > 0.0 && reserved < reset {
                return 0; // reserved before the tenant's reset
            }
            return log_refund(entries, units, reserved);
        }
        let Some((bytes, changed)) = refund(
            route.as_deref(),
            tenant.as_deref(),
            request.algorithm.tag(),
            units,
            reserved,
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
    match tenant {
        Some(t) if t.first() == Some(&b'M') && t.len() >= 10 => {
            let clen = 10 + 24 * usize::from(t[9]);
            t.get(clen..clen + 8)
                .map_or(0.0, |b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
        }
        _ => 0.0,
    }
}

/// Whether the states under `route`'s controls were written before its tenant's reset.
fn stale(route: Option<&[u8]>, tenant: Option<&[u8]>) -> bool {
    let f = |s: &[u8], at: usize| {
        s.get(at..at + 8)
            .map_or(0.0, |b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let reset = tenant_reset_us(tenant);
    if reset <= 0.0 {
        return false;
    }
    let stamp = match route {
        Some(s) if s.first() == Some(&b'M') && s.len() >= 10 => {
            let clen = 10 + 24 * usize::from(s[9]);
            if s.get(clen) == Some(&STAMP) {
                f(s, clen + 1)
            } else {
                0.0
            }
        }
        _ => 0.0,
    };
    stamp < reset
}
