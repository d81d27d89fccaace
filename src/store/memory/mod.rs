//! [`MemoryStore`]: the same algorithms in this process, with the same decisions as Redis.

use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;

mod driver;
mod index;
pub(crate) mod shard;

use self::driver::{decide, Refused, Written};
use self::index::{KeyHasher, Probe};
use self::shard::{expiry, used_share, KeyState, Shard, Stored};
use crate::algorithm::{Kind, MAX_SLIDING_LOG_BURST};
use crate::clock::system_now_micros;
use crate::decision::Decision;
use crate::quota::Quota;
use crate::store::contract::{CheckRequest, Operation, Store, StoreError};
use crate::store::wire::layout::{capped_cost, is_exact, log_controls_key};

/// The default cap on keys held at once.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// The default cap on the sliding log's entries held at once, over all keys: 6.4 million
/// (8 bytes each, 51 MB), i.e. [`MAX_SLIDING_LOG_BURST`] per shard.
pub const DEFAULT_MAX_LOG_ENTRIES: usize = SHARDS * MAX_SLIDING_LOG_BURST as usize;

const SHARDS: usize = 64;

/// The shard of a key whose tag hashes to `tag` (see [`KeyHasher::tag`]).
fn shard_of(tag: u64) -> usize {
    (tag % SHARDS as u64) as usize
}

/// A [`Store`] in process memory, for one instance, tests, and the
/// [`LocalFallback`](crate::failure_policy::LocalFallback) policy.
///
/// It runs the Rust mirror of each Lua script, so it gives the same [`Decision`]s as
/// [`RedisStore`](super::RedisStore). Keys are spread over 64 independently locked shards, so
/// there is no global lock on the hot path.
///
/// **Bounded memory.** An idle key expires exactly when its Redis twin would (when its state is
/// back to "fresh"). At most `max_keys` keys are held (100 000 by default, spread evenly over the
/// shards), and never more. A new key in a full shard first makes room, evicting what loses the
/// least:
/// 1. the keys that have expired (up to 32 at once, the longest expired first): an expired
///    key's state equals a fresh key's, so evicting it loses nothing, and as long as the shard
///    holds one no live key is evicted;
/// 2. else one ordinary live key: of the 16 closest to expiry, the one with the smallest share
///    of its quota in use (the share after its last decision, falling linearly to 0 at its
///    expiry, when it is fresh again; a key whose share is unknown, such as a sliding log,
///    counts as fully used), the closest to expiry among equals;
/// 3. only when the shard holds no other live key, a protected key, the closest to expiry
///    first. Protected is what a caller relies on and no later write gives back: a tenant's
///    controls (its suspension, override or reset), a route's override or suspension (a
///    sliding log's controls, learning's record too), a block's offences, and a
///    [concurrency limit](crate::concurrency::ConcurrencyLimiter)'s held slots. A route's
///    string whose controls hold nothing but the tenant's reset its states were written under
///    is rate state: ordinary.
///
/// So a flood of new keys cannot lift a suspension or a block, nor free a held concurrency
/// slot, while the shard holds any other live key, and resets a key that spent its quota only
/// when none of the 16 candidates uses less. The bound: a shard holds `max_keys / 64` keys
/// (rounded up), and the keys of one hash tag (a tenant's routes, controls and slots) share one;
/// a shard holding nothing but protected keys makes room for a new key of any kind with the
/// protected key closest to expiry (a held slot's key, renewed every third of a lease, usually
/// expires first). A slot lost so is put back at its holder's next renewal, as one Redis lost;
/// until then its key admits up to N more.
/// Each shard keeps its keys' expiry times in two min-heaps (protected keys; the others),
/// updated lazily: a write that moves a key's expiry later (nearly all of them) does not touch
/// them, the key's pair is moved up when it reaches the top; new keys, earlier expiries and a
/// key changing class push a pair, and outdated pairs are compacted away once they outnumber
/// the keys. A new key in a full shard costs O(log n) amortized (16 heap pops and pushes when
/// it evicts a live key). A flood of distinct keys therefore cannot grow memory nor slow the
/// store down.
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
    hasher: KeyHasher,
    pub(crate) max_keys_per_shard: usize,
    max_log_entries_per_shard: usize,
}

