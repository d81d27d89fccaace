//! [`RedisStore`]: every decision is one Lua script run atomically in Redis (single node or
//! Cluster).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind};
use tokio::sync::OnceCell;

use super::breaker::{Admission, BreakerState, CircuitBreaker};
use super::{CheckRequest, Store, StoreError};
use crate::algorithm::Reply;
use crate::Decision;

/// The default time a store call may take before it counts as a failure.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// How long one connection attempt may take (bounded by the call timeout anyway).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Consecutive timeouts after which a connection is taken for silently dead (a peer gone
/// without RST or FIN: a dead node behind a VIP, a dropped conntrack entry) and replaced.
const STALE_AFTER_TIMEOUTS: u32 = 3;

/// A [`Store`] on Redis: each decision is one `EVALSHA` of the algorithm's script, reloaded by
/// itself after `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`).
///
/// **It never waits for Redis.** It can be created while Redis is down: it connects on first use
/// and reconnects by itself after failures. Every call is bounded by a timeout (100 ms by
/// default), so a hung Redis never hangs a request, and a [`CircuitBreaker`] skips Redis for a
/// cool-down after repeated failures. Errors go to the limiter's failure policy; a timeout is
/// always [`StoreError::Timeout`], whichever timer noticed it.
///
/// **Stale connections.** A connection that is alive but useless is replaced by a fresh one:
/// after a `READONLY` or `MASTERDOWN` reply (a failover demoted the server it leads to, while the
/// address now leads to the new primary), and after 3 consecutive timeouts (a peer that vanished
/// without closing the connection). A connection that has never answered is replaced at most
/// once a second, so a slow first connection gets its chance and a URL that leads to a replica
/// does not open a connection per call.
///
/// **Cluster.** [`RedisStore::cluster`] runs on Redis Cluster: all Redis keys of one limiter key
/// share a hash tag, so each script runs on the one node that owns the slot.
///
/// Clones share the connection and the breaker.
///
/// ```no_run
/// use redlimit::store::RedisStore;
/// use std::time::Duration;
///
/// let single = RedisStore::builder("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(50))
///     .build()?;
/// let cluster = RedisStore::cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])?;
/// # Ok::<(), redis::RedisError>(())
/// ```
#[derive(Clone)]
pub struct RedisStore {
    backend: Arc<Backend>,
    timeout: Duration,
    breaker: Option<Arc<BreakerState>>,
}

// Built once and kept behind an Arc: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Single {
        client: Client,
        connection: Replaceable<ConnectionManager>,
    },
    Cluster {
        client: ClusterClient,
        connection: Replaceable<ClusterConnection>,
    },
}

/// A connection (created lazily, on first use) that is thrown away and created afresh once it
/// proves stale.
///
/// Callers take the current [`Slot`] (one brief lock and an `Arc` clone), use its connection and
/// report how the call went; a stale slot is swapped for an empty one only if it is still the
/// current one, so calls that fail together replace it once.
struct Replaceable<C> {
    current: Mutex<Arc<Slot<C>>>,
}

/// One generation of a [`Replaceable`] connection.
struct Slot<C> {
    connection: OnceCell<C>,
    created: Instant,
    /// Whether a call on this connection has succeeded.
    proven: AtomicBool,
    /// Consecutive timeouts on this connection.
    timeouts: AtomicU32,
}

impl<C> Slot<C> {
    fn new() -> Self {
        Slot {
            connection: OnceCell::new(),
            created: Instant::now(),
            proven: AtomicBool::new(false),
            timeouts: AtomicU32::new(0),
        }
    }
}

impl<C> Replaceable<C> {
    fn new() -> Self {
        Replaceable {
            current: Mutex::new(Arc::new(Slot::new())),
        }
    }

