//! Concurrency slots on the wire (`lua/slots.lua`): the script, its key, packed argument and ids.

use std::sync::LazyLock;

use crate::mirror::layout::exact;
use crate::mirror::SLOTS_SOURCE;
use crate::store::micros;
use crate::store::slots::slot_op;
use crate::store::SlotRequest;

pub(super) static SLOTS: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&SLOTS_SOURCE));

/// Appends a slot operation's `numkeys`, `KEYS` and `ARGV` (the ids last).
pub(super) fn push_slots(cmd: &mut redis::Cmd, r: &SlotRequest<'_>) {
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
