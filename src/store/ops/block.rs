//! Block on abuse (`lua/block.lua`, the decision script wrapped): its script, keys, packed
//! arguments and reply (a decision's), and what its Rust mirror, which the memory store runs,
//! shares with it.

use std::future::Future;
use std::sync::PoisonError;
use std::time::Duration;

use super::timed::decide_in_memory;
use super::StoreOp;
use crate::clock::system_now_micros;
use crate::decision::Decision;
use crate::store::block::Block;
use crate::store::contract::OperationRequest;
use crate::store::contract::{micros, CheckRequest, Control, ControlRequest, StoreError};
use crate::store::memory::shard::{expiry, KeyState, Stored};
use crate::store::memory::{positive, refused, time, MemoryStore};
use crate::store::op::{Script, ScriptId, ScriptOp};
use crate::store::redis::RedisStore;
use crate::store::wire::decide::read_decision;
use crate::store::wire::decide::PackedArgs;
use crate::store::wire::layout::{exact, log_controls_key, tenant_key, Controls};
use crate::store::wire::scripts::BLOCK_SOURCE;

/// The block script.
pub(crate) static BLOCK: Script = Script {
    id: ScriptId::Block,
    source: &BLOCK_SOURCE,
    hashed: std::sync::LazyLock::new(|| redis::Script::new(&BLOCK_SOURCE)),
};

/// A decision that blocks the key on a denial; `timed` as for a
/// [`DecideOp`](crate::store::wire::decide::DecideOp).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockOp<'a> {
    pub(crate) request: CheckRequest<'a>,
    pub(crate) block: Block,
    pub(crate) timed: bool,
}

impl ScriptOp for BlockOp<'_> {
    type Output = (Decision, Option<u64>);

    fn script(&self) -> &'static Script {
        &BLOCK
    }

    fn write_args(&self, cmd: &mut redis::Cmd) {
        push_block(cmd, &self.request, &self.block, self.timed);
    }

    fn read_reply(&self, reply: redis::Value) -> Result<Self::Output, StoreError> {
        read_decision(reply, &self.request)
    }
}

/// Appends a blocking decision's `numkeys`, `KEYS` and `ARGV`.
fn push_block(cmd: &mut redis::Cmd, r: &CheckRequest<'_>, block: &Block, timed: bool) {
    let args = PackedArgs::of(r, timed);
    if r.algorithm.spec().is_log() {
        cmd.arg(4).arg(log_controls_key(r.key)).arg(r.key);
    } else {
        cmd.arg(3).arg(r.key);
    }
    cmd.arg(tenant_key(r.key)).arg(offences_key(r.key));
    cmd.arg(args.as_bytes())
        .arg(block_args(micros(block.duration), micros(block.max)));
}

/// The block script's second argument: `'<dd'` block_us, max_us.
fn block_args(block_us: u64, max_us: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16);
    bytes.extend_from_slice(&exact(block_us).to_le_bytes());
    bytes.extend_from_slice(&exact(max_us).to_le_bytes());
    bytes
}

/// The key of a tenant's offence count: its hash tag and `#b`, beside its controls (`#t`).
pub(crate) fn offences_key(key: &str) -> String {
    let mut tenant = tenant_key(key);
    tenant.pop();
    tenant.push('b');
    tenant
}

/// The block for the offence after `offences` earlier ones: `min(block * 2^n, max)` in µs, as
/// `lua/block.lua` computes it (in doubles).
pub(crate) fn block_us(block_us: u64, max_us: u64, offences: f64) -> f64 {
    if max_us <= block_us {
        return block_us as f64;
    }
    (block_us as f64 * 2f64.powf(offences.min(60.0))).min(max_us as f64)
}

impl StoreOp for BlockOp<'_> {
    type Output = (Decision, Option<u64>);

    fn request(&self) -> OperationRequest<'_> {
        OperationRequest::Blocking(self.request, self.block)
    }

    const LACKING: &'static str = "this store cannot block";

    fn on_redis<'s>(
        &'s self,
        store: &'s RedisStore,
    ) -> impl Future<Output = Result<Self::Output, StoreError>> + Send + 's {
        store.guarded(*self, "check")
    }

    /// Refuses what `lua/block.lua` refuses (its block, then the decision's arguments).
    fn in_memory(&self, store: &MemoryStore) -> Result<Self::Output, StoreError> {
        let block_us = positive(micros(self.block.duration), "block", "block_us")?;
        let max_us = positive(micros(self.block.max), "block", "max_us")?;
        if max_us < block_us {
            return Err(refused("block", "max_us must be at least block_us"));
        }
        if let Some(now) = self.request.now_micros {
            time(now, "decision", "now_us")?;
        }
        let decide = |request: CheckRequest<'_>| Ok(store.check_blocking_now(request, self.block));
        match self.timed {
            true => decide_in_memory(self.request, decide),
            false => Ok((decide(self.request)?, None)),
        }
    }
}

/// The mirror.
impl MemoryStore {
    /// A decision that blocks on a denial (`lua/block.lua`), synchronously: the decision, then
    /// the block at the same time (a memory store serves one process: nothing comes between
    /// that could tell the two apart).
    pub(crate) fn check_blocking_now(&self, request: CheckRequest<'_>, block: Block) -> Decision {
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
            // Never sooner than the quota admits (`lua/block.lua`'s reply).
            decision.retry_after = decision.retry_after.max(Duration::from_millis(left as u64));
        }
        decision
    }
}
