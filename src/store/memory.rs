//! [`MemoryStore`]: the same algorithms in this process, with the same decisions as Redis.

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;

use super::{CheckRequest, Store, StoreError};
use crate::algorithm::{
    fixed_window, gcra, sliding_log, sliding_window, token_bucket, Args, Reply, Step, Write,
};
use crate::clock::system_now_micros;
use crate::{Algorithm, Decision};

/// The default cap on keys held at once.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

const SHARDS: usize = 64;

/// A [`Store`] in process memory, for one instance, tests, and the
/// [`LocalFallback`](crate::policy::LocalFallback) policy.
///
/// It runs the Rust mirror of each Lua script, so it gives the same [`Decision`]s as
/// [`RedisStore`](super::RedisStore). Keys are spread over 64 independently locked shards, so
/// there is no global lock on the hot path.
///
/// **Bounded memory.** An idle key expires exactly when its Redis twin would (when its state is
/// back to "fresh"), and expired keys are swept from a shard whenever it fills up. At most
/// `max_keys` keys are held (100 000 by default, spread evenly over the shards). When a shard is
/// full of live keys, the key closest to expiry is evicted: it is the one nearest to a fresh
/// state, so evicting it loses the least. A flood of distinct keys therefore cannot grow memory.
/// Every algorithm keeps a few numbers per key, except the sliding log: one `f64` per admitted
/// unit, up to `burst` per key.
///
/// ```
/// use redlimit::{store::MemoryStore, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = Limiter::new(MemoryStore::new());
/// let quota = Quota::per_minute(2).unwrap();
/// assert!(limiter.check("client-1", &quota).await.is_allowed());
/// assert!(limiter.check("client-1", &quota).await.is_allowed());
/// assert!(!limiter.check("client-1", &quota).await.is_allowed());
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shards: Arc<[Mutex<Shard>]>,
    max_keys_per_shard: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .field("max_keys", &(self.max_keys_per_shard * SHARDS))
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Default)]
struct Shard {
    entries: HashMap<String, Stored>,
}

struct Stored {
    state: KeyState,
    /// µs time at which the key expires, as Redis's PEXPIRE would.
    expires_at: u64,
}

/// The state of one key, per algorithm. A key read under another algorithm counts as fresh.
#[derive(Debug, Clone, PartialEq)]
enum KeyState {
    TokenBucket(token_bucket::State),
    Gcra(gcra::State),
    FixedWindow(fixed_window::State),
    /// O(burst): changed in place, never copied.
    SlidingLog(sliding_log::Log),
    SlidingWindow(sliding_window::State),
}

impl MemoryStore {
    /// A store holding at most [`DEFAULT_MAX_KEYS`] keys.
    pub fn new() -> Self {
        Self::with_max_keys(DEFAULT_MAX_KEYS)
    }

