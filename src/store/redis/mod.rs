//! [`RedisStore`]: every decision is one Lua script run atomically in Redis (single node,
//! Cluster, or a primary found through Sentinel).

mod connection;
mod modes;
mod reload;
mod sentinel;
mod server;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    Client, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError,
    ServerErrorKind,
};

use self::connection::{stale_server_or_dropped, Replaceable, CONNECT_TIMEOUT};
use self::reload::{Reloads, Script};
use self::sentinel::{PrimaryConnection, SentinelOptions, SentinelTarget};
pub use self::server::{ServerInfo, MIN_REDIS_VERSION};
use super::breaker::{Admission, BreakerState, CircuitBreaker};
use super::{CheckRequest, ControlReply, ControlRequest, Store, StoreError};
use crate::algorithm::{control_script, Algorithm, Reply, CONTROL_SOURCE};
use crate::decision::Decision;

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
/// Redis never hangs a request, and a [`CircuitBreaker`] skips Redis for a cool-down after
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
    reloads: Arc<Reloads>,
}

enum Backend {
    Single {
        addr: String,
        connection: Replaceable<ConnectionManager>,
    },
    Cluster {
        connection: Replaceable<ClusterConnection>,
    },
    Sentinel {
        master: String,
        connection: Replaceable<PrimaryConnection>,
    },
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("RedisStore");
        match &*self.backend {
            Backend::Single { addr, .. } => s.field("addr", addr),
            Backend::Cluster { .. } => s.field("addr", &"cluster"),
            Backend::Sentinel { master, .. } => s.field("sentinel_master", master),
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
        RedisStoreBuilder::new(
            url.into_connection_info()
                .map(|info| Target::Single(Box::new(info))),
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
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn cluster_builder<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> RedisStoreBuilder {
        let nodes: Result<Vec<ConnectionInfo>, RedisError> = nodes
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect();
        RedisStoreBuilder::new(nodes.map(Target::Cluster))
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
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn sentinel<T: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: impl Into<String>,
    ) -> Result<Self, RedisError> {
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
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn sentinel_builder<T: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: impl Into<String>,
    ) -> RedisStoreBuilder {
        let sentinels: Result<Vec<ConnectionInfo>, RedisError> = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect();
        let master = master_name.into();
        RedisStoreBuilder::new(
            sentinels.map(|sentinels| Target::Sentinel(SentinelTarget { sentinels, master })),
        )
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
            match &*self.backend {
                Backend::Single { connection, .. } => {
                    let (mut connection, server) = connection.wait_ready().await?;
                    check_server(&mut connection).await?;
                    Ok(server)
                }
                Backend::Cluster { connection } => {
                    let (mut connection, server) = connection.wait_ready().await?;
                    check_server(&mut connection).await?;
                    Ok(server)
                }
                Backend::Sentinel { connection, .. } => {
                    let (mut connection, server) = connection.wait_ready().await?;
                    check_server(&mut connection).await?;
                    Ok(server)
                }
            }
        };
        tokio::time::timeout(VERIFY_TIMEOUT, verify)
            .await
            .unwrap_or(Err(StoreError::Timeout(VERIFY_TIMEOUT)))
    }

    /// One call, bounded by the timeout, on the current connection; a stale connection is
    /// replaced afterwards.
    async fn run_script(&self, request: Call<'_>) -> Result<Answer, StoreError> {
        match &*self.backend {
            Backend::Single { connection, .. } => {
                let (generation, open) = connection.connection();
                let result = self
                    .bounded(async {
                        let mut connection = match open {
                            Some(open) => open,
                            None => connection.wait_ready().await?.0,
                        };
                        match invoke(&mut connection, &self.reloads, request).await {
                            // The manager may still hold a connection attempt that failed while
                            // Redis was down. Nothing was sent, so one retry is safe, and it
                            // reconnects now instead of one cool-down later.
                            Err(StoreError::Redis(error)) if error.is_connection_refusal() => {
                                invoke(&mut connection, &self.reloads, request).await
                            }
                            result => result,
                        }
                    })
                    .await;
                connection.settle(generation, &result);
                result
            }
            Backend::Cluster { connection } => {
                let (generation, open) = connection.connection();
                let result = self
                    .bounded(async {
                        let mut connection = match open {
                            Some(open) => open,
                            None => connection.wait_ready().await?.0,
                        };
                        invoke_on_cluster(&mut connection, &self.reloads, request).await
                    })
                    .await;
                connection.settle(generation, &result);
                result
            }
            Backend::Sentinel { connection, .. } => {
                let (generation, open) = connection.connection();
                let result = self
                    .bounded(async {
                        let mut connection = match open {
                            Some(open) => open,
                            None => connection.wait_ready().await?.0,
                        };
                        // No resend: a dropped connection is replaced, and the next call goes
                        // to the primary the sentinels name then.
                        invoke(&mut connection, &self.reloads, request).await
                    })
                    .await;
                connection.settle(generation, &result);
                result
            }
        }
    }

    /// Runs `call` within the store's timeout: the one timer of a call (redis-rs's own response
    /// timeouts are off). A timeout comes out as [`StoreError::Timeout`].
    async fn bounded(
        &self,
        call: impl Future<Output = Result<Answer, StoreError>>,
    ) -> Result<Answer, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Err(StoreError::Redis(error))) if error.is_timeout() => {
                Err(StoreError::Timeout(self.timeout))
            }
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

/// `PING` and `SCRIPT LOAD` of every algorithm's script: what a call needs besides `EVALSHA`.
async fn check_server(connection: &mut impl ConnectionLike) -> Result<(), StoreError> {
    redis::cmd("PING").exec_async(connection).await?;
    for algorithm in Algorithm::ALL {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(algorithm.script_source())
            .exec_async(connection)
            .await?;
    }
    Ok(())
}

/// Script calls on Cluster: redis-rs is told not to retry (`.retries(0)`), so this resends a
/// call only after a reply that proves the script did not run, twice at most, within the
/// call's timeout.
///
/// Why redis-rs must not retry: in redis-rs 1.8.1, `choose_response` in
/// `src/cluster_handling/async_connection/request.rs` resends a request whenever
/// `request.retry < retry_params.number_of_retries`, by the error's `RedisError::retry_method`
/// (`src/errors/redis_error.rs`): an I/O error reads as `Reconnect` (connection dropped) or
/// `RetryImmediately` (any other, a response timeout included), and both come *after* the
/// command was written, when the script may have run. A resend there would count one request
/// twice. With `number_of_retries` 0 every error is handed back as it is (slot refreshes and
/// reconnections still happen, they just resend nothing). `send_refresh_error` goes through
/// the same `choose_response`.
///
/// What this resends instead: `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`,
/// `MASTERDOWN` and `READONLY` are refusals made before a script runs (a script refused by
/// `READONLY` stops at its first write, before any change), `ClusterConnectionNotFound` and a
/// refused connection mean nothing was written. (`NOSCRIPT` is handled by [`invoke`].)
///
/// **Slot migration.** While a slot moves (`CLUSTER SETSLOT … MIGRATING/IMPORTING`, then
/// `MIGRATE` key by key) the source answers `ASK <slot> <host:port>` for a key it no longer
/// holds. Sent by slot again, the call would reach the source again and get `ASK` again, so
/// every new or moved key of that slot failed open for the whole migration. An `ASK` is
/// followed here: `ASKING` and the script go to the node named in the error as one pipeline
/// (one write, so no other call on that multiplexed connection can come between them and use
/// up the `ASKING`). A `MOVED` (the slot has moved for good) is followed to the node it names
/// at once, while redis-rs refreshes its slot map (it does so on `MOVED` even without
/// retries), so later calls go there by slot.
///
/// A decision reads two keys of one hash tag (three for the sliding log), and while their slot
/// moves Redis refuses it with `TRYAGAIN Multiple keys request during rehashing of slot`
/// whenever some of them exist and some do not, on the source and (after `ASKING`) on the
/// target alike: the tenant's key usually does not exist, so no resend can help. On that
/// refusal alone a decision takes [`split_check`] instead; every other call is as it was.
async fn invoke_on_cluster(
    connection: &mut ClusterConnection,
    reloads: &Reloads,
    request: Call<'_>,
) -> Result<Answer, StoreError> {
    match follow(connection, reloads, request).await {
        Err(StoreError::Redis(error)) if is_rehashing(&error) => match request {
            Call::Check(check) => split_check(connection, reloads, check).await,
            _ => Err(error.into()),
        },
        result => result,
    }
}

/// A decision in two steps, still exact (`lua/common.lua`'s header, "Split"): the keys besides
/// the state's are read with one-key commands, which a migration never refuses (they follow
/// `ASK` and `MOVED` as scripts do), then the same script runs on the state's key alone with
/// those strings as arguments. Controls read a moment before the decision are those of a
/// decision that ran just before a concurrent change to them, so no decision is wrong for it.
async fn split_check(
    connection: &mut ClusterConnection,
    reloads: &Reloads,
    check: CheckRequest<'_>,
) -> Result<Answer, StoreError> {
    let mut extras = Vec::with_capacity(2);
    for key in crate::algorithm::split_keys(check.key, check.algorithm) {
        extras.push(read_string(connection, &key).await?);
    }
    follow(connection, reloads, Call::Split(check, &extras)).await
}

/// One string by a one-key `MGET` (as the script reads it: a key of another type reads as
/// absent), empty when absent, following `ASK` and `MOVED` as [`follow`] does.
async fn read_string(connection: &mut ClusterConnection, key: &str) -> Result<Vec<u8>, StoreError> {
    let mut resends = 0;
    let mut redirect: Option<Redirect> = None;
    loop {
        let mut mget = redis::cmd("MGET");
        mget.arg(key);
        let result = match &redirect {
            None => mget.query_async(connection).await,
            Some(to) => send_to(connection, to, mget).await,
        };
        match result {
            Ok(redis::Value::Array(mut values)) if values.len() == 1 => {
                return match values.pop() {
                    Some(redis::Value::BulkString(bytes)) => Ok(bytes),
                    Some(redis::Value::Nil) => Ok(Vec::new()),
                    other => Err(StoreError::BadReply(format!("{other:?}"))),
                };
            }
            Ok(other) => return Err(StoreError::BadReply(format!("{other:?}"))),
            Err(error) if resends < 4 && did_not_run(&error) => {
                resends += 1;
                redirect = Redirect::of(&error);
                if redirect.is_none() {
                    tokio::time::sleep(Duration::from_millis(5 * resends)).await;
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Whether `error` is a migrating slot's refusal of a call on several keys, some missing.
fn is_rehashing(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::TryAgain)
        && error
            .detail()
            .is_some_and(|detail| detail.starts_with("Multiple keys request during rehashing"))
}

/// One call with the resends of [`invoke_on_cluster`]: a decision's `TRYAGAIN` on several
/// keys ([`is_rehashing`]) comes back at once, for the split form.
async fn follow(
    connection: &mut ClusterConnection,
    reloads: &Reloads,
    request: Call<'_>,
) -> Result<Answer, StoreError> {
    let mut resends = 0;
    let mut redirect: Option<Redirect> = None;
    loop {
        let result = match &redirect {
            None => invoke(connection, reloads, request).await,
            Some(to) => invoke_redirected(connection, to, request).await,
        };
        match result {
            Err(StoreError::Redis(error))
                if is_rehashing(&error) && matches!(request, Call::Check(_)) =>
            {
                return Err(error.into());
            }
            Err(StoreError::Redis(error)) if resends < 4 && did_not_run(&error) => {
                resends += 1;
                redirect = Redirect::of(&error);
                if redirect.is_none() {
                    // The slot map refresh that the refusal started needs a moment.
                    tokio::time::sleep(Duration::from_millis(5 * resends)).await;
                }
            }
            result => return result,
        }
    }
}

/// Where an `ASK` or `MOVED` error sends a call.
#[derive(Debug, Clone)]
struct Redirect {
    ask: bool,
    host: String,
    port: u16,
}

impl Redirect {
    /// The node an `ASK` or `MOVED` reply names (`ASK 3999 127.0.0.1:7001`), `None` for other
    /// errors.
    fn of(error: &RedisError) -> Option<Redirect> {
        let ask = error.kind() == ErrorKind::Server(ServerErrorKind::Ask);
        let (addr, _slot) = error.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        Some(Redirect {
            ask,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// One script call sent to the node `to` names, after `ASKING` for an `ASK`. The target of a
/// migration may not have the script yet: on `NOSCRIPT` the body goes with `EVAL` (which
/// caches it there, so the next call's `EVALSHA` finds it).
async fn invoke_redirected(
    connection: &mut ClusterConnection,
    to: &Redirect,
    request: Call<'_>,
) -> Result<Answer, StoreError> {
    let (script, source) = request.script();
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(script.get_hash());
    request.push_call(&mut evalsha);
    let reply = match send_to(connection, to, evalsha).await {
        Err(error) if is_noscript(&error) => {
            let mut eval = redis::cmd("EVAL");
            eval.arg(source);
            request.push_call(&mut eval);
            send_to(connection, to, eval).await?
        }
        result => result?,
    };
    request.answer(reply)
}

/// Sends `cmd` to the node `to` names: with `ASKING` before it in one pipeline for an `ASK`.
async fn send_to(
    connection: &mut ClusterConnection,
    to: &Redirect,
    cmd: redis::Cmd,
) -> Result<redis::Value, RedisError> {
    let node = SingleNodeRoutingInfo::ByAddress {
        host: to.host.clone(),
        port: to.port,
    };
    let reply = if to.ask {
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").add_command(cmd);
        // Offset 1: only the script's reply comes back.
        let mut replies = connection.route_pipeline(pipe, 1, 1, node).await?;
        replies.pop().ok_or_else(|| {
            RedisError::from((ErrorKind::Client, "no reply to the script after ASKING"))
        })?
    } else {
        connection
            .route_command(cmd, RoutingInfo::SingleNode(node))
            .await?
    };
    reply.extract_error()
}

/// Whether a Cluster reply proves that the script was not run; see [`invoke_on_cluster`].
fn did_not_run(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        ) | ErrorKind::ClusterConnectionNotFound
    ) || error.is_connection_refusal()
}

/// One EVALSHA of the algorithm's script. On `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`)
/// the script is loaded once for every call that saw it ([`Reloads`]) and this call retries; if
/// `NOSCRIPT` comes back again (another flush landed between the load and the retry, or the
/// retry reached a replica promoted without the script), or the load failed, it sends the
/// script body with `EVAL`, which cannot fail that way. A `NOSCRIPT` reply means the script
/// did not run, so each of these resends is safe.
async fn invoke<C>(
    connection: &mut C,
    reloads: &Reloads,
    request: Call<'_>,
) -> Result<Answer, StoreError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let (script, source) = request.script();
    let which = request.which();
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(script.get_hash());
    request.push_call(&mut evalsha);
    let seen = reloads.seen(which);
    let reply: redis::Value = match evalsha.query_async(connection).await {
        Err(error) if is_noscript(&error) => {
            let (retried, load_failed) = match reloads.reload(which, seen, connection, source).await
            {
                Ok(()) => (evalsha.query_async(connection).await, false),
                Err(error) => (Err(error), true),
            };
            match retried {
                // NOSCRIPT again, or the load failed (e.g. an ACL without `script|load`); never
                // after any other reply, which may come from a script that ran.
                Err(error) if is_noscript(&error) || (load_failed && !error.is_io_error()) => {
                    let mut eval = redis::cmd("EVAL");
                    eval.arg(source);
                    request.push_call(&mut eval);
                    eval.query_async(connection).await?
                }
                result => result?,
            }
        }
        result => result?,
    };
    request.answer(reply)
}

/// One script call: a decision, or a fleet control.
#[derive(Debug, Clone, Copy)]
enum Call<'a> {
    Check(CheckRequest<'a>),
    /// A decision in the split form ([`split_check`]), with the other keys' strings.
    Split(CheckRequest<'a>, &'a [Vec<u8>]),
    Control(ControlRequest<'a>),
    /// A production mode's script (`modes.rs`): a refund, a decision that blocks, a slot.
    Mode(modes::ModeCall<'a>),
}

/// What a script call answers.
#[derive(Debug)]
enum Answer {
    Decision(Decision),
    Control(ControlReply),
    /// A production mode's reply, parsed by `modes.rs`.
    Mode(redis::Value),
}

impl Call<'_> {
    /// The script this call runs, and its body.
    fn script(&self) -> (&'static redis::Script, &'static str) {
        match self {
            Call::Check(check) | Call::Split(check, _) => {
                (check.algorithm.script(), check.algorithm.script_source())
            }
            Call::Control(_) => (control_script(), CONTROL_SOURCE),
            Call::Mode(mode) => mode.script(),
        }
    }

    /// Which script, for [`Reloads`].
    fn which(&self) -> Script {
        match self {
            Call::Check(_) | Call::Split(..) => Script::Decide,
            Call::Control(_) => Script::Control,
            Call::Mode(mode) => mode.which(),
        }
    }

    /// Appends `numkeys`, `KEYS` and `ARGV` after the SHA-1 or the body.
    fn push_call(&self, cmd: &mut redis::Cmd) {
        match self {
            Call::Check(request) => crate::algorithm::push_call(
                cmd,
                request.key,
                request.algorithm,
                request.quotas,
                request.cost,
                request.now_micros,
            ),
            Call::Split(request, extras) => crate::algorithm::push_split_call(
                cmd,
                request.key,
                request.algorithm,
                request.quotas,
                request.cost,
                request.now_micros,
                extras,
            ),
            Call::Control(request) => crate::algorithm::push_control(
                cmd,
                request.key,
                request.algorithm,
                request.control.op(),
                request.now_micros,
            ),
            Call::Mode(mode) => mode.push_call(cmd),
        }
    }

    fn answer(&self, reply: redis::Value) -> Result<Answer, StoreError> {
        let bad = |reply: &redis::Value| StoreError::BadReply(format!("{reply:?}"));
        match self {
            Call::Check(request) | Call::Split(request, _) => {
                let parsed = match &reply {
                    redis::Value::BulkString(bytes) => Reply::from_redis(bytes),
                    redis::Value::Int(both) => Reply::from_admission(*both, request.quotas),
                    _ => None,
                };
                parsed
                    .and_then(|parsed| parsed.into_decision(request.quotas))
                    .map(Answer::Decision)
                    .ok_or_else(|| bad(&reply))
            }
            Call::Control(_) => {
                let (stored, pttl, now, count): (Option<Vec<u8>>, i64, String, i64) =
                    redis::from_redis_value_ref(&reply).map_err(|_| bad(&reply))?;
                let now_micros = now.parse().map_err(|_| bad(&reply))?;
                Ok(Answer::Control(ControlReply {
                    stored,
                    expires_in: u64::try_from(pttl).ok().map(Duration::from_millis),
                    now_micros,
                    log_entries: u64::try_from(count).ok(),
                }))
            }
            Call::Mode(_) => Ok(Answer::Mode(reply)),
        }
    }
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
            let result = self.run_script(Call::Check(request)).await;
            unsettled.breaker = None;
            // Only transport trouble counts toward the breaker: a script's error or an
            // unreadable reply concerns this key alone, and the server did answer.
            let transport = result.as_ref().err().map(StoreError::is_transport);
            if let Some(breaker) = &self.breaker {
                match transport {
                    Some(true) => breaker.on_failure(admission),
                    _ => breaker.on_success(admission),
                }
            }
            if let Some(transport) = transport {
                count_error("check", transport);
            }
            match result? {
                Answer::Decision(decision) => Ok(decision),
                other => Err(StoreError::BadReply(format!("{other:?}"))),
            }
        })
    }

    fn check_blocking<'a>(
        &'a self,
        request: CheckRequest<'a>,
        block: super::Block,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.block_call(request, block)
    }

    fn refund<'a>(
        &'a self,
        request: super::RefundRequest<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.refund_call(request)
    }

    fn slots<'a>(
        &'a self,
        request: super::SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<super::SlotReply, StoreError>> {
        self.slots_call(request)
    }

    /// Controls go to Redis even while the circuit breaker is open: an operator's change is
    /// worth a try, and it is bounded by the same timeout.
    fn control<'a>(
        &'a self,
        request: ControlRequest<'a>,
    ) -> BoxFuture<'a, Result<ControlReply, StoreError>> {
        Box::pin(async move {
            let result = match self.run_script(Call::Control(request)).await {
                Ok(Answer::Control(reply)) => Ok(reply),
                Ok(other) => Err(StoreError::BadReply(format!("{other:?}"))),
                Err(error) => Err(error),
            };
            if let Err(error) = &result {
                // Loud: a control that did not run (an ACL without a command the script
                // calls, a server refusing it) leaves an operator's change, or an upstream's
                // Retry-After, without effect on the fleet. Never the key: it may be a secret.
                count_error("control", error.is_transport());
                tracing::error!(
                    %error,
                    algorithm = %request.algorithm,
                    control = ?request.control,
                    "rate limit control failed: nothing was changed in the store"
                );
            }
            result
        })
    }
}

