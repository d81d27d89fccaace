//! TLS at connection time, for every topology: settings refused for a URL without TLS, and a
//! failed handshake said as such.

use redis::RedisError;
#[cfg(feature = "tls")]
use redis::{ConnectionAddr, ConnectionInfo, ErrorKind};

/// A failed TLS handshake said as such, with what to check (rustls's own words kept).
pub(super) fn explain_tls(error: RedisError) -> RedisError {
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
pub(super) fn require_tls(info: &ConnectionInfo) -> Result<(), RedisError> {
    match info.addr() {
        ConnectionAddr::TcpTls { .. } => Ok(()),
        _ => Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "TLS certificates were given for a URL without TLS",
            "use rediss:// (or drop the CA and client certificate)".to_owned(),
        ))),
    }
}
