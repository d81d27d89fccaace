//! [`ServerInfo`]: what the store learns about Redis on each new connection, and the version
//! check.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, RedisError, RedisResult, Value};

use super::tls::explain_tls;

/// The oldest Redis the scripts run on: they call `TIME` before writing, which Redis allows
/// (replicating the script's effects) by default since 5.0.
pub const MIN_REDIS_VERSION: (u32, u32) = (5, 0);

/// What [`RedisStore::verify`](super::RedisStore::verify) found: the server the store talks to.
///
/// ```
/// use redlimit::store::ServerInfo;
///
/// let info = ServerInfo::default();
/// assert_eq!(info.version, None); // not known until a connection is made
/// assert_eq!(info.to_string(), "Redis (version unknown)");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// The Redis version, e.g. `"7.0.15"` (on Cluster, of one node); `None` if the server would
    /// not say (neither `HELLO` nor `INFO server` allowed to the user).
    pub version: Option<String>,
}

impl fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.version {
            Some(version) => write!(f, "Redis {version}"),
            None => f.write_str("Redis (version unknown)"),
        }
    }
}

/// Opens a multiplexed connection to the one server `client` names, within `connect_timeout`,
/// and [`inspect`]s it: the single node's, or the primary Sentinel names.
pub(super) async fn connect(
    client: &Client,
    connect_timeout: Duration,
) -> Result<(MultiplexedConnection, ServerInfo), RedisError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        // One timer per call: the store's. (redis-rs would otherwise cut every reply at its
        // own 500 ms default, whatever the store's timeout.)
        .set_response_timeout(None);
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(explain_tls)?;
    let server = inspect(&mut connection).await;
    Ok((connection, server))
}

/// Asks the server its version (`HELLO`, or `INFO server` on Redis before 6) and logs an error
/// when it is older than [`MIN_REDIS_VERSION`]. Never fails: a server that will not say is
/// used as it is.
pub(super) async fn inspect(connection: &mut impl ConnectionLike) -> ServerInfo {
    let version = match hello_version(connection).await {
        Ok(Some(version)) => Some(version),
        _ => info_version(connection).await.ok().flatten(),
    };
    let info = ServerInfo { version };
    match &info.version {
        Some(version) if !is_supported(version) => tracing::error!(
            version = %version,
            minimum = %format!("{}.{}", MIN_REDIS_VERSION.0, MIN_REDIS_VERSION.1),
            "Redis is too old for redlimit's scripts: every call will fail; upgrade Redis"
        ),
        Some(_) => {}
        None => tracing::debug!("Redis did not tell its version"),
    }
    info
}

async fn hello_version(connection: &mut impl ConnectionLike) -> RedisResult<Option<String>> {
    // `HELLO` without a protocol version only describes the connection (Redis 6 and later; on
    // Cluster it goes to one node).
    let reply: Value = redis::cmd("HELLO").query_async(connection).await?;
    let pairs: Vec<(String, Value)> = match reply {
        Value::Map(pairs) => pairs
            .into_iter()
            .filter_map(|(k, v)| redis::from_redis_value::<String>(k).ok().map(|k| (k, v)))
            .collect(),
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|kv| {
                let key = redis::from_redis_value::<String>(kv[0].clone()).ok()?;
                Some((key, kv[1].clone()))
            })
            .collect(),
        _ => Vec::new(),
    };
    Ok(pairs
        .into_iter()
        .find(|(key, _)| key == "version")
        .and_then(|(_, value)| redis::from_redis_value::<String>(value).ok()))
}

/// `INFO server` for Redis before 6 (single node: on Cluster every node answers, and a version
/// that old is not looked for there).
async fn info_version(connection: &mut impl ConnectionLike) -> RedisResult<Option<String>> {
    let text: String = redis::cmd("INFO")
        .arg("server")
        .query_async(connection)
        .await?;
    Ok(text.lines().find_map(|line| {
        line.trim_end()
            .strip_prefix("redis_version:")
            .map(str::to_owned)
    }))
}

/// Whether `version` (`"7.0.15"`) is at least [`MIN_REDIS_VERSION`]; an unparsable one is
/// given the benefit of the doubt.
pub(super) fn is_supported(version: &str) -> bool {
    let mut parts = version.split('.').map(|part| part.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= MIN_REDIS_VERSION,
        (Some(Ok(major)), None) => major >= MIN_REDIS_VERSION.0,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_5_0_are_supported() {
        assert!(is_supported("7.0.15"));
        assert!(is_supported("5.0.0"));
        assert!(is_supported("6.2.14"));
        assert!(is_supported("10.0.1"));
        assert!(!is_supported("4.0.14"));
        assert!(!is_supported("3.2.12"));
        assert!(is_supported("unstable"));
    }
}
