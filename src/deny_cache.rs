//! The local deny cache: a denial with `retry_after` r is answered in-process, without the
//! store, until r has passed.
//!
//! It holds denials only, so it can never admit what the store would deny. An entry answers a
//! request only for the same storage key, the same quota and the same cost (its `retry_after`
//! is that cost's: a larger cost would be told to come back too early, a smaller one may pass
//! sooner), so any other cost, or a peek, goes to the store. Denials that can never pass (cost
//! above the capacity) are not cached.
//!
//! **Controls.** Every entry carries the control generation of its tenant (the storage key up
//! to its hash tag's `}`, shared by every scope and by the tenant's controls), one of
//! [`GENERATIONS`] stripes of tenants. A control through the limiter bumps its tenant's stripe
//! after its store call returned and before it returns ([`DenyCache::forget_tenant`]): every
//! entry of the tenant, on every scope, stops answering, with one atomic add whatever the cache
//! holds. A check takes the generation before its store call ([`DenyCache::start`]) and its
//! denial is remembered only if the generation is unchanged, so a denial decided before a
//! control is never cached after it. A lookup compares one atomic load, and only when an entry
//! would answer. Tenants sharing a stripe lose their entries too (one store call each).
//!
//! **Under leases** an entry answers for one lease interval at most from the start of the check
//! that was denied (the `max_life` given to [`DenyCache::new`]), with the denial's own
//! `retry_after` counted down: a denied key goes back to the store once per interval, so a
//! control made elsewhere reaches it within that delay.
//!
//! Memory is bounded: at most `max_keys` entries, spread over 16 shards. A new key in a full
//! shard makes room in constant time, like Redis's `maxmemory` sampling: the shard looks at its
//! next [`EVICTION_SAMPLE`] entries in a rotating order and evicts the first that has ended, or
//! else the one among them that ends first (the one with the least left to save). Evicting a
//! live entry costs only one store call when its key comes back. So a client minting new keys
//! that are each denied once costs a bounded amount per request whatever the cap:
//! `cargo bench --bench limiter -- deny-cache-full` measured 5 to 9 µs per new denied key at
//! 1 000 000 keys (against 2 to 3 µs at 10 000 keys: cache misses in a 200 MB table).
//!
//! **Memory per entry**, measured as the growth of the process's RSS while a cache fills
//! (`cargo bench --bench limiter -- deny-cache-full` prints it; 28-byte storage keys, one quota):
//! 211 bytes per entry at 10 000 keys, 194 at 1 000 000, with a 112-byte slot. The slot is 120
//! bytes (the key's pointer, the first quota inline, the entry's numbers, its generation and
//! its end under leases), so expect 8 bytes more; then the index, 16 bytes a bucket at a load
//! of 7/16 to 7/8, and the key's own heap allocation (its length rounded up to the allocator's
//! size class, plus the allocator's header). Several quotas add a boxed slice of the others
//! (32 bytes each). The earlier entry held a whole `Quotas` (264 bytes, room for 8 tiers) and
//! the map's buckets were 368 bytes: 648 and 802 bytes per entry, measured the same way.
//!
//! Time: with a client clock ([`Clock::System`](crate::clock::Clock::System) or a
//! [`ManualClock`](crate::clock::ManualClock)) the cache uses the time the store decided at, so the key
//! is answered by the store again exactly when `retry_after` has passed. With Redis server time
//! it uses a local monotonic clock started when the reply arrived: the entry lives at most one
//! round trip longer than the denial, never shorter.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use crate::decision::Decision;
use crate::key::Prehashed;
use crate::quota::{Quota, Quotas};
use crate::store::wire::layout::tenant_route;

/// Shards of the map (fewer when `max_keys` is smaller).
const SHARDS: usize = 16;

/// How many entries a full shard looks at to make room for a new key.
const EVICTION_SAMPLE: usize = 8;

/// Control generations, one per stripe of tenants: a control bumps its tenant's stripe, which
/// ends every entry of the tenants in that stripe (a neighbour's entry only costs a store call).
const GENERATIONS: usize = 1024;

/// The control generation of a key's tenant's stripe: a denial is remembered, and answers, only
/// while its stripe is still at the generation its check started at, so no control ran on the
/// tenant between the check's start and the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Generation(u32);

/// When a check started, for [`DenyCache::remember`]: its tenant's generation, and the cache's
/// time before the store call (a leasing limiter's entry answers one interval from then).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Started {
    generation: Generation,
    at: u64,
}

