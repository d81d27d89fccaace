//! Block on abuse's store call: a decision that suspends the key's tenant on a denial.

use std::time::Duration;

/// A block on abuse for [`StoreExt::check_blocking`](super::StoreExt::check_blocking): a denial by a
/// quota suspends the key's tenant for `duration`, doubled per repeated offence up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The first offence's block.
    pub duration: Duration,
    /// The longest block (equal to `duration`: no doubling).
    pub max: Duration,
}
