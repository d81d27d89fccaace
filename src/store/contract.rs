//! The [`Store`] trait, and what its calls take and answer: the contract between the limiter
//! and a store (re-exported by [`store`](crate::store)).

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::answers::Receiver;
use super::block::Block;
use super::failure::RedisFailure;
use super::refund::RefundRequest;
use super::slots::SlotRequest;
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::quota::Quotas;

/// One decision to make: which key, under which algorithm and quota, at what cost.
///
/// The [`Limiter`](crate::Limiter) builds one per check; calling a store directly is for tests
/// and custom stores.
///
/// ```
/// use redlimit::store::{CheckRequest, MemoryStore};
/// use redlimit::{Algorithm, Quota};
///
/// let store = MemoryStore::new();
/// let quota = Quota::per_second(2).unwrap();
/// let request = CheckRequest {
///     key: "redlimit:{tenant-42}",
///     algorithm: Algorithm::Gcra,
///     quotas: &quota.into(),
///     cost: 2,
///     now_micros: Some(1_000_000), // a fixed client time: deterministic
/// };
/// assert!(store.check_now(request).allowed);
/// let again = store.check_now(CheckRequest { cost: 1, ..request });
/// assert!(!again.allowed);
/// assert_eq!(again.retry_after.as_millis(), 500); // one request every 500 ms
/// ```
#[derive(Debug, Clone, Copy)]
pub struct CheckRequest<'a> {
    /// The storage key: already bounded and hash-tagged by the [`Limiter`](crate::Limiter),
    /// e.g. `redlimit:{tenant-42}`.
    pub key: &'a str,
    /// The algorithm that decides.
    pub algorithm: Algorithm,
    /// The quotas to apply, all or none (an override set with
    /// [`Limiter::set_quota`](crate::Limiter::set_quota) replaces them in the store).
    pub quotas: &'a Quotas,
    /// What this request costs (0 peeks without consuming).
    pub cost: u64,
    /// Client time in microseconds since the Unix epoch; `None` means the store's own clock
    /// (Redis `TIME`, or the system clock for the memory store).
    pub now_micros: Option<u64>,
}

