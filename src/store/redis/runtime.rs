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
//! its first call. Once that runtime has shut down, every call fails at once with
//! [`RUNTIME_GONE`], never a stall.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What a call on a store whose runtime has shut down answers
/// ([`StoreError::Unavailable`](crate::store::StoreError::Unavailable)).
pub(super) const RUNTIME_GONE: &str =
    "the Tokio runtime this store was built on has shut down (build the store on a runtime \
     that outlives every caller)";

/// The runtime one store (and its clones) runs its own tasks on.
#[derive(Default)]
pub(super) struct StoreRuntime {
    bound: OnceLock<Bound>,
}

struct Bound {
    handle: Handle,
    /// Set when the runtime drops the watch task: it shut down.
    gone: Arc<AtomicBool>,
    /// Dropped with the store: ends the watch task.
    _alive: oneshot::Sender<()>,
}

impl StoreRuntime {
    /// A store's runtime, bound now to the current one if there is one.
    pub(super) fn current() -> Self {
        let runtime = StoreRuntime::default();
        runtime.bound();
        runtime
    }

    /// The bound runtime; bound to the caller's on first use when built outside any.
    fn bound(&self) -> Option<&Bound> {
        if let Some(bound) = self.bound.get() {
            return Some(bound);
        }
        let handle = Handle::try_current().ok()?;
        let gone = Arc::new(AtomicBool::new(false));
        let (alive, stopped) = oneshot::channel::<()>();
        let bound = Bound {
            handle: handle.clone(),
            gone: Arc::clone(&gone),
            _alive: alive,
        };
        if self.bound.set(bound).is_ok() {
            // A runtime drops its tasks when it shuts down: this one's guard says so.
            let guard = SetOnDrop(Some(gone));
            handle.spawn(async move {
                let _ = stopped.await;
                guard.disarm(); // the store went first
            });
        }
        self.bound.get()
    }

    /// Whether the bound runtime has shut down (then nothing the store spawns will run).
    #[inline]
    pub(super) fn is_gone(&self) -> bool {
        self.bound
            .get()
            .is_some_and(|bound| bound.gone.load(Ordering::Relaxed))
    }

    /// Runs `future` as a task on the store's runtime. A runtime that has shut down drops it
    /// at once (its drop guards run, its awaiting callers hear so); `None` only when no
    /// runtime is bound and none is current.
    pub(super) fn spawn<F>(&self, future: F) -> Option<JoinHandle<F::Output>>
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

    #[test]
    fn a_store_runtime_that_shuts_down_is_gone_and_runs_nothing() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store_runtime = runtime.block_on(async { StoreRuntime::current() });
        runtime.block_on(tokio::task::yield_now());
        assert!(!store_runtime.is_gone());
        drop(runtime);
        assert!(store_runtime.is_gone());
        let (sent, ran) = std::sync::mpsc::channel();
        let _ = store_runtime.spawn(async move { sent.send(()).unwrap() });
        assert!(ran.try_recv().is_err());
    }

    #[test]
    fn a_store_built_outside_a_runtime_binds_its_first_callers() {
        let store_runtime = StoreRuntime::default();
        assert!(store_runtime.spawn(async {}).is_none());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ran = runtime.block_on(async { store_runtime.spawn(async { 7 }).unwrap().await });
        assert_eq!(ran.unwrap(), 7);
        assert!(!store_runtime.is_gone());
    }
}
