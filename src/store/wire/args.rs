//! The decision script's packed argument (`lua/common.lua`'s header, ARGV): what every
//! decision sends, whichever script wraps it.

use crate::algorithm::Algorithm;
use crate::quota::{Quota, MAX_TIERS};
use crate::store::wire::layout::capped_cost;
use crate::store::wire::layout::{exact, put_quota, ARGS_HEADER, QUOTA_BYTES};

/// The longest argument: now, cost, the algorithm, and 8 tiers.
const MAX_ARGS: usize = ARGS_HEADER + QUOTA_BYTES * MAX_TIERS;

/// The decision script's one argument: `'<ddB' .. n * '<ddd'` (see `lua/common.lua`).
pub(crate) struct PackedArgs {
    len: usize,
    bytes: [u8; MAX_ARGS],
}

impl PackedArgs {
    pub(crate) fn new(
        algorithm: Algorithm,
        quotas: &[Quota],
        cost: u64,
        now_micros: Option<u64>,
        timed: bool,
    ) -> Self {
        let quotas = &quotas[..quotas.len().min(MAX_TIERS)];
        let now = match now_micros {
            Some(now) => exact(now),
            None if timed => -2.0,
            None => -1.0,
        };
        let cost = exact(capped_cost(cost));
        let mut bytes = [0; MAX_ARGS];
        bytes[0..8].copy_from_slice(&now.to_le_bytes());
        bytes[8..16].copy_from_slice(&cost.to_le_bytes());
        bytes[16] = algorithm.tag();
        let mut at = ARGS_HEADER;
        for quota in quotas {
            at = put_quota(&mut bytes, at, quota);
        }
        PackedArgs { len: at, bytes }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}
