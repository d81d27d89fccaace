//! Storage keys, built here and nowhere else: `<prefix>:{<id>}` for a key, `<prefix>:{<id>}:<scope>`
//! for a key within a scope, and `<prefix>:{#:<id>}:<scope>` for the shared key of requests
//! without one. The stores derive the keys beside a storage key (a tenant's controls, the
//! sliding log's); [`StoredKey`] reads any of them back.
//!
//! The braces make a Redis Cluster hash tag shared by every key of one limiter key; `<id>` is
//! the key itself when short and printable, or its SHA-256 otherwise (see [`key`](crate::key)).

use std::sync::{Arc, Mutex};

use crate::key::{fingerprint, scope_id, storage_id, SHARED_ID_PREFIX};

use super::Limiter;

/// Which limiter key a check or a control addresses: a key as [`Limiter::check`] takes it, or a
/// key within a scope as a [`RateLimitLayer`](crate::RateLimitLayer) uses it (see
/// [`RateLimitLayer::scope`](crate::RateLimitLayer::scope)). Each scope keeps its own state, so
/// several quotas can apply to the same key; the scope is stored after the hash tag
/// (`redlimit:{tenant-42}:per-minute`), so all scopes of a key share a Cluster slot.
///
/// ```
/// use redlimit::{store::MemoryStore, Limiter, Target};
///
/// let limiter = Limiter::new(MemoryStore::new());
/// let plain: Target = "tenant-42".into();
/// assert_eq!(limiter.storage_key(plain), "redlimit:{tenant-42}");
/// let scoped = Target::scoped("login", "tenant-42");
/// assert_eq!(limiter.storage_key(scoped), "redlimit:{tenant-42}:login");
/// ```
///
/// A tenant is a key as the extractor hands it to the limiter. Its suspension and its reset
/// reach every route (every scope and the unscoped key) when the target names no scope; an
/// override reaches the route the target names, or every route with [`Target::all_routes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    pub(crate) scope: Option<&'a str>,
    pub(crate) key: &'a str,
    pub(crate) all_routes: bool,
    /// `key` and `scope` are ids as the store holds them (see [`Target::stored`]), not names to
    /// hash.
    pub(crate) stored: bool,
}

impl<'a> Target<'a> {
    /// `key`, unscoped: what [`Limiter::check`] checks.
    pub fn key(key: &'a str) -> Self {
        Target {
            scope: None,
            key,
            all_routes: false,
            stored: false,
        }
    }

    /// `key` on every route: for [`Limiter::set_quota`] and [`Limiter::clear_quota`], an
    /// override of every route of the tenant that has none of its own (kept until cleared, or
    /// for [`OVERRIDE_IDLE_TTL`](crate::limiter::OVERRIDE_IDLE_TTL) after it was set); for the other controls the same as
    /// [`Target::key`].
    pub fn all_routes(key: &'a str) -> Self {
        Target {
            scope: None,
            key,
            all_routes: true,
            stored: false,
        }
    }

    /// `key` within `scope`: what a layer with that [scope](crate::RateLimitLayer::scope) checks.
    pub fn scoped(scope: &'a str, key: &'a str) -> Self {
        Target {
            scope: Some(scope),
            key,
            all_routes: false,
            stored: false,
        }
    }

