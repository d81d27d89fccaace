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
    /// How long ago the units were reserved, in µs: the reservation was made at
    /// `now - age_micros`, and the units go back only to the window that holds that time, and
    /// not at all when it is before a reset of the tenant. Never less than the true age (it
    /// may only lose a refund, never give one to the wrong window): measured from before the
    /// reservation's store call was sent. 0 when `now_micros` is the reservation's own time.
    pub age_micros: u64,
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

/// What to do with a concurrency slot (see [`SlotRequest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotOp {
    /// Take a slot if fewer than `limit` are held (leases that ended do not count).
    Acquire {
        /// The most slots held at once.
        limit: u64,
    },
    /// Extend a held slot's lease to one lease from now.
    Renew,
    /// Give a slot back.
    Release,
}

/// One call on a key's concurrency slots (see
/// [`ConcurrencyLimiter`](crate::limiter::ConcurrencyLimiter)): `lua/slots.lua`.
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest<'a> {
    /// The slots' storage key (`<prefix>:{<id>}:<scope>#c`).
    pub key: &'a str,
    /// The operation.
    pub op: SlotOp,
    /// The slot's id, unique per holder (1 to 64 bytes).
    pub id: &'a str,
    /// How long a slot is held without a renewal: a dead holder's slot is free after it.
    pub lease: Duration,
    /// Client time in µs since the Unix epoch; `None` means the store's own clock.
    pub now_micros: Option<u64>,
}

/// What a slot call answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotReply {
    /// Acquire: a slot was taken; renew and release: the slot was held.
    pub ok: bool,
    /// Acquire: the slots left after this one.
    pub remaining: u64,
    /// Acquire when full: how long until the oldest lease ends (the longest a slot can stay
    /// taken).
    pub wait: Duration,
}

/// A slot operation's byte and limit (1 for the operations that take none).
pub(crate) fn slot_op(op: SlotOp) -> (u8, u64) {
    use crate::algorithm::{ACQUIRE, RELEASE, RENEW};
    match op {
        SlotOp::Acquire { limit } => (ACQUIRE, limit),
        SlotOp::Renew => (RENEW, 1),
        SlotOp::Release => (RELEASE, 1),
    }
}
