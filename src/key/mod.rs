//! Which key a request counts against: the [`KeyExtractor`] trait and the extractors.
//!
//! | extractor | key | notes |
//! |---|---|---|
//! | [`GlobalKey`] | one fixed key | a fleet-wide quota, e.g. for an outbound API |
//! | [`HeaderKey`] | a header's value | hashed (SHA-256) before it reaches Redis or logs |
//! | [`PeerIp`] | the client address | peer address; forwarding headers only from trusted proxies; IPv6 by /64 |
//! | [`FnKey`] | your closure | anything in the request head |
//!
//! An extractor returns `None` when a request has no key (no such header, no peer address). What
//! happens then is never a silent bypass: see [`MissingKey`](crate::layer::MissingKey).
//!
//! **Storage keys are bounded.** Whatever an extractor returns, the limiter stores it as
//! `<prefix>:{<id>}`: `<id>` is the key itself when it is 1 to 200 bytes of printable ASCII
//! without `{`, `}` and not starting with `#`; any other key (a 1 MB header, control bytes,
//! braces) becomes `#` + its SHA-256 in hex, so a hostile client cannot bloat Redis or break the
//! Cluster hash tag.
//!
//! ```
//! use redlimit::key::{HeaderKey, KeyExtractor};
//!
//! let extractor = HeaderKey::named("x-api-key").unwrap();
//! let request = http::Request::builder().header("x-api-key", "secret").body(()).unwrap();
//! let (parts, _) = request.into_parts();
//! let key = extractor.extract(&parts).unwrap();
//! assert!(!key.contains("secret")); // hashed
//! ```
//!
//! # Examples
//!
//! One quota per API key, and requests without one rejected:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use redlimit::{key::HeaderKey, layer::MissingKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder(
//!     Limiter::new(MemoryStore::new()),
//!     Quota::per_minute(1)?,
//!     HeaderKey::named("x-api-key")?,
//! )
//! .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
//! .build()?;
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::new()))
//!     });
//!
//! let with_key = |key: &str| Request::builder().header("x-api-key", key).body(String::new());
//! let alice = svc.ready().await?.call(with_key("alice")?).await?;
//! assert_eq!(alice.status(), StatusCode::OK);
//! // Each key has its own quota: alice has used hers, bob has not.
//! let alice = svc.ready().await?.call(with_key("alice")?).await?;
//! assert_eq!(alice.status(), StatusCode::TOO_MANY_REQUESTS);
//! let bob = svc.ready().await?.call(with_key("bob")?).await?;
//! assert_eq!(bob.status(), StatusCode::OK);
//! let anonymous = svc.ready().await?.call(Request::new(String::new())).await?;
//! assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;

use http::request::Parts;
use sha2::{Digest, Sha256};

mod func;
mod global;
mod header;
mod peer;

pub use self::func::FnKey;
pub use self::global::GlobalKey;
pub use self::header::HeaderKey;
pub use self::peer::{Cidr, InvalidCidr, PeerIp};

/// The longest key stored as it is; longer keys are stored as their hash.
pub const MAX_LITERAL_KEY_LEN: usize = 200;

