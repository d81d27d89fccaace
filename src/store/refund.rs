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
    /// Client time in µs since the Unix epoch; `None` means the store's own clock.
    pub now_micros: Option<u64>,
    /// How long ago the units were reserved, in µs: the reservation was made at
    /// `now - age_micros`, and the units go back only to the window that holds that time, and
    /// not at all when it is before a reset of the tenant. Never less than the true age when
    /// it is sent (it may only lose a refund, never give one to the wrong window): measured
    /// from before the reservation's store call was sent. With the store's clock, a refund the
    /// store runs late counts its `now` from when it runs: see the [modes
    /// guide](crate::guide::modes). 0 when `now_micros` is the reservation's own time.
    pub age_micros: u64,
}