/// One cached denial.
#[derive(Debug)]
struct Entry {
    /// The request's first quota; the others follow in `more`.
    first: Quota,
    /// The request's other quotas, then the denial's quota when it is none of the request's
    /// (an override's). Empty, so not allocated, for one quota that decided itself.
    more: Box<[Quota]>,
    /// The denied cost: the entry answers requests of this cost only.
    cost: u64,
    limit: u64,
    remaining: u64,
    /// When the denial ends, in the cache's microseconds.
    until: u64,
    /// When the entry stops answering, at `until` at the latest: sooner under leases, whose
    /// instances must see a control made elsewhere within one lease interval.
    fresh_until: u64,
    /// When the key is full again, in the cache's microseconds.
    reset_at: u64,
    /// The generation of the key's tenant when the denied check started.
    generation: Generation,
    /// How many quotas the request had (at most [`MAX_TIERS`](crate::quota::MAX_TIERS)).
    tiers: u8,
    /// The denial's quota: index 0 is `first`, `i` is `more[i - 1]`.
    binding: u8,
    suspended: bool,
    overridden: bool,
}

impl Entry {
    fn new(
        quotas: &Quotas,
        cost: u64,
        decision: &Decision,
        (until, fresh_until, reset_at): (u64, u64, u64),
        generation: Generation,
    ) -> Entry {
        let tiers = quotas.as_slice();
        let found = tiers.iter().position(|q| *q == decision.quota);
        let mut more = Vec::with_capacity(tiers.len() - 1 + usize::from(found.is_none()));
        more.extend_from_slice(&tiers[1..]);
        let binding = found.unwrap_or_else(|| {
            more.push(decision.quota);
            tiers.len()
        });
        Entry {
            first: tiers[0],
            more: more.into_boxed_slice(),
            cost,
            limit: decision.limit,
            remaining: decision.remaining,
            until,
            fresh_until,
            reset_at,
            generation,
            tiers: tiers.len() as u8,
            binding: binding as u8,
            suspended: decision.suspended,
            overridden: decision.overridden,
        }
    }

    /// Whether this denial answers a request of `cost` under `quotas`.
    fn answers(&self, quotas: &Quotas, cost: u64) -> bool {
        let tiers = quotas.as_slice();
        cost == self.cost
            && tiers.len() == usize::from(self.tiers)
            && tiers[0] == self.first
            && tiers[1..] == self.more[..tiers.len() - 1]
    }

    fn quota(&self) -> Quota {
        match usize::from(self.binding) {
            0 => self.first,
            i => self.more[i - 1],
        }
    }
}

/// A storage key and its cached denial.
struct Slot {
    key: Box<str>,
    entry: Entry,
}

/// One shard: its entries in a `Vec`, so that a full shard can look at a few of them in a
/// rotating order, and an index from the key's hash to its slot (a slot holds its key, so two
/// keys with one hash are told apart: the second one's entry replaces the first's).
#[derive(Default)]
struct Shard {
    index: HashMap<u64, usize, BuildHasherDefault<Prehashed>>,
    slots: Vec<Slot>,
    /// Where the next eviction sample starts in `slots` (taken modulo its length).
    cursor: usize,
    /// Entries looked at to make room, for the tests.
    #[cfg(test)]
    examined: usize,
}

impl Shard {
    /// The slot of `key`, whose hash is `hash`.
    fn find(&self, hash: u64, key: &str) -> Option<usize> {
        let slot = *self.index.get(&hash)?;
        (*self.slots[slot].key == *key).then_some(slot)
    }

    /// Stores `entry` for `key`, keeping the shard within `max` entries.
    fn put(
        &mut self,
        hasher: &RandomState,
        hash: u64,
        key: &str,
        entry: Entry,
        now: u64,
        max: usize,
    ) {
        if let Some(&slot) = self.index.get(&hash) {
            let held = &mut self.slots[slot];
            if *held.key != *key {
                held.key = key.into();
            }
            held.entry = entry;
            return;
        }
        if self.slots.len() >= max {
            self.make_room(hasher, now);
        }
        if self.slots.len() == self.slots.capacity() {
            // Double, but never past `max`: a full shard keeps no spare capacity.
            let room = max.saturating_sub(self.slots.len()).max(1);
            self.slots.reserve_exact(self.slots.len().max(4).min(room));
        }
        self.index.insert(hash, self.slots.len());
        self.slots.push(Slot {
            key: key.into(),
            entry,
        });
    }

