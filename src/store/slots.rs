//! The concurrency limit's store call: slots taken, renewed and given back.

use std::time::Duration;

/// What to do with concurrency slots (see [`SlotRequest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotOp {
    /// Take a slot if fewer than `limit` are held (leases that ended do not count).
    Acquire {
        /// The most slots held at once.
        limit: u64,
    },
    /// Extend the leases of held slots to one lease from now, and put back under its id any
    /// slot the store lost (data lost, or a lease that ran out while the store was
    /// unreachable): a slot renewed is a request still in flight, so it is counted again even
    /// when the key is now over its limit.
    Renew,
    /// Give slots back.
    Release,
}

/// One call on a key's concurrency slots (see
/// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter)): `lua/slots.lua`.
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest<'a> {
    /// The slots' storage key (`<prefix>:{<id>}:<scope>#c`).
    pub key: &'a str,
    /// The operation.
    pub op: SlotOp,
    /// The slots' ids, each unique per holder (1 to 64 bytes): exactly one to acquire, one or
    /// more to renew or release.
    pub ids: &'a [&'a str],
    /// How long a slot is held without a renewal: a dead holder's slot is free after it.
    pub lease: Duration,
    /// Client time in µs since the Unix epoch; `None` means the store's own clock.
    /// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) always sends `None`: the
    /// instances of a fleet must time one key's leases by one clock, or an instance whose
    /// clock runs ahead by more than a lease would evict the others' live slots.
    pub now_micros: Option<u64>,
}

/// What a slot call answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotReply {
    /// Acquire: a slot was taken; renew: none of the slots had been lost; release: at least
    /// one slot was held.
    pub ok: bool,
    /// Acquire: the slots left after this one.
    pub remaining: u64,
    /// Acquire when full: how long until the oldest lease ends (the longest a slot can stay
    /// taken).
    pub wait: Duration,
    /// Renew: the slots the store had lost and that were put back.
    pub restored: u64,
}

impl SlotReply {
    /// The reply of `op` from the script's (or its mirror's) `{ok, n, wait}`.
    pub(crate) fn of(op: SlotOp, ok: bool, n: u64, wait: Duration) -> Self {
        let (remaining, restored) = match op {
            SlotOp::Acquire { .. } => (n, 0),
            SlotOp::Renew => (0, n),
            SlotOp::Release => (0, 0),
        };
        SlotReply {
            ok,
            remaining,
            wait,
            restored,
        }
    }
}
