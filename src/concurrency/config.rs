//! What every clone of a [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer)'s service
//! shares.

use http::HeaderValue;

use super::ConcurrencyLimiter;

/// The slots, the key extractor and the policy's name and `RateLimit-Policy` header.
pub(super) struct Shared<K> {
    pub(super) slots: ConcurrencyLimiter,
    pub(super) extractor: K,
    pub(super) name: String,
    pub(super) policy: HeaderValue,
}