    /// Removes one entry, looking at no more than [`EVICTION_SAMPLE`] of them: the first that
    /// has ended from the rotating cursor on, else the one among them that ends first.
    fn make_room(&mut self, hasher: &RandomState, now: u64) {
        let len = self.slots.len();
        if len == 0 {
            return;
        }
        let start = self.cursor % len;
        let mut victim = start;
        let mut looked = 0;
        for offset in 0..EVICTION_SAMPLE.min(len) {
            let slot = (start + offset) % len;
            let until = self.slots[slot].entry.fresh_until;
            looked = offset + 1;
            if until <= now {
                victim = slot;
                break;
            }
            if until < self.slots[victim].entry.fresh_until {
                victim = slot;
            }
        }
        #[cfg(test)]
        {
            self.examined += looked;
        }
        self.cursor = start + looked;
        self.remove(hasher, victim);
    }

    fn remove(&mut self, hasher: &RandomState, slot: usize) {
        let removed = self.slots.swap_remove(slot);
        self.index.remove(&hasher.hash_one(&*removed.key));
        if let Some(moved) = self.slots.get(slot) {
            self.index.insert(hasher.hash_one(&*moved.key), slot);
        }
    }
}

pub(crate) struct DenyCache {
    shards: Box<[RwLock<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    /// The origin of the local monotonic clock (Redis server time mode).
    origin: Instant,
    /// The tenants' control generations, by stripe ([`GENERATIONS`]).
    generations: Box<[AtomicU64]>,
    /// The longest an entry answers, in µs (a leasing limiter's lease interval).
    max_life: Option<u64>,
}

impl std::fmt::Debug for DenyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyCache")
            .field("max_keys", &(self.per_shard * self.shards.len()))
            .finish_non_exhaustive()
    }
}

impl DenyCache {
    /// A cache of at most `max_keys` entries (at least 1), each answering for `max_life` at
    /// most when given.
    pub(crate) fn new(max_keys: usize, max_life: Option<Duration>) -> Self {
        let max_keys = max_keys.max(1);
        let shards = SHARDS.min(max_keys);
        DenyCache {
            shards: (0..shards).map(|_| RwLock::default()).collect(),
            per_shard: max_keys / shards,
            hasher: RandomState::new(),
            origin: Instant::now(),
            generations: (0..GENERATIONS).map(|_| AtomicU64::new(0)).collect(),
            max_life: max_life.map(micros),
        }
    }

    /// The control generation of the stripe of `key`'s tenant (every scope of a tenant shares
    /// it).
    fn stripe(&self, key: &str) -> &AtomicU64 {
        let hash = self.hasher.hash_one(tenant_route(key));
        &self.generations[(hash >> 32) as usize % GENERATIONS]
    }

    /// A check on `key` starts at `now` (the cache's time), before its store call: what
    /// [`remember`](Self::remember) needs with its denial.
    pub(crate) fn start(&self, key: &str, now: u64) -> Started {
        Started {
            generation: self.generation(key),
            at: now,
        }
    }

    /// The generation of `key`'s tenant now.
    fn generation(&self, key: &str) -> Generation {
        // Truncated: an entry could answer again only after exactly 2^32 controls on its
        // stripe within its life.
        Generation(self.stripe(key).load(Ordering::SeqCst) as u32)
    }

    /// Ends every entry of `key`'s tenant, every scope: a control changed it. Called after
    /// the control's store call returned, before the control returns to its caller, so a
    /// denial decided before the control (its check started before this) never answers after.
    pub(crate) fn forget_tenant(&self, key: &str) {
        self.stripe(key).fetch_add(1, Ordering::SeqCst);
    }

    /// The cache's time: the client clock's when there is one, else a local monotonic clock.
    pub(crate) fn now(&self, client_now: Option<u64>) -> u64 {
        client_now.unwrap_or_else(|| self.origin.elapsed().as_micros() as u64)
    }

    /// The key's hash and its shard. The shard comes from the hash's bits 32 and up, which the
    /// index's table does not use for the bucket (the low bits) nor, at 16 shards, as its tag
    /// (the top 7): every shard's table still spreads its keys over all its buckets.
    fn locate(&self, key: &str) -> (u64, &RwLock<Shard>) {
        let hash = self.hasher.hash_one(key);
        let index = (hash >> 32) as usize % self.shards.len();
        (hash, &self.shards[index])
    }

