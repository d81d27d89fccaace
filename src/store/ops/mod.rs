//! The crate's operations besides a plain decision, one file each: what each sends to Redis
//! (its [`ScriptOp`](super::op::ScriptOp): script, keys, arguments, reply), its Rust mirror, which the memory store
//! runs, and how a [`Store`] runs it ([`StoreOp`]). The batch's operation is the batcher's own,
//! in `redis/batch.rs`; a plain decision's is the stores' own (`wire/decide.rs`, `Store::check`).
//!
//! How an operation reaches a store: [`StoreExt`] (or the crate, through [`run`]) wraps it with
//! a place for its reply into an opaque [`Operation`] and hands it to [`Store::run`]. A custom
//! store forwards it to the store it wraps; the crate's two stores hand themselves to it, and it
//! runs on the one it knows ([`StoreOp::on_redis`], [`StoreOp::in_memory`]). The stores list no
//! operation, and a new operation changes no store.

use std::any::Any;
use std::future::Future;

use futures::future::BoxFuture;

use super::block::Block;
use super::contract::{
    CheckRequest, Control, ControlReply, ControlRequest, Operation, OperationRequest, Pending,
    Store, StoreError,
};
use super::memory::MemoryStore;
use super::redis::RedisStore;
use super::refund::RefundRequest;
use super::slots::{SlotReply, SlotRequest};
use crate::decision::Decision;

pub(crate) mod block;
pub(crate) mod control;
pub(crate) mod refund;
pub(crate) mod slots;
pub(crate) mod timed;

use self::block::BlockOp;
use self::control::ControlOp;
use self::refund::RefundOp;
use self::slots::SlotsOp;
use self::timed::TimedOp;

/// An operation as the crate's stores run it.
pub(crate) trait StoreOp: Send + Sync {
    /// What its reply reads as.
    type Output: Send;

    /// What it asks, for a store that wraps another.
    fn request(&self) -> OperationRequest<'_>;

    /// What a store that cannot run it lacks, for [`StoreError::Unsupported`].
    const LACKING: &'static str;

    /// Runs it on Redis.
    fn on_redis<'s>(
        &'s self,
        store: &'s RedisStore,
    ) -> impl Future<Output = Result<Self::Output, StoreError>> + Send + 's;

    /// Runs its mirror in memory.
    fn in_memory(&self, store: &MemoryStore) -> Result<Self::Output, StoreError>;
}

/// An operation and, once run, its reply.
struct Waiting<O: StoreOp> {
    op: O,
    reply: Option<O::Output>,
}

impl<O: StoreOp> Pending for Waiting<O> {
    fn request(&self) -> OperationRequest<'_> {
        self.op.request()
    }

    fn run_on<'s>(
        &'s mut self,
        store: &'s (dyn Any + Send + Sync),
    ) -> BoxFuture<'s, Result<(), StoreError>> {
        if let Some(memory) = store.downcast_ref::<MemoryStore>() {
            let result = self.op.in_memory(memory).map(|reply| {
                self.reply = Some(reply);
            });
            return Box::pin(std::future::ready(result));
        }
        match store.downcast_ref::<RedisStore>() {
            Some(redis) => Box::pin(async move {
                self.reply = Some(self.op.on_redis(redis).await?);
                Ok(())
            }),
            None => Box::pin(std::future::ready(Err(StoreError::Unsupported(O::LACKING)))),
        }
    }
}

/// Runs `op` on `store` (through [`Store::run`], which a custom store forwards), and reads its
/// reply. A store that does not run it answers [`StoreError::Unsupported`], saying what it lacks.
pub(crate) async fn run<S, O>(store: &S, op: O) -> Result<O::Output, StoreError>
where
    S: Store + ?Sized,
    O: StoreOp,
{
    let mut waiting = Waiting { op, reply: None };
    match store.run(Operation::new(&mut waiting)).await {
        Ok(()) => waiting.reply.ok_or(StoreError::Unsupported(O::LACKING)),
        Err(StoreError::Unsupported(_)) => Err(StoreError::Unsupported(O::LACKING)),
        Err(error) => Err(error),
    }
}