    /// The slot to use for one call.
    fn current(&self) -> Arc<Slot<C>> {
        // Nothing panics while the lock is held: a poisoned lock still holds a valid slot.
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records how a call on `slot` went; replaces the slot if that shows it stale.
    fn settle(&self, slot: &Arc<Slot<C>>, result: &Result<Decision, StoreError>) {
        let reason = match result {
            Ok(_) => {
                // Loads first: the hot path only reads the shared cache line.
                if slot.timeouts.load(Ordering::Relaxed) != 0 {
                    slot.timeouts.store(0, Ordering::Relaxed);
                }
                if !slot.proven.load(Ordering::Relaxed) {
                    slot.proven.store(true, Ordering::Relaxed);
                }
                return;
            }
            Err(StoreError::Timeout(_)) => {
                let timeouts = slot.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                if timeouts < STALE_AFTER_TIMEOUTS {
                    return;
                }
                "consecutive timeouts"
            }
            Err(StoreError::Redis(error)) if is_stale_server(error) => "the server is a replica",
            Err(_) => return,
        };
        // A connection that never answered may still be connecting (or lead to a replica for
        // good): give it one connection attempt's time before replacing it.
        if !slot.proven.load(Ordering::Relaxed) && slot.created.elapsed() < CONNECT_TIMEOUT {
            return;
        }
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if Arc::ptr_eq(&current, slot) {
            *current = Arc::new(Slot::new());
            drop(current);
            // Dropping the last handle of the old connection closes it.
            tracing::warn!(reason, "rate limit store connection is stale; reconnecting");
        }
    }
}

/// Whether a reply shows that the connection leads to a server that can no longer take the
/// scripts' writes (a primary demoted to replica by a failover), so that a new connection to the
/// same address may find the new primary.
fn is_stale_server(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
    )
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("RedisStore");
        match &*self.backend {
            Backend::Single { client, .. } => s.field("addr", client.get_connection_info().addr()),
            Backend::Cluster { .. } => s.field("addr", &"cluster"),
        };
        s.field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .finish()
    }
}

impl RedisStore {
    /// A store on the Redis at `url` with the defaults. Fails only on a malformed URL; Redis
    /// itself may be down.
    pub fn new<T: IntoConnectionInfo>(url: T) -> Result<Self, RedisError> {
        Self::builder(url).build()
    }

    /// A store on the Redis Cluster reachable through `nodes` (any subset of its nodes).
    pub fn cluster<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<Self, RedisError> {
        Self::cluster_builder(nodes).build()
    }

    /// Starts a builder for a store on the Redis at `url`.
    pub fn builder<T: IntoConnectionInfo>(url: T) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Client::open(url).map(|client| Backend::Single {
            client,
            connection: Replaceable::new(),
        }))
    }

    /// Starts a builder for a store on a Redis Cluster.
    ///
    /// ```no_run
    /// use redlimit::store::RedisStore;
    /// use std::time::Duration;
    ///
    /// let store = RedisStore::cluster_builder(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
    ///     .timeout(Duration::from_millis(50))
    ///     .build()?;
    /// assert_eq!(store.timeout(), Duration::from_millis(50));
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn cluster_builder<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> RedisStoreBuilder {
        let client = ClusterClient::builder(nodes)
            .connection_timeout(CONNECT_TIMEOUT)
            .retries(2)
            .min_retry_wait(5)
            .max_retry_wait(100)
            .build();
        RedisStoreBuilder::new(client.map(|client| Backend::Cluster {
            client,
            connection: Replaceable::new(),
        }))
    }

    /// The time a call may take before it counts as a failure.
    ///
    /// ```
    /// use redlimit::store::{RedisStore, DEFAULT_TIMEOUT};
    ///
    /// let store = RedisStore::new("redis://127.0.0.1:6379")?;
    /// assert_eq!(store.timeout(), DEFAULT_TIMEOUT);
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the circuit breaker is open (Redis is being skipped).
    ///
    /// ```
    /// use redlimit::store::RedisStore;
    ///
    /// let store = RedisStore::new("redis://127.0.0.1:6379")?;
    /// assert!(!store.circuit_open()); // closed until calls fail
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn circuit_open(&self) -> bool {
        self.breaker.as_ref().is_some_and(|b| b.is_open())
    }

    /// One call, bounded by the timeout, on the current connection; a stale connection is
    /// replaced afterwards.
    async fn run_script(&self, request: CheckRequest<'_>) -> Result<Decision, StoreError> {
        match &*self.backend {
            Backend::Single { client, connection } => {
                let slot = connection.current();
                let result = self
                    .bounded(async {
                        let mut connection = slot
                            .connection
                            .get_or_try_init(|| async {
                                // Lazy: does not wait for Redis; reconnects by itself after
                                // failures.
                                let config = ConnectionManagerConfig::new()
                                    .set_number_of_retries(1)
                                    .set_min_delay(Duration::from_millis(10))
                                    .set_max_delay(Duration::from_millis(500))
                                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                                    // redis-rs would cut every reply at 500 ms by default,
                                    // whatever the store's timeout: the store's timeout is the
                                    // one that applies.
                                    .set_response_timeout(Some(self.timeout));
                                ConnectionManager::new_lazy_with_config(client.clone(), config)
                            })
                            .await?
                            .clone();
                        match invoke(&mut connection, request).await {
                            // The manager may still hold a connection attempt that failed while
                            // Redis was down. Nothing was sent, so one retry is safe, and it
                            // reconnects now instead of one cool-down later.
                            Err(StoreError::Redis(error)) if error.is_connection_refusal() => {
                                invoke(&mut connection, request).await
                            }
                            result => result,
                        }
                    })
                    .await;
                connection.settle(&slot, &result);
                result
            }
            Backend::Cluster { client, connection } => {
                let slot = connection.current();
                let result = self
                    .bounded(async {
                        // Until the first connection succeeds each call tries again (within its
                        // timeout); after that the cluster connection heals itself (and is
                        // replaced if it goes stale).
                        let mut connection = slot
                            .connection
                            .get_or_try_init(|| client.get_async_connection())
                            .await?
                            .clone();
                        invoke(&mut connection, request).await
                    })
                    .await;
                connection.settle(&slot, &result);
                result
            }
        }
    }

    /// Runs `call` within the store's timeout. Every timeout comes out as
    /// [`StoreError::Timeout`], whether this timer fired or redis-rs's own response timeout (set
    /// to the same duration) fired first.
    async fn bounded(
        &self,
        call: impl Future<Output = Result<Decision, StoreError>>,
    ) -> Result<Decision, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Err(StoreError::Redis(error))) if error.is_timeout() => {
                Err(StoreError::Timeout(self.timeout))
            }
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

