//! [`RedisStore`]: every decision is one Lua script run atomically in Redis.

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, IntoConnectionInfo, RedisError};
use tokio::sync::OnceCell;

use super::{CheckRequest, Store, StoreError};
use crate::algorithm::Reply;
use crate::Decision;

/// The default time a store call may take before it counts as a failure.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// A [`Store`] on Redis: each decision is one `EVALSHA` of the algorithm's script (reloaded by
/// itself after `NOSCRIPT`: a restart, a failover, `SCRIPT FLUSH`).
///
/// The store never waits for Redis to come up: it can be created while Redis is down, connects on
/// first use, reconnects by itself after a failure, and bounds every call by a timeout (100 ms by
/// default) so a hung Redis never hangs a request. Clones share the connection.
///
/// ```no_run
/// use redlimit::store::RedisStore;
/// use std::time::Duration;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(50))
///     .build()?;
/// # Ok::<(), redis::RedisError>(())
/// ```
#[derive(Clone)]
pub struct RedisStore {
    client: Client,
    connection: std::sync::Arc<OnceCell<ConnectionManager>>,
    timeout: Duration,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("addr", &self.client.get_connection_info().addr())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on the Redis at `url` with the default timeout. Fails only on a malformed URL;
    /// Redis itself may be down.
    pub fn new<T: IntoConnectionInfo>(url: T) -> Result<Self, RedisError> {
        Self::builder(url).build()
    }

    /// Starts a builder for a store on the Redis at `url`.
    pub fn builder<T: IntoConnectionInfo>(url: T) -> RedisStoreBuilder {
        RedisStoreBuilder {
            client: Client::open(url),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The time a call may take before it counts as a failure.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The shared connection, created on first use (it needs a running Tokio runtime). Creating
    /// it does not wait for Redis: the manager connects lazily and reconnects after failures.
    async fn connection(&self) -> Result<ConnectionManager, RedisError> {
        self.connection
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(500))
                    .set_connection_timeout(Some(Duration::from_secs(1)));
                ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            })
            .await
            .cloned()
    }

    async fn run_script(&self, request: CheckRequest<'_>) -> Result<Decision, StoreError> {
        let mut connection = self.connection().await?;
        let quota = request.quota;
        let mut invocation = request.algorithm.script().prepare_invoke();
        for key in request.algorithm.redis_keys(request.key) {
            invocation.key(key);
        }
        match request.now_micros {
            Some(now) => invocation.arg(now),
            None => invocation.arg(""),
        };
        invocation
            .arg(request.cost)
            .arg(quota.limit())
            .arg(quota.period_micros())
            .arg(quota.burst());
        let values: Vec<i64> = invocation.invoke_async(&mut connection).await?;
        Reply::from_redis(&values)
            .map(Reply::into_decision)
            .ok_or_else(|| StoreError::BadReply(format!("{values:?}")))
    }
}

impl Store for RedisStore {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            match tokio::time::timeout(self.timeout, self.run_script(request)).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::Timeout(self.timeout)),
            }
        })
    }
}

/// Builds a [`RedisStore`]; see [`RedisStore::builder`].
#[derive(Debug)]
pub struct RedisStoreBuilder {
    client: Result<Client, RedisError>,
    timeout: Duration,
}

impl RedisStoreBuilder {
    /// The time one call (including a script reload) may take; 100 ms by default.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Builds the store. Fails only on a malformed URL.
    pub fn build(self) -> Result<RedisStore, RedisError> {
        Ok(RedisStore {
            client: self.client?,
            connection: Default::default(),
            timeout: self.timeout,
        })
    }
}
