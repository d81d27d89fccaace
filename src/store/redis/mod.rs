//! [`RedisStore`]: every decision is one Lua script run atomically in Redis (single node,
//! Cluster, or a primary found through Sentinel).

mod address;
mod batch;
mod builder;
mod cluster;
mod connection;
mod error;
mod invoke;
mod reload;
mod runtime;
mod sentinel;
mod server;
mod tls;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, IntoConnectionInfo, RedisError};

pub use self::address::redacted_url;
use self::batch::Batches;
pub use self::batch::{DEFAULT_MAX_BATCH, MAX_BATCH};
pub use self::builder::RedisStoreBuilder;
use self::builder::Target;
use self::connection::Replaceable;
pub use self::error::BuildError;
use self::invoke::{check_server, ScriptConnection};
use self::reload::Reloads;
pub(crate) use self::runtime::StoreRuntime;
use self::sentinel::{PrimaryConnection, SentinelTarget};
pub use self::server::{ServerInfo, MIN_REDIS_VERSION};
use super::breaker::{Admission, BreakerState, CircuitBreaker, Ticket};
use super::failure::FailureLog;
use super::op::ScriptOp;
use super::wire::decide::DecideOp;
use crate::decision::Decision;
use crate::store::contract::{CheckRequest, Operation, QueuedDecision, Store, StoreError};

/// The default time a store call may take before it counts as a failure.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// How long [`RedisStore::verify`] may take at most.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// A [`Store`] on Redis: each decision is one `EVALSHA` of the algorithm's script, reloaded by
/// itself after `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`).
///
/// **It never waits for Redis.** It can be created while Redis is down: it connects in the
/// background on first use (or at [`verify`](RedisStore::verify)) and reconnects by itself
/// after failures. A connection attempt runs as a task of its own, so one that takes longer
/// than the call timeout (TLS, another zone, Cluster slot discovery) is still made while calls
/// go to the failure policy. Every call is bounded by a timeout (100 ms by default), so a hung
/// Redis never hangs a request, and a [`CircuitBreaker`](crate::store::CircuitBreaker) skips Redis for a cool-down after
/// repeated failures. Errors go to the limiter's failure policy; a timeout is always
/// [`StoreError::Timeout`].
///
/// **Stale connections.** A connection that is alive but useless is replaced by a fresh one:
/// after a `READONLY` or `MASTERDOWN` reply (a failover demoted the server it leads to, while the
/// address now leads to the new primary), and after 3 consecutive timeouts (a peer that vanished
/// without closing the connection). A connection that has never answered is replaced at most
/// once a second, so a URL that leads to a replica does not open a connection per call.
///
/// **Never twice.** A script that may have run is never sent again: the store resends only
/// after replies that prove the script did not run (`NOSCRIPT`, a refused connection, and on
/// Cluster `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`, `MASTERDOWN`, `READONLY`),
/// and redis-rs's own Cluster retries are off.
///
/// **Redis version.** The scripts need Redis 5.0 or later ([`MIN_REDIS_VERSION`]); each new
/// connection asks the server's version and logs an error when it is older.
///
/// **Cluster.** [`RedisStore::cluster`] runs on Redis Cluster: all Redis keys of one limiter key
/// share a hash tag, so each script runs on the one node that owns the slot. While a slot
/// moves, `ASK` and `MOVED` are followed, and a decision that Redis refuses with `TRYAGAIN
/// Multiple keys request during rehashing of slot` (some of its keys moved or absent, the
/// tenant's key usually absent) is decided in an exact split form instead: the other keys read
/// first, then the script on the state's key alone (`lua/common.lua`'s header, "Split").
///
/// **Sentinel.** [`RedisStore::sentinel`] asks the sentinels for the primary and connects to it;
/// when that connection is dropped, answers `READONLY`/`MASTERDOWN`, times out 3 times in a
/// row, or the sentinels name another primary (asked once a second), the next connection asks
/// the sentinels again, so a failover is followed without a restart (calls meanwhile go to the
/// failure policy, each within the timeout).
///
/// **TLS.** `rediss://` URLs need the crate's `tls` feature (rustls); see
/// `RedisStoreBuilder::tls_ca_pem` and `tls_client_cert_pem` for a private CA and client
/// certificates.
///
/// **Its runtime.** The connection, script loads and the batch sender run on the Tokio
/// runtime current when the store was built (or, built outside any, the runtime of its first
/// call), as a redis-rs connection runs on the runtime that made it: build the store inside the
/// runtime that serves it, and keep that runtime running. Other runtimes may share the store;
/// see [the store's docs](crate::store#the-stores-runtime).
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
/// # Ok::<(), redlimit::store::BuildError>(())
/// ```
#[derive(Clone)]
pub struct RedisStore {
    backend: Arc<Backend>,
    timeout: Duration,
    breaker: Option<Arc<BreakerState>>,
    reloads: Arc<Reloads>,
    batches: Arc<Batches>,
    /// Where the store's own tasks run: its connection, its script loads, its batch senders.
    runtime: Arc<StoreRuntime>,
    /// Where it connects, as written, passwords hidden, and its breaker's settings: with the
    /// timeout, its `Debug`, its description in log lines (its settings, never its state).
    address: Arc<str>,
    breaker_settings: Option<CircuitBreaker>,
    /// The log of its failures, which the limiters using it write; every answer ends an
    /// episode of failures there.
    failures: Arc<FailureLog>,
}