/// The `metrics` feature's counter of failed store calls, `redlimit_store_errors_total`,
/// labelled `call` (`check`, `control`) and `kind` (`transport`: counts toward the breaker;
/// `request`: a script error or an unreadable reply, for that call alone).
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn count_error(call: &'static str, transport: bool) {
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
    admission: Admission,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker {
            breaker.on_abandoned(self.admission);
        }
    }
}

/// Builds a [`RedisStore`]; see [`RedisStore::builder`], [`RedisStore::cluster_builder`] and
/// [`RedisStore::sentinel_builder`].
///
/// Building never connects: only a malformed URL (or TLS settings for a URL without TLS) fails.
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
    target: Result<Target, RedisError>,
    timeout: Duration,
    breaker: Option<CircuitBreaker>,
    credentials: Option<(Option<String>, String)>,
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

/// What the builder connects to.
enum Target {
    Single(Box<ConnectionInfo>),
    Cluster(Vec<ConnectionInfo>),
    Sentinel(SentinelTarget),
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
    fn new(target: Result<Target, RedisError>) -> Self {
        RedisStoreBuilder {
            target,
            timeout: DEFAULT_TIMEOUT,
            breaker: Some(CircuitBreaker::default()),
            credentials: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// The time one call (a script reload included) may take; 100 ms by default. Zero is
    /// refused by [`build`](Self::build): every call would time out and go to the failure
    /// policy.
    ///
    /// ```
    /// use redlimit::store::RedisStore;
    /// use std::time::Duration;
    ///
    /// let error = RedisStore::builder("redis://127.0.0.1:6379")
    ///     .timeout(Duration::ZERO)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(error.kind(), redis::ErrorKind::InvalidClientConfig);
    /// ```
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

    /// Authenticates as the ACL user `username` (`None`: the `default` user) with `password`,
    /// instead of what the URL says (`redis://user:pass@host`). On Cluster it applies to every
    /// node.
    ///
    /// ```
    /// use redlimit::store::RedisStore;
    ///
    /// let password = std::env::var("REDIS_PASSWORD").unwrap_or_default();
    /// let store = RedisStore::builder("redis://127.0.0.1:6379")
    ///     .credentials(Some("limiter"), password)
    ///     .build()?;
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn credentials(mut self, username: Option<&str>, password: impl Into<String>) -> Self {
        self.credentials = Some((username.map(str::to_owned), password.into()));
        self
    }

    /// Trusts the certificate authorities in `pem` (PEM, one or more certificates) for
    /// `rediss://` instead of the system's roots: a private CA.
    ///
    /// ```no_run
    /// use redlimit::store::RedisStore;
    ///
    /// let ca = std::fs::read("/etc/redis/ca.pem")?;
    /// let store = RedisStore::builder("rediss://redis.internal:6380").tls_ca_pem(ca).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_certificates().root_cert = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (both PEM) to the server: mutual TLS
    /// (`tls-auth-clients yes`).
    ///
    /// ```no_run
    /// use redlimit::store::RedisStore;
    ///
    /// let store = RedisStore::builder("rediss://redis.internal:6380")
    ///     .tls_ca_pem(std::fs::read("ca.pem")?)
    ///     .tls_client_cert_pem(std::fs::read("client.pem")?, std::fs::read("client.key")?)
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_cert_pem(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls_certificates().client_tls = Some(redis::ClientTlsConfig {
            client_cert: certificate.into(),
            client_key: key.into(),
        });
        self
    }

    #[cfg(feature = "tls")]
    fn tls_certificates(&mut self) -> &mut redis::TlsCertificates {
        self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        })
    }

