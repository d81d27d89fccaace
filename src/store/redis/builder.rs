//! [`RedisStoreBuilder`]: the address (single node, Cluster, Sentinel), the timeout, the
//! circuit breaker, credentials and TLS; building never connects.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::FutureExt;
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::{Client, ConnectionInfo, RedisError};

use super::batch::Batches;
use super::connection::{stale_server_or_dropped, Replaceable, CONNECT_TIMEOUT};
use super::reload::Reloads;
use super::runtime::StoreRuntime;
use super::sentinel::{self, SentinelOptions, SentinelTarget};
use super::server::{self, ServerInfo};
use super::tls::explain_tls;
#[cfg(feature = "tls")]
use super::tls::require_tls;
use super::{Backend, BuildError, RedisStore, DEFAULT_MAX_BATCH, DEFAULT_TIMEOUT, MAX_BATCH};
use crate::store::breaker::{BreakerState, CircuitBreaker};
use crate::store::failure::failure_log;

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
/// # Ok::<(), redlimit::store::BuildError>(())
/// ```
pub struct RedisStoreBuilder {
    target: Result<Target, RedisError>,
    timeout: Duration,
    breaker: Option<CircuitBreaker>,
    credentials: Option<(Option<String>, String)>,
    max_batch: usize,
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
    /// Where it connects, passwords hidden (`RedisStore`'s description).
    address: String,
}

/// What the builder connects to.
pub(super) enum Target {
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
    pub(super) fn new(target: Result<Target, RedisError>, address: String) -> Self {
        RedisStoreBuilder {
            target,
            timeout: DEFAULT_TIMEOUT,
            breaker: Some(CircuitBreaker::default()),
            credentials: None,
            max_batch: DEFAULT_MAX_BATCH,
            #[cfg(feature = "tls")]
            tls: None,
            address,
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
    /// assert!(matches!(error, redlimit::store::BuildError::ZeroTimeout));
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

    /// The most decisions one script call may carry ([`DEFAULT_MAX_BATCH`] by default; 1 sends
    /// every decision alone; 0 and more than [`MAX_BATCH`] are refused by
    /// [`build`](Self::build) with a [`BuildError`]).
    ///
    /// Decisions are batched only when there is a queue: a decision that finds no call in
    /// flight on its connection (on Cluster: for its slot) goes out alone at once; decisions
    /// that arrive while one is in flight wait, and the next call carries up to this many of
    /// them in one `EVALSHA`, each decided on its own with its own reply (see the
    /// [module docs](crate::store#batching)). A user sees no difference but Redis's cost.
    ///
    /// ```
    /// use redlimit::store::{RedisStore, MAX_BATCH};
    ///
    /// let unbatched = RedisStore::builder("redis://127.0.0.1:6379").max_batch(1).build()?;
    /// assert_eq!(unbatched.max_batch(), 1);
    /// assert!(RedisStore::builder("redis://127.0.0.1:6379").max_batch(0).build().is_err());
    /// let largest = RedisStore::builder("redis://127.0.0.1:6379").max_batch(MAX_BATCH).build()?;
    /// assert_eq!(largest.max_batch(), MAX_BATCH);
    /// assert!(RedisStore::builder("redis://127.0.0.1:6379")
    ///     .max_batch(MAX_BATCH + 1)
    ///     .build()
    ///     .is_err());
    /// # Ok::<(), redlimit::store::BuildError>(())
    /// ```
    pub fn max_batch(mut self, decisions: usize) -> Self {
        self.max_batch = decisions;
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
    /// # Ok::<(), redlimit::store::BuildError>(())
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
    /// zero timeout: see [`BuildError`].
    pub fn build(self) -> Result<RedisStore, BuildError> {
        if self.timeout.is_zero() {
            return Err(BuildError::ZeroTimeout);
        }
        if self.max_batch == 0 {
            return Err(BuildError::ZeroBatch);
        }
        if self.max_batch > MAX_BATCH {
            return Err(BuildError::BatchTooLarge(self.max_batch));
        }
        let mut builder = self;
        let target = std::mem::replace(&mut builder.target, Ok(Target::Cluster(Vec::new())));
        let target = target.map_err(|error| BuildError::InvalidUrl(error.into()))?;
        builder
            .build_on(target)
            .map_err(|error| BuildError::InvalidSettings(error.into()))
    }

    /// [`build`](Self::build) once the URLs are known good.
    fn build_on(self, target: Target) -> Result<RedisStore, RedisError> {
        let timeout = self.timeout;
        let runtime = Arc::new(StoreRuntime::current());
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
        let backend = match target {
            Target::Single(info) => {
                let info = with_credentials(*info);
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
                    connection: Replaceable::with_stale(
                        Box::new(move || connect_single(client.clone()).boxed()),
                        stale_server_or_dropped,
                    )
                    .on(Arc::clone(&runtime)),
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
                    }))
                    .on(Arc::clone(&runtime)),
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
                    connection: Replaceable::with_stale(connect, stale_server_or_dropped)
                        .on(Arc::clone(&runtime)),
                }
            }
        };
        let mut store = RedisStore {
            backend: Arc::new(backend),
            timeout,
            breaker: self
                .breaker
                .map(|b| Arc::new(BreakerState::new(b, timeout))),
            reloads: Arc::new(Reloads::on(Arc::clone(&runtime))),
            batches: Arc::new(Batches::new(self.max_batch)),
            runtime,
            address: self.address.into(),
            breaker_settings: self.breaker,
            failures: Arc::default(),
        };
        // The log its limiters find by its description, so that its answers end their episodes,
        // and its script loads tell their failures through it.
        let (description, failures) = failure_log(&store);
        let cluster = matches!(*store.backend, Backend::Cluster { .. });
        if let Some(reloads) = Arc::get_mut(&mut store.reloads) {
            reloads.failures = Arc::clone(&failures);
            reloads.store = description.into();
            // A quarter of the timeout, then `EVAL`: a master that hangs holds up no call on
            // another (see `Reloads::wait`).
            reloads.wait = cluster.then(|| timeout / 4);
        }
        store.failures = failures;
        Ok(store)
    }
}

/// Opens the single-node connection: a plain multiplexed connection, replaced by the store
/// (on its own runtime) once it proves dropped or stale. (A `ConnectionManager` would reconnect
/// by itself, on the runtime of whichever call met the dropped connection.)
async fn connect_single(client: Client) -> Result<(MultiplexedConnection, ServerInfo), RedisError> {
    server::connect(&client, CONNECT_TIMEOUT).await
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
            assert!(matches!(error, BuildError::ZeroTimeout));
            assert!(error.to_string().contains("timeout"), "{error}");
        }
        let store = RedisStore::builder("redis://127.0.0.1:6379")
            .timeout(Duration::from_micros(1))
            .build()
            .unwrap();
        assert_eq!(store.timeout(), Duration::from_micros(1));
    }
}