/// Shows the configuration only: counting the keys would lock every shard, and this is logged
/// on every store failure under [`LocalFallback`](crate::failure_policy::LocalFallback).
impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("max_keys", &(self.max_keys_per_shard * SHARDS))
            .field(
                "max_log_entries",
                &(self.max_log_entries_per_shard * SHARDS),
            )
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
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
        let hasher = KeyHasher::default();
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::new(hasher.clone())))
                .collect(),
            hasher,
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
            max_log_entries_per_shard: DEFAULT_MAX_LOG_ENTRIES / SHARDS,
        }
    }

    /// Caps the sliding log's entries held at once over all keys (rounded up to a multiple of
    /// 64, at least 64); [`DEFAULT_MAX_LOG_ENTRIES`] by default. See the type's docs for what
    /// happens at the cap.
    ///
    /// ```
    /// use redlimit::store::{CheckRequest, MemoryStore};
    /// use redlimit::{Algorithm, Quota};
    ///
    /// let store = MemoryStore::new().with_max_log_entries(64 * 1_000);
    /// let quota = Quota::per_hour(500).unwrap();
    /// for client in 0..100 {
    ///     let key = format!("redlimit:{{client-{client}}}");
    ///     let request = CheckRequest {
    ///         key: &key,
    ///         algorithm: Algorithm::SlidingLog,
    ///         quotas: &quota.into(),
    ///         cost: 500,
    ///         now_micros: Some(1_000_000),
    ///     };
    ///     assert!(store.check_now(request).allowed);
    /// }
    /// assert!(store.log_entries() <= 64 * 1_000);
    /// ```
    pub fn with_max_log_entries(mut self, max_log_entries: usize) -> Self {
        self.max_log_entries_per_shard = max_log_entries.div_ceil(SHARDS).max(1);
        self
    }

    /// Sliding-log entries allocated now, over all keys.
    pub fn log_entries(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).log_entries)
            .sum()
    }

    /// Keys held now, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).slots.len())
            .sum()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides synchronously: the whole step runs under the key's shard lock.
    ///
    /// A call the decision script refuses (a client time at or past 2^53 µs) is denied, and
    /// nothing is written; [`Store::check`] answers it with the script's error instead.
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
    ///     quotas: &quota.into(),
    ///     cost: 1,
    ///     now_micros: None, // the system clock
    /// };
    /// assert_eq!(store.check_now(request).remaining, 2);
    /// assert_eq!(store.len(), 1);
    /// ```
    pub fn check_now(&self, request: CheckRequest<'_>) -> Decision {
        self.try_check(request)
            .unwrap_or_else(|_| denied(request.quotas.as_slice()))
    }

    /// [`check_now`](Self::check_now), or the refusal of arguments the decision script refuses.
    pub(crate) fn try_check(&self, request: CheckRequest<'_>) -> Result<Decision, StoreError> {
        let now = call_time(request.now_micros, "decision")?;
        let (now_f, cost) = (now as f64, capped_cost(request.cost) as f64);
        let quotas = request.quotas.as_slice();
        // One hash of the key's tag picks the shard and finds the key in it.
        let (tag, hash) = self.hasher.hash(request.key);
        let mut guard = self.shards[shard_of(tag)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shard = &mut *guard;
        let max = self.max_keys_per_shard;
        let result = match request.algorithm.kind() {
            Kind::Packed(step) => {
                let tenant = shard.tenant(request.key, now);
                let key = Probe {
                    hash,
                    key: request.key,
                };
                let (held, live) = shard.find_hashed(key, now);
                let stored = live.and_then(|slot| shard.bytes(slot));
                let decided = decide(step, stored, tenant.as_deref(), now_f, cost, quotas);
                decided.map(|(reply, write)| {
                    if let Some((written, ttl_ms)) = write {
                        let stored = Stored {
                            state: match written {
                                Written::Packed(packed) => KeyState::Packed(packed),
                                Written::Joined(bytes) => KeyState::Bytes(bytes),
                            },
                            expires_at: expiry(now, ttl_ms),
                        };
                        let slot = shard.put(held, request.key, stored, now, max);
                        shard.set_used(slot, used_share(&reply, quotas));
                    }
                    reply
                })
            }
            Kind::Log => {
                let controls_key = log_controls_key(request.key);
                let result = shard.log_step(request.key, &controls_key, quotas, now, cost, max);
                shard.trim_logs(request.key, self.max_log_entries_per_shard);
                result
            }
        };
        Ok(match result.map(|reply| reply.into_decision(quotas)) {
            Ok(Some(decision)) => decision,
            // Unreachable from the crate's own quotas and controls; never a panic, never a pass.
            Ok(None) | Err(Refused(_)) => {
                tracing::error!("memory store: invalid quota in the controls; request denied");
                denied(quotas)
            }
        })
    }

    /// A concurrency slot holder's id, hashed with the store's key: what its set keeps.
    pub(crate) fn hash_id(&self, id: &str) -> u64 {
        self.hasher.bytes(id.as_bytes())
    }

    /// The shard that holds `key`, and every key of its hash tag.
    pub(crate) fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[self.shard_index(key)]
    }

    /// Every key of one limiter key (its string, a sliding log and its controls) shares a shard,
    /// like a Redis Cluster slot: by the hash tag, the text between the first `{` and the next
    /// `}`, when there is one.
    fn shard_index(&self, key: &str) -> usize {
        shard_of(self.hasher.tag(key))
    }

    /// The stored state of `key` at `now_micros`, byte for byte what Redis holds: a pure step's
    /// state string, or for the sliding log its admission times as little-endian doubles (the
    /// sorted set's scores, oldest first). `None` when absent or expired. For the differential
    /// tests, which run on a client clock (on Redis's clock, Redis also remembers a busy key's
    /// expiry before its state).
    #[cfg(any(test, feature = "test-hooks"))]
    #[doc(hidden)]
    pub fn stored_state(&self, key: &str, now_micros: u64) -> Option<Vec<u8>> {
        let shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let stored = &shard.slots[shard.slot_of(key)?].stored;
        if stored.expires_at <= now_micros {
            return None;
        }
        Some(match &stored.state {
            KeyState::Packed(packed) => packed.as_bytes().to_vec(),
            KeyState::Bytes(bytes) | KeyState::Slots(bytes) => bytes.clone(),
            KeyState::Log(log) => log.iter().flat_map(|t| t.to_le_bytes()).collect(),
        })
    }
}