/// The crate's operations on any [`Store`], run through [`Store::run`]: the fleet controls, the
/// refunds, blocking decisions, decisions that tell their time, the concurrency slots.
///
/// The [`Limiter`](crate::Limiter) runs them for you; calling them on a store directly is for
/// tests and tools. On a store that does not run operations (its [`run`](Store::run) is the
/// default), each answers [`StoreError::Unsupported`], but for the two decisions, which fall
/// back to [`check`](Store::check) as their docs say.
///
/// ```
/// use std::time::Duration;
/// use redlimit::store::{Control, ControlRequest, MemoryStore, StoreExt};
/// use redlimit::Algorithm;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let request = ControlRequest {
///     key: "redlimit:{k}",
///     algorithm: Algorithm::TokenBucket,
///     control: Control::Suspend(Duration::from_secs(2)),
///     now_micros: Some(1_000_000),
/// };
/// let reply = store.control(request).await.unwrap();
/// assert_eq!(reply.expires_in(), Some(Duration::from_secs(2)));
/// # }
/// ```
pub trait StoreExt: Store {
    /// Runs a fleet control on one key (an override of its quotas, a suspension, a reset, or a
    /// look), atomically like a decision.
    fn control<'a>(
        &'a self,
        request: ControlRequest<'a>,
    ) -> impl Future<Output = Result<ControlReply, StoreError>> + Send + 'a {
        run(self, ControlOp(request))
    }

    /// Gives units back to a route's tiers in one atomic call, never above a tier's capacity,
    /// and only to the window (and reset epoch) of their reservation
    /// ([`RefundRequest::reserved`]); answers how many tiers (for the sliding log, entries)
    /// got units back.
    fn refund<'a>(
        &'a self,
        request: RefundRequest<'a>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'a {
        run(self, RefundOp(request))
    }

    /// Takes, renews or gives back a fleet-wide concurrency slot, atomically
    /// (`lua/slots.lua`).
    fn slots<'a>(
        &'a self,
        request: SlotRequest<'a>,
    ) -> impl Future<Output = Result<SlotReply, StoreError>> + Send + 'a {
        run(self, SlotsOp(request))
    }

    /// Decides like [`check`](Store::check), and when a quota denies (not a suspension),
    /// suspends the key's tenant for the `block` in the same atomic call (`lua/block.lua`); the
    /// denial's `retry_after` is the longer of the block's time left and the quota's own wait.
    /// On a store that does not run blocking decisions: a block that doubles is refused
    /// ([`StoreError::Unsupported`], before anything is decided: doubling needs the store's
    /// count of offences); one that does not is `check`, then the tenant's suspension extended
    /// with [`control`](Self::control), two calls (a store that refuses the control too
    /// answers its refusal).
    fn check_blocking<'a>(
        &'a self,
        request: CheckRequest<'a>,
        block: Block,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        async move { Ok(decide(self, request, Some(block), false).await?.0) }
    }

    /// Decides like [`check`](Store::check), or with a `block` like
    /// [`check_blocking`](Self::check_blocking), and with the store's own clock (`now_micros`
    /// `None`) tells, on an admission, the µs on that clock at which it decided: the time a
    /// refund of the units it reserved sends ([`ReservedAt::Store`]), exact however late the
    /// refund runs. `None` otherwise, and always on a store that does not run operations (a
    /// refund then sends the reservation's age, [`ReservedAt::Ago`], which the store counts
    /// back from when it runs the refund: one it runs late may land in a later window or after
    /// a reset).
    ///
    /// [`ReservedAt::Store`]: super::ReservedAt::Store
    /// [`ReservedAt::Ago`]: super::ReservedAt::Ago
    fn check_timed<'a>(
        &'a self,
        request: CheckRequest<'a>,
        block: Option<Block>,
    ) -> impl Future<Output = Result<(Decision, Option<u64>), StoreError>> + Send + 'a {
        decide(self, request, block, request.now_micros.is_none())
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// A decision that blocks on a denial, or tells its time (`timed`), or both; on a store that runs
/// no operation, [`check_then_block`].
async fn decide<S: Store + ?Sized>(
    store: &S,
    request: CheckRequest<'_>,
    block: Option<Block>,
    timed: bool,
) -> Result<(Decision, Option<u64>), StoreError> {
    let result = match block {
        Some(block) => {
            let op = BlockOp {
                request,
                block,
                timed,
            };
            run(store, op).await
        }
        None if timed => run(store, TimedOp(request)).await,
        None => return Ok((store.check(request).await?, None)),
    };
    match result {
        // A doubling block needs the store's count of offences: refused, never weakened.
        Err(StoreError::Unsupported(_)) if block.is_some_and(|b| b.max > b.duration) => {
            Err(StoreError::Unsupported(
                "this store cannot double a block: it runs no blocking decisions",
            ))
        }
        Err(StoreError::Unsupported(_)) => {
            Ok((check_then_block(store, request, block).await?, None))
        }
        result => result,
    }
}

/// A decision, then its `block` as a control of its own: what a store that runs no operation
/// can be asked (two calls, and no doubling).
async fn check_then_block<S: Store + ?Sized>(
    store: &S,
    request: CheckRequest<'_>,
    block: Option<Block>,
) -> Result<Decision, StoreError> {
    let mut decision = store.check(request).await?;
    if let Some(block) = block.filter(|_| !decision.allowed && !decision.suspended) {
        let tenant = crate::store::wire::layout::tenant_key(request.key);
        let control = ControlRequest {
            key: &tenant,
            algorithm: request.algorithm,
            control: Control::Extend(block.duration),
            now_micros: request.now_micros,
        };
        run(store, ControlOp(control)).await?;
        decision.retry_after = decision.retry_after.max(block.duration);
    }
    Ok(decision)
}
