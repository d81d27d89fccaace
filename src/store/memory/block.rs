//! Block on abuse in memory: the mirror of `lua/block.lua`, under the key's shard lock.

use std::sync::PoisonError;
use std::time::Duration;

use super::{expiry, KeyState, MemoryStore, Stored};
use crate::clock::system_now_micros;
use crate::decision::Decision;
use crate::store::block::Block;
use crate::store::contract::{micros, CheckRequest, Control, ControlRequest};
use crate::store::ops::block::{block_us, offences_key};
use crate::store::wire::layout::{tenant_key, Controls};

impl MemoryStore {
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
}