/// The answer to a call the store cannot decide: denied, for ever (never a pass).
fn denied(quotas: &[Quota]) -> Decision {
    Decision {
        allowed: false,
        limit: quotas[0].limit(),
        remaining: 0,
        retry_after: Decision::NEVER,
        reset_after: std::time::Duration::ZERO,
        suspended: false,
        quota: quotas[0],
        overridden: false,
    }
}

/// The memory store's refusal of arguments a script refuses (`lua/`, each script's argument
/// checks): the error Redis answers for them, a script's error reply (code `ERR`, a request's
/// trouble, not the store's), so that a call gets one answer from either store. `call` names
/// the script's call (`slot`, `refund`, ...), `what` the argument and what it must be.
pub(crate) fn refused(call: &str, what: &str) -> StoreError {
    let detail = format!("redlimit: invalid {call} arguments; {what}");
    StoreError::redis(::redis::RedisError::from((
        ::redis::ErrorKind::Server(::redis::ServerErrorKind::ResponseError),
        "refused by the memory store",
        detail,
    )))
}

/// A time in µs (a caller's clock, a reservation's age), as the scripts take one: from 0 below
/// 2^53 (past it, a double no longer tells one µs from the next).
pub(crate) fn time(us: u64, call: &str, name: &str) -> Result<u64, StoreError> {
    if is_exact(us) {
        Ok(us)
    } else {
        Err(refused(
            call,
            &format!("{name} must be an integer from 0 below 2^53"),
        ))
    }
}