/// A backend that makes decisions atomically.
///
/// Implemented by [`RedisStore`](super::RedisStore) (one Lua script per decision) and
/// [`MemoryStore`](super::MemoryStore) (the same algorithms in process). The future is boxed so
/// a limiter can hold any store behind `dyn`.
///
/// # Implementing a store
///
/// A store does two things:
///
/// - **It decides**: [`check`](Store::check) takes a [`CheckRequest`] (key, algorithm, quotas,
///   cost, time) and answers a [`Decision`]. Any store can decide: a test double, a store
///   that denies everything, a router over several stores. `MemoryStore` is the reference for
///   what a decision must answer.
/// - **It runs the crate's other operations** ([`run`](Store::run)): the fleet controls, the
///   refunds of settlement and leases, blocking decisions, decisions that tell their time, the
///   concurrency slots. An [`Operation`] is opaque: its state is the scripts' byte layout
///   (every tier's state, the overrides, the tenant's reset), which must match
///   `lua/common.lua` byte for byte to mean anything and is no public contract, so only
///   `RedisStore` and `MemoryStore` can run one. A custom store forwards it to a store it
///   wraps; the default refuses it with [`StoreError::Unsupported`] (the controls, refunds and
///   slots are then refused; a blocking decision and a decision that tells its time fall back
///   to [`check`](Store::check): see [`StoreExt`](super::StoreExt)).
///
/// [`StoreExt`](super::StoreExt) runs each operation on any store, e.g. `store.control(request)`.
///
/// A custom store usually wraps one of the crate's, e.g. to count or route calls, and forwards
/// `check`, `run` and [`call_timeout`](Store::call_timeout) (so that a request waiting for
/// another's lease renewal waits as long as the wrapped store's calls may take, not the 1 s
/// bound for a store that does not say). Forwarding [`decide_now`](Store::decide_now) and
/// [`queue`](Store::queue) too keeps what they save: a `MemoryStore`'s answer in place, a
/// batching `RedisStore`'s decision with no boxed future. Without them, decisions go through
/// `check`, with the same outcome:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use futures::future::BoxFuture;
/// use redlimit::store::{CheckRequest, MemoryStore, Operation, Store, StoreError};
/// use redlimit::{Decision, Limiter, Quota};
///
/// /// Counts the decisions and the operations that reach the store, and lets a `MemoryStore`
/// /// run them.
/// #[derive(Debug, Default)]
/// struct Counted {
///     inner: MemoryStore,
///     checks: Arc<AtomicU64>,
///     operations: Arc<AtomicU64>,
/// }
///
/// impl Store for Counted {
///     fn check<'a>(
///         &'a self,
///         request: CheckRequest<'a>,
///     ) -> BoxFuture<'a, Result<Decision, StoreError>> {
///         self.checks.fetch_add(1, Ordering::Relaxed);
///         self.inner.check(request)
///     }
///
///     fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
///         self.operations.fetch_add(1, Ordering::Relaxed);
///         self.inner.run(operation)
///     }
///
///     fn call_timeout(&self) -> Option<Duration> {
///         self.inner.call_timeout()
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = Counted::default();
/// let (checks, operations) = (store.checks.clone(), store.operations.clone());
/// let limiter = Limiter::new(store);
/// let quota = Quota::per_minute(1).unwrap();
/// assert!(limiter.check("k", &quota).await.is_allowed());
/// assert!(!limiter.check("k", &quota).await.is_allowed());
/// assert_eq!(checks.load(Ordering::Relaxed), 2);
/// // A fleet control runs through the wrapper too: the suspension of the key's tenant, and a
/// // look at its route for the status it answers.
/// limiter.suspend("k", Duration::from_secs(60)).await.unwrap();
/// assert_eq!(operations.load(Ordering::Relaxed), 2);
/// # }
/// ```
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Decides one request and records its cost when admitted.
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;

    /// The decision [`check`](Self::check) would give, when the store can make it at once, in
    /// this process, without waiting for anything; `None` (the default) when it cannot, and the
    /// request then goes through `check`. A store answering here records the request exactly
    /// as `check` would: it is asked first, and `check` is not called after a `Some`.
    /// [`MemoryStore`](super::MemoryStore) answers here, which spares each request of a layer
    /// on it a boxed future.
    fn decide_now(&self, request: CheckRequest<'_>) -> Option<Result<Decision, StoreError>> {
        let _ = request;
        None
    }

    /// Starts `request`'s decision when the store answers it without a boxed future: a
    /// [`RedisStore`](super::RedisStore) that batches queues it for its sender, whose answer
    /// comes through the returned [`QueuedDecision`]. `None` (the default): the request goes
    /// through [`check`](Self::check). Asked only where `check` would be next, so a store
    /// answering here records the request exactly as `check` would. Only the crate's stores
    /// make a `QueuedDecision`; a store that wraps one forwards this.
    fn queue(&self, request: CheckRequest<'_>) -> Option<QueuedDecision> {
        let _ = request;
        None
    }

    /// Runs one of the crate's operations (a fleet control, a refund, a blocking decision, a
    /// decision that tells its time, a concurrency slot), atomically like a decision, and
    /// leaves its reply in it. [`RedisStore`](super::RedisStore) and
    /// [`MemoryStore`](super::MemoryStore) run every operation; a store that wraps one forwards
    /// it. The default answers [`StoreError::Unsupported`], so a store that does not forward it
    /// refuses the controls instead of ignoring them.
    fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = operation;
        Box::pin(std::future::ready(Err(StoreError::Unsupported(
            "this store runs none of the crate's operations",
        ))))
    }

    /// The longest one call takes before it fails with [`StoreError::Timeout`], when the store
    /// bounds its calls; `None` (the default) when it does not say. A request waiting for
    /// another request's lease renewal waits no longer than this before the failure policy
    /// answers it: 1 s when the store does not say (as the crate's other waits for a store's
    /// work in flight: the outbound layer's, a control's). A store that wraps another forwards
    /// it, so that those waits follow the store that makes the calls.
    fn call_timeout(&self) -> Option<Duration> {
        None
    }
}

pin_project! {
    /// A decision a store has started (see [`Store::queue`]): queued for a call that the
    /// store's own sender makes, in a call of its own, or already answered. Opaque: only the
    /// crate's stores make one, and only the limiter waits for it.
    pub struct QueuedDecision {
        #[pin]
        state: Queued,
    }
}

/// A decision's result, with the store's time of an admission when it told.
pub(crate) type Decided = Result<(Decision, Option<u64>), StoreError>;

/// A queued decision's call of its own, which owns what it sends.
pub(crate) type AloneCall = BoxFuture<'static, Decided>;