enum Backend {
    Single {
        connection: Replaceable<MultiplexedConnection>,
    },
    Cluster {
        connection: Replaceable<ClusterConnection>,
    },
    Sentinel {
        connection: Replaceable<PrimaryConnection>,
    },
}

/// `$body` with `$connection` bound to the backend's [`Replaceable`] connection, whichever
/// backend it is: the one place that tells the three apart (each connection type says how it
/// sends a script, [`ScriptConnection`]).
macro_rules! on_backend {
    ($backend:expr, $connection:ident => $body:expr) => {
        match $backend {
            Backend::Single {
                connection: $connection,
                ..
            } => $body,
            Backend::Cluster {
                connection: $connection,
            } => $body,
            Backend::Sentinel {
                connection: $connection,
                ..
            } => $body,
        }
    };
}

/// Parses a URL with redis-rs behind the crate's own signature (a string), so a redis-rs
/// major version is no breaking change for callers.
fn parse_url(url: impl AsRef<str>) -> Result<ConnectionInfo, RedisError> {
    url.as_ref().into_connection_info()
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("address", &self.address)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker_settings)
            .finish()
    }
}

impl RedisStore {
    /// One decision, batched when the store batches; `timed`: as for a [`DecideOp`].
    pub(crate) async fn decide(
        &self,
        request: CheckRequest<'_>,
        timed: bool,
    ) -> Result<(Decision, Option<u64>), StoreError> {
        if self.batches.max() > 1 {
            return self.batched_check(request, timed).await;
        }
        self.guarded(DecideOp { request, timed }, "check").await
    }

    /// Runs one script operation behind the circuit breaker: skipped while it is open, its
    /// outcome heard by the breaker (even when this future is dropped first), and only
    /// transport trouble counted toward it: a script's error or an unreadable reply concerns
    /// this key alone, and the server did answer. Errors are counted under `name`.
    pub(crate) async fn guarded<O: ScriptOp + Sync>(
        &self,
        op: O,
        name: &'static str,
    ) -> Result<O::Output, StoreError> {
        let ticket = match &self.breaker {
            Some(breaker) => breaker.ticket(),
            None => Ticket::CALL,
        };
        self.guarded_with(ticket, op, name).await
    }

    /// [`guarded`](Self::guarded) with the breaker's admission already asked.
    async fn guarded_with<O: ScriptOp + Sync>(
        &self,
        ticket: Ticket,
        op: O,
        name: &'static str,
    ) -> Result<O::Output, StoreError> {
        if ticket.admission == Admission::Skip {
            return Err(StoreError::Unavailable("circuit breaker open"));
        }
        let mut unsettled = Unsettled {
            breaker: self.breaker.as_deref(),
            ticket,
        };
        let result = self.run_script(&op).await;
        unsettled.breaker = None;
        let transport = result.as_ref().err().map(StoreError::is_transport);
        if let Some(breaker) = &self.breaker {
            match transport {
                Some(true) => breaker.on_failure_of(ticket, &self.failures),
                _ => breaker.on_success_of(ticket),
            }
        }
        if let Some(transport) = transport {
            count_error(name, transport);
        }
        result
    }

    /// A store on the Redis at `url` with the defaults. Fails only on a malformed URL; Redis
    /// itself may be down.
    ///
    /// A URL is `redis://[user:password@]host[:port][/db]`, or `rediss://` for TLS (the `tls`
    /// feature); any `&str` or `String` does.
    pub fn new<T: AsRef<str>>(url: T) -> Result<Self, BuildError> {
        Self::builder(url).build()
    }

    /// A store on the Redis Cluster reachable through `nodes` (any subset of its nodes).
    pub fn cluster<T: AsRef<str>>(nodes: impl IntoIterator<Item = T>) -> Result<Self, BuildError> {
        Self::cluster_builder(nodes).build()
    }