/// A call's time in µs: the caller's ([`time`]), else the system clock's.
pub(crate) fn call_time(now_micros: Option<u64>, call: &str) -> Result<u64, StoreError> {
    match now_micros {
        Some(now) => time(now, call, "now_us"),
        None => Ok(system_now_micros()),
    }
}

/// A count or a duration in µs, as the scripts take one: from 1 below 2^53.
pub(crate) fn positive(v: u64, call: &str, name: &str) -> Result<u64, StoreError> {
    if v >= 1 && is_exact(v) {
        Ok(v)
    } else {
        Err(refused(
            call,
            &format!("{name} must be an integer from 1 below 2^53"),
        ))
    }
}

impl Store for MemoryStore {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(std::future::ready(self.try_check(request)))
    }

    fn decide_now(&self, request: CheckRequest<'_>) -> Option<Result<Decision, StoreError>> {
        Some(self.try_check(request))
    }

    fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        operation.run_on(self)
    }
}

#[cfg(test)]
mod tests {
    use super::shard::tests::assert_consistent;
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::quota::Quota;
    use crate::store::contract::ControlRequest;

    /// A flood of distinct keys, with time passing so that some keys expire on the way, under
    /// every algorithm: `len()` never exceeds the cap, the store fills up to it, and the newest
    /// key is still enforced.
    #[test]
    fn a_flood_of_keys_never_exceeds_the_cap() {
        let quotas = [
            Quota::per_hour(10).unwrap(),
            Quota::per_second(1).unwrap(),
            Quota::new(3, std::time::Duration::from_millis(5)).unwrap(),
        ];
        for &algorithm in Algorithm::ALL {
            let store = MemoryStore::with_max_keys(1_000);
            let cap = 1_024; // rounded up to a multiple of 64 shards
            let mut now = 1_700_000_000_000_000;
            for i in 0..20_000 {
                now += 100;
                let quota = &quotas[i % quotas.len()];
                let decision = store.check_now(CheckRequest {
                    key: &format!("redlimit:{{flood-{i}}}"),
                    algorithm,
                    quotas: &quota.into(),
                    cost: 1,
                    now_micros: Some(now),
                });
                assert!(decision.allowed, "{algorithm}: first check of a new key");
                if i % 97 == 0 {
                    assert!(store.len() <= cap, "{algorithm}: {} > {cap}", store.len());
                }
            }
            assert!(store.len() <= cap, "{algorithm}: {} > {cap}", store.len());
            assert!(store.len() >= cap / 2, "{algorithm}: only {}", store.len());
            for shard in store.shards.iter() {
                let shard = shard.lock().unwrap();
                assert!(shard.slots.len() <= store.max_keys_per_shard);
                assert_consistent(&shard);
            }
            let one = Quota::per_hour(1).unwrap();
            let newest = |now| {
                store.check_now(CheckRequest {
                    key: "redlimit:{newest}",
                    algorithm,
                    quotas: &one.into(),
                    cost: 1,
                    now_micros: Some(now),
                })
            };
            assert!(newest(now).allowed);
            assert!(
                !newest(now + 1).allowed,
                "{algorithm}: the newest key was lost"
            );
        }
    }

    /// Shards are chosen with a hasher keyed at random per store: the same keys land on
    /// different shards in two stores, so nobody can compute keys that all land on a victim's
    /// shard.
    #[test]
    fn shard_choice_is_keyed_per_store() {
        let keys: Vec<String> = (0..64).map(|i| format!("redlimit:{{k{i}}}")).collect();
        let placement = |store: &MemoryStore| -> Vec<usize> {
            keys.iter().map(|k| store.shard_index(k)).collect()
        };
        let one = MemoryStore::new();
        assert_eq!(
            placement(&one),
            placement(&one.clone()),
            "clones share the hasher"
        );
        // 64 keys over 64 shards placed alike by chance: probability 64^-64.
        assert_ne!(placement(&one), placement(&MemoryStore::new()));
    }

