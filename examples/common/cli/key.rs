//! `--key`: who a client is, as a [`KeyExtractor`] for the layer.

use std::borrow::Cow;

use http::request::Parts;
use redlimit::key::{HeaderKey, KeyExtractor, PeerIp};

use super::KeyChoice;

/// The client's `x-api-key` header (hashed) when it sends one, else its IP address: for a
/// server behind a layer that has authenticated the header (`--key api-key`).
#[derive(Debug, Clone)]
pub struct ApiKeyOrIp {
    api_key: HeaderKey,
    ip: PeerIp,
}

impl ApiKeyOrIp {
    pub fn new() -> Self {
        ApiKeyOrIp {
            api_key: HeaderKey::named("x-api-key").expect("a valid header name"),
            ip: PeerIp::new(),
        }
    }
}

impl KeyExtractor for ApiKeyOrIp {
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        self.api_key
            .extract(parts)
            .or_else(|| self.ip.extract(parts))
    }
}

/// The key `--key` chose.
#[derive(Debug, Clone)]
pub enum ExampleKey {
    /// `--key ip`.
    Ip(PeerIp),
    /// `--key api-key`.
    ApiKey(ApiKeyOrIp),
}

impl ExampleKey {
    pub fn new(choice: KeyChoice) -> Self {
        match choice {
            KeyChoice::Ip => ExampleKey::Ip(PeerIp::new()),
            KeyChoice::ApiKey => ExampleKey::ApiKey(ApiKeyOrIp::new()),
        }
    }
}

impl KeyExtractor for ExampleKey {
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        match self {
            ExampleKey::Ip(ip) => ip.extract(parts),
            ExampleKey::ApiKey(api_key) => api_key.extract(parts),
        }
    }

    // Forwarded: `PeerIp` builds its key on the stack.
    fn with_key<R>(&self, parts: &Parts, f: impl FnOnce(Option<&str>) -> R) -> R
    where
        Self: Sized,
    {
        match self {
            ExampleKey::Ip(ip) => ip.with_key(parts, f),
            ExampleKey::ApiKey(api_key) => api_key.with_key(parts, f),
        }
    }
}