    /// The route a key found in the store belongs to, named by its ids as [`StoredKey`] reads
    /// them back: `id`, the key's id (between the braces), and `scope`, its scope's id. A tool
    /// that lists the store (the `redlimit` command) names a hashed key this way: its id (`#`
    /// and the 64 lower-case hex digits of its SHA-256) cannot be turned back into the key.
    ///
    /// An id kept as it is (a short, printable key) names what [`Target::key`] or
    /// [`Target::scoped`] names. A hashed id names only the key stored under it: no key given
    /// to the limiter is stored as itself when it starts with `#` (it is hashed), so none is
    /// confused with it. `None` when an id is neither (the limiter never stores such an id).
    ///
    /// ```
    /// use redlimit::limiter::StoredKey;
    /// use redlimit::{store::MemoryStore, Limiter, Target};
    ///
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let key = limiter.storage_key(Target::scoped("a b", "{x}"));
    /// let Some(StoredKey::Route { id, scope }) = limiter.stored_key(&key) else { unreachable!() };
    /// assert_eq!(limiter.storage_key(Target::stored(id, scope).unwrap()), key);
    /// assert_eq!(Target::stored("t", Some("login")), Some(Target::scoped("login", "t")));
    /// assert_eq!(Target::stored("{x}", None), None);
    /// ```
    pub fn stored(id: &'a str, scope: Option<&'a str>) -> Option<Self> {
        let id_ok = is_hashed(id) || storage_id(id) == id;
        let scope_ok = scope.is_none_or(|s| is_hashed(s) || scope_id(s) == s);
        if !(id_ok && scope_ok) {
            return None;
        }
        // Plain ids are their own names: the same target as the name's.
        let stored = is_hashed(id) || scope.is_some_and(is_hashed);
        Some(Target {
            scope,
            key: id,
            all_routes: false,
            stored,
        })
    }

    /// [`Target::stored`] of the unscoped id on every route: [`Target::all_routes`] of the key
    /// stored as `id`.
    pub fn stored_all_routes(id: &'a str) -> Option<Self> {
        Target::stored(id, None).map(|target| Target {
            all_routes: true,
            ..target
        })
    }
}

impl<'a> From<&'a str> for Target<'a> {
    fn from(key: &'a str) -> Self {
        Target::key(key)
    }
}

impl<'a> From<&'a String> for Target<'a> {
    fn from(key: &'a String) -> Self {
        Target::key(key)
    }
}

/// The constant parts of the storage keys of one scope: `<prefix>:{` and `}:<scope>` (or `}`
/// unscoped), computed once, so that a caller checking many keys in one scope builds each
/// storage key with one allocation and no formatting.
#[derive(Debug, Clone)]
pub(crate) struct KeyScope {
    head: String,
    tail: String,
    /// The storage keys of the keys that came back (shared by clones: the same scope).
    recent: Arc<RecentKeys>,
}

impl KeyScope {
    pub(super) fn new(prefix: &str, scope: Option<&str>) -> KeyScope {
        KeyScope {
            head: head(prefix),
            tail: tail(scope),
            recent: Arc::default(),
        }
    }

    /// The storage key of `key` in this scope, without allocating when it fits inline.
    pub(crate) fn storage_key(&self, key: &str) -> StorageKey {
        StorageKey::join(&[&self.head, &storage_id(key), &self.tail])
    }

    /// [`storage_key`](Self::storage_key), built once for a key that keeps coming back (see
    /// [`RecentKeys`]): for a path that checks every request's key, such as a layer's.
    pub(crate) fn recent_storage_key(&self, key: &str) -> StorageKey {
        self.recent.storage_key(self, key)
    }

    /// The storage key of the shared key `name` of requests without a key in this scope: an id
    /// no key gets (see [`SHARED_ID_PREFIX`]).
    pub(crate) fn shared_storage_key(&self, name: &str) -> StorageKey {
        StorageKey::join(&[&self.head, SHARED_ID_PREFIX, &storage_id(name), &self.tail])
    }
}

/// `<prefix>:{`: what every storage key of a limiter starts with.
fn head(prefix: &str) -> String {
    format!("{prefix}:{{")
}

/// `}:<scope>`, or `}` unscoped: what follows the id.
fn tail(scope: Option<&str>) -> String {
    match scope {
        Some(scope) => format!("}}:{}", scope_id(scope)),
        None => "}".to_owned(),
    }
}

/// `text` with Redis glob patterns' special characters escaped: it matches only itself.
fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The storage key of `target` under `unscoped`'s prefix (the limiter's, precomputed).
pub(super) fn target_key(unscoped: &KeyScope, target: Target<'_>) -> StorageKey {
    if target.stored {
        let scope = target.scope.map_or([""; 2], |scope| [":", scope]);
        return StorageKey::join(&[&unscoped.head, target.key, "}", scope[0], scope[1]]);
    }
    match target.scope {
        None => unscoped.storage_key(target.key),
        Some(scope) => StorageKey::join(&[
            &unscoped.head,
            &storage_id(target.key),
            "}:",
            &scope_id(scope),
        ]),
    }
}

