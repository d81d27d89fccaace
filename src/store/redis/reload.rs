//! [`Reloads`]: after `NOSCRIPT`, one `SCRIPT LOAD` for all the calls that saw it.
//!
//! After a `SCRIPT FLUSH` (or a restart, a failover to a server without the scripts) every call
//! in flight answers `NOSCRIPT`. If each loaded the script itself, 512 concurrent checks sent
//! up to 355 loads of the 45 KB script (12 MB) and most passed their timeout. Here the first
//! call to see `NOSCRIPT` starts one load, as a task of its own (it finishes even if that call
//! gives up); the others wait for it and then send their `EVALSHA` again. A call whose
//! `EVALSHA` was sent before the last load finished does not load again: that load may already
//! have put the script back, so it retries, and if `NOSCRIPT` comes back once more (another
//! flush landed in between) it sends the body with `EVAL`, which cannot fail that way. So one
//! flush costs one load per script (on Cluster, one per primary: `SCRIPT LOAD` goes to all).
//! On Cluster a load ends with the slowest master, so a call waits for it a quarter of its
//! timeout at most, then sends `EVAL` to its own node: one hung master holds up no call on
//! another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError};

use super::connection::within;
use super::runtime::StoreRuntime;
use crate::store::failure::FailureLog;
use crate::store::op::ScriptId;

/// How long one background `SCRIPT LOAD` may take; calls wait for it within their own timeout.
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// The reload state of every script, shared by every clone of a store.
#[derive(Default)]
pub(super) struct Reloads {
    scripts: [Arc<Reload>; ScriptId::COUNT],
    /// Where loads run.
    runtime: Arc<StoreRuntime>,
    /// The store's failure log, and its description there: a failed load is told through it.
    pub(super) failures: Arc<FailureLog>,
    pub(super) store: Arc<str>,
    /// How long a call waits for a load under way before it sends the body with `EVAL`;
    /// `None`: as long as the call's own timeout. On Cluster, `SCRIPT LOAD` goes to every
    /// master and ends with the slowest, so a call on a healthy master must not wait for it.
    pub(super) wait: Option<Duration>,
}

/// A load under way, awaited by every call that saw `NOSCRIPT` meanwhile.
type Load = Shared<BoxFuture<'static, Result<(), RedisError>>>;

#[derive(Default)]
struct Reload {
    /// Loads finished (successful or not): a call reads it before its `EVALSHA`.
    done: AtomicU64,
    /// The load under way, if any; guarded with `done` so that the two agree.
    running: Mutex<Option<Load>>,
}

impl Reloads {
    /// No load yet; loads run on the store's `runtime`.
    pub(super) fn on(runtime: Arc<StoreRuntime>) -> Self {
        Reloads {
            scripts: Default::default(),
            runtime,
            failures: Arc::default(),
            store: Arc::from(""),
            wait: None,
        }
    }

    /// What a call reads before its `EVALSHA`, to tell a `NOSCRIPT` that a finished load
    /// already answered from one that needs a load.
    pub(super) fn seen(&self, script: ScriptId) -> u64 {
        self.scripts[script as usize].done.load(Ordering::Acquire)
    }

    /// Makes sure a load of `source` ran after this call's `EVALSHA` (sent when `done` was
    /// `seen`): joins the load under way, or starts one on `connection` if none has finished
    /// since. Err is the load's error.
    pub(super) async fn reload<C>(
        &self,
        script: ScriptId,
        seen: u64,
        connection: &C,
        source: &'static str,
    ) -> Result<(), RedisError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let reload = &self.scripts[script as usize];
        let running = {
            let mut running = reload.lock();
            if reload.done.load(Ordering::Acquire) != seen {
                return Ok(()); // a load finished after this call's EVALSHA was sent
            }
            match &*running {
                Some(load) => load.clone(),
                None => {
                    let load = self.spawn_load(Arc::clone(reload), connection.clone(), source);
                    *running = Some(load.clone());
                    load
                }
            }
        };
        match self.wait {
            None => running.await,
            Some(limit) => tokio::time::timeout(limit, running)
                .await
                .unwrap_or_else(|_| {
                    // Not an I/O error: the call sends the body with `EVAL`, which runs the script
                    // on its own node (and leaves it loaded there).
                    Err(RedisError::from((
                        ErrorKind::Client,
                        "SCRIPT LOAD still under way",
                        format!("after {limit:?}"),
                    )))
                }),
        }
    }

    fn spawn_load<C>(&self, reload: Arc<Reload>, mut connection: C, source: &'static str) -> Load
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let abandoned = Arc::clone(&reload);
        let (failures, store) = (Arc::clone(&self.failures), Arc::clone(&self.store));
        let task = self.runtime.spawn(async move {
            let load = load(&mut connection, source);
            let result = within(LOAD_TIMEOUT, "SCRIPT LOAD timed out", load).await;
            let mut running = reload.lock();
            reload.done.fetch_add(1, Ordering::AcqRel);
            *running = None;
            drop(running);
            // One outage, one warning: a load that fails in an outage is one of its failures,
            // told at `warn` only as the episode's first line.
            if let Err(error) = &result {
                if failures.may_tell() {
                    tracing::warn!(%store, %error, "rate limit script could not be loaded; calls send it with EVAL");
                } else {
                    tracing::debug!(%error, "rate limit script could not be loaded; calls send it with EVAL");
                }
            }
            result
        });
        // A task dropped unfinished (its runtime shut down) ends the load all the same, so that
        // the next NOSCRIPT starts another instead of joining this one for good.
        let ended = move || {
            let mut running = abandoned.lock();
            abandoned.done.fetch_add(1, Ordering::AcqRel);
            *running = None;
            Err(RedisError::from((
                ErrorKind::Client,
                "SCRIPT LOAD task ended without an answer",
            )))
        };
        match task {
            Some(task) => task
                .map(move |joined| joined.unwrap_or_else(|_| ended()))
                .boxed()
                .shared(),
            // No runtime at all (this call holds the lock: nothing to end).
            None => futures::future::ready(Err(RedisError::from((
                ErrorKind::Client,
                "no Tokio runtime to load the script on",
            ))))
            .boxed()
            .shared(),
        }
    }
}

impl Reload {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Load>> {
        // Nothing panics while the lock is held: a poisoned lock still holds a valid state.
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `SCRIPT LOAD` of `source`: the one load, at [`check_server`](super::invoke::check_server)
/// and after `NOSCRIPT`.
pub(super) async fn load(
    connection: &mut impl ConnectionLike,
    source: &str,
) -> Result<(), RedisError> {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .exec_async(connection)
        .await
}
