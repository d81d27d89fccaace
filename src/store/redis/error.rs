//! [`BuildError`]: why a [`RedisStore`](super::RedisStore) could not be built.

/// The error redis-rs gave, kept as the source without putting redis-rs's types in this
/// crate's API.
type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a Redis store could not be built. Building never connects, so each one is a setting to
/// fix; the error redis-rs gave, if any, is the [`source`](std::error::Error::source).
///
/// ```
/// use std::time::Duration;
/// use redlimit::store::{BuildError, RedisStore};
///
/// let error = RedisStore::new("not a url").unwrap_err();
/// assert!(matches!(error, BuildError::InvalidUrl(_)));
/// assert!(std::error::Error::source(&error).is_some());
///
/// let error = RedisStore::builder("redis://127.0.0.1:6379")
///     .timeout(Duration::ZERO)
///     .build()
///     .unwrap_err();
/// assert!(matches!(error, BuildError::ZeroTimeout));
/// assert!(error.to_string().contains("leave the default"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A URL that does not parse.
    #[error(
        "invalid Redis URL ({0}); write redis://[user:password@]host[:port][/db] \
         (rediss:// for TLS)"
    )]
    InvalidUrl(#[source] Source),
    /// A zero store timeout: every call would time out and go to the failure policy.
    #[error(
        "the store timeout must be above zero: with a zero timeout every call times out and goes \
         to the failure policy; leave the default (100 ms) or give the longest a decision may wait"
    )]
    ZeroTimeout,
    /// A batch of zero decisions ([`RedisStoreBuilder::max_batch`](super::RedisStoreBuilder::max_batch)):
    /// no call could carry one.
    #[error(
        "max_batch must be at least 1: 1 sends every decision alone; leave the default \
         (64) to batch decisions that queue behind a call in flight"
    )]
    ZeroBatch,
    /// A batch larger than [`MAX_BATCH`](super::batch::MAX_BATCH), the most one script call can
    /// always carry (Lua's stack bounds what a script may unpack).
    #[error(
        "max_batch must be at most {max}, the most decisions one script call can carry (it was          {0}); larger batches save Redis nothing more and wait longer for their call",
        max = super::batch::MAX_BATCH
    )]
    BatchTooLarge(usize),
    /// Settings that do not fit together, e.g. TLS certificates for a URL without TLS, or
    /// sentinels with different credentials; the message says which, and what to change.
    #[error("invalid Redis store settings: {0}")]
    InvalidSettings(#[source] Source),
}