/// What a key found in the store is, read back from its name by [`Limiter::stored_key`]:
/// a tool that scans the store (such as the `redlimit` command, with
/// [`Limiter::key_pattern`]) needs no knowledge of the format.
///
/// ```
/// use redlimit::limiter::StoredKey;
/// use redlimit::{store::MemoryStore, Limiter, Target};
///
/// let limiter = Limiter::new(MemoryStore::new());
/// let key = limiter.storage_key(Target::scoped("login", "tenant-42"));
/// assert_eq!(
///     limiter.stored_key(&key),
///     Some(StoredKey::Route { id: "tenant-42", scope: Some("login") })
/// );
/// assert_eq!(limiter.stored_key("redlimit:{tenant-42}#t"), Some(StoredKey::Tenant { id: "tenant-42" }));
/// assert_eq!(limiter.stored_key("other:{tenant-42}"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredKey<'a> {
    /// A route's state: the unscoped key (`scope: None`) or a scope's. `id` is the key itself,
    /// or `#` and its SHA-256 when it was hashed (`#:` and the name for a shared key).
    Route {
        /// The key's id, between the braces.
        id: &'a str,
        /// The scope, if any.
        scope: Option<&'a str>,
    },
    /// A tenant's controls (a suspension, an override of every route, a reset): `<key>#t`.
    Tenant {
        /// The key's id, between the braces.
        id: &'a str,
    },
    /// The sliding log's controls, beside its log: `<route key>#m`.
    LogControls {
        /// The key's id, between the braces.
        id: &'a str,
        /// The route's scope, if any.
        scope: Option<&'a str>,
    },
    /// A route's learning record (which marks its override as learned): `<route key>#l`. Not
    /// a route.
    LearningRecord {
        /// The key's id, between the braces.
        id: &'a str,
        /// The route's scope, if any.
        scope: Option<&'a str>,
    },
}

/// The suffix of a tenant's controls and of the sliding log's, as the stores derive them.
fn suffixes() -> (String, String) {
    let bare = "p:{k}";
    let tenant = crate::store::wire::layout::tenant_key(bare);
    let log = crate::store::wire::layout::log_controls_key(bare);
    (
        tenant[bare.len()..].to_owned(),
        log[bare.len()..].to_owned(),
    )
}

impl StoredKey<'_> {
    /// Reads `key` under `prefix`'s head.
    fn parse<'k>(head: &str, key: &'k str) -> Option<StoredKey<'k>> {
        let (id, rest) = key.strip_prefix(head)?.split_once('}')?;
        let (tenant, log) = suffixes();
        if rest == tenant {
            return Some(StoredKey::Tenant { id });
        }
        let record = crate::store::wire::layout::RECORD_SUFFIX;
        let (route, derived) = if let Some(route) = rest.strip_suffix(log.as_str()) {
            (route, Some(true))
        } else if let Some(route) = rest.strip_suffix(record) {
            (route, Some(false))
        } else {
            (rest, None)
        };
        let scope = match route {
            "" => None,
            scoped => Some(scoped.strip_prefix(':')?),
        };
        // A scope's id holds a `#` only when hashed (`#` and hex digits): anything else after
        // a `#` is a key derived from a route (the ones above, a concurrency limit's `#c`).
        if scope.is_some_and(|s| s.contains('#') && !is_hashed(s)) {
            return None;
        }
        Some(match derived {
            Some(true) => StoredKey::LogControls { id, scope },
            Some(false) => StoredKey::LearningRecord { id, scope },
            None => StoredKey::Route { id, scope },
        })
    }
}

