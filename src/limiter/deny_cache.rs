//! The local deny cache: a denial with `retry_after` r is answered in-process, without the
//! store, until r has passed.
//!
//! It holds denials only, so it can never admit what the store would deny. An entry answers a
//! request only for the same storage key, the same quota and the same cost (its `retry_after`
//! is that cost's: a larger cost would be told to come back too early, a smaller one may pass
//! sooner), so any other cost, or a peek, goes to the store. Denials that can never pass (cost above the capacity) are not cached. Memory is
//! bounded: at most `max_keys` entries, spread over shards; a full shard first drops what has
//! expired, then an arbitrary entry.
//!
//! Time: with a client clock ([`Clock::System`](crate::Clock::System) or a
//! [`ManualClock`](crate::ManualClock)) the cache uses the time the store decided at, so the key
//! is answered by the store again exactly when `retry_after` has passed. With Redis server time
//! it uses a local monotonic clock started when the reply arrived: the entry lives at most one
//! round trip longer than the denial, never shorter.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use crate::decision::Decision;
use crate::quota::{Quota, Quotas};

/// Shards of the map (fewer when `max_keys` is smaller).
const SHARDS: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Entry {
    quotas: Quotas,
    /// The denial's quota and suspension, as the store answered them.
    quota: Quota,
    suspended: bool,
    overridden: bool,
    /// The denied cost: the entry answers requests of this cost only.
    cost: u64,
    limit: u64,
    remaining: u64,
    /// When the denial ends, in the cache's microseconds.
    until: u64,
    /// When the key is full again, in the cache's microseconds.
    reset_at: u64,
}

/// One shard: storage key to its cached denial.
type Shard = RwLock<HashMap<Box<str>, Entry>>;

pub(crate) struct DenyCache {
    shards: Box<[Shard]>,
    per_shard: usize,
    hasher: RandomState,
    /// The origin of the local monotonic clock (Redis server time mode).
    origin: Instant,
}

impl std::fmt::Debug for DenyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyCache")
            .field("max_keys", &(self.per_shard * self.shards.len()))
            .finish_non_exhaustive()
    }
}

impl DenyCache {
    /// A cache of at most `max_keys` entries (at least 1).
    pub(crate) fn new(max_keys: usize) -> Self {
        let max_keys = max_keys.max(1);
        let shards = SHARDS.min(max_keys);
        DenyCache {
            shards: (0..shards).map(|_| RwLock::default()).collect(),
            per_shard: max_keys / shards,
            hasher: RandomState::new(),
            origin: Instant::now(),
        }
    }

    /// The cache's time: the client clock's when there is one, else a local monotonic clock.
    pub(crate) fn now(&self, client_now: Option<u64>) -> u64 {
        client_now.unwrap_or_else(|| self.origin.elapsed().as_micros() as u64)
    }

    fn shard(&self, key: &str) -> &Shard {
        let index = self.hasher.hash_one(key) as usize % self.shards.len();
        &self.shards[index]
    }

    /// The cached denial for a request, if one still holds at `now`.
    pub(crate) fn lookup(
        &self,
        key: &str,
        quotas: &Quotas,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let shard = self.shard(key).read().unwrap_or_else(|e| e.into_inner());
        let entry = shard.get(key)?;
        if now >= entry.until || cost != entry.cost || entry.quotas != *quotas {
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
            quota: entry.quota,
            overridden: entry.overridden,
        })
    }

    /// Remembers the store's `decision` for a request of `cost` decided at `now`, when it is a
    /// denial that will end.
    pub(crate) fn remember(
        &self,
        key: &str,
        quotas: &Quotas,
        cost: u64,
        decision: &Decision,
        now: u64,
    ) {
        if decision.allowed
            || decision.never_allowed()
            || cost == 0
            || decision.retry_after.is_zero()
        {
            return;
        }
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let entry = Entry {
            quotas: *quotas,
            quota: decision.quota,
            suspended: decision.suspended,
            overridden: decision.overridden,
            cost,
            limit: decision.limit,
            remaining: decision.remaining,
            until: now.saturating_add(micros(decision.retry_after)),
            reset_at: now.saturating_add(micros(decision.reset_after)),
        };
        let mut shard = self.shard(key).write().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = shard.get_mut(key) {
            *existing = entry;
            return;
        }
        if shard.len() >= self.per_shard {
            shard.retain(|_, e| e.until > now);
        }
        if shard.len() >= self.per_shard {
            let victim = shard.keys().next().cloned();
            if let Some(victim) = victim {
                shard.remove(&victim);
            }
        }
        shard.insert(key.into(), entry);
    }

    /// Records that the store admitted a request of `cost` under `quota` on `key`: a cached
    /// denial of another cost or quota may now wait too little, so it is dropped. A denial of
    /// this same cost and quota is kept: while it holds, the store cannot admit that cost (short
    /// of a reset or a new quota, which call [`DenyCache::forget`]), so the admission was decided
    /// before the denial and merely answered after it (concurrent calls on one connection).
    pub(crate) fn admitted(&self, key: &str, quotas: &Quotas, cost: u64) {
        let shard = self.shard(key);
        let stale = |e: &Entry| e.cost != cost || e.quotas != *quotas;
        if !shard
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .is_some_and(stale)
        {
            return;
        }
        let mut shard = shard.write().unwrap_or_else(|e| e.into_inner());
        if shard.get(key).is_some_and(stale) {
            shard.remove(key);
        }
    }

    /// Drops the entry of `key`: its state or quota changed.
    pub(crate) fn forget(&self, key: &str) {
        let shard = self.shard(key);
        // Most calls find nothing: a shared read lock keeps them from contending.
        if !shard
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(key)
        {
            return;
        }
        shard.write().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

fn micros_rounded_up_to_ms(micros: u64) -> Duration {
    Duration::from_millis(micros.div_ceil(1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let cache = DenyCache::new(100);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        cache.remember("k", &quota, 2, &denied(12_000), 1_000_000);
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
        let cache = DenyCache::new(100);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        cache.remember("k", &quota, 2, &denied(12_000), 1_000_000);
        // Same cost and quota: decided before the denial, answered after it. Kept.
        cache.admitted("k", &quota, 2);
        assert!(cache.lookup("k", &quota, 2, 1_000_000).is_some());
        // Another cost consumed after the denial: its wait may be too short now. Dropped.
        cache.admitted("k", &quota, 1);
        assert!(cache.lookup("k", &quota, 2, 1_000_000).is_none());
        cache.remember("k", &quota, 2, &denied(12_000), 1_000_000);
        cache.admitted("k", &Quotas::from(Quota::per_minute(6).unwrap()), 2);
        assert!(cache.lookup("k", &quota, 2, 1_000_000).is_none());
    }

    #[test]
    fn admissions_peeks_and_never_are_not_cached() {
        let cache = DenyCache::new(100);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        let mut allowed = denied(0);
        allowed.allowed = true;
        cache.remember("a", &quota, 1, &allowed, 0);
        let mut never = denied(0);
        never.retry_after = Decision::NEVER;
        cache.remember("n", &quota, 9, &never, 0);
        cache.remember("p", &quota, 0, &denied(5), 0);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn memory_is_bounded() {
        let cache = DenyCache::new(64);
        let quota = Quotas::from(Quota::per_minute(5).unwrap());
        for i in 0..10_000 {
            cache.remember(&format!("k{i}"), &quota, 1, &denied(60_000), 0);
        }
        assert!(cache.len() <= 64, "{}", cache.len());
        // The newest key is always in.
        assert!(cache.lookup("k9999", &quota, 1, 0).is_some());
    }
}