    /// The sliding log's entries are bounded over all keys, not just its keys: many keys with
    /// long logs stay within the cap (counted as allocated), the key just checked keeps its log,
    /// and the accounting matches the logs held.
    #[test]
    fn sliding_log_entries_are_bounded() {
        let cap = 64 * 1_000;
        let store = MemoryStore::with_max_keys(100_000).with_max_log_entries(cap);
        let quota = Quota::per_hour(900).unwrap();
        let now = 1_700_000_000_000_000;
        for i in 0..2_000 {
            let key = format!("redlimit:{{log-{i}}}");
            let request = CheckRequest {
                key: &key,
                algorithm: Algorithm::SlidingLog,
                quotas: &quota.into(),
                cost: 900,
                now_micros: Some(now + i),
            };
            assert!(store.check_now(request).allowed, "key {i}");
            // The key just checked keeps its state: the next unit is denied.
            assert!(!store.check_now(CheckRequest { cost: 1, ..request }).allowed);
            assert!(
                store.log_entries() <= cap,
                "{} > {cap}",
                store.log_entries()
            );
        }
        // 2 000 keys x 900 entries were asked for; about the cap is held.
        assert!(store.log_entries() >= cap / 2, "{}", store.log_entries());
        for shard in store.shards.iter() {
            let shard = shard.lock().unwrap();
            let held: usize = shard
                .slots
                .iter()
                .map(|s| s.stored.state.log_entries())
                .sum();
            assert_eq!(shard.log_entries, held);
            assert_consistent(&shard);
        }
    }

    /// Each writer's keys get the eviction class the type's docs promise: what a caller relies
    /// on (a tenant's controls, a route's suspension or override, a sliding log's override,
    /// learning's override and record, a block's suspension and offences, held slots) is
    /// protected; rate state is not, even a reset tenant's route, whose string starts with
    /// controls holding only that reset, nor a route whose suspension was resumed.
    #[test]
    fn every_writer_ranks_its_key_as_the_docs_say() {
        use crate::store::block::Block;
        use crate::store::contract::Control;
        use crate::store::slots::{SlotOp, SlotRequest};
        use std::time::Duration;

        let store = MemoryStore::new();
        let now = 1_700_000_000_000_000;
        let quotas: crate::quota::Quotas = Quota::per_hour(1).unwrap().into();
        let minute = Duration::from_secs(60);
        let control = |key: &str, algorithm, control| {
            store.control_now(ControlRequest {
                key,
                algorithm,
                control,
                now_micros: Some(now),
            });
        };
        let check = |key: &str, algorithm| {
            store.check_now(CheckRequest {
                key,
                algorithm,
                quotas: &quotas,
                cost: 1,
                now_micros: Some(now),
            })
        };
        let tb = Algorithm::TokenBucket;
        control("p:{a}#t", tb, Control::Suspend(minute));
        control("p:{b}:r", tb, Control::Suspend(minute));
        control("p:{c}:r", tb, Control::SetQuota(&quotas));
        check("p:{c}:r", tb);
        control("p:{d}:r", tb, Control::Learn(&quotas, minute));
        control("p:{e}:r", Algorithm::SlidingLog, Control::SetQuota(&quotas));
        check("p:{e}:r", Algorithm::SlidingLog);
        let block = Block {
            duration: minute,
            max: minute * 4,
        };
        for _ in 0..2 {
            let request = CheckRequest {
                key: "p:{f}:r",
                algorithm: tb,
                quotas: &quotas,
                cost: 1,
                now_micros: Some(now),
            };
            store.check_blocking_now(request, block);
        }
        store
            .slots_now(SlotRequest {
                key: "p:{g}:s#c",
                op: SlotOp::Acquire { limit: 1 },
                ids: &["one"],
                lease: Duration::from_secs(30),
                now_micros: Some(now),
            })
            .expect("a valid slot call");
        control("p:{h}#t", tb, Control::Reset);
        check("p:{h}:r", tb);
        control("p:{i}:r", tb, Control::Suspend(minute));
        control("p:{i}:r", tb, Control::Resume);
        check("p:{i}:r", tb);
        check("p:{j}:r", tb);
        let reset_route = store.stored_state("p:{h}:r", now).unwrap_or_default();
        assert_eq!(
            reset_route.first(),
            Some(&crate::store::wire::layout::CONTROLS)
        );
        let class = |key: &str| {
            let shard = store.shard(key).lock().unwrap();
            shard.is_protected(key)
        };
        let expected = [
            ("p:{a}#t", true),
            ("p:{b}:r", true),
            ("p:{c}:r", true),
            ("p:{d}:r", true),
            ("p:{d}:r#l", true),
            ("p:{e}:r#m", true),
            ("p:{e}:r", false),
            ("p:{f}#t", true),
            ("p:{f}#b", true),
            ("p:{f}:r", false),
            ("p:{g}:s#c", true),
            ("p:{h}#t", true),
            ("p:{h}:r", false),
            ("p:{i}:r", false),
            ("p:{j}:r", false),
        ];
        let seen: Vec<(&str, Option<bool>)> =
            expected.iter().map(|&(k, _)| (k, class(k))).collect();
        let expected: Vec<(&str, Option<bool>)> =
            expected.iter().map(|&(k, p)| (k, Some(p))).collect();
        assert_eq!(seen, expected, "(key, protected)");
    }