    /// Starts a builder for a store on the Redis at `url` (written as for [`new`](Self::new)).
    pub fn builder<T: AsRef<str>>(url: T) -> RedisStoreBuilder {
        let address = address::redacted_url(url.as_ref());
        RedisStoreBuilder::new(
            parse_url(url).map(|info| Target::Single(Box::new(info))),
            address,
        )
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
    /// # Ok::<(), redlimit::store::BuildError>(())
    /// ```
    pub fn cluster_builder<T: AsRef<str>>(nodes: impl IntoIterator<Item = T>) -> RedisStoreBuilder {
        let nodes: Vec<T> = nodes.into_iter().collect();
        let address = format!(
            "cluster {}",
            address::redacted_list(nodes.iter().map(AsRef::as_ref))
        );
        let nodes: Result<Vec<ConnectionInfo>, RedisError> =
            nodes.into_iter().map(parse_url).collect();
        RedisStoreBuilder::new(nodes.map(Target::Cluster), address)
    }

    /// A store on the primary that the sentinels at `sentinels` monitor as `master_name`
    /// (`sentinel monitor <master_name> ...`), with the defaults. Fails only on malformed URLs.
    ///
    /// ```no_run
    /// use redlimit::store::RedisStore;
    ///
    /// let store = RedisStore::sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )?;
    /// # Ok::<(), redlimit::store::BuildError>(())
    /// ```
    pub fn sentinel<T: AsRef<str>>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: impl Into<String>,
    ) -> Result<Self, BuildError> {
        Self::sentinel_builder(sentinels, master_name).build()
    }

    /// Starts a builder for a store on the primary that Sentinel names `master_name`.
    ///
    /// The sentinels' own password goes in their URLs (`redis://:password@host:26379`, the
    /// same for all); [`credentials`](RedisStoreBuilder::credentials) is the limiter's user on
    /// the primary. With `rediss://` sentinel URLs (the `tls` feature) the primary is reached
    /// over TLS too, and `tls_ca_pem` / `tls_client_cert_pem` apply to both.
    ///
    /// ```
    /// use redlimit::store::RedisStore;
    /// use std::time::Duration;
    ///
    /// let store = RedisStore::sentinel_builder(["redis://10.0.0.1:26379"], "mymaster")
    ///     .timeout(Duration::from_millis(50))
    ///     .credentials(Some("limiter"), "secret")
    ///     .build()?;
    /// assert_eq!(store.timeout(), Duration::from_millis(50));
    /// assert!(RedisStore::sentinel_builder(Vec::<String>::new(), "mymaster").build().is_err());
    /// # Ok::<(), redlimit::store::BuildError>(())
    /// ```
    pub fn sentinel_builder<T: AsRef<str>>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: impl Into<String>,
    ) -> RedisStoreBuilder {
        let sentinels: Vec<T> = sentinels.into_iter().collect();
        let master = master_name.into();
        let address = format!(
            "sentinel {master} at {}",
            address::redacted_list(sentinels.iter().map(AsRef::as_ref))
        );
        let sentinels: Result<Vec<ConnectionInfo>, RedisError> =
            sentinels.into_iter().map(parse_url).collect();
        RedisStoreBuilder::new(
            sentinels.map(|sentinels| Target::Sentinel(SentinelTarget { sentinels, master })),
            address,
        )
    }

    /// The time a call may take before it counts as a failure.
    ///
    /// ```
    /// use redlimit::store::{RedisStore, DEFAULT_TIMEOUT};
    ///
    /// let store = RedisStore::new("redis://127.0.0.1:6379")?;
    /// assert_eq!(store.timeout(), DEFAULT_TIMEOUT);
    /// # Ok::<(), redlimit::store::BuildError>(())
    /// ```
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The most decisions one script call carries ([`RedisStoreBuilder::max_batch`]).
    pub fn max_batch(&self) -> usize {
        self.batches.max()
    }

    /// Whether the circuit breaker is open (Redis is being skipped).
    ///
    /// ```
    /// use redlimit::store::RedisStore;
    ///
    /// let store = RedisStore::new("redis://127.0.0.1:6379")?;
    /// assert!(!store.circuit_open()); // closed until calls fail
    /// # Ok::<(), redlimit::store::BuildError>(())
    /// ```
    pub fn circuit_open(&self) -> bool {
        self.breaker.as_ref().is_some_and(|b| b.is_open())
    }

    /// Checks the store now, to fail fast at startup: waits for the connection (within 10 s),
    /// then `PING`s (every primary on Cluster) and loads every algorithm's script. Returns what
    /// the server said about itself, or why it cannot be used yet (a refused connection, a
    /// TLS or authentication failure, a missing permission).
    ///
    /// Optional: a store that is never verified connects on first use, and a store that failed
    /// verification keeps trying in the background. It does not go through the circuit breaker.
    ///
    /// ```no_run
    /// use redlimit::store::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::new("redis://127.0.0.1:6379")?;
    /// match store.verify().await {
    ///     Ok(server) => println!("store: {server}"), // "store: Redis 7.0.15"
    ///     Err(error) => eprintln!("store not reachable yet: {error}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn verify(&self) -> Result<ServerInfo, StoreError> {
        let verify = async {
            on_backend!(&*self.backend, connection => {
                let (mut connection, server) = connection.wait_ready().await?;
                check_server(&mut connection).await?;
                Ok(server)
            })
        };
        tokio::time::timeout(VERIFY_TIMEOUT, verify)
            .await
            .unwrap_or(Err(StoreError::Timeout(VERIFY_TIMEOUT)))
    }

    /// One operation, bounded by the timeout, on the current connection, its reply read by the
    /// operation; a stale connection is replaced afterwards.
    pub(crate) async fn run_script<O: ScriptOp + Sync>(
        &self,
        op: &O,
    ) -> Result<O::Output, StoreError> {
        on_backend!(&*self.backend, connection => self.run_on(connection, op).await)
    }

    /// [`run_script`](Self::run_script) on one backend's connection.
    async fn run_on<C: ScriptConnection, O: ScriptOp + Sync>(
        &self,
        connection: &Replaceable<C>,
        op: &O,
    ) -> Result<O::Output, StoreError> {
        let (generation, open) = connection.connection();
        let mut inner_error = None;
        let result = self
            .bounded(async {
                let mut connection = match open {
                    Some(open) => open,
                    None => connection.wait_ready().await?.0,
                };
                let reply = connection.run(&self.reloads, op).await?;
                inner_error = op.stale_connection(&reply);
                op.read_reply(reply)
            })
            .await;
        let replaced = match inner_error {
            // The call answered, and what it answered says the connection is stale.
            Some(error) if result.is_ok() => connection.settle::<()>(generation, &Err(error)),
            _ => connection.settle(generation, &result),
        };
        if let Some(reason) = replaced {
            // A call that failed is told by its failure's episode (one outage, one warning: the
            // failure policy's line, or the circuit breaker's); one that answered on a stale
            // connection (a batch's `READONLY`) is told here, with where the store connects.
            if result.is_ok() && self.failures.may_tell() {
                tracing::warn!(store = ?self, reason, "rate limit store connection is stale; reconnecting");
            } else {
                tracing::debug!(reason, "rate limit store connection is stale; reconnecting");
            }
        }
        if result.is_ok() {
            self.failures.answered();
        }
        result
    }

    /// Runs `call` within the store's timeout: the one timer of a call (redis-rs's own response
    /// timeouts are off). A timeout comes out as [`StoreError::Timeout`].
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Err(StoreError::Redis(error))) if error.is_timeout() => {
                Err(StoreError::Timeout(self.timeout))
            }
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

