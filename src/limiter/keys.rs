//! Storage keys: the constant parts of a scope, computed once, and the key of one check, built
//! without allocating when it is short.

use crate::key::{scope_id, storage_id, SHARED_ID_PREFIX};

/// The constant parts of the storage keys of one scope: `<prefix>:{` and `}:<scope>` (or `}`
/// unscoped).
#[derive(Debug, Clone)]
pub(crate) struct KeyScope {
    head: String,
    tail: String,
}

impl KeyScope {
    pub(super) fn new(prefix: &str, scope: Option<&str>) -> KeyScope {
        let tail = match scope {
            Some(scope) => format!("}}:{}", scope_id(scope)),
            None => "}".to_owned(),
        };
        KeyScope {
            head: format!("{prefix}:{{"),
            tail,
        }
    }
}

impl KeyScope {
    /// The storage key of `key` in this scope, without allocating when it fits inline.
    pub(crate) fn storage_key(&self, key: &str) -> StorageKey {
        StorageKey::join(&[&self.head, &storage_id(key), &self.tail])
    }

    /// The storage key of the shared key `name` of requests without a key in this scope: an id
    /// no key gets (see [`SHARED_ID_PREFIX`]).
    pub(crate) fn shared_storage_key(&self, name: &str) -> StorageKey {
        StorageKey::join(&[&self.head, SHARED_ID_PREFIX, &storage_id(name), &self.tail])
    }
}

/// How long a storage key can be and still be built on the stack (typical ones are 30 to 80
/// bytes: `redlimit:{ip:203.0.113.7}:default:token-bucket:100/60s`).
const INLINE_KEY: usize = 128;

/// A storage key built for one check: inline when short, so the request path does not allocate
/// for it.
pub(crate) enum StorageKey {
    Inline { bytes: [u8; INLINE_KEY], len: usize },
    Heap(String),
}

impl StorageKey {
    pub(super) fn join(parts: &[&str]) -> StorageKey {
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
        }
    }
}

pub(super) fn join_storage_key(a: &str, b: &str, id: &str, tail: &str) -> String {
    let mut key = String::with_capacity(a.len() + b.len() + id.len() + tail.len());
    key.push_str(a);
    key.push_str(b);
    key.push_str(id);
    key.push_str(tail);
    key
}
