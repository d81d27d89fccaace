//! Stores a user writes around the crate's: wrappers that forward `Store::run` (one level,
//! two, through an `Arc` or a `Box`, to a memory store while deciding on Redis, only some kinds
//! of operation), one that claims to have run an operation it never ran, one that runs none.
//! Written as outside the crate, against its public `Store` trait.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use redlimit::store::{
    CheckRequest, MemoryStore, Operation, OperationRequest, QueuedDecision, RedisStore, ReservedAt,
    Store, StoreError,
};
use redlimit::Decision;

/// `Store` methods that hand the call as it is to the store in a field: `forward!(0: check,
/// run)` writes `check` and `run` calling `self.0.check` and `self.0.run`.
macro_rules! forward {
    ($store:tt: check) => {
        fn check<'a>(
            &'a self,
            request: CheckRequest<'a>,
        ) -> BoxFuture<'a, Result<Decision, StoreError>> {
            self.$store.check(request)
        }
    };
    ($store:tt: decide_now) => {
        fn decide_now(&self, request: CheckRequest<'_>) -> Option<Result<Decision, StoreError>> {
            self.$store.decide_now(request)
        }
    };
    ($store:tt: queue) => {
        fn queue(&self, request: CheckRequest<'_>) -> Option<QueuedDecision> {
            self.$store.queue(request)
        }
    };
    ($store:tt: run) => {
        fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
            self.$store.run(operation)
        }
    };
    ($store:tt: call_timeout) => {
        fn call_timeout(&self) -> Option<Duration> {
            self.$store.call_timeout()
        }
    };
    ($store:tt: $($method:ident),+) => {
        $(forward!($store: $method);)+
    };
}

/// What a store answers to an operation it does not run: `StoreError::Unsupported(why)`.
pub fn refused<'a>(why: &'static str) -> BoxFuture<'a, Result<(), StoreError>> {
    Box::pin(std::future::ready(Err(StoreError::Unsupported(why))))
}

/// Forwards `check` and `run` to the store it wraps, and nothing else, as the `Store` docs'
/// example does (`decide_now` and `call_timeout` are the trait's defaults).
#[derive(Debug)]
pub struct Forward<S>(pub S);

impl<S: Store> Store for Forward<S> {
    forward!(0: check, run);
}

/// Forwards all five methods of the trait.
#[derive(Debug)]
pub struct Faithful<S>(pub S);

impl<S: Store> Store for Faithful<S> {
    forward!(0: check, decide_now, queue, run, call_timeout);
}

/// Holds its store behind an `Arc` it shares.
#[derive(Debug)]
pub struct Shared(pub Arc<RedisStore>);

impl Store for Shared {
    forward!(0: check, run);
}

/// Waits (a millisecond, as for a permit or a log write) before it forwards each call, holding
/// the operation across the wait.
#[derive(Debug)]
pub struct Delayed<S>(pub S);

impl<S: Store> Store for Delayed<S> {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.0.check(request).await
        })
    }

    fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert!(!operation.request().key().is_empty());
            self.0.run(operation).await
        })
    }
}

/// Decides on Redis, and runs every operation on a memory store.
#[derive(Debug)]
pub struct Mixed {
    pub decide: RedisStore,
    pub operations: MemoryStore,
}

impl Store for Mixed {
    forward!(decide: check);
    forward!(operations: run);
}

/// Decides on Redis, and answers `Ok(())` to every operation without running it.
#[derive(Debug)]
pub struct Liar(pub RedisStore);

impl Store for Liar {
    forward!(0: check);

    fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = operation;
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Decides on Redis and runs nothing else (the trait's default `run`).
#[derive(Debug)]
pub struct DecideOnly(pub RedisStore);

impl Store for DecideOnly {
    forward!(0: check);
}

/// A boxed store, as a store: what a user holding `Box<dyn Store>` writes.
#[derive(Debug)]
pub struct BoxedStore(pub Box<dyn Store>);

impl Store for BoxedStore {
    forward!(0: check, decide_now, queue, run, call_timeout);
}

/// The kind of an operation, as a wrapper names it.
pub fn kind(request: &OperationRequest<'_>) -> &'static str {
    match request {
        OperationRequest::Control(_) => "control",
        OperationRequest::Refund(_) => "refund",
        OperationRequest::Slots(_) => "slots",
        OperationRequest::Blocking(..) => "blocking",
        OperationRequest::Timed(_) => "timed",
        _ => "other",
    }
}

/// Forwards the kinds of operation it is given and refuses the others with
/// `StoreError::Unsupported`; notes each operation it sees (a refund with its `ReservedAt`'s
/// variant).
#[derive(Debug)]
pub struct Partial<S> {
    inner: S,
    forwards: &'static [&'static str],
    seen: Arc<Mutex<Vec<String>>>,
}

impl<S> Partial<S> {
    pub fn new(inner: S, forwards: &'static [&'static str]) -> Self {
        Partial {
            inner,
            forwards,
            seen: Arc::default(),
        }
    }

    pub fn seen(&self) -> Arc<Mutex<Vec<String>>> {
        self.seen.clone()
    }
}

impl<S: Store> Store for Partial<S> {
    forward!(inner: check);

    fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        let request = operation.request();
        let kind = kind(&request);
        let note = match request {
            OperationRequest::Refund(refund) => match refund.reserved {
                ReservedAt::Client(_) => "refund Client".to_owned(),
                ReservedAt::Store(_) => "refund Store".to_owned(),
                ReservedAt::Ago(_) => "refund Ago".to_owned(),
            },
            _ => kind.to_owned(),
        };
        self.seen.lock().unwrap().push(note);
        if self.forwards.contains(&kind) {
            self.inner.run(operation)
        } else {
            refused("not forwarded")
        }
    }
}

/// Every kind of operation.
pub const EVERY_KIND: &[&str] = &["control", "refund", "slots", "blocking", "timed"];
