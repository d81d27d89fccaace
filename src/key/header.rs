use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex};

use http::header::HeaderName;
use http::request::Parts;

use super::{fingerprint, write_sha256_hex, KeyExtractor};

/// 32 hex digits (128 bits) are plenty to tell clients apart, and keep keys short.
const DIGITS: usize = 32;
/// The longest key built on the stack: `<name>:<digits>` for names up to 95 bytes.
const STACK_KEY: usize = 128;

/// Slots of the cache of recent values' hashes.
const RECENT: usize = 64;

/// Values longer than this are hashed every time (an API key or a token is far shorter).
const RECENT_MAX_VALUE: usize = 256;

/// The value of a request header (an API key, a bearer token), **hashed** with SHA-256 before it
/// reaches Redis, logs or traces.
///
/// The hash can be keyed with a secret the whole fleet shares ([`HeaderKey::with_secret`]), so
/// that someone who reads Redis cannot test guesses of API keys against it. Never use a random
/// per-process secret: instances would count the same client under different keys.
///
/// Any byte sequence works, including non-UTF-8 values. A request without the header has no key.
/// The extractor (and its clones) remembers the hashes of up to 64 recently seen values, in
/// this process only, so a busy client's value is hashed once rather than on every request.
///
/// **A header key limits only what has been authenticated.** The client chooses its headers:
/// keyed on an unchecked `x-api-key`, a client sending a fresh value with every request gets a
/// fresh quota every time, and the limit holds nobody. Use `HeaderKey` behind a layer that
/// rejects unknown keys, or key on the identity that layer established (below); for anonymous
/// clients, key on [`PeerIp`](crate::key::PeerIp).
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
///
/// # Keying on an authenticated identity
///
/// The authentication layer runs first (outermost) and puts who the caller is into the request's
/// extensions; the rate-limit layer keys on that with an [`FnKey`](crate::key::FnKey), and
/// rejects requests without it instead of sharing one key among them:
///
/// ```
/// use axum::{body::Body, routing::get, Router};
/// use http::{request::Parts, Request, StatusCode};
/// use redlimit::key::FnKey;
/// use redlimit::{layer::MissingKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// /// Who the authentication layer says the caller is.
/// #[derive(Clone)]
/// struct Tenant(String);
///
/// /// Your authentication: a checked API key, a verified token's subject, a session...
/// fn authenticate(mut request: Request<Body>) -> Request<Body> {
///     let tenant = match request.headers().get("x-api-key").map(|key| key.as_bytes()) {
///         Some(b"k-acme-1") => Some(Tenant("acme".to_owned())),
///         _ => None,
///     };
///     if let Some(tenant) = tenant {
///         request.extensions_mut().insert(tenant);
///     }
///     request
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let by_tenant = FnKey::new(|parts: &Parts| {
///     parts.extensions.get::<Tenant>().map(|t| t.0.clone())
/// });
/// let rate_limit = RateLimitLayer::builder(
///     Limiter::new(MemoryStore::new()),
///     Quota::per_minute(100)?,
///     by_tenant,
/// )
/// .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
/// .build()?;
/// // ServiceBuilder runs its layers top to bottom: authentication, then the limit.
/// let app = Router::new()
///     .route("/", get(|| async { "ok" }))
///     .layer(ServiceBuilder::new().map_request(authenticate).layer(rate_limit));
///
/// let with_key = |key: &str| Request::get("/").header("x-api-key", key).body(Body::empty());
/// let known = app.clone().oneshot(with_key("k-acme-1")?).await?;
/// assert_eq!(known.status(), StatusCode::OK);
/// // A made-up key is nobody: refused, and it buys no quota of its own.
/// let made_up = app.oneshot(with_key("fresh-random-key")?).await?;
/// assert_eq!(made_up.status(), StatusCode::UNAUTHORIZED);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct HeaderKey {
    name: HeaderName,
    secret: Option<Vec<u8>>,
    /// The keys of recently seen values, shared by clones: a busy client's header is hashed
    /// once, not on every request (SHA-256 was a third of the layer's instructions per request).
    recent: Arc<Recent>,
}

/// A small direct-mapped cache: a value's slot is picked by a cheap hash of it, and holds the
/// last value seen there with its key. It holds values this process has seen in requests
/// (never sent anywhere), at most [`RECENT`] of them; a collision only costs a hash.
struct Recent {
    slots: Box<[Mutex<Option<Seen>>]>,
}

/// A value seen, and its key (`<name>:<hex digits>`): handed out whole, so a hit neither copies
/// nor re-checks it.
type Seen = (Box<[u8]>, Arc<str>);

impl Recent {
    fn new() -> Arc<Recent> {
        Arc::new(Recent {
            slots: (0..RECENT).map(|_| Mutex::new(None)).collect(),
        })
    }

    fn slot(&self, value: &[u8]) -> &Mutex<Option<Seen>> {
        // A few instructions whatever the value's length, against SHA-256's thousands a block.
        &self.slots[(fingerprint(value) >> 58) as usize % self.slots.len()]
    }

    /// The key of a request whose header `name` holds `value`, from the cache when it holds it
    /// (hashed and cached otherwise); `None` when the value is not cached (too long, or its
    /// slot held by another thread).
    fn key(&self, name: &str, secret: Option<&[u8]>, value: &[u8]) -> Option<Arc<str>> {
        if value.len() > RECENT_MAX_VALUE {
            return None;
        }
        // Never waits: a slot another thread holds is skipped.
        let mut slot = self.slot(value).try_lock().ok()?;
        if let Some((seen, key)) = &*slot {
            if **seen == *value {
                return Some(key.clone());
            }
        }
        // One allocation for the key (its `Arc` made from the stack, not from a `String`),
        // and none for the value when the slot's buffer has its length (an API's keys
        // usually share one): a miss over many keys allocates once, not three times.
        let key: Arc<str> = match name.len() + 1 + DIGITS {
            len if len <= STACK_KEY => {
                Arc::from(write_key(name, secret, value, &mut [0u8; STACK_KEY][..len]))
            }
            len => Arc::from(write_key(name, secret, value, &mut vec![0u8; len])),
        };
        match &mut *slot {
            Some((seen, seen_key)) if seen.len() == value.len() => {
                seen.copy_from_slice(value);
                *seen_key = key.clone();
            }
            other => *other = Some((value.into(), key.clone())),
        }
        Some(key)
    }
}

impl HeaderKey {
    /// The value of header `name`, hashed.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey {
            name,
            secret: None,
            recent: Recent::new(),
        }
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
        // Digits cached under another secret are not this one's.
        self.recent = Recent::new();
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

/// Writes the key of a request whose header `name` holds `value` into `out`, exactly
/// `name.len() + 1 + DIGITS` bytes: `<name>:<hex digits of the hash>`.
fn write_key<'b>(name: &str, secret: Option<&[u8]>, value: &[u8], out: &'b mut [u8]) -> &'b str {
    let name = name.as_bytes();
    let (head, digits) = out.split_at_mut(name.len() + 1);
    head[..name.len()].copy_from_slice(name);
    head[name.len()] = b':';
    write_sha256_hex(digits, secret, value);
    // A header name and hex digits: ASCII.
    std::str::from_utf8(out).expect("header names and hex digits are ASCII")
}

