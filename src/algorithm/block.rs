//! Block on abuse: the decision script wrapped by `lua/block.lua`, and what its Rust mirror
//! (the memory store) shares with it.

use std::sync::LazyLock;

use super::{tenant_key, Algorithm};

/// The key of a tenant's offence count: its hash tag and `#b`, beside its controls (`#t`).
pub(crate) fn offences_key(key: &str) -> String {
    let mut tenant = tenant_key(key);
    tenant.pop();
    tenant.push('b');
    tenant
}

/// The block script's second argument: `'<dd'` block_us, max_us.
pub(crate) fn block_args(block_us: u64, max_us: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16);
    bytes.extend_from_slice(&(block_us.min(1 << 53) as f64).to_le_bytes());
    bytes.extend_from_slice(&(max_us.min(1 << 53) as f64).to_le_bytes());
    bytes
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
pub(crate) static BLOCK_SOURCE: LazyLock<String> = LazyLock::new(|| {
    let wrapper = include_str!("../../lua/block.lua");
    let decide = Algorithm::TokenBucket.script_source();
    let spliced = wrapper.replacen("-- @decide\n", decide, 1);
    assert_ne!(spliced, wrapper, "lua/block.lua has its @decide line");
    spliced
});

/// The block script, loaded once per process.
pub(crate) fn block_script() -> &'static redis::Script {
    static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&BLOCK_SOURCE));
    &SCRIPT
}