impl StoredKey<'_> {
    /// Whether `id`, a key's or a scope's id as [`StoredKey`] reads it back, is a hashed one:
    /// `#` and the 64 lower-case hex digits of the name's SHA-256 (the name cannot be read
    /// back; [`Target::stored`] names it).
    pub fn is_hashed_id(id: &str) -> bool {
        is_hashed(id)
    }
}

/// Whether an id is a hashed one: `#` and 64 lower-case hex digits.
fn is_hashed(scope: &str) -> bool {
    scope.len() == 65
        && scope.starts_with('#')
        && scope[1..]
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Limiter {
    /// The storage key of `target`: `<prefix>:{<id>}`, or `<prefix>:{<id>}:<scope>` within a
    /// scope. The braces make a Redis Cluster hash tag shared by every key of one limiter key;
    /// `<id>` is the key itself when short and printable, or its SHA-256 otherwise (see
    /// [`key`](crate::key)). [`StoredKey`] reads a key back.
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter, Target};
    ///
    /// let limiter = Limiter::new(MemoryStore::new());
    /// assert_eq!(limiter.storage_key("tenant-42"), "redlimit:{tenant-42}");
    /// assert_eq!(limiter.storage_key(Target::scoped("login", "t")), "redlimit:{t}:login");
    /// // Braces would break the hash tag, and huge keys would bloat Redis: both are hashed.
    /// let hashed = limiter.storage_key(&"{x}".repeat(10_000));
    /// assert!(hashed.starts_with("redlimit:{#"));
    /// assert_eq!(hashed.len(), "redlimit:{#}".len() + 64);
    /// ```
    pub fn storage_key<'a>(&self, target: impl Into<Target<'a>>) -> String {
        self.target_key(target.into()).as_str().to_owned()
    }

    /// What `key`, a key found in the store, is to this limiter (its prefix); `None` when it is
    /// not one of its keys. See [`StoredKey`].
    pub fn stored_key<'k>(&self, key: &'k str) -> Option<StoredKey<'k>> {
        StoredKey::parse(&self.inner.unscoped.head, key)
    }

    /// The `SCAN MATCH` pattern of every key this limiter (its prefix) stores, of every tenant:
    /// `<prefix>:{*`, with the pattern's special characters in the prefix escaped. Other keys
    /// may match too (a prefix that is another's start followed by `:{`): read each key found
    /// with [`stored_key`](Self::stored_key).
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter};
    ///
    /// assert_eq!(Limiter::new(MemoryStore::new()).key_pattern(), "redlimit:{*");
    /// let odd = Limiter::builder(MemoryStore::new()).prefix("a*b").build()?;
    /// assert_eq!(odd.key_pattern(), r"a\*b:{*");
    /// # Ok::<(), redlimit::limiter::ConfigError>(())
    /// ```
    pub fn key_pattern(&self) -> String {
        let mut pattern = glob_escaped(&self.inner.unscoped.head);
        pattern.push('*');
        pattern
    }

    /// The `SCAN MATCH` pattern of every key of the tenant `key` (as the extractor hands it to
    /// the limiter): its unscoped route, its scopes, its controls. Read each key found with
    /// [`stored_key`](Self::stored_key): the pattern may also match keys of other tenants.
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter};
    ///
    /// let limiter = Limiter::new(MemoryStore::new());
    /// assert_eq!(limiter.tenant_pattern("ip:203.0.113.7"), "redlimit:{ip:203.0.113.7}*");
    /// assert_eq!(limiter.tenant_pattern("a?"), r"redlimit:{a\?}*");
    /// ```
    ///
    /// Any target names its tenant (its scope is left out): [`Target::stored`] names a tenant
    /// stored hashed.
    pub fn tenant_pattern<'a>(&self, key: impl Into<Target<'a>>) -> String {
        let tenant = Target {
            scope: None,
            all_routes: false,
            ..key.into()
        };
        let mut pattern = glob_escaped(&self.storage_key(tenant));
        pattern.push('*');
        pattern
    }

    /// The storage key of `target`, inline when short.
    pub(crate) fn target_key(&self, target: Target<'_>) -> StorageKey {
        target_key(&self.inner.unscoped, target)
    }
}

