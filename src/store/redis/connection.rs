//! [`Replaceable`]: a connection opened in the background, shared by every call, and replaced by
//! a fresh one once it proves stale.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use futures::future::{BoxFuture, FutureExt, Shared};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::runtime::StoreRuntime;
use super::server::ServerInfo;
use crate::store::contract::StoreError;

/// How long one connection attempt may take (TCP connect per node; the attempt as a whole is
/// bounded by [`ATTEMPT_TIMEOUT`]).
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one background connection attempt may take as a whole: the TCP and TLS handshakes,
/// `AUTH`, the version check and, on Cluster, slot discovery and a connection to every node.
pub(super) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Consecutive timeouts after which a connection is taken for silently dead (a peer gone
/// without RST or FIN: a dead node behind a VIP, a dropped conntrack entry) and replaced.
const STALE_AFTER_TIMEOUTS: u32 = 3;

/// The wait before the next connection attempt after `failures` failed ones in a row: 100 ms,
/// doubling up to 1 s. Calls in between fail at once with the last attempt's error.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100u64 << failures.saturating_sub(1).min(4)).min(Duration::from_secs(1))
}

/// Opens one connection: connects, checks the server, answers with what it found.
pub(super) type Connect<C> =
    Box<dyn Fn() -> BoxFuture<'static, Result<(C, ServerInfo), RedisError>> + Send + Sync>;

/// Which error replies show a connection stale, and why: `None` for an error that says nothing
/// about the connection.
pub(super) type Stale = fn(&RedisError) -> Option<&'static str>;

/// A connection opened in the background and thrown away for a fresh one once it proves stale.
///
/// **Lock-free hot path.** Calls read the current [`Slot`] through an [`ArcSwap`] (no lock, no
/// reference count) and clone its connection; they report how they went by the slot's
/// generation, so nothing is held across the call.
///
/// **Background connection.** The first call (or [`RedisStore::verify`]) starts a connection
/// attempt as a task of its own: calls wait for it within their own timeout, and a call that
/// times out leaves the attempt running for the next one, so a connection that takes longer
/// than the timeout (TLS, another zone, slot discovery) still gets made. After a failed attempt
/// the next one waits [`backoff`]; calls in between fail at once with its error.
///
/// [`RedisStore::verify`]: super::RedisStore::verify
pub(super) struct Replaceable<C> {
    current: ArcSwap<Slot<C>>,
    connect: Connect<C>,
    stale: Stale,
    generations: AtomicU64,
    /// Where connection attempts run (and the drivers redis-rs spawns beside them).
    runtime: Arc<StoreRuntime>,
}

/// One generation of a [`Replaceable`] connection.
pub(super) struct Slot<C> {
    generation: u64,
    ready: OnceLock<Ready<C>>,
    attempt: Mutex<Attempt>,
    /// Whether a call on this connection has succeeded.
    proven: AtomicBool,
    /// Consecutive timeouts on this connection.
    timeouts: AtomicU32,
}

/// An open connection and what its server said.
pub(super) struct Ready<C> {
    pub(super) connection: C,
    pub(super) server: ServerInfo,
    at: Instant,
    /// The store runtime's binding the attempt ran under: its driver task lives there.
    epoch: u64,
}

/// The connection attempt of a slot that is not ready yet.
enum Attempt {
    Idle {
        failures: u32,
    },
    Running(Shared<BoxFuture<'static, ()>>),
    Failed {
        at: Instant,
        error: RedisError,
        failures: u32,
    },
}

impl<C> Slot<C> {
    fn new(generation: u64) -> Self {
        Self::after_failures(generation, 0)
    }

    fn after_failures(generation: u64, failures: u32) -> Self {
        Slot {
            generation,
            ready: OnceLock::new(),
            attempt: Mutex::new(Attempt::Idle { failures }),
            proven: AtomicBool::new(false),
            timeouts: AtomicU32::new(0),
        }
    }

    fn attempt(&self) -> std::sync::MutexGuard<'_, Attempt> {
        // Nothing panics while the lock is held: a poisoned lock still holds a valid state.
        self.attempt.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Clone + Send + Sync + 'static> Replaceable<C> {
    /// A connection replaced after `READONLY` or `MASTERDOWN` and after consecutive timeouts.
    pub(super) fn new(connect: Connect<C>) -> Self {
        Self::with_stale(connect, stale_server)
    }

