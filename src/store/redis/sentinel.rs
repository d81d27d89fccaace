//! Redis Sentinel: the store asks the sentinels which server is the primary, connects to it,
//! and asks again whenever that connection proves stale (see [`stale_server_or_dropped`]).
//!
//! redis-rs 1.8 has no self-reconnecting connection for Sentinel (its `ConnectionManager`
//! reconnects to one fixed address), so the store's own background connection does it: each
//! connection attempt resolves the primary through [`SentinelClient`] (which also checks with
//! `ROLE` that the server it names is a primary) and opens a plain multiplexed connection to it.
//! A connection that is dropped (the primary died), answers `READONLY`/`MASTERDOWN` (it was
//! demoted) or times out 3 times in a row is thrown away, and the next attempt asks the
//! sentinels again, so the store follows a failover without a restart.
//!
//! A primary that stays up through a failover (`SENTINEL FAILOVER`, or one cut off from the
//! sentinels but not from this process) keeps taking writes until Sentinel demotes it, which
//! can take it several seconds. So while a connection is open, a watcher asks a sentinel once a
//! second which server is the primary (`SENTINEL GET-MASTER-ADDR-BY-NAME`); when it names
//! another one, the connection's calls fail (nothing is sent) and it is replaced.
//!
//! [`stale_server_or_dropped`]: super::connection::stale_server_or_dropped

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::FutureExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline,
    RedisError, RedisFuture, TlsMode, Value,
};

use super::connection::{Connect, CONNECT_TIMEOUT};
use super::server::{self, ServerInfo};

/// What the builder needs to reach the primary through Sentinel.
pub(super) struct SentinelTarget {
    /// The sentinels, as their URLs said (their own credentials included).
    pub(super) sentinels: Vec<ConnectionInfo>,
    /// The name the sentinels monitor the primary under (`sentinel monitor <name> ...`).
    pub(super) master: String,
}

/// The credentials and TLS settings the builder applies.
pub(super) struct SentinelOptions<'a> {
    /// The ACL user (`None`: `default`) and password on the primary.
    pub(super) credentials: Option<&'a (Option<String>, String)>,
    /// A private CA and client certificate, for the sentinels and the primary alike.
    #[cfg(feature = "tls")]
    pub(super) tls: Option<redis::TlsCertificates>,
}

