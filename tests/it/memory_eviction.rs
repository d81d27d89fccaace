//! The memory store at its cap of keys (`MemoryStore::with_max_keys`): a key that holds what a
//! caller relies on (a held concurrency slot, a suspension) is evicted only when its shard
//! holds nothing else, and then exactly as the docs say. No Redis here: the store is in memory.

use std::time::Duration;

use redlimit::concurrency::{ConcurrencyLimiter, SlotOutcome, DEFAULT_SLOT_LEASE};
use redlimit::store::MemoryStore;
use redlimit::{Limiter, Quota, Target};

use crate::support::Ctx;

/// The slots `store` holds under `key` now.
fn held(store: &MemoryStore, key: &str) -> usize {
    let now = redlimit::clock::Clock::System.now_micros().unwrap();
    store
        .stored_state(key, now)
        .map_or(0, |bytes| bytes.len() / 16)
}

/// Slots of `limit` on `store`, in `scope`, with leases of `lease`.
fn slots(store: &MemoryStore, limit: u64, lease: Duration, scope: &str) -> ConcurrencyLimiter {
    let limiter = Ctx::default().limiter(store.clone());
    ConcurrencyLimiter::with_options(limiter, limit, lease, scope).unwrap()
}

/// 20 000 new keys, each spending a quota of 1 an hour: the flood that evicts what loses least.
async fn flood(store: &MemoryStore) {
    let flood = Limiter::new(store.clone());
    let quota = Quota::per_hour(1).unwrap();
    for client in 0..20_000 {
        assert!(flood
            .check(&format!("client-{client}"), &quota)
            .await
            .is_allowed());
    }
}

/// N = 1: a request holds the slot, a flood of new keys fills the store, and a second
/// acquisition of the key is refused: never 2 in flight. At 2 keys a shard (128) the held slot
/// shares its shard with one other key at a time; at 16 (1 024), with 15.
#[tokio::test]
async fn a_key_flood_never_evicts_a_held_slot() {
    let mut seen = Vec::new();
    for max_keys in [128, 1_024] {
        let store = MemoryStore::with_max_keys(max_keys);
        let slots = slots(&store, 1, DEFAULT_SLOT_LEASE, "exports");
        let SlotOutcome::Acquired(_first) = slots.acquire("k").await else {
            panic!("the first slot")
        };
        flood(&store).await;
        // The memory store answers at once: no await yielded, no renewal put anything back.
        let counted = held(&store, &slots.slots_key("k"));
        let second = slots.acquire("k").await;
        let in_flight = 1 + usize::from(matches!(second, SlotOutcome::Acquired(_)));
        eprintln!(
            "max_keys {max_keys}: {counted} slot counted after the flood, {in_flight} in flight"
        );
        seen.push((max_keys, counted, in_flight));
    }
    // (max_keys, slots counted after the flood, in flight) under N = 1.
    assert_eq!(seen, [(128, 1, 1), (1_024, 1, 1)]);
}

/// After a tenant's reset, each of its routes' strings starts with the reset it was written
/// under: that is rate state, evicted as any other, never ranked with the tenant's held slot
/// (all in one shard, by their hash tag). 40 routes of the tenant at 16 keys a shard: the held
/// slot stays.
#[tokio::test]
async fn a_reset_tenants_routes_never_evict_its_held_slot() {
    let store = MemoryStore::with_max_keys(1_024);
    let slots = slots(&store, 1, DEFAULT_SLOT_LEASE, "exports");
    let limiter = Ctx::default().limiter(store.clone());
    let SlotOutcome::Acquired(_first) = slots.acquire("k").await else {
        panic!("the first slot")
    };
    limiter.reset("k").await.unwrap();
    let quota = Quota::per_hour(1).unwrap();
    for route in 0..40 {
        let scope = format!("route-{route}");
        let target = Target::scoped(&scope, "k");
        assert!(limiter
            .check_quotas(target, &quota.into(), 1)
            .await
            .is_allowed());
    }
    let counted = held(&store, &slots.slots_key("k"));
    let second = slots.acquire("k").await;
    let in_flight = 1 + usize::from(matches!(second, SlotOutcome::Acquired(_)));
    eprintln!("{counted} slot counted after 40 routes, {in_flight} in flight");
    assert_eq!((counted, in_flight), (1, 1));
}
