//! Settlement's store call: units given back to the window they were reserved from.

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
    /// When the units were reserved: they go back only to the window that holds that time, and
    /// not at all when it is before a reset of the tenant.
    pub reserved: ReservedAt,
}

/// When a refund's units were reserved, and on which clock. Never later than the truth: an
/// earlier time may only lose a refund, never give one to the wrong window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservedAt {
    /// On the caller's client clock, in µs since the Unix epoch.
    Client(u64),
    /// On the store's own clock, in µs since the Unix epoch: the time the store told for the
    /// admission that reserved them ([`StoreExt::check_timed`](super::StoreExt::check_timed)).
    Store(u64),
    /// On the store's own clock, this many µs before the store runs the refund: measured from
    /// before the reservation's store call was sent, so never less than the true age when the
    /// refund is sent; a refund the store runs late (queued behind a busy or stalled server)
    /// counts its age from then, later than the truth by that delay (see the [modes
    /// guide](crate::guide::modes)).
    Ago(u64),
}
