//! The [`Store`] trait, and what its calls take and answer: the contract between the limiter
//! and a store (re-exported by [`store`](crate::store)).

use std::time::Duration;

use futures::future::BoxFuture;

use super::block::Block;
use super::failure::RedisFailure;
use super::refund::RefundRequest;
use super::slots::{SlotReply, SlotRequest};
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
/// Decisions are typed: a store takes a [`CheckRequest`] (key, algorithm, quotas, cost, time)
/// and answers a [`Decision`], so any store can decide (a test double, a store that denies
/// everything, a router over several stores). The fleet controls are not: they are sealed to
/// [`RedisStore`](super::RedisStore) and [`MemoryStore`](super::MemoryStore), because their
/// state is the scripts' byte layout (every tier's state, the overrides, the tenant's reset),
/// which must match `lua/common.lua` byte for byte to mean anything and is no public
/// contract. [`ControlReply`] has no public
/// constructor, so a custom store keeps the default [`control`](Store::control) (the controls
/// are refused) or forwards to a store it wraps. `MemoryStore` is the reference for what a
/// decision must answer.
///
/// A custom store usually wraps one of them, e.g. to count or route calls. A wrapper forwards
/// [`check_timed`](Store::check_timed) too (the default tells no time, so refunds of what it
/// admits are dated by age: see there), and [`refund`](Store::refund) when it settles:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use futures::future::BoxFuture;
/// use redlimit::store::{Block, CheckRequest, MemoryStore, RefundRequest, Store, StoreError};
/// use redlimit::{Decision, Limiter, Quota};
///
/// /// Counts the checks that reach the store, and lets a `MemoryStore` decide.
/// #[derive(Debug, Default)]
/// struct Counted {
///     inner: MemoryStore,
///     checks: Arc<AtomicU64>,
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
///     fn check_timed<'a>(
///         &'a self,
///         request: CheckRequest<'a>,
///         block: Option<Block>,
///     ) -> BoxFuture<'a, Result<(Decision, Option<u64>), StoreError>> {
///         self.checks.fetch_add(1, Ordering::Relaxed);
///         self.inner.check_timed(request, block)
///     }
///
///     fn refund<'a>(&'a self, request: RefundRequest<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
///         self.inner.refund(request)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = Counted::default();
/// let checks = store.checks.clone();
/// let limiter = Limiter::new(store);
/// let quota = Quota::per_minute(1).unwrap();
/// assert!(limiter.check("k", &quota).await.is_allowed());
/// assert!(!limiter.check("k", &quota).await.is_allowed());
/// assert_eq!(checks.load(Ordering::Relaxed), 2);
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

    /// Decides like [`check`](Self::check), or with a `block` like
    /// [`check_blocking`](Self::check_blocking), and with the store's own clock (`now_micros`
    /// `None`) tells, on an admission, the µs on that clock at which it decided: the time a
    /// refund of the units it reserved sends ([`ReservedAt::Store`]), exact however late the
    /// refund runs. `None` otherwise; the default always answers `None` (a refund then sends
    /// the reservation's age, [`ReservedAt::Ago`], which the store counts back from when it
    /// runs the refund: one it runs late may land in a later window or after a reset). A store
    /// that wraps another forwards this too.
    ///
    /// [`ReservedAt::Store`]: super::ReservedAt::Store
    /// [`ReservedAt::Ago`]: super::ReservedAt::Ago
    fn check_timed<'a>(
        &'a self,
        request: CheckRequest<'a>,
        block: Option<Block>,
    ) -> BoxFuture<'a, Result<(Decision, Option<u64>), StoreError>> {
        Box::pin(async move {
            let decision = match block {
                Some(block) => self.check_blocking(request, block).await?,
                None => self.check(request).await?,
            };
            Ok((decision, None))
        })
    }

    /// Runs a fleet control on one key (an override of its quotas, a suspension, a reset, or a
    /// look), atomically like a decision. [`RedisStore`](super::RedisStore) and
    /// [`MemoryStore`](super::MemoryStore) implement it; the default answers
    /// [`StoreError::Unsupported`], so a wrapper that does not forward it refuses the controls
    /// instead of ignoring them.
    fn control<'a>(
        &'a self,
        request: ControlRequest<'a>,
    ) -> BoxFuture<'a, Result<ControlReply, StoreError>> {
        let _ = request;
        unsupported("this store has no fleet controls")
    }

    /// Decides like [`check`](Self::check), and when a quota denies (not a suspension), suspends
    /// the key's tenant for the `block` in the same atomic call (`lua/block.lua`). The default
    /// runs `check` then extends the tenant's suspension with [`control`](Self::control): two
    /// calls, and no doubling.
    fn check_blocking<'a>(
        &'a self,
        request: CheckRequest<'a>,
        block: Block,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            let mut decision = self.check(request).await?;
            if !decision.allowed && !decision.suspended {
                let tenant = crate::store::wire::layout::tenant_key(request.key);
                self.control(ControlRequest {
                    key: &tenant,
                    algorithm: request.algorithm,
                    control: Control::Extend(block.duration),
                    now_micros: request.now_micros,
                })
                .await?;
                decision.retry_after = decision.retry_after.max(block.duration);
            }
            Ok(decision)
        })
    }

    /// Gives units back to a route's tiers in one atomic call, never above a tier's capacity,
    /// and only to the window (and reset epoch) of their reservation
    /// ([`RefundRequest::reserved`]); answers how many tiers (for the sliding log, entries)
    /// got units back. The default
    /// answers [`StoreError::Unsupported`].
    fn refund<'a>(&'a self, request: RefundRequest<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
        let _ = request;
        unsupported("this store has no refunds")
    }

    /// The longest one call takes before it fails with [`StoreError::Timeout`], when the store
    /// bounds its calls; `None` (the default) when it does not say. A request waiting for
    /// another request's lease renewal waits no longer than this before the failure policy
    /// answers it.
    fn call_timeout(&self) -> Option<Duration> {
        None
    }

    /// Takes, renews or gives back a fleet-wide concurrency slot, atomically
    /// (`lua/slots.lua`). The default answers [`StoreError::Unsupported`].
    fn slots<'a>(
        &'a self,
        request: SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<SlotReply, StoreError>> {
        let _ = request;
        unsupported("this store has no concurrency slots")
    }
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

impl<'a> Control<'a> {
    /// The operation the scripts (and their mirror) run: durations in whole µs, at least 1.
    pub(crate) fn op(self) -> crate::store::wire::layout::Op<'a> {
        use crate::store::wire::layout::Op;
        match self {
            Control::SetQuota(quotas) => Op::SetQuota(quotas.as_slice()),
            Control::ClearQuota => Op::ClearQuota,
            Control::Suspend(duration) => Op::Suspend(micros(duration)),
            Control::Extend(duration) => Op::Extend(micros(duration)),
            Control::Resume => Op::Resume,
            Control::Reset => Op::Reset,
            Control::Inspect => Op::Inspect,
            Control::Learn(quotas, duration) => Op::Learn(quotas.as_slice(), micros(duration)),
            Control::Unlearn => Op::Unlearn,
        }
    }
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
/// [`MemoryStore`](super::MemoryStore) make one. A custom store forwards its inner store's (see
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

/// The answer of a [`Store`] method's default: [`StoreError::Unsupported`] saying `what` the
/// store lacks.
fn unsupported<'a, T: Send + 'a>(what: &'static str) -> BoxFuture<'a, Result<T, StoreError>> {
    Box::pin(std::future::ready(Err(StoreError::Unsupported(what))))
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
