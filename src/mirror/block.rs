//! Block on abuse: what the memory store's mirror of `lua/block.lua` (the decision script
//! wrapped) shares with it. Its wire (keys, arguments) is in `src/store/redis/block.rs`.

use crate::store::wire::layout::tenant_key;

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