/// Extracts the rate-limit key from a request head.
///
/// Implement it for custom keys, or use [`FnKey`] with a closure.
///
/// The key is a [`Cow`]: borrow it when it is already there (a constant, a header's text, a
/// path segment), so the request path allocates nothing for it; return
/// `Some(owned.into())` for a key you build (and, to spare the layer that `String`, build it
/// on the stack in [`with_key`](Self::with_key) too, as [`HeaderKey`] does).
///
/// ```
/// use std::borrow::Cow;
/// use http::request::Parts;
/// use redlimit::key::KeyExtractor;
///
/// /// The tenant from the `Host` header: `acme.example.com` counts as `tenant:acme`.
/// #[derive(Debug)]
/// struct Subdomain;
///
/// impl KeyExtractor for Subdomain {
///     fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
///         let host = parts.headers.get(http::header::HOST)?.to_str().ok()?;
///         let (tenant, _) = host.split_once('.')?;
///         Some(format!("tenant:{tenant}").into())
///     }
/// }
///
/// let (parts, _) = http::Request::builder()
///     .header("host", "acme.example.com")
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(Subdomain.extract(&parts).as_deref(), Some("tenant:acme"));
/// let (parts, _) = http::Request::new(()).into_parts();
/// assert_eq!(Subdomain.extract(&parts), None); // no key: see `MissingKey`
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key for this request, or `None` when it has none.
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>>;

    /// Calls `f` with the key of this request (`None` when it has none), which need not outlive
    /// the call: what the layer uses, so that an extractor that builds its key can build it on
    /// the stack ([`HeaderKey`] does) instead of in a `String` per request. The default hands
    /// over what [`extract`](Self::extract) returns; override it only together with `extract`,
    /// and give the same key.
    ///
    /// ```
    /// use redlimit::key::{HeaderKey, KeyExtractor};
    ///
    /// let extractor = HeaderKey::named("x-api-key").unwrap();
    /// let request = http::Request::builder().header("x-api-key", "secret").body(()).unwrap();
    /// let (parts, _) = request.into_parts();
    /// let extracted = extractor.extract(&parts);
    /// extractor.with_key(&parts, |key| assert_eq!(key, extracted.as_deref()));
    /// ```
    fn with_key<R>(&self, parts: &Parts, f: impl FnOnce(Option<&str>) -> R) -> R
    where
        Self: Sized,
    {
        f(self.extract(parts).as_deref())
    }

    /// Why requests may come without a key, in the words of a log line: the layer logs it once,
    /// at warn level, when it first counts such a request against the shared key of
    /// [`MissingKey::Shared`](crate::layer::MissingKey::Shared).
    ///
    /// ```
    /// use redlimit::key::{KeyExtractor, PeerIp};
    ///
    /// assert!(PeerIp::new().missing_key_hint().contains("into_make_service_with_connect_info"));
    /// ```
    fn missing_key_hint(&self) -> &'static str {
        "the key extractor found no key in the request"
    }
}

/// The id a key is stored under: the key itself when it is short and plain, else its hash.
pub(crate) fn storage_id(key: &str) -> Cow<'_, str> {
    let plain = (1..=MAX_LITERAL_KEY_LEN).contains(&key.len())
        && !key.starts_with('#')
        && is_plain(key.as_bytes());
    if plain {
        Cow::Borrowed(key)
    } else {
        let mut id = String::with_capacity(65);
        id.push('#');
        push_sha256_hex(&mut id, None, key.as_bytes(), 64);
        Cow::Owned(id)
    }
}

/// How the id of the shared key of [`MissingKey::Shared`](crate::layer::MissingKey::Shared) starts: `#:`
/// then the name's [`storage_id`]. No key a [`KeyExtractor`] returns (nor any key given to a
/// [`Limiter`](crate::Limiter)) gets such an id: [`storage_id`] keeps a key only when it does not
/// start with `#`, and otherwise makes it `#` and hex digits. So the shared bucket never meets a
/// real key of the same name (an `FnKey` returning `"unkeyed"`).
pub(crate) const SHARED_ID_PREFIX: &str = "#:";

/// The id of a scope in a storage key: [`storage_id`], hashed also when it holds a `#`, so that
/// no scope ends like the keys the stores derive from a storage key (`<key>#m`, the sliding
/// log's controls).
pub(crate) fn scope_id(scope: &str) -> Cow<'_, str> {
    if scope.contains('#') {
        let mut id = String::with_capacity(65);
        id.push('#');
        push_sha256_hex(&mut id, None, scope.as_bytes(), 64);
        Cow::Owned(id)
    } else {
        storage_id(scope)
    }
}

/// SHA-256 of `value` in lower-case hex, keyed with `secret` when given.
#[cfg(test)]
pub(crate) fn sha256_hex(secret: Option<&[u8]>, value: &[u8]) -> String {
    let mut hex = String::with_capacity(64);
    push_sha256_hex(&mut hex, secret, value, 64);
    hex
}

/// Appends the first `digits` (at most 64) lower-case hex digits of the SHA-256 of `value`
/// (keyed with `secret` when given) to `out`.
pub(crate) fn push_sha256_hex(
    out: &mut String,
    secret: Option<&[u8]>,
    value: &[u8],
    digits: usize,
) {
    let mut hex = [0u8; 64];
    let hex = &mut hex[..digits.min(64)];
    write_sha256_hex(hex, secret, value);
    out.push_str(std::str::from_utf8(hex).expect("hex digits are ASCII"));
}

