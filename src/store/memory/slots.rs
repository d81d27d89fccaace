//! Concurrency slots in memory: the mirror of `lua/slots.lua`, under the key's shard lock.

use std::sync::PoisonError;
use std::time::Duration;

use super::{KeyState, MemoryStore, Stored};
use crate::clock::system_now_micros;
use crate::store::contract::micros;
use crate::store::ops::slots::{slots_step, ACQUIRE, RELEASE, RENEW};
use crate::store::slots::{SlotReply, SlotRequest};

impl MemoryStore {
    /// A slot call (`lua/slots.lua`), synchronously.
    pub(super) fn slots_now(&self, request: SlotRequest<'_>) -> SlotReply {
        let now = request.now_micros.unwrap_or_else(system_now_micros);
        let (op, limit) = crate::store::ops::slots::slot_op(request.op);
        let lease_us = micros(request.lease);
        let ids: Vec<u64> = request
            .ids
            .iter()
            .map(|id| self.hasher.bytes(id.as_bytes()))
            .collect();
        let mut guard = self
            .shard(request.key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shard = &mut *guard;
        let (held, live) = shard.find(request.key, now);
        // Nothing held: absent, expired, or another type, which the script's `TYPE` check
        // reads as a fresh key. A release then changes nothing.
        let held_slots = live.and_then(|slot| shard.held_slots(slot));
        if held_slots.is_none() && op == RELEASE {
            return SlotReply::of(request.op, false, 0, Duration::ZERO);
        }
        let bytes = held_slots.unwrap_or_default();
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
                    state: KeyState::Slots(bytes),
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
}
