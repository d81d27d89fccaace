//! Concurrency slots (`lua/slots.lua`): the script, its key, packed argument, ids and reply,
//! and its Rust mirror over the memory store's encoding of the sorted set (16 bytes per slot:
//! the lease's end as a little-endian double, then the id's 8-byte hash; the ids themselves are
//! the holders' business).

use std::future::Future;
use std::sync::PoisonError;
use std::time::Duration;

use super::StoreOp;
use crate::store::contract::OperationRequest;

use crate::store::contract::{micros, StoreError};
use crate::store::memory::shard::{KeyState, Stored};
use crate::store::memory::{call_time, positive, refused, MemoryStore};
use crate::store::op::{Script, ScriptId, ScriptOp};
use crate::store::redis::RedisStore;
use crate::store::slots::{SlotOp, SlotReply, SlotRequest};
use crate::store::wire::layout::exact;
use crate::store::wire::scripts::SLOTS_SOURCE;

/// The concurrency slots' script.
pub(crate) static SLOTS: Script = Script {
    id: ScriptId::Slots,
    source: &SLOTS_SOURCE,
    hashed: std::sync::LazyLock::new(|| redis::Script::new(&SLOTS_SOURCE)),
};

/// One slot operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotsOp<'a>(pub(crate) SlotRequest<'a>);

impl ScriptOp for SlotsOp<'_> {
    type Output = SlotReply;

    fn script(&self) -> &'static Script {
        &SLOTS
    }

    fn write_args(&self, cmd: &mut redis::Cmd) {
        push_slots(cmd, &self.0);
    }

    /// The script's `{ok, n, wait_ms}`.
    fn read_reply(&self, reply: redis::Value) -> Result<SlotReply, StoreError> {
        let (ok, n, wait_ms): (i64, i64, i64) = redis::from_redis_value_ref(&reply)
            .map_err(|_| StoreError::BadReply(format!("{reply:?}")))?;
        let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
        Ok(SlotReply::of(
            self.0.op,
            ok == 1,
            u64::try_from(n).unwrap_or(0),
            wait,
        ))
    }
}

/// Appends a slot operation's `numkeys`, `KEYS` and `ARGV` (the ids last).
fn push_slots(cmd: &mut redis::Cmd, r: &SlotRequest<'_>) {
    let (op, limit) = slot_op(r.op);
    cmd.arg(1)
        .arg(r.key)
        .arg(slot_args(op, limit, micros(r.lease), r.now_micros));
    for id in r.ids {
        cmd.arg(*id);
    }
}

/// The slots script's first argument: `'<dBdd'` now_us, op, limit, lease_us (the ids follow).
fn slot_args(op: u8, limit: u64, lease_us: u64, now_micros: Option<u64>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(25);
    bytes.extend_from_slice(&now_micros.map_or(-1.0, exact).to_le_bytes());
    bytes.push(op);
    bytes.extend_from_slice(&exact(limit).to_le_bytes());
    bytes.extend_from_slice(&exact(lease_us).to_le_bytes());
    bytes
}

/// The operations' bytes.
pub(crate) const ACQUIRE: u8 = b'a';
pub(crate) const RENEW: u8 = b'n';
pub(crate) const RELEASE: u8 = b'r';