/// Fills `out` (at most 64 bytes) with the first lower-case hex digits of the SHA-256 of
/// `value`, keyed with `secret` when given: into any buffer, so a key can be built on the
/// stack.
pub(crate) fn write_sha256_hex(out: &mut [u8], secret: Option<&[u8]>, value: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = match secret {
        None => Sha256::digest(value),
        Some(secret) => {
            let mut hasher = Sha256::new();
            // Length-prefixed, so (secret, value) pairs cannot run into each other.
            hasher.update((secret.len() as u64).to_be_bytes());
            hasher.update(secret);
            hasher.update(value);
            hasher.finalize()
        }
    };
    // Two digits per byte of the digest; an odd count ends on a high nibble.
    let whole = out.len() / 2;
    let mut pairs = out.chunks_exact_mut(2);
    for (pair, &byte) in pairs.by_ref().zip(digest.iter()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
    if let ([last], Some(&byte)) = (pairs.into_remainder(), digest.get(whole)) {
        *last = HEX[usize::from(byte >> 4)];
    }
}

/// A few instructions' fingerprint of `bytes` (its length, its first and last eight bytes), for
/// the small caches of the request path: it picks a slot and tells a value seen again, never two
/// values apart (a cache compares the text). Chosen values can share a slot, and only cost the
/// cache a miss, as fresh values do.
pub(crate) fn fingerprint(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let word = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    let (first, last) = match bytes.len() {
        // Two loads of eight bytes (overlapping when short): no copy of a length known only now.
        8.. => (word(&bytes[..8]), word(&bytes[bytes.len() - 8..])),
        _ => {
            let mut short = [0u8; 8];
            short[..bytes.len()].copy_from_slice(bytes);
            (word(&short), 0)
        }
    };
    (first.rotate_left(29) ^ last ^ bytes.len() as u64)
        .wrapping_mul(K)
        .rotate_left(17)
        .wrapping_mul(K)
}

/// The hasher of a map whose keys are hashes already (a key's [`fingerprint`] or a keyed
/// hash): hands the `u64` on as it is. The deny cache, the memory store's index and the lease
/// table use it.
#[derive(Default)]
pub(crate) struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed (`write_u64`); folding keeps any other input well defined.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Whether every byte is printable ASCII other than `{` and `}`: a storage id as it is. One
/// pass without early exits, which the compiler turns into wide compares (the layer checks
/// every key of every request).
fn is_plain(bytes: &[u8]) -> bool {
    bytes.iter().fold(true, |plain, &b| {
        plain & (b'!'..=b'~').contains(&b) & (b != b'{') & (b != b'}')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_digits_are_a_prefix_of_the_full_digest() {
        let full = sha256_hex(Some(b"s"), b"value");
        assert_eq!(full.len(), 64);
        for digits in [0, 1, 31, 32, 33, 64] {
            let mut out = String::from("p:");
            push_sha256_hex(&mut out, Some(b"s"), b"value", digits);
            assert_eq!(out, format!("p:{}", &full[..digits]), "{digits}");
        }
    }

    #[test]
    fn plain_keys_are_kept_and_others_hashed() {
        assert_eq!(storage_id("tenant-42"), "tenant-42");
        for hostile in ["", "a{b}", "#x", "tab\there", "é", &"x".repeat(201)] {
            let id = storage_id(hostile);
            assert!(id.starts_with('#') && id.len() == 65, "{hostile:?} -> {id}");
        }
        assert_ne!(storage_id("a{b}"), storage_id("a{c}"));
        let huge = "k".repeat(1 << 20);
        assert_eq!(storage_id(&huge).len(), 65);
    }

    #[test]
    fn plain_bytes_are_printable_ascii_without_braces() {
        for b in 0..=255u8 {
            let expected = b.is_ascii_graphic() && b != b'{' && b != b'}';
            assert_eq!(is_plain(&[b]), expected, "{b}");
            assert_eq!(
                is_plain(&[b'a', b, b'z']),
                expected,
                "{b} between plain bytes"
            );
        }
        assert!(is_plain(b""));
    }

    #[test]
    fn keyed_hash_differs_from_plain() {
        assert_ne!(sha256_hex(Some(b"s"), b"v"), sha256_hex(None, b"v"));
        assert_eq!(
            sha256_hex(None, b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