    /// A connection replaced after the errors `stale` names and after consecutive timeouts.
    pub(super) fn with_stale(connect: Connect<C>, stale: Stale) -> Self {
        Replaceable {
            current: ArcSwap::from_pointee(Slot::new(0)),
            connect,
            stale,
            generations: AtomicU64::new(0),
            runtime: Arc::default(),
        }
    }

    /// The same connection, its attempts run on the store's `runtime`.
    pub(super) fn on(mut self, runtime: Arc<StoreRuntime>) -> Self {
        self.runtime = runtime;
        self
    }

    /// The current connection if it is open, and the generation to report the call under.
    #[inline]
    pub(super) fn connection(&self) -> (u64, Option<C>) {
        let slot = self.current.load();
        let open = match slot.ready.get() {
            Some(ready) if self.runtime.is_live(ready.epoch) => Some(ready.connection.clone()),
            Some(_) => {
                // Made on a runtime that has shut down: its driver died with it.
                if self.replace(&slot) {
                    tracing::warn!(
                        reason = "the store's runtime shut down",
                        "rate limit store connection is stale; reconnecting"
                    );
                }
                None
            }
            None => None,
        };
        (slot.generation, open)
    }

    /// The current connection, waiting for the connection attempt (started if none runs and the
    /// backoff after the last failure has passed).
    pub(super) async fn wait_ready(&self) -> Result<(C, ServerInfo), StoreError> {
        let _ = self.connection(); // replaces a connection whose runtime shut down
        let slot = self.current.load_full();
        if let Some(ready) = slot.ready.get() {
            return Ok((ready.connection.clone(), ready.server.clone()));
        }
        let running = {
            let mut attempt = slot.attempt();
            if let Some(ready) = slot.ready.get() {
                return Ok((ready.connection.clone(), ready.server.clone()));
            }
            match &*attempt {
                Attempt::Running(running) => running.clone(),
                Attempt::Failed {
                    at,
                    error,
                    failures,
                } if at.elapsed() < backoff(*failures) => {
                    return Err(StoreError::redis(error.clone()));
                }
                Attempt::Failed { failures, .. } | Attempt::Idle { failures } => {
                    let failures = *failures;
                    let running = self.spawn_attempt(Arc::clone(&slot), failures);
                    *attempt = Attempt::Running(running.clone());
                    running
                }
            }
        };
        running.await;
        if let Some(ready) = slot.ready.get() {
            return Ok((ready.connection.clone(), ready.server.clone()));
        }
        let mut attempt = slot.attempt();
        match &*attempt {
            Attempt::Failed { error, .. } => Err(StoreError::redis(error.clone())),
            Attempt::Running(ended) if ended.peek().is_some() => {
                // Its task was dropped unfinished (the store's runtime shut down): the next
                // call makes another.
                *attempt = Attempt::Idle { failures: 0 };
                Err(StoreError::Unavailable("connection attempt abandoned"))
            }
            _ => Err(StoreError::Unavailable("connection attempt abandoned")),
        }
    }

    /// Runs one connection attempt as a task of its own on the store's runtime: it goes on
    /// when the calls waiting for it give up, and the connection's driver lives there too.
    fn spawn_attempt(&self, slot: Arc<Slot<C>>, failures: u32) -> Shared<BoxFuture<'static, ()>> {
        let connecting = (self.connect)();
        let epoch = self.runtime.epoch();
        let task = self.runtime.spawn(async move {
            let result = within(ATTEMPT_TIMEOUT, "connection attempt timed out", connecting).await;
            let mut attempt = slot.attempt();
            match result {
                Ok((connection, server)) => {
                    if failures > 0 {
                        tracing::info!(%server, "rate limit store connected");
                    } else {
                        tracing::debug!(%server, "rate limit store connected");
                    }
                    let _ = slot.ready.set(Ready {
                        connection,
                        server,
                        at: Instant::now(),
                        epoch,
                    });
                    *attempt = Attempt::Idle { failures: 0 };
                }
                Err(error) => {
                    // Debug-level: the limiter logs the first failure of its calls at `warn`,
                    // with the store's address (`FailureLog`).
                    tracing::debug!(%error, failures, "rate limit store cannot connect to Redis");
                    *attempt = Attempt::Failed {
                        at: Instant::now(),
                        error,
                        failures: failures.saturating_add(1),
                    };
                }
            }
        });
        match task {
            Some(task) => task.map(|_| ()).boxed().shared(),
            // No runtime at all: the waiting call hears the attempt was abandoned.
            None => futures::future::ready(()).boxed().shared(),
        }
    }