/// One slot call on the memory store's encoding `held`, the steps of `lua/slots.lua`: the
/// reply `(ok, n, wait_us)` and the new encoding (`None`: nothing held, the key is deleted).
pub(crate) fn slots_step(
    held: &[u8],
    op: u8,
    limit: u64,
    lease_us: u64,
    ids: &[u64],
    now: u64,
) -> ((bool, u64, u64), Option<Vec<u8>>) {
    // Leases that have ended are free (as ZREMRANGEBYSCORE -inf now).
    let mut slots: Vec<(f64, u64)> = held
        .chunks_exact(16)
        .map(|c| {
            let end = f64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            let id = u64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
            (end, id)
        })
        .filter(|&(end, _)| end > now as f64)
        .collect();
    let end = (now + lease_us) as f64;
    // ZADD: a new lease's end for `id`; whether it was added (not held before).
    let add = |slots: &mut Vec<(f64, u64)>, id: u64| match slots.iter_mut().find(|s| s.1 == id) {
        Some(slot) => {
            slot.0 = end;
            false
        }
        None => {
            slots.push((end, id));
            true
        }
    };
    let reply = match op {
        ACQUIRE => {
            let before = slots.len() as u64;
            if before >= limit {
                let oldest = slots.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
                (false, 0, (oldest - now as f64).max(0.0) as u64)
            } else {
                for &id in ids {
                    add(&mut slots, id);
                }
                (true, limit - before - 1, 0)
            }
        }
        RENEW => {
            // A slot the store lost is put back: its request is still in flight.
            let restored = ids.iter().filter(|&&id| add(&mut slots, id)).count() as u64;
            (restored == 0, restored, 0)
        }
        _ => {
            let before = slots.len();
            slots.retain(|s| !ids.contains(&s.1));
            let removed = (before - slots.len()) as u64;
            (removed > 0, removed, 0)
        }
    };
    let bytes: Vec<u8> = slots
        .iter()
        .flat_map(|(end, id)| end.to_le_bytes().into_iter().chain(id.to_le_bytes()))
        .collect();
    (reply, (!bytes.is_empty()).then_some(bytes))
}

/// A slot operation's byte and limit (1 for the operations that take none).
pub(crate) fn slot_op(op: SlotOp) -> (u8, u64) {
    match op {
        SlotOp::Acquire { limit } => (ACQUIRE, limit),
        SlotOp::Renew => (RENEW, 1),
        SlotOp::Release => (RELEASE, 1),
    }
}

impl StoreOp for SlotsOp<'_> {
    type Output = SlotReply;

    fn request(&self) -> OperationRequest<'_> {
        OperationRequest::Slots(self.0)
    }

    const LACKING: &'static str = "this store has no concurrency slots";

    fn on_redis<'s>(
        &'s self,
        store: &'s RedisStore,
    ) -> impl Future<Output = Result<SlotReply, StoreError>> + Send + 's {
        store.guarded(*self, "slots")
    }

    fn in_memory(&self, store: &MemoryStore) -> Result<SlotReply, StoreError> {
        store.slots_now(self.0)
    }
}

/// The longest slot id `lua/slots.lua` takes, in bytes.
const MAX_ID_BYTES: usize = 64;

/// The mirror: the same call under the key's shard lock.
impl MemoryStore {
    /// A slot call (`lua/slots.lua`), synchronously; refused as the script refuses its
    /// arguments, in the same order.
    pub(crate) fn slots_now(&self, request: SlotRequest<'_>) -> Result<SlotReply, StoreError> {
        if request.ids.is_empty() {
            return Err(refused("slot", "expected the slot ids"));
        }
        let now = call_time(request.now_micros, "slot")?;
        let (op, limit) = slot_op(request.op);
        positive(limit, "slot", "limit")?;
        let lease_us = positive(micros(request.lease), "slot", "lease_us")?;
        if request
            .ids
            .iter()
            .any(|id| id.is_empty() || id.len() > MAX_ID_BYTES)
        {
            return Err(refused("slot", "a slot id has 1 to 64 bytes"));
        }
        if op == ACQUIRE && request.ids.len() != 1 {
            return Err(refused("slot", "acquire takes one slot id"));
        }
        let ids: Vec<u64> = request.ids.iter().map(|id| self.hash_id(id)).collect();
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
            return Ok(SlotReply::of(request.op, false, 0, Duration::ZERO));
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
        Ok(SlotReply::of(
            request.op,
            ok,
            n,
            Duration::from_millis(wait_us.div_ceil(1000)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{slots_step, ACQUIRE, RENEW};

    /// A renewal of a slot the store lost (the key gone) puts it back, with its id.
    #[test]
    fn a_renewal_puts_a_lost_slot_back() {
        let ((ok, _, _), after) = slots_step(&[], RENEW, 1, 1_000, &[7], 5_000);
        let held = after.unwrap_or_default();
        assert_eq!(
            held.len(),
            16,
            "{} bytes held after the renewal (ok {ok})",
            held.len()
        );
        // It counts against the limit again.
        let ((admitted, _, _), _) = slots_step(&held, ACQUIRE, 1, 1_000, &[8], 5_001);
        assert!(!admitted);
    }
}
