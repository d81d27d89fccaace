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
//! [`stale_server_or_dropped`]: super::connection::stale_server_or_dropped

use std::sync::Arc;

use futures::future::FutureExt;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, TlsMode,
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
            super::require_tls(info)?;
        }
        builder = builder
            .set_client_to_sentinel_certificates(certificates.clone())
            .set_client_to_redis_certificates(certificates);
    }
    builder.build()
}

/// The store's connection attempt: asks the sentinels for the primary, connects to it.
pub(super) fn connect(client: SentinelClient) -> Connect<MultiplexedConnection> {
    let client = Arc::new(tokio::sync::Mutex::new(client));
    Box::new(move || connect_once(Arc::clone(&client)).boxed())
}

async fn connect_once(
    client: Arc<tokio::sync::Mutex<SentinelClient>>,
) -> Result<(MultiplexedConnection, ServerInfo), RedisError> {
    // Asks the sentinels in turn (up to 3 at once) and checks with `ROLE` that the server named
    // is a primary; redis-rs bounds each of those connections (1 s) and replies (500 ms), and
    // the attempt as a whole is bounded by the store's attempt timeout.
    let primary = client.lock().await.async_get_client().await?;
    let address = primary.get_connection_info().addr().to_string();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        // One timer per call: the store's.
        .set_response_timeout(None);
    let mut connection = primary
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(super::explain_tls)?;
    let server = server::inspect(&mut connection).await;
    tracing::info!(primary = %address, "rate limit store: Sentinel names this primary");
    Ok((connection, server))
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
        let secure = ConnectionAddr::TcpTls {
            host: "127.0.0.1".into(),
            port: 26379,
            insecure: false,
            tls_params: None,
        };
        assert_eq!(tls_mode(&secure), Some(TlsMode::Secure));
        let insecure = ConnectionAddr::TcpTls {
            host: "127.0.0.1".into(),
            port: 26379,
            insecure: true,
            tls_params: None,
        };
        assert_eq!(tls_mode(&insecure), Some(TlsMode::Insecure));
    }
}
