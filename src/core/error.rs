//! [`ControlError`]: why an operation on one key (a control, a refund, a blocking check) was
//! refused or failed, and [`MAX_SUSPENSION`], the longest suspension any of them sets;
//! [`LeaseError`], a lease configuration the builder refuses (a [`ConfigError`](super::ConfigError)'s).

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::quota::QuotaError;
use crate::store::StoreError;

/// The longest suspension [`Limiter::suspend`](crate::Limiter::suspend) accepts: 30 days.
pub const MAX_SUSPENSION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Why a control was refused or failed. Nothing was changed by a refused control.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{limiter::ControlError, store::MemoryStore, Limiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let limiter = Limiter::new(MemoryStore::new());
/// let zero = limiter.suspend("k", Duration::ZERO).await;
/// assert!(matches!(zero, Err(ControlError::InvalidDuration)));
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// A quota the limiter's algorithm cannot serve.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// A suspension of zero, or longer than [`MAX_SUSPENSION`].
    #[error("a suspension must last from 1 µs to 30 days")]
    InvalidDuration,
    /// The key holds another algorithm's state (or another Redis type) than the limiter's:
    /// the control was aimed at the wrong key or with the wrong algorithm. Nothing changed.
    #[error("{0}; give the algorithm of the limiters that use this key")]
    WrongKind(String),
    /// The store failed (or has no controls).
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for ControlError {
    fn from(error: StoreError) -> Self {
        // The scripts (and the memory store) refuse a control on another algorithm's key by
        // an error that starts so; anything else is the store's.
        const REFUSED: &str = "redlimit: refused: ";
        let text = error.to_string();
        match text.find(REFUSED) {
            Some(at) if matches!(error, StoreError::Redis(_) | StoreError::BadReply(_)) => {
                let what = &text[at + REFUSED.len()..];
                let what = what.split("; nothing changed").next().unwrap_or(what);
                ControlError::WrongKind(what.to_owned())
            }
            _ => ControlError::Store(error),
        }
    }
}

/// A lease configuration the builder refuses (inside
/// [`ConfigError::Lease`](crate::limiter::ConfigError::Lease)).
///
/// ```
/// use std::time::Duration;
/// use redlimit::limiter::{ConfigError, LeaseError, Leases};
/// use redlimit::{store::MemoryStore, Algorithm, Limiter};
///
/// let zero = Limiter::builder(MemoryStore::new()).leases(Leases::new(Duration::ZERO)).build();
/// assert_eq!(zero.err(), Some(ConfigError::Lease(LeaseError::ZeroInterval)));
///
/// let log = Limiter::builder(MemoryStore::new())
///     .algorithm(Algorithm::SlidingLog)
///     .leases(Leases::default())
///     .build()
///     .unwrap_err();
/// assert_eq!(log, ConfigError::Lease(LeaseError::Unsupported(Algorithm::SlidingLog)));
/// assert!(log.to_string().contains("token-bucket, gcra or fixed-window"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The lease interval is zero.
    #[error("the lease interval must be above zero (50 ms is a good start)")]
    ZeroInterval,
    /// The lease interval is above [`MAX_LEASE_INTERVAL`](crate::limiter::MAX_LEASE_INTERVAL).
    #[error("the lease interval must be at most 10 s: controls reach a leasing instance only within one interval")]
    IntervalTooLong,
    /// `max_units` is zero.
    #[error("a lease must be allowed at least 1 unit (max_units)")]
    ZeroMaxUnits,
    /// `max_keys` is below 16.
    #[error("leases need room for at least 16 keys (max_keys)")]
    TooFewKeys,
    /// `idle_after` is shorter than the lease interval.
    #[error("a lease's idle time must be at least its interval")]
    IdleShorterThanInterval,
    /// The algorithm cannot lease exactly.
    #[error("{0} cannot lease exactly; leases need token-bucket, gcra or fixed-window")]
    Unsupported(Algorithm),
}