    /// `Debug` is logged on every store failure under `LocalFallback`: it must not lock the
    /// shards (here one is held elsewhere) nor count the keys.
    #[test]
    fn debug_does_not_lock_the_shards() {
        let store = MemoryStore::with_max_keys(100);
        let _held = store.shards[0].lock().unwrap();
        let (send, receive) = std::sync::mpsc::channel();
        let shown = store.clone();
        std::thread::spawn(move || send.send(format!("{shown:?}")));
        let shown = receive
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("Debug waited for a shard lock");
        assert_eq!(
            shown,
            "MemoryStore { max_keys: 128, max_log_entries: 6400000, .. }"
        );
    }

    /// A client time past 2^53 µs, which the scripts refuse: the calls that return a result
    /// refuse it with the script's error (`ERR`, not transport trouble); `check_now` denies and
    /// `control_now` reports the key as it is. Nothing is written either way.
    #[test]
    fn a_time_the_scripts_refuse_is_refused_and_writes_nothing() {
        use crate::store::contract::Control;
        use std::time::Duration;

        let store = MemoryStore::new();
        let quotas: crate::quota::Quotas = Quota::per_minute(10).unwrap().into();
        let check = CheckRequest {
            key: "redlimit:{k}",
            algorithm: Algorithm::TokenBucket,
            quotas: &quotas,
            cost: 1,
            now_micros: Some(u64::MAX),
        };
        let error = store.try_check(check).unwrap_err();
        let StoreError::Redis(failure) = &error else {
            panic!("{error:?}")
        };
        assert_eq!(failure.code(), Some("ERR"), "{error}");
        assert!(!error.is_transport());
        let denied = store.check_now(check);
        assert!(!denied.allowed && !denied.suspended, "{denied:?}");
        let control = ControlRequest {
            key: "redlimit:{k}",
            algorithm: Algorithm::TokenBucket,
            control: Control::Suspend(Duration::from_secs(5)),
            now_micros: Some(u64::MAX),
        };
        assert!(store.try_control(control).is_err());
        let reply = store.control_now(control);
        assert_eq!((&reply.stored, reply.expires_in), (&None, None));
        assert!(store.is_empty(), "{} keys written", store.len());
    }
}
