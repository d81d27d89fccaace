//! Block on abuse (`lua/block.lua`, the decision script wrapped): its script, keys, packed
//! arguments and reply (a decision's), and what its Rust mirror, which the memory store runs,
//! shares with it.

use super::decide::read_decision;
use crate::decision::Decision;
use crate::store::block::Block;
use crate::store::contract::{micros, CheckRequest, StoreError};
use crate::store::op::{Script, ScriptId, ScriptOp};
use crate::store::wire::args::PackedArgs;
use crate::store::wire::layout::{exact, log_controls_key, tenant_key};
use crate::store::wire::scripts::BLOCK_SOURCE;

/// The block script.
pub(crate) static BLOCK: Script = Script {
    id: ScriptId::Block,
    source: &BLOCK_SOURCE,
    hashed: std::sync::LazyLock::new(|| redis::Script::new(&BLOCK_SOURCE)),
};

/// A decision that blocks the key on a denial; `timed` as for a
/// [`DecideOp`](super::decide::DecideOp).
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