/// One EVALSHA of the algorithm's script. On `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`)
/// it loads the script and retries; if `NOSCRIPT` comes back again (another flush landed between
/// the load and the retry, or the retry reached a replica promoted without the script) it sends
/// the script body with `EVAL`, which cannot fail that way. A `NOSCRIPT` reply means the script
/// did not run, so each of these resends is safe.
async fn invoke(
    connection: &mut impl ConnectionLike,
    request: CheckRequest<'_>,
) -> Result<Decision, StoreError> {
    let script = request.algorithm.script();
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(script.get_hash());
    crate::algorithm::push_call(&request, &mut evalsha);
    let values: Vec<i64> = match evalsha.query_async(connection).await {
        Err(error) if is_noscript(&error) => {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(request.algorithm.script_source())
                .exec_async(connection)
                .await?;
            match evalsha.query_async(connection).await {
                Err(error) if is_noscript(&error) => {
                    let mut eval = redis::cmd("EVAL");
                    eval.arg(request.algorithm.script_source());
                    crate::algorithm::push_call(&request, &mut eval);
                    eval.query_async(connection).await?
                }
                result => result?,
            }
        }
        result => result?,
    };
    Reply::from_redis(&values)
        .map(Reply::into_decision)
        .ok_or_else(|| StoreError::BadReply(format!("{values:?}")))
}

fn is_noscript(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

impl Store for RedisStore {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            let admission = match &self.breaker {
                Some(breaker) => breaker.admit(),
                None => Admission::Call,
            };
            if admission == Admission::Skip {
                return Err(StoreError::Unavailable("circuit breaker open"));
            }
            // If this future is dropped before the call finishes, the breaker hears of it.
            let mut unsettled = Unsettled {
                breaker: self.breaker.as_deref(),
                admission,
            };
            let result = self.run_script(request).await;
            unsettled.breaker = None;
            if let Some(breaker) = &self.breaker {
                match &result {
                    Ok(_) => breaker.on_success(admission),
                    Err(_) => breaker.on_failure(admission),
                }
            }
            result
        })
    }
}

/// A breaker admission whose call has not finished. Dropped while still holding the breaker
/// (the caller went away mid-call: a client disconnect, an outer timeout), it tells the breaker,
/// so that an abandoned probe does not keep the circuit open for good.
struct Unsettled<'a> {
    breaker: Option<&'a BreakerState>,
    admission: Admission,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker {
            breaker.on_abandoned(self.admission);
        }
    }
}

/// Builds a [`RedisStore`]; see [`RedisStore::builder`] and [`RedisStore::cluster_builder`].
///
/// Building never connects: only a malformed URL fails.
///
/// ```
/// use redlimit::store::RedisStore;
/// use std::time::Duration;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(20))
///     .without_circuit_breaker()
///     .build()?;
/// assert_eq!(store.timeout(), Duration::from_millis(20));
/// assert!(RedisStore::builder("not a url").build().is_err());
/// # Ok::<(), redis::RedisError>(())
/// ```
pub struct RedisStoreBuilder {
    backend: Result<Backend, RedisError>,
    timeout: Duration,
    breaker: Option<CircuitBreaker>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    fn new(backend: Result<Backend, RedisError>) -> Self {
        RedisStoreBuilder {
            backend,
            timeout: DEFAULT_TIMEOUT,
            breaker: Some(CircuitBreaker::default()),
        }
    }

