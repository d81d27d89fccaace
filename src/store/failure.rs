//! [`RedisFailure`]: what went wrong talking to Redis, without redis-rs's types in the API.

use std::fmt;

use ::redis::{ErrorKind, RedisError, ServerErrorKind};

/// Redis answered with an error, or the connection to it failed: the payload of
/// [`StoreError::Redis`](super::StoreError::Redis).
///
/// Opaque, so the crate's public API does not change with its Redis client's. Its `Display`
/// is the client's message; [`code`](Self::code) gives the server's error code when there is
/// one, and [`StoreError::is_transport`](super::StoreError::is_transport) says whether it
/// concerns the whole store or one request.
#[derive(Debug, Clone)]
pub struct RedisFailure(RedisError);

impl RedisFailure {
    pub(crate) fn new(error: RedisError) -> Self {
        RedisFailure(error)
    }

    /// The client's error, for the store's own retry and reconnect decisions.
    pub(crate) fn inner(&self) -> &RedisError {
        &self.0
    }

    /// The server's error code, e.g. `NOPERM`, `BUSY`, `WRONGPASS` or `ERR` (a script's error
    /// reply); `None` when the failure is not a server's reply (I/O, a refused connection).
    pub fn code(&self) -> Option<&str> {
        self.0.code()
    }

    /// The server's or the client's message without the code, when there is one.
    pub fn detail(&self) -> Option<&str> {
        self.0.detail()
    }

    /// Whether the call timed out at the connection (not the store's own timeout, which is
    /// [`StoreError::Timeout`](super::StoreError::Timeout)).
    pub fn is_timeout(&self) -> bool {
        self.0.is_timeout()
    }

    /// See [`StoreError::is_transport`](super::StoreError::is_transport).
    pub(crate) fn is_transport(&self) -> bool {
        let error = &self.0;
        error.is_io_error()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_timeout()
            || matches!(
                error.kind(),
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                ) | ErrorKind::ClusterConnectionNotFound
            )
            // A script running past `busy-reply-threshold` (no kind of its own).
            || error.code() == Some("BUSY")
    }
}

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for RedisFailure {
    /// The client error's own cause (an I/O or TLS error, the server's reply).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::StoreError;

    #[test]
    fn a_failure_reads_like_the_clients_error_and_gives_the_servers_code() {
        let error = ::redis::make_extension_error(
            "NOPERM".to_owned(),
            Some("this user has no permissions to access one of the keys".to_owned()),
        );
        let failure = RedisFailure::new(error.clone());
        assert_eq!(failure.to_string(), error.to_string());
        assert_eq!(failure.code(), Some("NOPERM"));
        assert_eq!(failure.detail(), error.detail());
        let io = RedisFailure::new(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(io.code(), None);
        let store = StoreError::Redis(failure);
        let source = std::error::Error::source(&store).expect("a source");
        assert_eq!(source.to_string(), error.to_string());
    }
}
