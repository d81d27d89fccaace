//! Where decisions are made: the [`Store`] trait, [`RedisStore`] and [`MemoryStore`].
//!
//! A [`Limiter`](crate::Limiter) holds one store. [`RedisStore`] shares every limit across the
//! fleet; [`MemoryStore`] runs the same algorithms in this process and gives the same decisions,
//! for a single instance, for tests, and for the
//! [`LocalFallback`](crate::failure_policy::LocalFallback) policy.
//!
//! # Examples
//!
//! ```
//! use redlimit::store::{MemoryStore, RedisStore};
//! use redlimit::{Limiter, Quota};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // In production: one Redis for the whole fleet. Creating it does not connect yet.
//! let fleet = Limiter::new(RedisStore::new("redis://127.0.0.1:6379")?);
//!
//! // In tests (or on a single instance): the same decisions, in memory.
//! let local = Limiter::new(MemoryStore::new());
//! let quota = Quota::per_minute(2)?;
//! assert!(local.check("client-1", &quota).await.is_allowed());
//! assert!(local.check("client-1", &quota).await.is_allowed());
//! assert!(!local.check("client-1", &quota).await.is_allowed());
//! # Ok(())
//! # }
//! ```
//!
//! # Batching
//!
//! [`RedisStore`] sends several decisions in one script call when, and only when, they queue:
//!
//! - A decision that finds no call in flight on its connection (on Cluster: for its key's slot)
//!   goes out alone at once, as one `EVALSHA` of the decision script. A single caller, or a
//!   quiet service, never waits for a batch.
//! - Decisions that arrive while a call is in flight are queued, and the store's own sender (a
//!   task on the store's runtime, below) sends them: at once when none of its calls is in flight
//!   for the group, else when its call ends, up to [`RedisStoreBuilder::max_batch`] (64 by
//!   default, at most [`MAX_BATCH`]) in one `EVALSHA` of the batch script. A queue that fills up
//!   gets another call at once, and so does a queue of a quarter of `max_batch` behind a single
//!   call, so that two calls overlap under load.
//! - On Cluster only decisions whose keys share a slot share a call (the keys of one limiter key
//!   always do); Sentinel and a single node batch any decisions.
//!
//! Nothing else changes for a user: each decision is decided on its own, atomically, with all its
//! tiers or none, and gets its own reply and its own error (an ACL refusing one key fails that
//! decision alone), so the failure policy applies to it alone. The decisions of one call run in the
//! order they were queued; decisions in calls that overlap have no order between them, as
//! concurrent calls never had (one caller's decisions, one after another, keep theirs). A
//! decision's timeout counts from the moment it was queued. No queued decision waits for another
//! caller: not for its call, its task (parked, or busy with synchronous work), its poll, or its
//! runtime (idle, or shut down). A decision whose caller went away before its call was sent is
//! left out of it and consumes nothing.
//!
//! Under `maxmemory` with nothing to evict, each decision of a batch meets it as it would alone:
//! one that would write is refused with Redis's `OOM` error (and goes to the failure policy),
//! writing nothing; one that writes nothing (a denial, a peek) is decided. Redis checks memory
//! when a call starts: a call that starts below `maxmemory` may end above it by what its own
//! decisions write, as one decision alone may by its own write.
//!
//! # The store's runtime
//!
//! [`RedisStore`] runs the work that serves several callers on one Tokio runtime of its own
//! choosing, never a caller's: its connection (the connection attempts, and the driver task
//! redis-rs spawns for a connection), the one `SCRIPT LOAD` after `NOSCRIPT`, and the batch
//! sender. That runtime is the one current when the store was built, or, for a store built
//! outside any runtime, the one of its first call. It must keep running while the store is
//! used (a multi-thread runtime, or a current-thread one that is driven), as a redis-rs
//! connection must keep the runtime that made it. Calls from other runtimes are fine: another
//! runtime idling, blocking or shutting down touches no other caller's decision. If the store's
//! own runtime shuts down, the calls in flight on it fail (a decision that may have run is not
//! sent again), queued decisions not yet sent are sent by their callers alone, and the store
//! binds the runtime of its next call and reconnects there.
//!
//! Tokio cannot steal a task from a worker's LIFO slot (tokio-rs/tokio#4941): a task that
//! polls a store call once and then blocks its worker thread without yielding (a future polled
//! by hand, then seconds of synchronous work) can hold up the connection's driver, which it
//! woke into that slot, as with any redis-rs connection on that runtime. (The batch sender is
//! moved out of that slot when it is spawned, so such a task holds up no queued decision.) A
//! call that has ended leaves nothing of the store with its caller: no sender, call or lock
//! waits for that caller's task. The runtime is another matter: a task that blocks its worker
//! without yielding can stall that runtime's I/O driver and timers for every task on it (Tokio
//! hands the driver to an idle worker only with its unstable eager hand-off), the store's
//! connection included when the store runs there. Keep seconds of synchronous work off the
//! runtime (`tokio::task::spawn_blocking`), as Tokio asks of any async code.
//! The circuit breaker counts a failed call once, however many decisions it carried. What changes
//! is the cost: Redis pays a call's fixed part (the command, the script's lookup and start) once
//! per call instead of once per decision; see `benches/README.md` for the figures. Lease renewals
//! and settlement charges are decisions and batch like the others; blocking checks, refunds and
//! give-backs, concurrency slots, fleet controls and sliding-log decisions of more than one unit
//! (whose cost to Redis grows with their units: batched, several would make one long call that
//! holds every other client of Redis behind it) are always sent alone. `max_batch(1)` sends
//! every decision alone.

mod answers;
mod block;
mod breaker;
mod contract;
mod failure;
mod memory;
mod op;
pub(crate) mod ops;
mod redis;
mod refund;
pub(crate) mod slots;
pub(crate) mod wire;

pub use self::block::Block;
pub use self::breaker::CircuitBreaker;
pub(crate) use self::contract::failure_log_gate;
pub use self::contract::{
    CheckRequest, Control, ControlReply, ControlRequest, Operation, OperationRequest,
    QueuedDecision, Store, StoreError,
};
pub use self::failure::RedisFailure;
pub(crate) use self::failure::StoreFailureLog;
pub use self::memory::{MemoryStore, DEFAULT_MAX_KEYS, DEFAULT_MAX_LOG_ENTRIES};
pub use self::ops::StoreExt;
pub(crate) use self::redis::StoreRuntime;
pub use self::redis::{
    redacted_url, BuildError, RedisStore, RedisStoreBuilder, ServerInfo, DEFAULT_MAX_BATCH,
    DEFAULT_TIMEOUT, MAX_BATCH, MIN_REDIS_VERSION,
};
pub use self::refund::{RefundRequest, ReservedAt};
pub use self::slots::{SlotOp, SlotReply, SlotRequest};
