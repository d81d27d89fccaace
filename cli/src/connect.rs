//! Where the limiters' Redis is and how to reach it: the store the commands control it through,
//! and the `SCAN` of every node that holds keys (the store runs only its scripts, and a `SCAN`
//! sent to one node sees only that node's keys).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, TlsMode};
use redlimit::store::{RedisStore, RedisStoreBuilder};

use crate::cluster::{self, Coverage};
use crate::urls::{redacted, shown_list};
use crate::Failure;

/// The limiters' Redis, as the command line names it.
#[derive(Debug)]
pub enum Redis {
    Single(String),
    /// Any of the cluster's nodes, not necessarily its masters.
    Cluster(Vec<String>),
    /// The sentinels and the name they monitor the primary under.
    Sentinel {
        sentinels: Vec<String>,
        service: String,
    },
}

/// A private CA and a client certificate for `rediss://`, all PEM.
#[derive(Debug, Default)]
pub struct Tls {
    pub ca: Option<Vec<u8>>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

/// The Redis and the settings every connection to it takes.
pub struct Connection {
    pub redis: Redis,
    /// The password of `--password-file`, for the URL's user (or `default`).
    pub password: Option<String>,
    pub tls: Option<Tls>,
}

/// Each call of a `SCAN` looks at this many keys, so Redis is never blocked for long.
const SCAN_COUNT: u32 = 1000;

/// How long one call to Redis may take. Not the store's default (100 ms, for a service's
/// request path): an operator may be a slow link away, and a control that timed out may still
/// have been applied. Still a bound: a stalled Redis fails the command rather than hangs it.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

impl Connection {
    /// The URLs without passwords, for messages.
    pub fn shown(&self) -> String {
        match &self.redis {
            Redis::Single(url) => redacted(url),
            Redis::Cluster(urls) => shown_list(urls),
            Redis::Sentinel { sentinels, service } => {
                format!("{} (service {service})", shown_list(sentinels))
            }
        }
    }

    /// The store the limiters use on this Redis.
    pub fn store(&self) -> Result<RedisStore, Failure> {
        let builder = match &self.redis {
            Redis::Single(url) => RedisStore::builder(url.as_str()),
            Redis::Cluster(urls) => RedisStore::cluster_builder(urls.iter().map(String::as_str)),
            Redis::Sentinel { sentinels, service } => {
                RedisStore::sentinel_builder(sentinels.iter().map(String::as_str), service)
            }
        };
        let builder = match &self.password {
            Some(password) => builder.credentials(self.username().as_deref(), password),
            None => builder,
        };
        with_tls(builder, self.tls.as_ref())
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| Failure::Input(format!("invalid Redis settings {}: {e}", self.shown())))
    }

    /// The user the first URL names (a password file is that user's password).
    fn username(&self) -> Option<String> {
        let url = match &self.redis {
            Redis::Single(url) => url,
            Redis::Cluster(urls) => urls.first()?,
            // The sentinels' URLs carry the sentinels' user, not the primary's.
            Redis::Sentinel { .. } => return None,
        };
        let info = url.as_str().into_connection_info().ok()?;
        info.redis_settings().username().map(str::to_owned)
    }

    /// `info` with the password file's password and the TLS settings: a plain client.
    fn client(&self, info: ConnectionInfo) -> Result<redis::Client, redis::RedisError> {
        let info = match &self.password {
            Some(password) => {
                let settings = info.redis_settings().clone().set_password(password);
                info.set_redis_settings(settings)
            }
            None => info,
        };
        match self.tls.as_ref() {
            Some(tls) => redis::Client::build_with_tls(info, certificates(tls)),
            None => redis::Client::open(info),
        }
    }