    /// Records how a call on generation `generation` went; replaces the connection if that
    /// shows it stale, and then says why (the caller logs it: as part of a failure's episode,
    /// or on its own when the call answered).
    pub(super) fn settle<T>(
        &self,
        generation: u64,
        result: &Result<T, StoreError>,
    ) -> Option<&'static str> {
        let slot = self.current.load();
        if slot.generation != generation {
            return None; // already replaced
        }
        let reason = match result {
            Ok(_) => {
                // Loads first: the hot path only reads the shared cache line.
                if slot.timeouts.load(Ordering::Relaxed) != 0 {
                    slot.timeouts.store(0, Ordering::Relaxed);
                }
                if !slot.proven.load(Ordering::Relaxed) {
                    slot.proven.store(true, Ordering::Relaxed);
                }
                return None;
            }
            Err(StoreError::Timeout(_)) => {
                let timeouts = slot.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                if timeouts < STALE_AFTER_TIMEOUTS {
                    return None;
                }
                "consecutive timeouts"
            }
            Err(StoreError::Redis(error)) => (self.stale)(error.inner())?,
            Err(_) => return None,
        };
        // A connection still being made is not stale: its attempt goes on in the background.
        let ready = slot.ready.get()?;
        // A connection that never answered (a slow first reply, or a URL that leads to a
        // replica for good) is replaced at most once per connection attempt's time.
        if !slot.proven.load(Ordering::Relaxed) && ready.at.elapsed() < CONNECT_TIMEOUT {
            return None;
        }
        self.replace(&slot).then_some(reason)
    }

    /// Puts a fresh slot in place of `slot` (unless another call already did): the next call
    /// makes a new connection. Whether this call replaced it.
    fn replace(&self, slot: &Arc<Slot<C>>) -> bool {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let previous = self
            .current
            .compare_and_swap(slot, Arc::new(Slot::new(generation)));
        // Dropping the last handle of the old connection closes it.
        Arc::ptr_eq(&previous, slot)
    }

    #[cfg(test)]
    fn current_generation(&self) -> u64 {
        self.current.load().generation
    }

    #[cfg(test)]
    fn make_ready(&self, connection: C, at: Instant) {
        let slot = self.current.load();
        let _ = slot.ready.set(Ready {
            connection,
            server: ServerInfo::default(),
            at,
            epoch: self.runtime.epoch(),
        });
    }
}

/// Whether a reply shows that the connection leads to a server that can no longer take the
/// scripts' writes (a primary demoted to replica by a failover), so that a new connection to the
/// same address may find the new primary.
pub(super) fn is_stale_server(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
    )
}

/// [`Stale`] for connections that reconnect by themselves (single node, Cluster): only a server
/// that became a replica makes them stale.
fn stale_server(error: &RedisError) -> Option<&'static str> {
    is_stale_server(error).then_some("the server is a replica")
}

/// [`Stale`] for a plain connection to the primary Sentinel named (it never reconnects by
/// itself): a server that became a replica, or a dropped connection (the primary died, or its
/// address is gone). Either way the next connection asks the sentinels again.
pub(super) fn stale_server_or_dropped(error: &RedisError) -> Option<&'static str> {
    if is_stale_server(error) {
        Some("the server is a replica")
    } else if error.is_connection_dropped() {
        Some("the connection was dropped")
    } else {
        None
    }
}