    /// The time one call (a script reload included) may take; 100 ms by default.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The circuit breaker's settings (on by default with [`CircuitBreaker::default`]).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Calls Redis even when it keeps failing (each call still has its timeout).
    pub fn without_circuit_breaker(mut self) -> Self {
        self.breaker = None;
        self
    }

    /// Builds the store. Fails only on malformed URLs.
    pub fn build(self) -> Result<RedisStore, RedisError> {
        Ok(RedisStore {
            backend: Arc::new(self.backend?),
            timeout: self.timeout,
            breaker: self.breaker.map(|b| Arc::new(BreakerState::new(b))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision() -> Result<Decision, StoreError> {
        Ok(Decision {
            allowed: true,
            limit: 1,
            remaining: 0,
            retry_after: Duration::ZERO,
            reset_after: Duration::ZERO,
        })
    }

    fn timeout() -> Result<Decision, StoreError> {
        Err(StoreError::Timeout(DEFAULT_TIMEOUT))
    }

    fn server_error(code: &str) -> Result<Decision, StoreError> {
        Err(StoreError::Redis(redis::make_extension_error(
            code.to_owned(),
            None,
        )))
    }

    fn readonly() -> Result<Decision, StoreError> {
        let error = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        Err(StoreError::Redis(error))
    }

    /// A slot that has answered once.
    fn proven(connection: &Replaceable<()>) -> Arc<Slot<()>> {
        let slot = connection.current();
        connection.settle(&slot, &decision());
        slot
    }

    #[test]
    fn consecutive_timeouts_replace_a_proven_connection_once() {
        let connection = Replaceable::new();
        let slot = proven(&connection);
        connection.settle(&slot, &timeout());
        connection.settle(&slot, &timeout());
        connection.settle(&slot, &decision()); // a success resets the count
        connection.settle(&slot, &timeout());
        connection.settle(&slot, &timeout());
        assert!(Arc::ptr_eq(&slot, &connection.current()));
        connection.settle(&slot, &timeout());
        let fresh = connection.current();
        assert!(
            !Arc::ptr_eq(&slot, &fresh),
            "3 consecutive timeouts replace it"
        );
        // Calls still in flight on the old slot do not replace the new one.
        connection.settle(&slot, &timeout());
        connection.settle(&slot, &readonly());
        assert!(Arc::ptr_eq(&fresh, &connection.current()));
    }

    #[test]
    fn readonly_and_masterdown_replace_a_proven_connection_at_once() {
        let connection = Replaceable::new();
        let slot = proven(&connection);
        connection.settle(&slot, &server_error("NOSCRIPT"));
        connection.settle(&slot, &server_error("ERR"));
        connection.settle(&slot, &Err(StoreError::BadReply(String::new())));
        assert!(Arc::ptr_eq(&slot, &connection.current()), "not stale");
        connection.settle(&slot, &readonly());
        assert!(!Arc::ptr_eq(&slot, &connection.current()));

        let slot = proven(&connection);
        let masterdown = RedisError::from((
            ErrorKind::Server(ServerErrorKind::MasterDown),
            "Link with MASTER is down",
        ));
        connection.settle(&slot, &Err(StoreError::Redis(masterdown)));
        assert!(!Arc::ptr_eq(&slot, &connection.current()));
    }

    #[test]
    fn a_connection_that_never_answered_gets_one_connect_timeout() {
        let connection: Replaceable<()> = Replaceable::new();
        let slot = connection.current();
        for _ in 0..10 {
            connection.settle(&slot, &timeout());
            connection.settle(&slot, &readonly());
        }
        assert!(
            Arc::ptr_eq(&slot, &connection.current()),
            "still connecting, or a replica: not replaced before CONNECT_TIMEOUT"
        );
        let old = Arc::new(Slot {
            created: Instant::now() - CONNECT_TIMEOUT,
            ..Slot::new()
        });
        *connection.current.lock().unwrap() = old.clone();
        connection.settle(&old, &readonly());
        assert!(!Arc::ptr_eq(&old, &connection.current()));
    }
}