/// What a queued decision hears from the call that carried it.
pub(crate) enum QueuedAnswer {
    /// Its reply, or the error of its part or of the whole call, and when it came.
    Reply(Result<redis::Value, StoreError>, std::time::Instant),
    /// The call was refused before any decision ran, in a way a decision alone may answer
    /// otherwise, or its sender was gone before sending it: it goes alone, by the call this
    /// makes (of the decision's request, within its deadline).
    Alone(Box<dyn FnOnce(CheckRequest<'_>, Instant) -> AloneCall + Send>),
}

pin_project! {
    #[project = QueuedProj]
    enum Queued {
        // Waiting for its sender's answer until `deadline`; its timer is made at the first
        // poll, inside the runtime.
        Waiting {
            answer: Receiver<QueuedAnswer>,
            deadline: Instant,
            timeout: Duration,
            read: fn(redis::Value, &CheckRequest<'_>) -> Decided,
            #[pin]
            timer: Option<Sleep>,
        },
        // In a call of its own.
        Alone { call: AloneCall },
        // Answered at once (a breaker open); taken by the first poll.
        Answered { result: Option<Decided> },
    }
}

/// What a queued decision hears when the call that carried it was dropped with its sender (the
/// store's runtime shut down): it may have run, so it is not sent again.
pub(crate) const SENDER_GONE: &str =
    "the store's runtime shut down with this decision's call in flight (it may have run)";

impl QueuedDecision {
    /// Queued for a sender's call: `answer` hears it, `read` reads its reply, and the whole
    /// wait ends at `deadline` (the store's `timeout` after it was queued).
    pub(crate) fn waiting(
        answer: Receiver<QueuedAnswer>,
        deadline: Instant,
        timeout: Duration,
        read: fn(redis::Value, &CheckRequest<'_>) -> Decided,
    ) -> Self {
        QueuedDecision {
            state: Queued::Waiting {
                answer,
                deadline,
                timeout,
                read,
                timer: None,
            },
        }
    }

    /// In a call of its own.
    pub(crate) fn alone(call: AloneCall) -> Self {
        QueuedDecision {
            state: Queued::Alone { call },
        }
    }

    /// Answered already.
    pub(crate) fn answered(result: Decided) -> Self {
        QueuedDecision {
            state: Queued::Answered {
                result: Some(result),
            },
        }
    }

    /// Polls for the decision of `request`, the one it was queued for, and how long before
    /// this poll it came (zero for a call of its own, read as it ends).
    pub(crate) fn poll_decided(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        request: CheckRequest<'_>,
    ) -> Poll<(Decided, Duration)> {
        let mut state = self.project().state;
        loop {
            let alone = match state.as_mut().project() {
                QueuedProj::Waiting {
                    answer,
                    deadline,
                    timeout,
                    read,
                    mut timer,
                } => {
                    if timer.is_none() {
                        timer.set(Some(tokio::time::sleep_until(*deadline)));
                    }
                    let heard = match Pin::new(answer).poll(cx) {
                        Poll::Ready(heard) => heard,
                        Poll::Pending => {
                            let timer = timer.as_pin_mut().expect("set above");
                            ready!(timer.poll(cx));
                            let timed_out = Err(StoreError::Timeout(*timeout));
                            return Poll::Ready((timed_out, Duration::ZERO));
                        }
                    };
                    match heard {
                        Ok(QueuedAnswer::Reply(reply, came)) => {
                            let result = reply.and_then(|reply| read(reply, &request));
                            return Poll::Ready((result, came.elapsed()));
                        }
                        Err(_) => {
                            let gone = Err(StoreError::Unavailable(SENDER_GONE));
                            return Poll::Ready((gone, Duration::ZERO));
                        }
                        Ok(QueuedAnswer::Alone(go)) => go(request, *deadline),
                    }
                }
                QueuedProj::Alone { call } => {
                    return call
                        .as_mut()
                        .poll(cx)
                        .map(|result| (result, Duration::ZERO))
                }
                QueuedProj::Answered { result } => {
                    let result = result
                        .take()
                        .expect("a queued decision polled after its answer");
                    return Poll::Ready((result, Duration::ZERO));
                }
            };
            state.set(Queued::Alone { call: alone });
        }
    }
}

impl std::fmt::Debug for QueuedDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            Queued::Waiting { .. } => "waiting",
            Queued::Alone { .. } => "alone",
            Queued::Answered { .. } => "answered",
        };
        f.debug_tuple("QueuedDecision").field(&state).finish()
    }
}

/// One of the crate's operations, for a [`Store`] to [`run`](Store::run): opaque, so that only
/// [`RedisStore`](super::RedisStore) and [`MemoryStore`](super::MemoryStore) run one (see
/// [`Store`]); [`StoreExt`](super::StoreExt) makes them.
pub struct Operation<'a> {
    pending: &'a mut (dyn Pending + 'a),
}