/// How long a storage key can be and still be built on the stack (typical ones are 30 to 80
/// bytes: `redlimit:{ip:203.0.113.7}:default:token-bucket:100/60s`).
const INLINE_KEY: usize = 128;

/// A storage key built for one check: inline when short, so the request path does not allocate
/// for it; or one kept by [`RecentKeys`], shared.
pub(crate) enum StorageKey {
    Inline { bytes: [u8; INLINE_KEY], len: usize },
    Heap(String),
    Kept(Arc<str>),
}

impl StorageKey {
    fn join(parts: &[&str]) -> StorageKey {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > INLINE_KEY {
            return StorageKey::Heap(parts.concat());
        }
        let mut bytes = [0u8; INLINE_KEY];
        let mut at = 0;
        for part in parts {
            bytes[at..at + part.len()].copy_from_slice(part.as_bytes());
            at += part.len();
        }
        StorageKey::Inline { bytes, len }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Whole `&str`s were copied in, so the bytes are UTF-8.
            StorageKey::Inline { bytes, len } => {
                std::str::from_utf8(&bytes[..*len]).expect("joined from whole str values")
            }
            StorageKey::Heap(key) => key,
            StorageKey::Kept(key) => key,
        }
    }
}

/// Slots of [`RecentKeys`].
const RECENT_KEYS: usize = 64;

/// The storage keys of one scope's recently seen keys, so that a busy client's storage key is
/// built once rather than on every request (checking its id, joining it and checking the joined
/// text cost about 400 instructions a request; a kept key, about 100).
///
/// A small direct-mapped cache, as [`HeaderKey`](crate::key::HeaderKey)'s of hashes: a key's
/// slot is picked by a cheap [`fingerprint`] of it, and holds the last key kept there with its
/// storage key. A key is kept the second time in a row its slot sees it: a flood of distinct
/// keys allocates nothing (it only notes fingerprints), and a collision only costs a build.
struct RecentKeys {
    slots: Box<[Mutex<Recent>]>,
}

#[derive(Default)]
struct Recent {
    /// The fingerprint of the last key seen here and not kept.
    seen: Option<u64>,
    /// A key and its storage key.
    kept: Option<(Box<str>, Arc<str>)>,
}

