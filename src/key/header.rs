use std::borrow::Cow;
use std::fmt;

use http::header::HeaderName;
use http::request::Parts;

use super::{push_sha256_hex, KeyExtractor};

/// The value of a request header (an API key, a bearer token), **hashed** with SHA-256 before it
/// reaches Redis, logs or traces.
///
/// The hash can be keyed with a secret the whole fleet shares ([`HeaderKey::with_secret`]), so
/// that someone who reads Redis cannot test guesses of API keys against it. Never use a random
/// per-process secret: instances would count the same client under different keys.
///
/// Any byte sequence works, including non-UTF-8 values. A request without the header has no key.
///
/// ```
/// use redlimit::key::{HeaderKey, KeyExtractor};
///
/// let extractor = HeaderKey::named("x-api-key")?.with_secret(b"fleet-wide secret".to_vec());
/// let (parts, _) = http::Request::builder()
///     .header("x-api-key", "k-123")
///     .body(())
///     .unwrap()
///     .into_parts();
/// let key = extractor.extract(&parts).unwrap();
/// assert!(key.starts_with("x-api-key:") && !key.contains("k-123"));
/// # Ok::<(), http::header::InvalidHeaderName>(())
/// ```
#[derive(Clone)]
pub struct HeaderKey {
    name: HeaderName,
    secret: Option<Vec<u8>>,
}

impl HeaderKey {
    /// The value of header `name`, hashed.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name, secret: None }
    }

    /// The value of the header called `name` (case-insensitive), hashed.
    pub fn named(name: &str) -> Result<Self, http::header::InvalidHeaderName> {
        Ok(Self::new(HeaderName::try_from(name)?))
    }

    /// Keys the hash with a secret shared by the whole fleet.
    ///
    /// ```
    /// use redlimit::key::{HeaderKey, KeyExtractor};
    ///
    /// let (parts, _) = http::Request::builder()
    ///     .header("authorization", "Bearer t0ken")
    ///     .body(())
    ///     .unwrap()
    ///     .into_parts();
    /// let instance_a = HeaderKey::named("authorization")?.with_secret("s3cret");
    /// let instance_b = HeaderKey::named("authorization")?.with_secret("s3cret");
    /// let plain = HeaderKey::named("authorization")?;
    /// // The same secret on every instance: the same key for the same client.
    /// assert_eq!(instance_a.extract(&parts), instance_b.extract(&parts));
    /// assert_ne!(instance_a.extract(&parts), plain.extract(&parts));
    /// # Ok::<(), http::header::InvalidHeaderName>(())
    /// ```
    pub fn with_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(secret.into());
        self
    }
}

impl fmt::Debug for HeaderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeaderKey")
            .field("name", &self.name)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl KeyExtractor for HeaderKey {
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        let value = parts.headers.get(&self.name)?;
        // 32 hex digits (128 bits) are plenty to tell clients apart, and keep keys short.
        // Built in one `String` of the exact size: one allocation per request.
        const DIGITS: usize = 32;
        let name = self.name.as_str();
        let mut key = String::with_capacity(name.len() + 1 + DIGITS);
        key.push_str(name);
        key.push(':');
        push_sha256_hex(&mut key, self.secret.as_deref(), value.as_bytes(), DIGITS);
        Some(key.into())
    }

    fn missing_key_hint(&self) -> &'static str {
        "the requests lack the HeaderKey's header"
    }
}
