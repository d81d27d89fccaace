//! [`StoreRuntime`]: the Tokio runtime a store's own tasks run on, never a caller's.
//!
//! A store runs work that serves several callers: its connection attempts (and the connection
//! driver redis-rs spawns beside each), the one `SCRIPT LOAD` after `NOSCRIPT`, and the sender
//! of batched decisions. Spawned on whichever caller's runtime happened to be there, that work
//! would stall while that runtime idles (a current-thread runtime no longer driven), wait behind
//! that caller's synchronous work (a task spawned from a worker goes into that worker's LIFO
//! slot, which no other worker steals: tokio-rs/tokio#4941), and die with that runtime's
//! shutdown. So a store binds one runtime, as redis-rs binds a connection to the runtime that
//! made it: the runtime current when it was built, or, when built outside any, the runtime of
//! its first call. Only that runtime's shutdown touches the store: what is in flight on it
//! fails, and the store then binds the runtime of its next call (and reconnects there), so a
//! store outlives a runtime.
//!
//! A limiter's token leases bind one the same way for their renewals, give-backs and sweeps
//! (`src/lease/`): a renewal that other requests wait for must not run on the runtime of
//! whichever request started it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The runtime one store (and its clones) runs its own tasks on.
#[derive(Default)]
pub(crate) struct StoreRuntime {
    bound: ArcSwapOption<Bound>,
    /// Bindings made so far: each binding's number.
    bindings: std::sync::atomic::AtomicU64,
}

struct Bound {
    /// Which binding: what a connection made on this runtime remembers.
    epoch: u64,
    handle: Handle,
    /// Set when the runtime drops the watch task: it shut down.
    gone: Arc<AtomicBool>,
    /// Dropped with the store: ends the watch task.
    _alive: oneshot::Sender<()>,
}

impl StoreRuntime {
    /// A store's runtime, bound now to the current one if there is one.
    pub(crate) fn current() -> Self {
        let runtime = StoreRuntime::default();
        runtime.bound();
        runtime
    }

    /// The bound runtime while it runs; else the caller's, bound from now on.
    fn bound(&self) -> Option<Arc<Bound>> {
        let bound = self.bound.load_full();
        if let Some(bound) = &bound {
            if !bound.gone.load(Ordering::Relaxed) {
                return Some(Arc::clone(bound));
            }
        }
        let handle = Handle::try_current().ok()?;
        let gone = Arc::new(AtomicBool::new(false));
        let (alive, stopped) = oneshot::channel::<()>();
        let fresh = Arc::new(Bound {
            epoch: self.bindings.fetch_add(1, Ordering::Relaxed) + 1,
            handle: handle.clone(),
            gone: Arc::clone(&gone),
            _alive: alive,
        });
        let previous = self
            .bound
            .compare_and_swap(&bound, Some(Arc::clone(&fresh)));
        let won = match (&*previous, &bound) {
            (Some(previous), Some(bound)) => Arc::ptr_eq(previous, bound),
            (None, None) => true,
            _ => false,
        };
        if !won {
            // Another call bound one first.
            return self.bound.load_full();
        }
        // A runtime drops its tasks when it shuts down: this one's guard says so.
        let guard = SetOnDrop(Some(gone));
        handle.spawn(async move {
            let _ = stopped.await;
            guard.disarm(); // the store went first
        });
        Some(fresh)
    }

    /// The binding tasks spawned now run under (bound now if need be); 0 when none can be.
    pub(crate) fn epoch(&self) -> u64 {
        self.bound().map_or(0, |bound| bound.epoch)
    }

    /// Whether the binding `epoch` still runs: what was made under it (a connection and its
    /// driver task) still works.
    #[inline]
    pub(super) fn is_live(&self, epoch: u64) -> bool {
        match &*self.bound.load() {
            Some(bound) => bound.epoch == epoch && !bound.gone.load(Ordering::Relaxed),
            None => epoch == 0, // made where no runtime could be bound
        }
    }

    /// Whether the caller runs on the store's runtime (a multi-thread one: a current-thread
    /// runtime has one worker and nothing to steal).
    pub(crate) fn is_current(&self) -> bool {
        let Ok(current) = Handle::try_current() else {
            return false;
        };
        current.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            && self
                .bound
                .load()
                .as_ref()
                .is_some_and(|bound| bound.handle.id() == current.id())
    }

    /// Runs `future` as a task on the store's runtime. A runtime that shuts down drops it (its
    /// drop guards run, its awaiting callers hear so); `None` only when no runtime is bound
    /// and none is current.
    pub(crate) fn spawn<F>(&self, future: F) -> Option<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        Some(self.bound()?.handle.spawn(future))
    }
}

/// Sets its flag, if it still holds one, when dropped.
struct SetOnDrop(Option<Arc<AtomicBool>>);

impl SetOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_store_runtime_that_shuts_down_runs_nothing_and_the_next_callers_is_bound() {
        let first = runtime();
        let store_runtime = first.block_on(async { StoreRuntime::current() });
        drop(first);
        // Nothing current: nothing to run on.
        assert!(store_runtime.spawn(async {}).is_none());
        let second = runtime();
        let ran = second.block_on(async { store_runtime.spawn(async { 7 }).unwrap().await });
        assert_eq!(ran.unwrap(), 7);
    }

    #[test]
    fn only_the_bound_runtime_runs_the_stores_tasks() {
        let first = runtime();
        let store_runtime = first.block_on(async { StoreRuntime::current() });
        let (sent, ran) = std::sync::mpsc::channel();
        // Spawned from another runtime: it runs on the bound one, once that one is driven.
        runtime().block_on(async {
            store_runtime.spawn(async move { sent.send(()).unwrap() });
        });
        assert!(ran.try_recv().is_err());
        first.block_on(tokio::task::yield_now());
        assert!(ran.try_recv().is_ok());
    }

    #[test]
    fn a_store_built_outside_a_runtime_binds_its_first_callers() {
        let store_runtime = StoreRuntime::default();
        assert!(store_runtime.spawn(async {}).is_none());
        let ran = runtime().block_on(async { store_runtime.spawn(async { 7 }).unwrap().await });
        assert_eq!(ran.unwrap(), 7);
    }
}