    /// Builds the store. Fails only on malformed URLs, TLS settings for a URL without TLS, or a
    /// zero timeout (all of kind [`ErrorKind::InvalidClientConfig`] but the URL's own).
    pub fn build(self) -> Result<RedisStore, RedisError> {
        let timeout = self.timeout;
        if timeout.is_zero() {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "the store timeout must be above zero",
                "with a zero timeout every call times out and goes to the failure policy; \
                 leave the default (100 ms) or give the longest a decision may wait"
                    .to_owned(),
            )));
        }
        let with_credentials = |info: ConnectionInfo| match &self.credentials {
            Some((username, password)) => {
                let mut redis = info.redis_settings().clone().set_password(password);
                if let Some(username) = username {
                    redis = redis.set_username(username);
                }
                info.set_redis_settings(redis)
            }
            None => info,
        };
        let backend = match self.target? {
            Target::Single(info) => {
                let info = with_credentials(*info);
                let addr = match info.addr() {
                    ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
                    ConnectionAddr::TcpTls { host, port, .. } => format!("tls {host}:{port}"),
                    other => other.to_string(),
                };
                #[cfg(feature = "tls")]
                let client = match self.tls {
                    Some(certificates) => {
                        require_tls(&info)?;
                        Client::build_with_tls(info, certificates)?
                    }
                    None => Client::open(info)?,
                };
                #[cfg(not(feature = "tls"))]
                let client = Client::open(info)?;
                Backend::Single {
                    addr,
                    connection: Replaceable::new(Box::new(move || {
                        connect_single(client.clone()).boxed()
                    })),
                }
            }
            Target::Cluster(nodes) => {
                let nodes: Vec<ConnectionInfo> = nodes.into_iter().map(with_credentials).collect();
                let builder = ClusterClient::builder(nodes.clone())
                    .connection_timeout(CONNECT_TIMEOUT)
                    // Never resend a script that may have run: see `invoke_on_cluster`.
                    .retries(0);
                #[cfg(feature = "tls")]
                let builder = match self.tls {
                    Some(certificates) => {
                        nodes.iter().try_for_each(require_tls)?;
                        builder.certs(certificates)
                    }
                    None => builder,
                };
                let client = builder.build()?;
                Backend::Cluster {
                    connection: Replaceable::new(Box::new(move || {
                        let client = client.clone();
                        async move {
                            let mut connection =
                                client.get_async_connection().await.map_err(explain_tls)?;
                            let server = server::inspect(&mut connection).await;
                            Ok((connection, server))
                        }
                        .boxed()
                    })),
                }
            }
            Target::Sentinel(target) => {
                let options = SentinelOptions {
                    credentials: self.credentials.as_ref(),
                    #[cfg(feature = "tls")]
                    tls: self.tls.clone(),
                };
                let client = sentinel::client(&target, options)?;
                #[cfg(feature = "tls")]
                let connect = sentinel::connect(client, &target, self.tls);
                #[cfg(not(feature = "tls"))]
                let connect = sentinel::connect(client, &target);
                Backend::Sentinel {
                    master: target.master,
                    connection: Replaceable::with_stale(connect, stale_server_or_dropped),
                }
            }
        };
        Ok(RedisStore {
            backend: Arc::new(backend),
            timeout,
            breaker: self.breaker.map(|b| Arc::new(BreakerState::new(b))),
            reloads: Arc::default(),
        })
    }
}