impl<'a> Operation<'a> {
    /// An operation waiting for its reply in `pending`.
    pub(crate) fn new(pending: &'a mut (dyn Pending + 'a)) -> Self {
        Operation { pending }
    }

    /// What it asks: which key, and what to do there, e.g. for a store that routes keys or
    /// counts calls by kind.
    pub fn request(&self) -> OperationRequest<'_> {
        self.pending.request()
    }

    /// Runs it on `store`, one of the crate's stores, which hands itself over.
    pub(crate) fn run_on(
        self,
        store: &'a (dyn Any + Send + Sync),
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.pending.run_on(store)
    }
}

impl std::fmt::Debug for Operation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Operation").field(&self.request()).finish()
    }
}

/// What an [`Operation`] asks (see [`Operation::request`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum OperationRequest<'a> {
    /// A fleet control ([`StoreExt::control`](super::StoreExt::control)).
    Control(ControlRequest<'a>),
    /// A refund ([`StoreExt::refund`](super::StoreExt::refund)).
    Refund(RefundRequest<'a>),
    /// A concurrency slot call ([`StoreExt::slots`](super::StoreExt::slots)).
    Slots(SlotRequest<'a>),
    /// A decision that blocks on a denial
    /// ([`StoreExt::check_blocking`](super::StoreExt::check_blocking)).
    Blocking(CheckRequest<'a>, Block),
    /// A decision that tells when the store admitted
    /// ([`StoreExt::check_timed`](super::StoreExt::check_timed)).
    Timed(CheckRequest<'a>),
}

impl OperationRequest<'_> {
    /// The storage key it runs on.
    pub fn key(&self) -> &str {
        match self {
            OperationRequest::Control(request) => request.key,
            OperationRequest::Refund(request) => request.key,
            OperationRequest::Slots(request) => request.key,
            OperationRequest::Blocking(request, _) | OperationRequest::Timed(request) => {
                request.key
            }
        }
    }
}

/// An operation and the place for its reply (see `ops/mod.rs`): it runs on the store handed to
/// it when it knows that store, and answers [`StoreError::Unsupported`] otherwise.
pub(crate) trait Pending: Send {
    /// What it asks.
    fn request(&self) -> OperationRequest<'_>;

    /// Runs on `store` and keeps the reply.
    fn run_on<'s>(
        &'s mut self,
        store: &'s (dyn Any + Send + Sync),
    ) -> BoxFuture<'s, Result<(), StoreError>>;
}

/// One fleet control to run: which storage key, under which algorithm (the sliding log keeps
/// its controls next to its log), what to do, and when.
///
/// The [`Limiter`](crate::Limiter)'s [`set_quota`](crate::Limiter::set_quota),
/// [`suspend`](crate::Limiter::suspend) and siblings build one; calling a store directly is for
/// tests and custom stores.
#[derive(Debug, Clone, Copy)]
pub struct ControlRequest<'a> {
    /// The storage key, as in [`CheckRequest::key`].
    pub key: &'a str,
    /// The limiter's algorithm.
    pub algorithm: Algorithm,
    /// What to do.
    pub control: Control<'a>,
    /// Client time in microseconds since the Unix epoch; `None` means the store's own clock.
    pub now_micros: Option<u64>,
}

/// A fleet control (see [`ControlRequest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Control<'a> {
    /// Replace the caller's quotas with these on every decision, until cleared.
    SetQuota(&'a Quotas),
    /// Remove the override.
    ClearQuota,
    /// Deny every decision for this long (at least 1 µs), on every route of the key's tenant.
    Suspend(Duration),
    /// Deny every decision for at least this long: a suspension that ends later stays as it is
    /// (it only ever extends).
    Extend(Duration),
    /// End a suspension.
    Resume,
    /// Forget the key's usage (its quotas start full); an override and a suspension stay.
    Reset,
    /// Change nothing; report.
    Inspect,
    /// Learning's override of a route, lasting this long: set as
    /// [`SetQuota`](Self::SetQuota) does and marked as learned, in the same atomic call,
    /// unless the route holds an operator's override (then nothing changes).
    /// [`SetQuota`](Self::SetQuota) and [`ClearQuota`](Self::ClearQuota) are an operator's:
    /// they remove the mark.
    Learn(&'a Quotas, Duration),
    /// Clears a route's override when it is learned (an operator's stays), and the mark.
    Unlearn,
}

/// Whole µs, at least 1.
pub(crate) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// What a store reports after a control, for the [`Limiter`](crate::Limiter) to read into a
/// [`KeyStatus`](crate::limiter::KeyStatus).
///
/// Opaque but for its typed accessors: it holds the key's string in the scripts' own layout,
/// which is no contract, so only [`RedisStore`](super::RedisStore) and
/// [`MemoryStore`](super::MemoryStore) make one. A custom store forwards the operation to its inner store (see
/// [`Store`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlReply {
    /// The key's string (for the sliding log, its controls' string), `None` when absent.
    pub(crate) stored: Option<Vec<u8>>,
    /// When that string expires, `None` when absent.
    pub(crate) expires_in: Option<Duration>,
    /// The store's time of the control, µs since the Unix epoch.
    pub(crate) now_micros: u64,
    /// The sliding log's entries (`None` for other algorithms).
    pub(crate) log_entries: Option<u64>,
    /// A route's learning record (its controls' string), when the control read it and it
    /// holds one.
    pub(crate) record: Option<Vec<u8>>,
}

impl ControlReply {
    /// When the key's string expires, `None` when absent.
    pub fn expires_in(&self) -> Option<Duration> {
        self.expires_in
    }

    /// The store's time of the control, µs since the Unix epoch.
    pub fn now_micros(&self) -> u64 {
        self.now_micros
    }

    /// The sliding log's entries (`None` for other algorithms).
    pub fn log_entries(&self) -> Option<u64> {
        self.log_entries
    }
}

/// Why a store could not decide. The [`FailurePolicy`](crate::failure_policy::FailurePolicy) turns it into an
/// outcome.
///
/// [`Limiter::try_check_quotas`](crate::Limiter::try_check_quotas) returns it as it is:
///
/// ```
/// use std::time::Duration;
/// use futures::future::BoxFuture;
/// use redlimit::store::{CheckRequest, Store, StoreError};
/// use redlimit::{Decision, Limiter, Quota};
///
/// /// A store whose every call times out, as a dead Redis would.
/// #[derive(Debug)]
/// struct Down;
///
/// impl Store for Down {
///     fn check<'a>(&'a self, _: CheckRequest<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
///         Box::pin(async { Err(StoreError::Timeout(Duration::from_millis(100))) })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let limiter = Limiter::new(Down);
/// let quota = Quota::per_second(1).unwrap();
/// let error = limiter.try_check_quotas("k", &quota.into(), 1).await.unwrap_err();
/// assert!(matches!(error, StoreError::Timeout(_)));
/// assert_eq!(error.to_string(), "store timed out after 100ms");
/// // `check` hands the same error to the failure policy, which fails open by default.
/// assert!(limiter.check("k", &quota).await.is_allowed());
/// # }
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within its timeout.
    #[error("store timed out after {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error or the connection failed.
    #[error("redis error: {0}")]
    Redis(#[source] RedisFailure),
    /// The store answered something the crate does not understand.
    #[error("unexpected reply from the store: {0}")]
    BadReply(String),
    /// The limiter's algorithm cannot serve this quota (e.g. a sliding log with a huge burst).
    #[error("invalid quota for this algorithm: {0}")]
    InvalidQuota(#[from] crate::quota::QuotaError),
    /// The store is skipped for now (the circuit breaker is open after repeated failures).
    #[error("store unavailable: {0}")]
    Unavailable(&'static str),
    /// The store cannot do this (e.g. a custom store without fleet controls).
    #[error("unsupported by the store: {0}")]
    Unsupported(&'static str),
}

impl StoreError {
    /// Wraps the Redis client's error; crate-internal so redis-rs's types stay out of the API.
    pub(crate) fn redis(error: ::redis::RedisError) -> Self {
        StoreError::Redis(RedisFailure::new(error))
    }

    /// Whether this is transport trouble, which says the store as a whole cannot decide now
    /// (so it counts toward the [`CircuitBreaker`]): a timeout, an I/O error or a refused or
    /// dropped connection, a server that cannot take the call (`BUSY`, `LOADING`,
    /// `MASTERDOWN`, `READONLY`, `TRYAGAIN`, `CLUSTERDOWN`, no connection to the slot's node),
    /// or a store skipped already.
    ///
    /// Anything else concerns one request and one key: a script's error reply, a permission
    /// refused for one key (`NOPERM`), a reply that cannot be parsed. It goes to the failure
    /// policy for that call alone; counting it toward the breaker would let one corrupt key
    /// fail every key open.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::store::StoreError;
    ///
    /// assert!(StoreError::Timeout(Duration::from_millis(100)).is_transport());
    /// assert!(!StoreError::BadReply("?".into()).is_transport());
    /// ```
    ///
    /// [`CircuitBreaker`]: super::CircuitBreaker
    pub fn is_transport(&self) -> bool {
        match self {
            StoreError::Timeout(_) | StoreError::Unavailable(_) => true,
            StoreError::Redis(failure) => failure.is_transport(),
            StoreError::BadReply(_) | StoreError::InvalidQuota(_) | StoreError::Unsupported(_) => {
                false
            }
        }
    }
}

/// At most one log line a second for store failures, process-wide, each saying how many were
/// left out before it: a poisoned key hammered, or an outage before the breaker opens, must
/// not flood the log. Every failure is still counted (`LimiterStats`, metrics).
pub(crate) fn failure_log_gate() -> Option<u64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::Instant;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    /// ms since `EPOCH` + 1 of the last line logged; 0 before the first.
    static LAST: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    const EVERY_MS: u64 = 1_000;
    let now = EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1;
    let last = LAST.load(Ordering::Relaxed);
    if (last == 0 || now >= last + EVERY_MS)
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        return Some(SUPPRESSED.swap(0, Ordering::Relaxed));
    }
    SUPPRESSED.fetch_add(1, Ordering::Relaxed);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::redis::{ErrorKind, RedisError, ServerErrorKind};

    fn server(kind: ServerErrorKind) -> StoreError {
        StoreError::redis(RedisError::from((
            ErrorKind::Server(kind),
            "from the server",
        )))
    }

    #[test]
    fn only_transport_trouble_is_transport() {
        let io = |kind| StoreError::redis(RedisError::from(std::io::Error::from(kind)));
        let transport = [
            StoreError::Timeout(Duration::from_millis(100)),
            StoreError::Unavailable("circuit breaker open"),
            io(std::io::ErrorKind::ConnectionRefused),
            io(std::io::ErrorKind::ConnectionReset),
            io(std::io::ErrorKind::TimedOut),
            server(ServerErrorKind::BusyLoading),
            server(ServerErrorKind::MasterDown),
            server(ServerErrorKind::ReadOnly),
            server(ServerErrorKind::TryAgain),
            server(ServerErrorKind::ClusterDown),
            StoreError::redis(::redis::make_extension_error(
                "BUSY".to_owned(),
                Some("Redis is busy running a script".to_owned()),
            )),
            StoreError::redis(RedisError::from((
                ErrorKind::ClusterConnectionNotFound,
                "no connection",
            ))),
        ];
        for error in &transport {
            assert!(error.is_transport(), "{error:?}");
        }
        let request = [
            server(ServerErrorKind::ResponseError), // a script's error_reply, a Lua error
            server(ServerErrorKind::NoPerm),
            server(ServerErrorKind::NoScript),
            server(ServerErrorKind::Ask),
            server(ServerErrorKind::Moved),
            StoreError::redis(::redis::make_extension_error("WRONGTYPE".to_owned(), None)),
            StoreError::redis(RedisError::from((ErrorKind::UnexpectedReturnType, "bad"))),
            StoreError::BadReply("Int(-1)".to_owned()),
            StoreError::Unsupported("no controls"),
        ];
        for error in &request {
            assert!(!error.is_transport(), "{error:?}");
        }
    }

    #[test]
    fn the_failure_log_gate_lets_one_line_a_second_through() {
        // Process-wide: other tests may have taken the current second's line already.
        let passed = (0..1_000).filter(|_| failure_log_gate().is_some()).count();
        assert!(passed <= 1, "{passed} lines in one burst");
    }
}