/// The redis-rs client that resolves the primary. The sentinels' credentials come from their
/// URLs (one user and password for all of them, as a Sentinel deployment has); the primary's
/// from the builder's `credentials`. With `rediss://` sentinels the primary is reached over TLS
/// too, with the same certificates.
pub(super) fn client(
    target: &SentinelTarget,
    options: SentinelOptions<'_>,
) -> Result<SentinelClient, RedisError> {
    let Some(first) = target.sentinels.first() else {
        return Err(invalid(
            "no sentinel given",
            "give the URL of at least one sentinel".to_owned(),
        ));
    };
    let (username, password) = (
        first.redis_settings().username(),
        first.redis_settings().password(),
    );
    if target.sentinels.iter().any(|info| {
        info.redis_settings().username() != username || info.redis_settings().password() != password
    }) {
        return Err(invalid(
            "the sentinel URLs carry different credentials",
            "give every sentinel the same user and password".to_owned(),
        ));
    }
    let tls = tls_mode(first.addr());
    if target
        .sentinels
        .iter()
        .any(|info| tls_mode(info.addr()) != tls)
    {
        return Err(invalid(
            "the sentinel URLs mix redis:// and rediss://",
            "use rediss:// for every sentinel or for none".to_owned(),
        ));
    }
    if target.master.is_empty() {
        return Err(invalid(
            "empty Sentinel master name",
            "give the name of `sentinel monitor <name> ...`".to_owned(),
        ));
    }

    let addrs = target.sentinels.iter().map(|info| info.addr().clone());
    let mut builder =
        SentinelClientBuilder::new(addrs, &target.master, SentinelServerType::Master)?;
    if let Some(username) = username {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(mode) = tls {
        builder = builder.set_client_to_redis_tls_mode(mode);
    }
    if let Some((username, password)) = options.credentials {
        if let Some(username) = username {
            builder = builder.set_client_to_redis_username(username);
        }
        builder = builder.set_client_to_redis_password(password);
    }
    #[cfg(feature = "tls")]
    if let Some(certificates) = options.tls {
        for info in &target.sentinels {
            super::tls::require_tls(info)?;
        }
        builder = builder
            .set_client_to_sentinel_certificates(certificates.clone())
            .set_client_to_redis_certificates(certificates);
    }
    builder.build()
}

/// How often the watcher of an open connection asks a sentinel which server is the primary.
const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// The connection to the primary; its calls fail without sending anything once the sentinels
/// name another primary (see the module docs).
#[derive(Clone)]
pub(super) struct PrimaryConnection {
    connection: MultiplexedConnection,
    moved: Arc<AtomicBool>,
}

impl PrimaryConnection {
    fn moved_error() -> RedisError {
        // An I/O error of its own: the store takes the connection for dropped and replaces it.
        RedisError::from((
            ErrorKind::Io,
            "Sentinel names another primary",
            "reconnecting".to_owned(),
        ))
    }
}

impl ConnectionLike for PrimaryConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if self.moved.load(Ordering::Relaxed) {
            return Box::pin(async { Err(Self::moved_error()) });
        }
        self.connection.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        if self.moved.load(Ordering::Relaxed) {
            return Box::pin(async { Err(Self::moved_error()) });
        }
        self.connection.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.connection.get_db()
    }
}

/// What the watcher needs to ask a sentinel on its own connection.
struct Watch {
    sentinels: Vec<ConnectionInfo>,
    master: String,
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

/// The store's connection attempt: asks the sentinels for the primary, connects to it, and
/// watches that the sentinels keep naming it.
pub(super) fn connect(
    client: SentinelClient,
    target: &SentinelTarget,
    #[cfg(feature = "tls")] tls: Option<redis::TlsCertificates>,
) -> Connect<PrimaryConnection> {
    let client = Arc::new(tokio::sync::Mutex::new(client));
    let watch = Arc::new(Watch {
        sentinels: target.sentinels.clone(),
        master: target.master.clone(),
        #[cfg(feature = "tls")]
        tls,
    });
    Box::new(move || connect_once(Arc::clone(&client), Arc::clone(&watch)).boxed())
}

async fn connect_once(
    client: Arc<tokio::sync::Mutex<SentinelClient>>,
    watch: Arc<Watch>,
) -> Result<(PrimaryConnection, ServerInfo), RedisError> {
    // Asks the sentinels in turn (up to 3 at once) and checks with `ROLE` that the server named
    // is a primary; redis-rs bounds each of those connections (1 s) and replies (500 ms), and
    // the attempt as a whole is bounded by the store's attempt timeout.
    let primary = client.lock().await.async_get_client().await?;
    let address = primary.get_connection_info().addr().to_string();
    let (connection, server) = server::connect(&primary, CONNECT_TIMEOUT).await?;
    tracing::info!(primary = %address, "rate limit store: Sentinel names this primary");
    let moved = Arc::new(AtomicBool::new(false));
    if let Some(named) = host_port(primary.get_connection_info().addr()) {
        tokio::spawn(watch_primary(watch, named, Arc::downgrade(&moved)));
    }
    Ok((PrimaryConnection { connection, moved }, server))
}

/// Asks a sentinel every [`WATCH_PERIOD`] which server is the primary; sets `moved` when it
/// names another than `primary`. Ends then, or once the connection is gone.
async fn watch_primary(watch: Arc<Watch>, primary: (String, u16), moved: Weak<AtomicBool>) {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(WATCH_PERIOD));
    let mut sentinel: Option<MultiplexedConnection> = None;
    let mut next = 0;
    loop {
        tokio::time::sleep(WATCH_PERIOD).await;
        let Some(flag) = moved.upgrade() else {
            return; // the connection was replaced
        };
        if sentinel.is_none() {
            let info = watch.sentinels[next % watch.sentinels.len()].clone();
            next += 1;
            #[cfg(feature = "tls")]
            let client = match &watch.tls {
                Some(certificates) => Client::build_with_tls(info, certificates.clone()),
                None => Client::open(info),
            };
            #[cfg(not(feature = "tls"))]
            let client = Client::open(info);
            sentinel = match client {
                Ok(client) => client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .ok(),
                Err(_) => None,
            };
        }
        let Some(connection) = sentinel.as_mut() else {
            continue;
        };
        let named: Result<Option<(String, u16)>, RedisError> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&watch.master)
            .query_async(connection)
            .await;
        match named {
            Ok(Some(named)) if named != primary => {
                tracing::warn!(
                    old = %format!("{}:{}", primary.0, primary.1),
                    new = %format!("{}:{}", named.0, named.1),
                    "rate limit store: Sentinel names another primary; reconnecting"
                );
                flag.store(true, Ordering::Relaxed);
                return;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(%error, "rate limit store: cannot ask a sentinel; trying the next");
                sentinel = None;
            }
        }
    }
}

