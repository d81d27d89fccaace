//! The production modes' store calls: a refund (units given back after a settlement), a
//! decision that blocks the key on a denial, and fleet-wide concurrency slots. Each is one
//! atomic script call in Redis and the same steps under the shard lock in memory.

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::quota::Quotas;

/// Units to give back to one route's tiers (see [`Limiter::refund`](crate::Limiter::refund)).
#[derive(Debug, Clone, Copy)]
pub struct RefundRequest<'a> {
    /// The route's storage key, as in [`CheckRequest::key`](super::CheckRequest::key).
    pub key: &'a str,
    /// The limiter's algorithm.
    pub algorithm: Algorithm,
    /// The caller's quotas (an override in the store replaces them, as in a decision).
    pub quotas: &'a Quotas,
    /// The units to give back (at least 1).
    pub units: u64,
    /// Client time in µs since the Unix epoch; `None` means the store's own clock.
    pub now_micros: Option<u64>,
}

/// A block on abuse for [`Store::check_blocking`](super::Store::check_blocking): a denial by a
/// quota suspends the key's tenant for `duration`, doubled per repeated offence up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The first offence's block.
    pub duration: Duration,
    /// The longest block (equal to `duration`: no doubling).
    pub max: Duration,
}
