//! Concurrency slots (`lua/slots.lua`): the script, its key, packed argument, ids and reply.

use std::time::Duration;

use crate::store::op::{Script, ScriptId, ScriptOp};
use crate::store::slots::slot_op;
use crate::store::wire::layout::exact;
use crate::store::wire::scripts::SLOTS_SOURCE;
use crate::store::{micros, SlotReply, SlotRequest, StoreError};

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