    /// A store holding at most `max_keys` keys (rounded up to a multiple of 64, at least 64).
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = MemoryStore::with_max_keys(1_024);
    /// let limiter = Limiter::new(store.clone()); // clones share the keys
    /// let quota = Quota::per_hour(10).unwrap();
    /// for client in 0..10_000 {
    ///     limiter.check(&format!("client-{client}"), &quota).await;
    /// }
    /// assert!(store.len() <= 1_024); // a flood of keys cannot grow memory
    /// # }
    /// ```
    pub fn with_max_keys(max_keys: usize) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    /// Keys held now, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entries
                    .len()
            })
            .sum()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides synchronously: the whole step runs under the key's shard lock.
    ///
    /// ```
    /// use redlimit::store::{CheckRequest, MemoryStore};
    /// use redlimit::{Algorithm, Quota};
    ///
    /// let store = MemoryStore::new();
    /// let quota = Quota::per_minute(3).unwrap();
    /// let request = CheckRequest {
    ///     key: "redlimit:{k}",
    ///     algorithm: Algorithm::FixedWindow,
    ///     quota: &quota,
    ///     cost: 1,
    ///     now_micros: None, // the system clock
    /// };
    /// assert_eq!(store.check_now(request).remaining, 2);
    /// assert_eq!(store.len(), 1);
    /// ```
    pub fn check_now(&self, request: CheckRequest<'_>) -> Decision {
        let now = request.now_micros.unwrap_or_else(system_now_micros);
        let quota = request.quota;
        let args = Args {
            now: now as f64,
            cost: request.cost as f64,
            limit: quota.limit() as f64,
            period: quota.period_micros() as f64,
            burst: quota.burst() as f64,
        };
        let mut shard = self
            .shard(request.key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let live = shard
            .entries
            .get_mut(request.key)
            .filter(|stored| stored.expires_at > now);
        let (reply, write) = match request.algorithm {
            Algorithm::TokenBucket => {
                let stored = match live.map(|s| &s.state) {
                    Some(KeyState::TokenBucket(s)) => Some(*s),
                    _ => None,
                };
                split(token_bucket::step(stored, &args), KeyState::TokenBucket)
            }
            Algorithm::Gcra => {
                let stored = match live.map(|s| &s.state) {
                    Some(KeyState::Gcra(s)) => Some(*s),
                    _ => None,
                };
                split(gcra::step(stored, &args), KeyState::Gcra)
            }
            Algorithm::FixedWindow => {
                let stored = match live.map(|s| &s.state) {
                    Some(KeyState::FixedWindow(s)) => Some(*s),
                    _ => None,
                };
                split(fixed_window::step(stored, &args), KeyState::FixedWindow)
            }
            Algorithm::SlidingLog => sliding_log_step(live, &args, now),
            Algorithm::SlidingWindow => {
                let stored = match live.map(|s| &s.state) {
                    Some(KeyState::SlidingWindow(s)) => Some(*s),
                    _ => None,
                };
                split(sliding_window::step(stored, &args), KeyState::SlidingWindow)
            }
        };
        if let Write::Put { state, ttl_ms } = write {
            let expires_at = expiry(now, ttl_ms);
            shard.put(
                request.key,
                Stored { state, expires_at },
                now,
                self.max_keys_per_shard,
            );
        }
        reply.into_decision()
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        &self.shards[hasher.finish() as usize % SHARDS]
    }
}

/// The µs time at which a key written at `now` with a TTL of `ttl_ms` expires.
fn expiry(now: u64, ttl_ms: u64) -> u64 {
    now.saturating_add(ttl_ms.saturating_mul(1000))
}

/// The sliding log changes a live log in place (only refreshing its expiry when the step
/// writes), and stores a fresh one only when the step writes.
fn sliding_log_step(live: Option<&mut Stored>, args: &Args, now: u64) -> (Reply, Write<KeyState>) {
    match live {
        Some(Stored {
            state: KeyState::SlidingLog(log),
            expires_at,
        }) => {
            let step = sliding_log::step(log, args);
            if let Write::Put { ttl_ms, .. } = step.write {
                *expires_at = expiry(now, ttl_ms);
            }
            (step.reply, Write::Keep)
        }
        _ => {
            let mut log = sliding_log::Log::new();
            let step = sliding_log::step(&mut log, args);
            split(step, |()| KeyState::SlidingLog(log))
        }
    }
}

fn split<S>(step: Step<S>, wrap: impl FnOnce(S) -> KeyState) -> (Reply, Write<KeyState>) {
    let write = match step.write {
        Write::Keep => Write::Keep,
        Write::Put { state, ttl_ms } => Write::Put {
            state: wrap(state),
            ttl_ms,
        },
    };
    (step.reply, write)
}

impl Shard {
    /// Stores `key`, keeping the shard within `max` keys: first sweep the expired, then evict the
    /// key closest to expiry.
    fn put(&mut self, key: &str, stored: Stored, now: u64, max: usize) {
        if let Some(existing) = self.entries.get_mut(key) {
            *existing = stored;
            return;
        }
        if self.entries.len() >= max {
            self.entries.retain(|_, s| s.expires_at > now);
        }
        if self.entries.len() >= max {
            let soonest = self
                .entries
                .iter()
                .min_by_key(|(_, s)| s.expires_at)
                .map(|(k, _)| k.clone());
            if let Some(soonest) = soonest {
                self.entries.remove(&soonest);
            }
        }
        if let Entry::Vacant(slot) = self.entries.entry(key.to_owned()) {
            slot.insert(stored);
        }
    }
}

impl Store for MemoryStore {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(std::future::ready(Ok(self.check_now(request))))
    }
}