impl KeyExtractor for HeaderKey {
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        self.with_key(parts, |key| key.map(|key| Cow::Owned(key.to_owned())))
    }

    fn with_key<R>(&self, parts: &Parts, f: impl FnOnce(Option<&str>) -> R) -> R {
        let Some(value) = parts.headers.get(&self.name) else {
            return f(None);
        };
        let (name, secret) = (self.name.as_str(), self.secret.as_deref());
        if let Some(key) = self.recent.key(name, secret, value.as_bytes()) {
            return f(Some(&key));
        }
        // A value the cache cannot hold: the layer only reads the key while it builds the
        // storage key, so a buffer on the stack saves the request path an allocation.
        let len = self.name.as_str().len() + 1 + DIGITS;
        if len <= STACK_KEY {
            let mut stack = [0u8; STACK_KEY];
            f(Some(write_key(
                name,
                secret,
                value.as_bytes(),
                &mut stack[..len],
            )))
        } else {
            let mut heap = vec![0u8; len];
            f(Some(write_key(name, secret, value.as_bytes(), &mut heap)))
        }
    }

    fn missing_key_hint(&self) -> &'static str {
        "the requests lack the HeaderKey's header"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(value: &str) -> Parts {
        let request = http::Request::builder().header("x-api-key", value).body(());
        request.unwrap().into_parts().0
    }

    #[test]
    fn the_key_is_the_name_and_32_hex_digits_of_the_hash() {
        let extractor = HeaderKey::named("x-api-key").unwrap();
        let hash = super::super::sha256_hex(None, b"k-1");
        let expected = format!("x-api-key:{}", &hash[..DIGITS]);
        assert_eq!(
            extractor.extract(&parts("k-1")).as_deref(),
            Some(&*expected)
        );
        extractor.with_key(&parts("k-1"), |key| assert_eq!(key, Some(&*expected)));
        let none = http::Request::new(()).into_parts().0;
        assert_eq!(extractor.extract(&none), None);
        extractor.with_key(&none, |key| assert_eq!(key, None));
    }

    #[test]
    fn cached_digits_are_the_hash_of_that_value_under_that_secret() {
        let plain = HeaderKey::named("x-api-key").unwrap();
        let secret = plain.clone().with_secret("s");
        for round in 0..3 {
            for i in 0..200 {
                let value = format!("k-{i}");
                let hash = super::super::sha256_hex(None, value.as_bytes());
                let expected = format!("x-api-key:{}", &hash[..DIGITS]);
                let request = parts(&value);
                let key = plain.extract(&request);
                assert_eq!(key.as_deref(), Some(&*expected), "round {round}");
                let hash = super::super::sha256_hex(Some(b"s"), value.as_bytes());
                let expected = format!("x-api-key:{}", &hash[..DIGITS]);
                assert_eq!(secret.extract(&request).as_deref(), Some(&*expected));
            }
        }
        // A value too long to cache is hashed as it is.
        let long = "v".repeat(RECENT_MAX_VALUE + 1);
        let hash = super::super::sha256_hex(None, long.as_bytes());
        let request = parts(&long);
        let key = plain.extract(&request).unwrap();
        assert_eq!(key, format!("x-api-key:{}", &hash[..DIGITS]));
    }

    #[test]
    fn a_name_too_long_for_the_stack_gives_the_same_key() {
        let name = "x".repeat(STACK_KEY);
        let extractor = HeaderKey::named(&name).unwrap().with_secret("s");
        let request = http::Request::builder().header(&name, "k-1").body(());
        let (parts, _) = request.unwrap().into_parts();
        let key = extractor.extract(&parts).unwrap();
        let hash = super::super::sha256_hex(Some(b"s"), b"k-1");
        assert_eq!(key, format!("{name}:{}", &hash[..DIGITS]));
        extractor.with_key(&parts, |borrowed| assert_eq!(borrowed, Some(&*key)));
    }
}