/// The host and port of a TCP address, as the sentinels name servers.
fn host_port(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}

/// TLS to the sentinels, as their address says, is TLS to the primary too.
fn tls_mode(addr: &ConnectionAddr) -> Option<TlsMode> {
    match addr {
        ConnectionAddr::TcpTls { insecure: true, .. } => Some(TlsMode::Insecure),
        ConnectionAddr::TcpTls { .. } => Some(TlsMode::Secure),
        _ => None,
    }
}

fn invalid(what: &'static str, detail: String) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, what, detail))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::IntoConnectionInfo;

    fn target(urls: &[&str], master: &str) -> SentinelTarget {
        SentinelTarget {
            sentinels: urls
                .iter()
                .map(|url| url.into_connection_info().unwrap())
                .collect(),
            master: master.to_owned(),
        }
    }

    fn build(urls: &[&str], master: &str) -> Result<(), RedisError> {
        let options = SentinelOptions {
            credentials: None,
            #[cfg(feature = "tls")]
            tls: None,
        };
        client(&target(urls, master), options).map(|_| ())
    }

    #[test]
    fn bad_sentinel_settings_are_clear_errors() {
        let error = build(&[], "mymaster").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidClientConfig);
        assert!(error.to_string().contains("no sentinel given"), "{error}");

        let error = build(&["redis://127.0.0.1:26379"], "").unwrap_err();
        assert!(error.to_string().contains("master name"), "{error}");

        let error = build(
            &["redis://:a@127.0.0.1:26379", "redis://:b@127.0.0.1:26380"],
            "mymaster",
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("different credentials"),
            "{error}"
        );
        assert!(
            !error.to_string().contains(":a@"),
            "no password shown: {error}"
        );

        assert!(build(
            &["redis://:a@127.0.0.1:26379", "redis://:a@127.0.0.1:26380"],
            "mymaster"
        )
        .is_ok());
    }

    #[test]
    fn tls_to_the_sentinels_is_tls_to_the_primary() {
        let plain = "redis://127.0.0.1:26379".into_connection_info().unwrap();
        assert_eq!(tls_mode(plain.addr()), None);
        for (insecure, mode) in [(false, TlsMode::Secure), (true, TlsMode::Insecure)] {
            let tls = ConnectionAddr::TcpTls {
                host: "127.0.0.1".into(),
                port: 26379,
                insecure,
                tls_params: None,
            };
            assert_eq!(tls_mode(&tls), Some(mode));
        }
    }
}