    /// The cached denial for a request, if one still holds at `now`.
    pub(crate) fn lookup(
        &self,
        key: &str,
        quotas: &Quotas,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let (hash, shard) = self.locate(key);
        let shard = shard.read().unwrap_or_else(|e| e.into_inner());
        let entry = &shard.slots[shard.find(hash, key)?].entry;
        if now >= entry.fresh_until
            || !entry.answers(quotas, cost)
            || entry.generation != self.generation(key)
        {
            return None;
        }
        let retry_after = micros_rounded_up_to_ms(entry.until - now);
        Some(Decision {
            allowed: false,
            limit: entry.limit,
            remaining: entry.remaining,
            retry_after,
            reset_after: micros_rounded_up_to_ms(entry.reset_at.saturating_sub(now))
                .max(retry_after),
            suspended: entry.suspended,
            quota: entry.quota(),
            overridden: entry.overridden,
        })
    }

    /// Remembers the store's `decision` for a request of `cost` decided at `now` (the end of its
    /// `retry_after` is counted from then), when it is a denial that will end and no control ran
    /// on its tenant since the check started (`started`).
    pub(crate) fn remember(
        &self,
        key: &str,
        quotas: &Quotas,
        cost: u64,
        decision: &Decision,
        now: u64,
        started: Started,
    ) {
        if decision.allowed
            || decision.never_allowed()
            || cost == 0
            || decision.retry_after.is_zero()
            || started.generation != self.generation(key)
        {
            return;
        }
        let until = now.saturating_add(micros(decision.retry_after));
        let fresh_until = self
            .max_life
            .map_or(until, |life| until.min(started.at.saturating_add(life)));
        let entry = Entry::new(
            quotas,
            cost,
            decision,
            (
                until,
                fresh_until,
                now.saturating_add(micros(decision.reset_after)),
            ),
            started.generation,
        );
        let (hash, shard) = self.locate(key);
        let mut shard = shard.write().unwrap_or_else(|e| e.into_inner());
        shard.put(&self.hasher, hash, key, entry, now, self.per_shard);
    }

    /// Records that the store admitted a request of `cost` under `quota` on `key`: a cached
    /// denial of another cost or quota may now wait too little, so it is dropped. A denial of
    /// this same cost and quota is kept: while it holds, the store cannot admit that cost (short
    /// of a control, which ends it through [`DenyCache::forget_tenant`]), so the admission was
    /// decided before the denial and merely answered after it (concurrent calls on one
    /// connection).
    pub(crate) fn admitted(&self, key: &str, quotas: &Quotas, cost: u64) {
        let (hash, shard) = self.locate(key);
        let stale = |shard: &Shard| {
            shard
                .find(hash, key)
                .filter(|&slot| !shard.slots[slot].entry.answers(quotas, cost))
        };
        if stale(&shard.read().unwrap_or_else(|e| e.into_inner())).is_none() {
            return;
        }
        let mut shard = shard.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = stale(&shard) {
            shard.remove(&self.hasher, slot);
        }
    }

    /// Drops the entry of `key`: its state or quota changed.
    pub(crate) fn forget(&self, key: &str) {
        let (hash, shard) = self.locate(key);
        // Most calls find nothing: a shared read lock keeps them from contending.
        if shard
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .find(hash, key)
            .is_none()
        {
            return;
        }
        let mut shard = shard.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = shard.find(hash, key) {
            shard.remove(&self.hasher, slot);
        }
    }