/// `attempt`, given at most `limit`: running out of time is an I/O error saying `what` timed
/// out.
pub(super) async fn within<T>(
    limit: Duration,
    what: &'static str,
    attempt: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    tokio::time::timeout(limit, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from((
                ErrorKind::Io,
                what,
                format!("after {limit:?}"),
            )))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Decision;
    use crate::quota::Quota;

    fn decision() -> Result<Decision, StoreError> {
        Ok(Decision {
            allowed: true,
            limit: 1,
            remaining: 0,
            retry_after: Duration::ZERO,
            reset_after: Duration::ZERO,
            suspended: false,
            quota: Quota::per_second(1).unwrap(),
            overridden: false,
        })
    }

    fn timeout() -> Result<Decision, StoreError> {
        Err(StoreError::Timeout(Duration::from_millis(100)))
    }

    fn server_error(code: &str) -> Result<Decision, StoreError> {
        Err(StoreError::redis(redis::make_extension_error(
            code.to_owned(),
            None,
        )))
    }

    fn readonly() -> Result<Decision, StoreError> {
        let error = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        Err(StoreError::redis(error))
    }

    fn never() -> Replaceable<()> {
        Replaceable::new(Box::new(|| {
            futures::future::pending::<Result<((), ServerInfo), RedisError>>().boxed()
        }))
    }

    /// A connection that is open and has answered once; its generation.
    fn proven(connection: &Replaceable<()>) -> u64 {
        connection.make_ready((), Instant::now());
        let (generation, open) = connection.connection();
        assert!(open.is_some());
        connection.settle(generation, &decision());
        generation
    }

    #[test]
    fn consecutive_timeouts_replace_a_proven_connection_once() {
        let connection = never();
        let first = proven(&connection);
        connection.settle(first, &timeout());
        connection.settle(first, &timeout());
        connection.settle(first, &decision()); // a success resets the count
        connection.settle(first, &timeout());
        connection.settle(first, &timeout());
        assert_eq!(connection.current_generation(), first);
        connection.settle(first, &timeout());
        let fresh = connection.current_generation();
        assert_ne!(first, fresh, "3 consecutive timeouts replace it");
        assert!(
            connection.connection().1.is_none(),
            "the new one is not open yet"
        );
        // Calls still in flight on the old slot do not replace the new one.
        connection.settle(first, &timeout());
        connection.settle(first, &readonly());
        assert_eq!(connection.current_generation(), fresh);
    }

    #[test]
    fn readonly_and_masterdown_replace_a_proven_connection_at_once() {
        let connection = never();
        let first = proven(&connection);
        connection.settle(first, &server_error("NOSCRIPT"));
        connection.settle(first, &server_error("ERR"));
        connection.settle::<()>(first, &Err(StoreError::BadReply(String::new())));
        assert_eq!(connection.current_generation(), first, "not stale");
        connection.settle(first, &readonly());
        assert_ne!(connection.current_generation(), first);

        let second = proven(&connection);
        let masterdown = RedisError::from((
            ErrorKind::Server(ServerErrorKind::MasterDown),
            "Link with MASTER is down",
        ));
        connection.settle::<()>(second, &Err(StoreError::redis(masterdown)));
        assert_ne!(connection.current_generation(), second);
    }

    #[test]
    fn a_connection_being_made_or_never_answering_is_not_replaced_early() {
        let connection = never();
        let (generation, open) = connection.connection();
        assert!(open.is_none());
        for _ in 0..10 {
            connection.settle(generation, &timeout());
            connection.settle(generation, &readonly());
        }
        assert_eq!(
            connection.current_generation(),
            generation,
            "still connecting: the attempt goes on"
        );
        connection.make_ready((), Instant::now());
        connection.settle(generation, &readonly());
        assert_eq!(
            connection.current_generation(),
            generation,
            "open but never answered: not replaced before CONNECT_TIMEOUT"
        );

        let other = never();
        other.make_ready((), Instant::now() - CONNECT_TIMEOUT);
        let (generation, _) = other.connection();
        other.settle(generation, &readonly());
        assert_ne!(other.current_generation(), generation);
    }

    fn dropped() -> Result<Decision, StoreError> {
        let error = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        Err(StoreError::redis(error))
    }

    #[test]
    fn a_dropped_connection_is_stale_only_where_nothing_reconnects_it() {
        // Single node and Cluster: redis-rs reconnects the connection by itself.
        let reconnecting = never();
        let generation = proven(&reconnecting);
        reconnecting.settle(generation, &dropped());
        assert_eq!(reconnecting.current_generation(), generation);

        // Sentinel: a plain connection to the primary; a new one asks the sentinels again.
        let plain = Replaceable::with_stale(
            Box::new(|| futures::future::pending::<Result<((), ServerInfo), RedisError>>().boxed()),
            stale_server_or_dropped,
        );
        let first = proven(&plain);
        plain.settle(first, &server_error("NOSCRIPT"));
        plain.settle(first, &server_error("ERR"));
        assert_eq!(plain.current_generation(), first, "not stale");
        plain.settle(first, &dropped());
        let second = plain.current_generation();
        assert_ne!(second, first, "dropped: replaced");
        let second = proven(&plain);
        plain.settle(second, &readonly());
        assert_ne!(plain.current_generation(), second, "READONLY: replaced");
    }

    #[test]
    fn backoff_grows_to_one_second() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(4), Duration::from_millis(800));
        assert_eq!(backoff(5), Duration::from_secs(1));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(1));
    }
}
