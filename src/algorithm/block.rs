//! Block on abuse: the decision script wrapped by `lua/block.lua`, and what its Rust mirror
//! (the memory store) shares with it. Its wire (keys, arguments, the script) is in
//! `src/store/redis/block.rs`.

use std::sync::LazyLock;

use super::tenant_key;

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

/// The block script: the decision script as a function, spliced into `lua/block.lua`.
pub(crate) static BLOCK_WRAPPER: LazyLock<String> = LazyLock::new(|| {
    let wrapper = include_str!("../../lua/block.lua");
    let spliced = wrapper.replacen("-- @decide\n", &super::SOURCE, 1);
    assert_ne!(spliced, wrapper, "lua/block.lua has its @decide line");
    spliced
});
