//! Block on abuse on the wire (`lua/block.lua`, the decision script wrapped): its script, keys
//! and packed arguments.

use std::sync::LazyLock;

use super::args::PackedArgs;
use crate::mirror::layout::exact;
use crate::mirror::{log_controls_key, offences_key, tenant_key, BLOCK_SOURCE};
use crate::store::micros;
use crate::store::{Block, CheckRequest};

pub(super) static BLOCK: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&BLOCK_SOURCE));

/// Appends a blocking decision's `numkeys`, `KEYS` and `ARGV`.
pub(super) fn push_block(cmd: &mut redis::Cmd, r: &CheckRequest<'_>, block: &Block, timed: bool) {
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
