//! The production modes' script calls on the wire (`lua/refund.lua`, `lua/block.lua`,
//! `lua/slots.lua`): which script, its keys and its packed arguments. Run by `modes.rs`.

use std::sync::LazyLock;

use super::args::PackedArgs;
use super::reload::Script;
use crate::algorithm::layout::exact;
use crate::algorithm::{
    log_controls_key, offences_key, tenant_key, Algorithm, BLOCK_WRAPPER, REFUND_SOURCE,
    SLOTS_SOURCE,
};
use crate::quota::Quota;
use crate::store::micros;
use crate::store::modes::slot_op;
use crate::store::{Block, CheckRequest, RefundRequest, SlotRequest};

static REFUND: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(REFUND_SOURCE));
static BLOCK: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&BLOCK_WRAPPER));
static SLOTS: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SLOTS_SOURCE));

/// A production mode's script call.
#[derive(Debug, Clone, Copy)]
pub(super) enum ModeCall<'a> {
    Refund(RefundRequest<'a>),
    /// A decision that blocks on a denial.
    Block(CheckRequest<'a>, Block),
    Slots(SlotRequest<'a>),
}

impl ModeCall<'_> {
    /// The script, its body, and which it is for the reloads.
    pub(super) fn script(&self) -> (&'static redis::Script, &'static str, Script) {
        match self {
            ModeCall::Refund(_) => (&REFUND, REFUND_SOURCE, Script::Refund),
            ModeCall::Block(..) => (&BLOCK, &BLOCK_WRAPPER, Script::Block),
            ModeCall::Slots(_) => (&SLOTS, SLOTS_SOURCE, Script::Slots),
        }
    }

    /// Appends `numkeys`, `KEYS` and `ARGV`.
    pub(super) fn push_call(&self, cmd: &mut redis::Cmd) {
        match self {
            ModeCall::Refund(r) => {
                if r.algorithm == Algorithm::SlidingLog {
                    cmd.arg(3)
                        .arg(log_controls_key(r.key))
                        .arg(r.key)
                        .arg(tenant_key(r.key));
                } else {
                    cmd.arg(2).arg(r.key).arg(tenant_key(r.key));
                }
                cmd.arg(refund_args(r));
            }
            ModeCall::Block(r, block) => {
                let args = PackedArgs::new(r.algorithm, r.quotas, r.cost, r.now_micros);
                if r.algorithm == Algorithm::SlidingLog {
                    cmd.arg(4).arg(log_controls_key(r.key)).arg(r.key);
                } else {
                    cmd.arg(3).arg(r.key);
                }
                cmd.arg(tenant_key(r.key)).arg(offences_key(r.key));
                cmd.arg(args.as_bytes())
                    .arg(block_args(micros(block.duration), micros(block.max)));
            }
            ModeCall::Slots(r) => {
                let (op, limit) = slot_op(r.op);
                cmd.arg(1)
                    .arg(r.key)
                    .arg(slot_args(op, limit, micros(r.lease), r.now_micros));
                for id in r.ids {
                    cmd.arg(*id);
                }
            }
        }
    }
}

/// The refund script's one argument: `'<dBdd' .. n * '<ddd'`: now_us (-1: Redis `TIME`), the
/// algorithm's tag, the units, the reservation's age, then the caller's tiers.
fn refund_args(r: &RefundRequest<'_>) -> Vec<u8> {
    let quotas: &[Quota] = r.quotas;
    let mut bytes = Vec::with_capacity(25 + 24 * quotas.len());
    bytes.extend_from_slice(&r.now_micros.map_or(-1.0, exact).to_le_bytes());
    bytes.push(r.algorithm.tag());
    bytes.extend_from_slice(&exact(r.units).to_le_bytes());
    bytes.extend_from_slice(&exact(r.age_micros).to_le_bytes());
    for quota in quotas.iter().take(crate::quota::MAX_TIERS) {
        for v in [quota.limit(), quota.period_micros(), quota.burst()] {
            bytes.extend_from_slice(&exact(v).to_le_bytes());
        }
    }
    bytes
}

/// The block script's second argument: `'<dd'` block_us, max_us.
fn block_args(block_us: u64, max_us: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16);
    bytes.extend_from_slice(&exact(block_us).to_le_bytes());
    bytes.extend_from_slice(&exact(max_us).to_le_bytes());
    bytes
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
