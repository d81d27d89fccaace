//! How a [`MemoryStore`](super::MemoryStore) finds a key: its hash tag, hashed with SipHash
//! keyed at random per store, picks the shard (as a Redis Cluster slot), and the shard's index
//! reuses that hash, mixed with the key's other bytes, rather than hashing the whole key again.
//!
//! Nobody can choose keys that collide without the store's key: the tag is the part a client
//! can choose (the limiter key); the bytes around it are the limiter's prefix and scope.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex};

use crate::key::Prehashed;

/// A store's hasher of keys, keyed at random per store; its clones (and its shards) share it,
/// and the hashes of the keys it hashed recently.
#[derive(Clone, Default)]
pub(super) struct KeyHasher {
    keys: RandomState,
    recent: Arc<RecentHashes>,
}

impl KeyHasher {
    /// The hash of `bytes`, written as they are (a holder's id, for the slots).
    pub(super) fn bytes(&self, bytes: &[u8]) -> u64 {
        let mut hasher = self.keys.build_hasher();
        hasher.write(bytes);
        hasher.finish()
    }

    /// The hash of `key`'s hash tag: what picks its shard.
    pub(super) fn tag(&self, key: &str) -> u64 {
        self.bytes(split_tag(key.as_bytes()).1)
    }

    /// The hash of `key`'s tag and its hash in the index, from one hash of the tag. The tag is
    /// hashed as its bytes alone, as [`bytes`](Self::bytes) does: one hash of one slice needs
    /// no length before it to tell it apart (`hash_one` would write one, another SipHash round).
    pub(super) fn hash(&self, key: &str) -> (u64, u64) {
        self.recent.hash(key, || self.computed(key))
    }

    /// [`hash`](Self::hash), computed.
    fn computed(&self, key: &str) -> (u64, u64) {
        let (before, tag, after) = split_tag(key.as_bytes());
        let tag = self.bytes(tag);
        (tag, mix(fold(fold(tag, before), after)))
    }
}

/// Slots of [`RecentHashes`].
const RECENT: usize = 64;

/// The hashes of the keys a store decided recently, so that a busy key's tag is found and
/// hashed once rather than on every decision (searching the braces and SipHash cost about 400
/// instructions a decision; kept hashes, about 180).
///
/// A small direct-mapped cache, as the layer's of storage keys: a key's slot is picked by an
/// unkeyed hash of it ([`slot_hash`], a few instructions a word), and holds the last key kept there
/// with its hashes, compared in full before they are used. A key is kept the second time in a
/// row its slot sees it, so a flood of distinct keys allocates nothing. The slot's hash is
/// unkeyed: keys chosen to share a slot only cost the cache its hits, as fresh keys do; the
/// shard and the index still see only the keyed hashes.
struct RecentHashes {
    slots: Box<[Mutex<Recent>]>,
}

#[derive(Default)]
struct Recent {
    /// The unkeyed hash of the last key seen here and not kept.
    seen: Option<u64>,
    /// A key and its hashes.
    kept: Option<(Box<str>, (u64, u64))>,
}

impl Default for RecentHashes {
    fn default() -> Self {
        RecentHashes {
            slots: (0..RECENT).map(|_| Mutex::default()).collect(),
        }
    }
}

impl RecentHashes {
    /// The hashes of `key`, kept, or else `hash`ed (and kept when `key` comes back).
    fn hash(&self, key: &str, hash: impl FnOnce() -> (u64, u64)) -> (u64, u64) {
        let print = slot_hash(key.as_bytes());
        let slot = &self.slots[(print >> 58) as usize % self.slots.len()];
        // Never waits: a slot another thread holds is skipped.
        let Ok(mut recent) = slot.try_lock() else {
            return hash();
        };
        if let Some((kept, hashes)) = &recent.kept {
            if **kept == *key {
                return *hashes;
            }
        }
        let hashes = hash();
        if recent.seen == Some(print) {
            recent.kept = Some((key.into(), hashes));
        } else {
            recent.seen = Some(print);
        }
        hashes
    }
}

/// `key` around its hash tag, the text between the first `{` and the next `}` when there is
/// one (the whole key otherwise): what precedes the tag, the tag, and what follows it.
fn split_tag(key: &[u8]) -> (&[u8], &[u8], &[u8]) {
    let Some(open) = memchr::memchr(b'{', key) else {
        return (&[], key, &[]);
    };
    let rest = &key[open + 1..];
    match memchr::memchr(b'}', rest) {
        Some(close) if close > 0 => (&key[..=open], &rest[..close], &rest[close..]),
        _ => (&[], key, &[]),
    }
}

/// `bytes` (a limiter's prefix or a scope: a few words) folded into `hash` a word at a time.
fn fold(hash: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step = |hash: u64, word: u64| (hash.rotate_left(5) ^ word).wrapping_mul(K);
    let word = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    let mut words = bytes.chunks_exact(8);
    let mut hash = step(hash, bytes.len() as u64);
    for chunk in words.by_ref() {
        hash = step(hash, word(chunk));
    }
    match words.remainder() {
        [] => hash,
        // The last 8 bytes, overlapping the last whole word: no copy.
        _ if bytes.len() >= 8 => step(hash, word(&bytes[bytes.len() - 8..])),
        rest => rest
            .iter()
            .fold(hash, |hash, &byte| step(hash, u64::from(byte))),
    }
}