impl Default for RecentKeys {
    fn default() -> Self {
        RecentKeys {
            slots: (0..RECENT_KEYS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl std::fmt::Debug for RecentKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentKeys").finish_non_exhaustive()
    }
}

impl RecentKeys {
    /// [`KeyScope::storage_key`] of `key` in `scope` (the one scope whose keys this holds),
    /// kept when `key` comes back.
    fn storage_key(&self, scope: &KeyScope, key: &str) -> StorageKey {
        let print = fingerprint(key.as_bytes());
        let slot = &self.slots[(print >> 58) as usize % self.slots.len()];
        // Never waits: a slot another thread holds is skipped.
        let Ok(mut recent) = slot.try_lock() else {
            return scope.storage_key(key);
        };
        if let Some((kept, storage_key)) = &recent.kept {
            if **kept == *key {
                return StorageKey::Kept(storage_key.clone());
            }
        }
        let built = scope.storage_key(key);
        if recent.seen == Some(print) {
            let storage_key: Arc<str> = built.as_str().into();
            recent.kept = Some((key.into(), storage_key.clone()));
            return StorageKey::Kept(storage_key);
        }
        recent.seen = Some(print);
        built
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn every_key_a_limiter_builds_or_a_store_derives_reads_back() {
        fn read<'k>(limiter: &Limiter, key: &'k str) -> Option<StoredKey<'k>> {
            limiter.stored_key(key)
        }
        let limiter = Limiter::builder(MemoryStore::new())
            .prefix("p")
            .build()
            .unwrap();
        let route = limiter.storage_key("t");
        let scoped = limiter.storage_key(Target::scoped("login", "t"));
        let hashed = limiter.storage_key("{t}");
        let tenant = crate::store::wire::layout::tenant_key(&scoped);
        let log = crate::store::wire::layout::log_controls_key(&scoped);
        let hashed_id = &hashed["p:{".len()..hashed.len() - 1];
        assert_eq!(
            read(&limiter, &route),
            Some(StoredKey::Route {
                id: "t",
                scope: None
            })
        );
        assert_eq!(
            read(&limiter, &scoped),
            Some(StoredKey::Route {
                id: "t",
                scope: Some("login")
            })
        );
        assert_eq!(read(&limiter, &tenant), Some(StoredKey::Tenant { id: "t" }));
        assert_eq!(
            read(&limiter, &log),
            Some(StoredKey::LogControls {
                id: "t",
                scope: Some("login")
            })
        );
        assert_eq!(
            read(&limiter, &hashed),
            Some(StoredKey::Route {
                id: hashed_id,
                scope: None
            })
        );
        // A learning record is not a route, whatever its scope.
        let record = crate::store::wire::layout::learned_record_key(&scoped).unwrap();
        assert_eq!(record, "p:{t}:login#l");
        assert_eq!(
            read(&limiter, &record),
            Some(StoredKey::LearningRecord {
                id: "t",
                scope: Some("login")
            })
        );
        let record = crate::store::wire::layout::learned_record_key(&route).unwrap();
        assert_eq!(
            read(&limiter, &record),
            Some(StoredKey::LearningRecord {
                id: "t",
                scope: None
            })
        );
        // The route of the scope `learned` is a route, and its record is not.
        let learned = limiter.storage_key(Target::scoped("learned", "t"));
        assert_ne!(
            crate::store::wire::layout::learned_record_key(&route),
            Some(learned.clone())
        );
        assert!(matches!(
            read(&limiter, &learned),
            Some(StoredKey::Route { .. })
        ));
        // A hashed scope is a route; a concurrency limit's slots are not.
        let hashed_scope = limiter.storage_key(Target::scoped("a#b", "t"));
        assert!(matches!(
            read(&limiter, &hashed_scope),
            Some(StoredKey::Route { .. })
        ));
        assert_eq!(read(&limiter, "p:{t}:login#c"), None);
        for foreign in ["q:{t}", "p:t", "p:{t}x", "p:{t"] {
            assert_eq!(read(&limiter, foreign), None, "{foreign}");
        }
    }
    /// Whether `key` is one [`RecentKeys`] handed out kept.
    fn kept(key: &StorageKey) -> bool {
        matches!(key, StorageKey::Kept(_))
    }

    #[test]
    fn a_recent_storage_key_is_the_storage_key_whether_built_or_kept() {
        let scope = KeyScope::new("p", Some("login"));
        let long = "k".repeat(INLINE_KEY);
        let keys = ["t", "{t}", "#t", "", "tenant-42", &long, "x-api-key:0123"];
        for round in 0..3 {
            for key in keys {
                let recent = scope.recent_storage_key(key);
                assert_eq!(recent.as_str(), scope.storage_key(key).as_str(), "{key}");
                // Built the first time, kept from the second time in a row on.
                assert_eq!(kept(&recent), round > 0, "{key} in round {round}");
                assert_eq!(scope.recent_storage_key(key).as_str(), recent.as_str());
            }
        }
        // Every clone of the scope shares what it kept.
        assert!(kept(&scope.clone().recent_storage_key("t")));
        // Another scope keeps its own.
        let other = KeyScope::new("p", None);
        assert_eq!(other.recent_storage_key("t").as_str(), "p:{t}");
    }

    #[test]
    fn a_flood_of_distinct_keys_keeps_none_and_a_key_that_comes_back_is_kept() {
        let scope = KeyScope::new("p", None);
        for i in 0..10_000 {
            let key = format!("ip:10.0.{}.{}", i / 256, i % 256);
            let recent = scope.recent_storage_key(&key);
            assert!(!kept(&recent), "{key}");
            assert_eq!(recent.as_str(), format!("p:{{{key}}}"));
        }
        // Two keys of one slot take turns: each is right, and kept when it comes back.
        let slot = |key: &str| fingerprint(key.as_bytes()) >> 58;
        let a = "tenant-a";
        let b = (0..)
            .map(|i| format!("tenant-{i}"))
            .find(|b| slot(b) == slot(a))
            .unwrap();
        for _ in 0..3 {
            for (key, is_kept) in [(a, false), (a, true), (&b, false), (&b, true)] {
                let recent = scope.recent_storage_key(key);
                assert_eq!(recent.as_str(), format!("p:{{{key}}}"));
                assert_eq!(kept(&recent), is_kept, "{key}");
            }
        }
    }

    #[test]
    fn threads_sharing_a_scope_get_their_own_keys() {
        let scope = KeyScope::new("p", Some("s"));
        std::thread::scope(|threads| {
            for t in 0..4 {
                let scope = &scope;
                threads.spawn(move || {
                    for i in 0..2_000 {
                        let key = format!("k-{}", (i / 3 + t) % 50);
                        let recent = scope.recent_storage_key(&key);
                        assert_eq!(recent.as_str(), format!("p:{{{key}}}:s"));
                    }
                });
            }
        });
    }
}

/// An outside review of the hashed-name promises: a stored id names exactly the key stored
/// under it, and no name or pattern reaches another tenant's keys or leaves the prefix.
#[cfg(test)]
mod probes {
    use super::*;
    use crate::store::MemoryStore;