    /// Whether the cache holds an entry for `key`, ended or not.
    #[cfg(test)]
    fn shard_holds(&self, key: &str) -> bool {
        let (hash, shard) = self.locate(key);
        let shard = shard.read().unwrap_or_else(|e| e.into_inner());
        shard.find(hash, key).is_some()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).slots.len())
            .sum()
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn micros_rounded_up_to_ms(micros: u64) -> Duration {
    Duration::from_millis(micros.div_ceil(1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    impl DenyCache {
        /// [`remember`](DenyCache::remember) for a check that started now.
        fn remember_now(
            &self,
            key: &str,
            quotas: &Quotas,
            cost: u64,
            decision: &Decision,
            now: u64,
        ) {
            self.remember(key, quotas, cost, decision, now, self.start(key, now));
        }
    }

    fn denied(retry_ms: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 5,
            remaining: 0,
            retry_after: Duration::from_millis(retry_ms),
            reset_after: Duration::from_millis(retry_ms * 5),
            suspended: false,
            quota: Quota::per_minute(5).unwrap(),
            overridden: false,
        }
    }

    #[test]
    fn a_denial_holds_until_retry_after_for_its_cost_only() {
        let cache = DenyCache::new(100, None);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        cache.remember_now("k", &quota, 2, &denied(12_000), 1_000_000);
        let hit = cache.lookup("k", &quota, 2, 1_000_000).unwrap();
        assert_eq!(hit.retry_after, Duration::from_millis(12_000));
        let later = cache
            .lookup("k", &quota, 2, 1_000_000 + 11_999_001)
            .unwrap();
        assert_eq!(later.retry_after, Duration::from_millis(1));
        assert!(!later.allowed);
        // Over at retry_after; a smaller cost, another quota or another key is the store's.
        assert!(cache.lookup("k", &quota, 2, 13_000_000).is_none());
        assert!(cache.lookup("k", &quota, 1, 1_000_000).is_none());
        assert!(cache.lookup("k", &quota, 3, 1_000_000).is_none());
        assert!(cache
            .lookup(
                "k",
                &Quotas::from(Quota::per_minute(6).unwrap()),
                2,
                1_000_000
            )
            .is_none());
        assert!(cache.lookup("other", &quota, 2, 1_000_000).is_none());
        cache.forget("k");
        assert!(cache.lookup("k", &quota, 2, 1_000_000).is_none());
    }

    #[test]
    fn an_admission_drops_only_a_denial_it_could_outdate() {
        let cache = DenyCache::new(100, None);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        cache.remember_now("k", &quota, 2, &denied(12_000), 1_000_000);
        // Same cost and quota: decided before the denial, answered after it. Kept.
        cache.admitted("k", &quota, 2);
        assert!(cache.lookup("k", &quota, 2, 1_000_000).is_some());
        // Another cost consumed after the denial: its wait may be too short now. Dropped.
        cache.admitted("k", &quota, 1);
        assert!(cache.lookup("k", &quota, 2, 1_000_000).is_none());
        cache.remember_now("k", &quota, 2, &denied(12_000), 1_000_000);
        cache.admitted("k", &Quotas::from(Quota::per_minute(6).unwrap()), 2);
        assert!(cache.lookup("k", &quota, 2, 1_000_000).is_none());
    }

    #[test]
    fn admissions_peeks_and_never_are_not_cached() {
        let cache = DenyCache::new(100, None);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        let mut allowed = denied(0);
        allowed.allowed = true;
        cache.remember_now("a", &quota, 1, &allowed, 0);
        let mut never = denied(0);
        never.retry_after = Decision::NEVER;
        cache.remember_now("n", &quota, 9, &never, 0);
        cache.remember_now("p", &quota, 0, &denied(5), 0);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn memory_is_bounded() {
        let cache = DenyCache::new(64, None);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        for i in 0..10_000 {
            cache.remember_now(&format!("k{i}"), &quota, 1, &denied(60_000), 0);
        }
        assert!(cache.len() <= 64, "{}", cache.len());
        // The newest key is always in.
        assert!(cache.lookup("k9999", &quota, 1, 0).is_some());
    }

    /// The keys (of `prefix` and a counter) that land in the shard of `target`.
    fn keys_in_shard_of(cache: &DenyCache, target: &str, prefix: &str, n: usize) -> Vec<String> {
        let shard = |key: &str| cache.locate(key).1 as *const RwLock<Shard>;
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .filter(|key| shard(key) == shard(target))
            .take(n)
            .collect()
    }

    /// A new key in a full shard evicts an entry that has ended, else the one that ends first
    /// (here the sample covers the whole shard), and keeps every other. The earlier cache dropped
    /// the ended entries, then an arbitrary one: a longer denial went as often as the shortest.
    #[test]
    fn a_full_shard_evicts_the_entry_that_ends_first() {
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        for round in 0..40 {
            let cache = DenyCache::new(SHARDS * EVICTION_SAMPLE, None);
            assert_eq!(cache.per_shard, EVICTION_SAMPLE);
            let keys = keys_in_shard_of(&cache, "x", "k", EVICTION_SAMPLE + 1);
            let soon = round % EVICTION_SAMPLE;
            for (i, key) in keys[..EVICTION_SAMPLE].iter().enumerate() {
                let retry_ms = if i == soon { 1_000 } else { 3_600_000 };
                cache.remember_now(key, &quota, 1, &denied(retry_ms), 0);
            }
            cache.remember_now(&keys[EVICTION_SAMPLE], &quota, 1, &denied(3_600_000), 0);
            for (i, key) in keys.iter().enumerate() {
                let held = cache.lookup(key, &quota, 1, 0).is_some();
                assert_eq!(held, i != soon, "round {round}: {key}");
            }
            // An entry that has ended goes before one that ends first.
            let ended = (soon + 1) % EVICTION_SAMPLE;
            let now = 2_000_000;
            cache.remember_now(&keys[ended], &quota, 1, &denied(1), now - 5_000);
            let newer = keys_in_shard_of(&cache, "x", "n", 1);
            cache.remember_now(&newer[0], &quota, 1, &denied(3_600_000), now);
            assert!(cache.lookup(&newer[0], &quota, 1, now).is_some());
            let held = keys
                .iter()
                .filter(|k| cache.lookup(k, &quota, 1, now).is_some());
            assert_eq!(held.count(), EVICTION_SAMPLE - 1, "round {round}");
            assert!(!cache.shard_holds(&keys[ended]), "round {round}");
        }
    }

    /// An insert into a full shard looks at [`EVICTION_SAMPLE`] entries at most, however large
    /// the shard: the earlier cache scanned the whole shard on each one (10 000 entries here)
    /// and freed nothing while they all held.
    #[test]
    fn an_insert_into_a_full_cache_looks_at_a_bounded_sample() {
        const PER_SHARD: usize = 10_000;
        let cache = DenyCache::new(SHARDS * PER_SHARD, None);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        let mut i = 0;
        while cache.len() < SHARDS * PER_SHARD {
            cache.remember_now(&format!("fill{i}"), &quota, 1, &denied(60_000), 0);
            i += 1;
        }
        let examined = |cache: &DenyCache| -> usize {
            cache
                .shards
                .iter()
                .map(|s| s.read().unwrap().examined)
                .sum()
        };
        let before = examined(&cache);
        const NEW: usize = 10_000;
        for n in 0..NEW {
            cache.remember_now(&format!("new{n}"), &quota, 1, &denied(60_000), 0);
        }
        let per_insert = (examined(&cache) - before) as f64 / NEW as f64;
        assert!(
            per_insert <= EVICTION_SAMPLE as f64,
            "{per_insert} entries looked at per insert"
        );
        assert_eq!(cache.len(), SHARDS * PER_SHARD);
        assert!(cache
            .lookup(&format!("new{}", NEW - 1), &quota, 1, 0)
            .is_some());
    }

    /// Several quotas, or a denial by a quota the request did not have (an override's), are
    /// kept exactly: the entry answers that list only, with the denial's own quota.
    #[test]
    fn tiers_and_the_deciding_quota_are_kept_exactly() {
        let cache = DenyCache::new(100, None);
        let second = Quota::per_second(2).unwrap();
        let minute = Quota::per_minute(5).unwrap();
        let tiers = Quotas::new([second, minute]).unwrap();
        let mut by_minute = denied(12_000);
        by_minute.quota = minute;
        cache.remember_now("k", &tiers, 1, &by_minute, 0);
        assert_eq!(cache.lookup("k", &tiers, 1, 0).unwrap().quota, minute);
        for other in [
            Quotas::from(second),
            Quotas::from(minute),
            Quotas::new([minute, second]).unwrap(),
            Quotas::new([second, minute, minute]).unwrap(),
        ] {
            assert!(cache.lookup("k", &other, 1, 0).is_none(), "{other:?}");
        }
        let overridden = Quota::per_hour(7).unwrap();
        let mut by_override = denied(12_000);
        by_override.quota = overridden;
        cache.remember_now("o", &Quotas::from(minute), 1, &by_override, 0);
        let hit = cache.lookup("o", &Quotas::from(minute), 1, 0).unwrap();
        assert_eq!(
            hit,
            Decision {
                retry_after: Duration::from_secs(12),
                ..by_override
            }
        );
    }

    /// Two keys with one hash are told apart: the second's entry replaces the first's, and the
    /// first is never answered with the second's denial.
    #[test]
    fn keys_that_share_a_hash_never_answer_for_each_other() {
        let cache = DenyCache::new(100, None);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        let mut shard = Shard::default();
        let entry = || {
            Entry::new(
                &quota,
                1,
                &denied(5_000),
                (5_000_000, 5_000_000, 25_000_000),
                Generation(0),
            )
        };
        shard.put(&cache.hasher, 42, "a", entry(), 0, 10);
        assert_eq!(shard.find(42, "a"), Some(0));
        shard.put(&cache.hasher, 42, "b", entry(), 0, 10);
        assert_eq!((shard.find(42, "a"), shard.find(42, "b")), (None, Some(0)));
        assert_eq!(shard.slots.len(), 1);
    }

    /// What an entry costs, inline: the slot (key pointer and entry) is 120 bytes; the index adds
    /// 16 bytes per bucket and the key its own allocation (see the module docs for the measured
    /// total). The earlier entry held a whole `Quotas`: 264 bytes for the quotas alone.
    #[test]
    fn an_entry_is_small() {
        assert_eq!(std::mem::size_of::<Quota>(), 32);
        assert_eq!(std::mem::size_of::<Slot>(), 120);
        assert_eq!(std::mem::size_of::<(u64, usize)>(), 16);
    }

    /// A control on a tenant ends the entries of every scope of it (and of the tenant's own
    /// key), and no other tenant's outside its stripe.
    #[test]
    fn a_control_ends_every_scope_of_its_tenant() {
        let cache = DenyCache::new(100, None);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        let other = (0..)
            .map(|i| format!("p:{{u{i}}}:api"))
            .find(|key| !std::ptr::eq(cache.stripe(key), cache.stripe("p:{t}")))
            .unwrap();
        for key in ["p:{t}", "p:{t}:api", "p:{t}:login", other.as_str()] {
            cache.remember_now(key, &quota, 1, &denied(12_000), 0);
            assert!(cache.lookup(key, &quota, 1, 0).is_some(), "{key}");
        }
        cache.forget_tenant("p:{t}#t");
        for key in ["p:{t}", "p:{t}:api", "p:{t}:login"] {
            assert!(cache.lookup(key, &quota, 1, 0).is_none(), "{key}");
        }
        assert!(cache.lookup(&other, &quota, 1, 0).is_some());
        // A denial of a check that started after the control is cached again.
        cache.remember_now("p:{t}:api", &quota, 1, &denied(12_000), 0);
        assert!(cache.lookup("p:{t}:api", &quota, 1, 0).is_some());
    }

    /// A denial whose check started before a control is not remembered after it.
    #[test]
    fn a_denial_from_before_a_control_is_not_remembered() {
        let cache = DenyCache::new(100, None);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        let started = cache.start("p:{t}:api", 0);
        cache.forget_tenant("p:{t}");
        cache.remember("p:{t}:api", &quota, 1, &denied(12_000), 0, started);
        assert!(!cache.shard_holds("p:{t}:api"));
        assert!(cache.lookup("p:{t}:api", &quota, 1, 0).is_none());
    }

    /// With a longest life (a leasing limiter's interval) an entry stops answering then, and
    /// until then it answers with the store's own `retry_after`, counted down.
    #[test]
    fn a_longest_life_ends_an_entry_early_but_keeps_its_retry_after() {
        let cache = DenyCache::new(100, Some(Duration::from_millis(50)));
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        cache.remember_now("k", &quota, 1, &denied(12_000), 1_000_000);
        let hit = cache.lookup("k", &quota, 1, 1_049_999).unwrap();
        assert_eq!(hit.retry_after, Duration::from_millis(11_951));
        assert!(cache.lookup("k", &quota, 1, 1_050_000).is_none());
        // The life counts from the check's start, the retry_after from its decision.
        let started = cache.start("late", 1_000_000);
        cache.remember("late", &quota, 1, &denied(12_000), 1_030_000, started);
        let hit = cache.lookup("late", &quota, 1, 1_049_999).unwrap();
        assert_eq!(hit.retry_after, Duration::from_millis(11_981));
        assert!(cache.lookup("late", &quota, 1, 1_050_000).is_none());
        // A denial shorter than the life ends with itself.
        cache.remember_now("s", &quota, 1, &denied(10), 1_000_000);
        assert!(cache.lookup("s", &quota, 1, 1_009_999).is_some());
        assert!(cache.lookup("s", &quota, 1, 1_010_000).is_none());
    }
}