/// The unkeyed hash that picks a key's slot in [`RecentHashes`]: every byte of the key, sixteen
/// at a time (a xor and a multiply each eight), then [`mix`]ed.
fn slot_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let word = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    let step = |hash: u64, word: u64| (hash ^ word).wrapping_mul(K);
    let mut hash = bytes.len() as u64;
    let mut pairs = bytes.chunks_exact(16);
    for pair in pairs.by_ref() {
        hash = step(step(hash, word(&pair[..8])), word(&pair[8..]));
    }
    let rest = pairs.remainder();
    hash = match rest.len() {
        0 => hash,
        // The last 16 bytes, overlapping the last whole pair: no copy.
        _ if bytes.len() >= 16 => {
            let last = &bytes[bytes.len() - 16..];
            step(step(hash, word(&last[..8])), word(&last[8..]))
        }
        _ => fold(hash, rest),
    };
    mix(hash)
}

/// A 64-bit finalizer (MurmurHash3's): every bit of the result depends on every bit of `hash`,
/// so keys of one shard (whose tags' hashes share the bits that picked it) still spread.
fn mix(mut hash: u64) -> u64 {
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

/// A shard's index: from key (with its hash) to slot.
pub(super) type Index = HashMap<Indexed, usize, BuildHasherDefault<Prehashed>>;

/// A key as the index holds it, with its hash.
pub(super) struct Indexed {
    pub(super) hash: u64,
    pub(super) key: Arc<str>,
}

/// A key the index is asked for, with its hash.
pub(super) struct Probe<'k> {
    pub(super) hash: u64,
    pub(super) key: &'k str,
}

/// What the index compares: a held key or a probe, by its hash and its text.
pub(super) trait Lookup {
    fn hash(&self) -> u64;
    fn text(&self) -> &str;
}

impl Lookup for Indexed {
    fn hash(&self) -> u64 {
        self.hash
    }

    fn text(&self) -> &str {
        &self.key
    }
}

impl Lookup for Probe<'_> {
    fn hash(&self) -> u64 {
        self.hash
    }

    fn text(&self) -> &str {
        self.key
    }
}

impl<'a> Borrow<dyn Lookup + 'a> for Indexed {
    fn borrow(&self) -> &(dyn Lookup + 'a) {
        self
    }
}

impl Hash for dyn Lookup + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(Lookup::hash(self));
    }
}

impl PartialEq for dyn Lookup + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl Eq for dyn Lookup + '_ {}

impl Hash for Indexed {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for Indexed {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Indexed {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_is_between_the_first_open_brace_and_the_next_close() {
        let split = |key: &'static str| {
            let (a, b, c) = split_tag(key.as_bytes());
            (a.to_vec(), b.to_vec(), c.to_vec())
        };
        let parts = |a: &str, b: &str, c: &str| (a.into(), b.into(), c.into());
        assert_eq!(split("p:{k}:s"), parts("p:{", "k", "}:s"));
        assert_eq!(split("p:{k}#t"), parts("p:{", "k", "}#t"));
        assert_eq!(split("{}k"), parts("", "{}k", ""));
        assert_eq!(split("k"), parts("", "k", ""));
        assert_eq!(split("p:{k"), parts("", "p:{k", ""));
    }

    #[test]
    fn keys_of_one_tag_share_the_tag_hash_and_differ_in_the_index() {
        let hasher = KeyHasher::default();
        let (route, in_index) = hasher.hash("p:{k}");
        let (scoped, scoped_in_index) = hasher.hash("p:{k}:login");
        assert_eq!(route, scoped);
        assert_eq!(hasher.tag("p:{k}#t"), route);
        assert_ne!(in_index, scoped_in_index);
        assert_ne!(hasher.hash("q:{k}").1, in_index);
        // Another store, another key.
        assert_ne!(KeyHasher::default().hash("p:{k}"), (route, in_index));
    }

    #[test]
    fn a_kept_hash_is_the_hash_of_that_key() {
        let hasher = KeyHasher::default();
        let keys = ["p:{k}", "p:{k}:s", "p:{k}#t", "k", "", "p:{j}", "p:{k}:t"];
        for _ in 0..3 {
            for key in keys {
                assert_eq!(hasher.hash(key), hasher.computed(key), "{key}");
            }
        }
        // Clones share the keys kept, and still hash with the same key.
        assert_eq!(hasher.clone().hash("p:{k}"), hasher.computed("p:{k}"));
        // Two keys of one slot take turns, each with its own hashes.
        let slot = |key: &str| slot_hash(key.as_bytes()) >> 58;
        let b = (0..)
            .map(|i| format!("p:{{{i}}}"))
            .find(|b| slot(b) == slot("p:{k}"))
            .unwrap();
        for _ in 0..3 {
            for key in ["p:{k}", "p:{k}", &b, &b] {
                assert_eq!(hasher.hash(key), hasher.computed(key), "{key}");
            }
        }
        // A flood of distinct keys keeps none of them.
        let flood = KeyHasher::default();
        for i in 0..1_000 {
            let key = format!("p:{{ip:{i}}}");
            assert_eq!(flood.hash(&key), flood.computed(&key));
        }
        let kept = flood.recent.slots.iter();
        assert!(kept
            .filter_map(|slot| slot.lock().ok())
            .all(|slot| slot.kept.is_none()));
    }

    #[test]
    fn threads_sharing_a_hasher_get_their_own_keys_hashes() {
        let hasher = KeyHasher::default();
        std::thread::scope(|threads| {
            for t in 0..4 {
                let hasher = hasher.clone();
                threads.spawn(move || {
                    for i in 0..2_000 {
                        let key = format!("p:{{k-{}}}:s", (i / 3 + t) % 50);
                        assert_eq!(hasher.hash(&key), hasher.computed(&key));
                    }
                });
            }
        });
    }
}