    fn limiter(prefix: &str) -> Limiter {
        Limiter::builder(MemoryStore::new())
            .prefix(prefix)
            .build()
            .unwrap()
    }

    /// The id between the braces of an unscoped storage key.
    fn id_of(limiter: &Limiter, key: &str) -> String {
        match limiter.stored_key(&limiter.storage_key(key)) {
            Some(StoredKey::Route { id, scope: None }) => id.to_owned(),
            other => panic!("{key:?} read back as {other:?}"),
        }
    }

    #[test]
    fn a_key_of_the_hashed_form_is_stored_hashed_and_named_only_by_its_own_stored_form() {
        let limiter = limiter("p");
        let own = format!("#{}", "a".repeat(64));
        let stored = id_of(&limiter, &own);
        assert!(StoredKey::is_hashed_id(&stored));
        assert_ne!(stored, own, "a key starting with # is stored as itself");
        // The argument form names the key stored under it, not the key that looks like it.
        let named = Target::stored(&own, None).unwrap();
        assert_ne!(
            limiter.storage_key(named),
            limiter.storage_key(own.as_str())
        );
        let by_stored = Target::stored(&stored, None).unwrap();
        assert_eq!(
            limiter.storage_key(by_stored),
            limiter.storage_key(own.as_str())
        );
    }

    #[test]
    fn only_hash_and_64_lower_case_hex_digits_is_a_hashed_id() {
        let hex = "0123456789abcdef".repeat(4);
        assert!(StoredKey::is_hashed_id(&format!("#{hex}")));
        // The digits without the `#` are a plain key's id: the key itself.
        assert!(!StoredKey::is_hashed_id(&hex));
        assert_eq!(Target::stored(&hex, None), Some(Target::key(&hex)));
        for not in [
            format!("#{}", hex.to_uppercase()),
            format!("#{}", &hex[1..]),
            format!("#{hex}0"),
            format!("#{}g", &hex[1..]),
            format!("#:{}", &hex[1..]),
            format!("#:{hex}"),
            format!(" #{}", &hex[1..]),
            "#".to_owned(),
            String::new(),
            // 65 bytes of which some are multi-byte: no panic on a non-boundary.
            format!("#{}é", &hex[2..]),
        ] {
            assert!(!StoredKey::is_hashed_id(&not), "{not:?}");
            // None of them is an id the limiter stores, so none names a stored key.
            assert_eq!(Target::stored(&not, None), None, "{not:?}");
            assert_eq!(Target::stored("t", Some(&not)), None, "{not:?}");
        }
    }