impl Store for RedisStore {
    fn call_timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        // Each way boxed on its own: a batching store's box holds only what a queued decision
        // needs (its call of its own is boxed apart, `batch.rs`), not the largest future of
        // the two.
        if self.batches.max() > 1 {
            Box::pin(async move { Ok(self.batched_check(request, false).await?.0) })
        } else {
            let op = DecideOp {
                request,
                timed: false,
            };
            Box::pin(async move { Ok(self.guarded(op, "check").await?.0) })
        }
    }

    /// A batching store's decision, queued for its sender (or in a call of its own when
    /// nothing is in flight), with no box while it waits.
    fn queue(&self, request: CheckRequest<'_>) -> Option<QueuedDecision> {
        (self.batches.max() > 1).then(|| self.queue_decision(request, false))
    }

    fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        operation.run_on(self)
    }
}

/// The `metrics` feature's counter of failed store calls, `redlimit_store_errors_total`,
/// labelled `call` (`check`, `control`) and `kind` (`transport`: counts toward the breaker;
/// `request`: a script error or an unreadable reply, for that call alone).
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn count_error(call: &'static str, transport: bool) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "redlimit_store_errors_total",
        "call" => call,
        "kind" => if transport { "transport" } else { "request" }
    )
    .increment(1);
}

/// A breaker admission whose call has not finished. Dropped while still holding the breaker
/// (the caller went away mid-call: a client disconnect, an outer timeout), it tells the breaker,
/// so that an abandoned probe does not keep the circuit open for good.
struct Unsettled<'a> {
    breaker: Option<&'a BreakerState>,
    ticket: Ticket,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker {
            breaker.on_abandoned_of(self.ticket);
        }
    }
}
