//! Where decisions are made: the [`Store`] trait, [`RedisStore`] and [`MemoryStore`].

use std::time::Duration;

use futures::future::BoxFuture;

use crate::{Algorithm, Decision, Quota};

mod breaker;
mod memory;
mod redis;

pub use self::breaker::CircuitBreaker;
pub use self::memory::{MemoryStore, DEFAULT_MAX_KEYS};
pub use self::redis::{RedisStore, RedisStoreBuilder, DEFAULT_TIMEOUT};

/// One decision to make: which key, under which algorithm and quota, at what cost.
#[derive(Debug, Clone, Copy)]
pub struct CheckRequest<'a> {
    /// The storage key: already bounded and hash-tagged by the [`Limiter`](crate::Limiter),
    /// e.g. `redlimit:{tenant-42}`.
    pub key: &'a str,
    /// The algorithm that decides.
    pub algorithm: Algorithm,
    /// The quota to apply.
    pub quota: &'a Quota,
    /// What this request costs (0 peeks without consuming).
    pub cost: u64,
    /// Client time in microseconds since the Unix epoch; `None` means the store's own clock
    /// (Redis `TIME`, or the system clock for the memory store).
    pub now_micros: Option<u64>,
}

/// A backend that makes decisions atomically.
///
/// Implemented by [`RedisStore`] (one Lua script per decision) and [`MemoryStore`] (the same
/// algorithms in process). The future is boxed so a limiter can hold any store behind `dyn`.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Decides one request and records its cost when admitted.
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;
}

/// Why a store could not decide. The [`FailurePolicy`](crate::FailurePolicy) turns it into an
/// outcome.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within its timeout.
    #[error("store timed out after {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error or the connection failed.
    #[error("redis error: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// The store answered something the crate does not understand.
    #[error("unexpected reply from the store: {0}")]
    BadReply(String),
    /// The limiter's algorithm cannot serve this quota (e.g. a sliding log with a huge burst).
    #[error("invalid quota for this algorithm: {0}")]
    InvalidQuota(#[from] crate::QuotaError),
    /// The store is skipped for now (the circuit breaker is open after repeated failures).
    #[error("store unavailable: {0}")]
    Unavailable(&'static str),
}