/// Opens the single-node connection: a `ConnectionManager` that reconnects by itself.
async fn connect_single(client: Client) -> Result<(ConnectionManager, ServerInfo), RedisError> {
    let config = ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(500))
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        // One timer per call: the store's. (redis-rs would otherwise cut every reply at its
        // own 500 ms default, whatever the store's timeout.)
        .set_response_timeout(None);
    let mut connection = ConnectionManager::new_with_config(client, config)
        .await
        .map_err(explain_tls)?;
    let server = server::inspect(&mut connection).await;
    Ok((connection, server))
}

/// A failed TLS handshake said as such, with what to check (rustls's own words kept).
fn explain_tls(error: RedisError) -> RedisError {
    let text = error.to_string();
    if text.contains("certificate") || text.contains("fatal alert") {
        RedisError::from((
            error.kind(),
            "TLS handshake failed",
            format!(
                "{text} (check that the CA given with tls_ca_pem, or the system's roots, signed \
                 the server's certificate, and the client certificate if the server asks for one)"
            ),
        ))
    } else {
        error
    }
}

/// TLS settings only make sense for a `rediss://` URL.
#[cfg(feature = "tls")]
fn require_tls(info: &ConnectionInfo) -> Result<(), RedisError> {
    match info.addr() {
        ConnectionAddr::TcpTls { .. } => Ok(()),
        _ => Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "TLS certificates were given for a URL without TLS",
            "use rediss:// (or drop the CA and client certificate)".to_owned(),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_timeout_is_refused_at_build_time() {
        for builder in [
            RedisStore::builder("redis://127.0.0.1:6379"),
            RedisStore::cluster_builder(["redis://127.0.0.1:7000"]),
            RedisStore::sentinel_builder(["redis://127.0.0.1:26379"], "mymaster"),
        ] {
            let error = builder.timeout(Duration::ZERO).build().unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidClientConfig);
            assert!(error.to_string().contains("timeout"), "{error}");
        }
        let store = RedisStore::builder("redis://127.0.0.1:6379")
            .timeout(Duration::from_micros(1))
            .build()
            .unwrap();
        assert_eq!(store.timeout(), Duration::from_micros(1));
    }

    #[test]
    fn redirections_name_their_node() {
        let ask = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Ask),
            "An error was signalled by the server",
            "3999 127.0.0.1:7001".to_owned(),
        ));
        let to = Redirect::of(&ask).expect("ASK names a node");
        assert!(to.ask);
        assert_eq!((to.host.as_str(), to.port), ("127.0.0.1", 7001));
        let moved = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Moved),
            "An error was signalled by the server",
            "3999 [::1]:7002".to_owned(),
        ));
        let to = Redirect::of(&moved).expect("MOVED names a node");
        assert!(!to.ask);
        assert_eq!((to.host.as_str(), to.port), ("::1", 7002));
        let other = RedisError::from((ErrorKind::Server(ServerErrorKind::TryAgain), "later"));
        assert!(Redirect::of(&other).is_none());
    }

    #[test]
    fn only_a_refusal_of_several_keys_takes_the_split_form() {
        let several = RedisError::from((
            ErrorKind::Server(ServerErrorKind::TryAgain),
            "An error was signalled by the server",
            "Multiple keys request during rehashing of slot".to_owned(),
        ));
        assert!(is_rehashing(&several));
        let other = RedisError::from((
            ErrorKind::Server(ServerErrorKind::TryAgain),
            "An error was signalled by the server",
            "later".to_owned(),
        ));
        assert!(!is_rehashing(&other));
        let ask = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Ask),
            "An error was signalled by the server",
            "3999 127.0.0.1:7001".to_owned(),
        ));
        assert!(!is_rehashing(&ask));
    }
}