    #[test]
    fn the_shared_key_of_requests_without_one_is_never_a_stored_target() {
        let limiter = limiter("p");
        let shared = KeyScope::new("p", Some("s")).shared_storage_key("unkeyed");
        let Some(StoredKey::Route { id, scope }) = limiter.stored_key(shared.as_str()) else {
            panic!("{} did not read back as a route", shared.as_str());
        };
        assert!(id.starts_with(SHARED_ID_PREFIX));
        assert_eq!(Target::stored(id, scope), None);
        // A key named like the shared id is a key of its own, hashed.
        assert!(StoredKey::is_hashed_id(&id_of(&limiter, id)));
    }

    #[test]
    fn a_plain_id_with_a_hashed_scope_names_the_route_of_the_names() {
        let limiter = limiter("p");
        for (scope, key) in [("a#b", "t"), ("has space", "{x}"), ("#", "#k")] {
            let named = limiter.storage_key(Target::scoped(scope, key));
            let Some(StoredKey::Route { id, scope }) = limiter.stored_key(&named) else {
                panic!("{named} did not read back");
            };
            let stored = Target::stored(id, scope).unwrap();
            assert_eq!(limiter.storage_key(stored), named);
            let all = Target::stored_all_routes(id).unwrap();
            assert_eq!(
                limiter.storage_key(all),
                limiter.storage_key(Target::key(key))
            );
        }
    }

    /// Whether the Redis glob `pattern` matches `text` (the subset `*`, `?`, `\` escapes,
    /// and `[` taken as special so that an unescaped one fails the probe).
    fn glob(pattern: &[u8], text: &[u8]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
            Some((b'?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
            Some((b'[', _)) => panic!("an unescaped [ in a pattern"),
            Some((b'\\', rest)) => match (rest.split_first(), text.split_first()) {
                (Some((p, rest)), Some((t, text))) => p == t && glob(rest, text),
                _ => false,
            },
            Some((p, rest)) => text.first() == Some(p) && glob(rest, &text[1..]),
        }
    }

    #[test]
    fn a_tenant_pattern_matches_only_its_tenants_keys_whatever_the_key_or_prefix() {
        let specials = ["*", "?", "[a]", "\\", "a*", "a?b", "[", "]", "\\*", "x\\"];
        for prefix in ["p", "p*", "p?", "p[", "p\\", "p]"] {
            let limiter = limiter(prefix);
            let mut keys: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
            keys.extend(["a", "ab", "axb", "x", "a}b", "a{", "#k"].map(String::from));
            for key in &keys {
                let pattern = limiter.tenant_pattern(key.as_str());
                for other in &keys {
                    let stored = [
                        limiter.storage_key(other.as_str()),
                        limiter.storage_key(Target::scoped("login", other)),
                        crate::store::wire::layout::tenant_key(
                            &limiter.storage_key(other.as_str()),
                        ),
                    ];
                    for stored in stored {
                        let matched = glob(pattern.as_bytes(), stored.as_bytes());
                        let same_id = id_of(&limiter, key) == id_of(&limiter, other);
                        // A pattern may match keys of a tenant whose id extends this one's
                        // only after the closing brace, which no other id holds.
                        assert_eq!(matched, same_id, "{pattern} against {stored}");
                    }
                }
                // Outside the prefix: never.
                for foreign in [format!("q:{{{key}}}"), key.clone()] {
                    assert!(!glob(pattern.as_bytes(), foreign.as_bytes()), "{foreign}");
                }
            }
            let every = limiter.key_pattern();
            assert!(glob(every.as_bytes(), limiter.storage_key("a").as_bytes()));
            assert!(!glob(every.as_bytes(), b"other:{a}"));
        }
    }

    #[test]
    fn a_hashed_ids_tenant_pattern_is_its_stored_keys() {
        let limiter = limiter("p");
        let id = id_of(&limiter, "{tenant}");
        let target = Target::stored(&id, Some("login")).unwrap();
        assert_eq!(limiter.tenant_pattern(target), format!("p:{{{id}}}*"));
    }
}
