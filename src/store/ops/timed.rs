//! A decision that tells, on an admission, when the store decided: the time a refund of what it
//! reserved sends (settlement and leases, [`ReservedAt::Store`](crate::store::ReservedAt)). Its
//! wire is a decision's (`wire/decide.rs`, with `now_us` -2).

use super::StoreOp;
use crate::clock::system_now_micros;
use crate::decision::Decision;
use crate::store::contract::OperationRequest;
use crate::store::contract::{CheckRequest, StoreError};
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;

/// A decision on the store's clock that tells when it admitted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimedOp<'a>(pub(crate) CheckRequest<'a>);

impl StoreOp for TimedOp<'_> {
    type Output = (Decision, Option<u64>);

    fn request(&self) -> OperationRequest<'_> {
        OperationRequest::Timed(self.0)
    }

    const LACKING: &'static str = "this store tells no time of its decisions";

    /// The script's own `TIME` when it admits, batched like any decision.
    fn on_redis<'s>(
        &'s self,
        store: &'s RedisStore,
    ) -> impl std::future::Future<Output = Result<Self::Output, StoreError>> + Send + 's {
        store.decide(self.0, true)
    }

    /// The system clock's µs it decided at, read once and decided with.
    fn in_memory(&self, store: &MemoryStore) -> Result<Self::Output, StoreError> {
        decide_in_memory(self.0, |request| store.try_check(request))
    }
}

/// A memory store's decision on the system clock (unless the request brings its own), read
/// once: `decide` runs with it, and an admission tells it.
pub(crate) fn decide_in_memory(
    request: CheckRequest<'_>,
    decide: impl FnOnce(CheckRequest<'_>) -> Result<Decision, StoreError>,
) -> Result<(Decision, Option<u64>), StoreError> {
    let (now, asked) = match request.now_micros {
        Some(now) => (now, false),
        None => (system_now_micros(), true),
    };
    let decision = decide(CheckRequest {
        now_micros: Some(now),
        ..request
    })?;
    let at = (asked && decision.allowed).then_some(now);
    Ok((decision, at))
}