    /// The keys matching `pattern` on every node that holds keys, by a bounded `SCAN` of each.
    /// On a Cluster every slot must have been read: a master that cannot be (down, flagged
    /// `fail?` or `fail`, refusing) fails the scan, naming it and its slots, rather than
    /// leaving its keys out of an answer that would look complete.
    pub async fn scan(&self, pattern: &str) -> Result<Vec<String>, String> {
        let mut keys = match &self.redis {
            Redis::Single(url) => {
                let info = url.as_str().into_connection_info();
                let client = info.and_then(|info| self.client(info));
                let connection = connect(client).await.map_err(|e| e.to_string())?;
                scan_node(connection, pattern).await?
            }
            Redis::Sentinel { sentinels, service } => {
                scan_node(self.primary(sentinels, service).await?, pattern).await?
            }
            Redis::Cluster(urls) => self.scan_cluster(urls, pattern).await?,
        };
        // SCAN may return a key more than once.
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// [`scan`](Self::scan) of every master of the cluster, from `CLUSTER NODES` asked of the
    /// first given node that answers; an error unless the masters read serve every slot.
    async fn scan_cluster(&self, urls: &[String], pattern: &str) -> Result<Vec<String>, String> {
        let mut last_error = String::from("no node given");
        for url in urls {
            let info = url.as_str().into_connection_info();
            let seed = match info.and_then(|info| self.client(info)) {
                Ok(seed) => seed,
                Err(e) => return Err(e.to_string()),
            };
            let nodes: String = match seed.get_multiplexed_async_connection().await {
                Ok(mut connection) => match redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut connection)
                    .await
                {
                    Ok(nodes) => nodes,
                    Err(e) => {
                        last_error = format!("CLUSTER NODES at {}: {e}", redacted(url));
                        continue;
                    }
                },
                Err(e) => {
                    last_error = format!("{}: {e}", redacted(url));
                    continue;
                }
            };
            let info = seed.get_connection_info();
            let (mut keys, mut coverage) = (Vec::new(), Coverage::new());
            for master in cluster::masters(&nodes) {
                // The given node's credentials and TLS settings, the master's address.
                let host = master.host.clone();
                let addr = match info.addr() {
                    ConnectionAddr::TcpTls {
                        host: given,
                        insecure,
                        tls_params,
                        ..
                    } => ConnectionAddr::TcpTls {
                        host: host.unwrap_or_else(|| given.clone()),
                        port: master.port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    ConnectionAddr::Tcp(given, _) => {
                        ConnectionAddr::Tcp(host.unwrap_or_else(|| given.clone()), master.port)
                    }
                    other => return Err(format!("a cluster node at {other}: not TCP")),
                };
                let address = addr.to_string();
                let client = self.client(info.clone().set_addr(addr));
                let scanned = match connect(client).await {
                    Ok(connection) => scan_node(connection, pattern).await,
                    Err(e) => Err(e.to_string()),
                };
                match scanned {
                    Ok(found) => {
                        keys.extend(found);
                        coverage.read(&master);
                    }
                    Err(e) => coverage.unread(&master, &address, &e),
                }
            }
            return match coverage.missing() {
                None => Ok(keys),
                Some(missing) => Err(missing),
            };
        }
        Err(format!("no node of the cluster answers: {last_error}"))
    }

    /// A connection to the primary the sentinels name.
    async fn primary(
        &self,
        sentinels: &[String],
        service: &str,
    ) -> Result<MultiplexedConnection, String> {
        let infos = sentinels
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let first = infos.first().ok_or("no sentinel given")?;
        let settings = first.redis_settings();
        let tls_mode = match first.addr() {
            ConnectionAddr::TcpTls { insecure: true, .. } => Some(TlsMode::Insecure),
            ConnectionAddr::TcpTls { .. } => Some(TlsMode::Secure),
            _ => None,
        };
        let addrs = infos.iter().map(|info| info.addr().clone());
        let mut builder = SentinelClientBuilder::new(addrs, service, SentinelServerType::Master)
            .map_err(|e| e.to_string())?;
        if let Some(username) = settings.username() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(mode) = tls_mode {
            builder = builder
                .set_client_to_sentinel_tls_mode(mode)
                .set_client_to_redis_tls_mode(mode);
        }
        if let Some(password) = &self.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(tls) = &self.tls {
            builder = builder
                .set_client_to_sentinel_certificates(certificates(tls))
                .set_client_to_redis_certificates(certificates(tls));
        }
        let mut client = builder.build().map_err(|e| e.to_string())?;
        client
            .get_async_connection()
            .await
            .map_err(|e| e.to_string())
    }
}

async fn connect(
    client: Result<redis::Client, redis::RedisError>,
) -> Result<MultiplexedConnection, redis::RedisError> {
    client?.get_multiplexed_async_connection().await
}

/// The keys matching `pattern` on the node of `connection`, by a bounded `SCAN` to its end.
async fn scan_node(
    mut connection: MultiplexedConnection,
    pattern: &str,
) -> Result<Vec<String>, String> {
    let (mut keys, mut cursor) = (Vec::new(), 0u64);
    loop {
        // Raw names: one that is not UTF-8 is not the limiter's (its keys are text), and must
        // not stop the scan.
        let (next, found): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(&mut connection)
            .await
            .map_err(|e| e.to_string())?;
        keys.extend(
            found
                .into_iter()
                .filter_map(|key| String::from_utf8(key).ok()),
        );
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

fn certificates(tls: &Tls) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    }
}

fn with_tls(builder: RedisStoreBuilder, tls: Option<&Tls>) -> RedisStoreBuilder {
    let Some(tls) = tls else {
        return builder;
    };
    let builder = match &tls.ca {
        Some(ca) => builder.tls_ca_pem(ca.clone()),
        None => builder,
    };
    match &tls.client {
        Some((cert, key)) => builder.tls_client_cert_pem(cert.clone(), key.clone()),
        None => builder,
    }
}
