//! Keys evicted at a store's cap: the memory store's cap of keys (`MemoryStore::with_max_keys`),
//! where a key that holds what a caller relies on (a held concurrency slot, a suspension) is
//! evicted only when its shard holds nothing else, and then exactly as the docs say; and
//! Redis's `maxmemory`, whose eviction loses a held slot as a `FLUSHALL` does.

use std::time::{Duration, Instant};

use redlimit::concurrency::{ConcurrencyLimiter, SlotOutcome, DEFAULT_SLOT_LEASE};
use redlimit::store::MemoryStore;
use redlimit::{Limiter, Quota, Target};

use crate::support::{Ctx, RedisServer};

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

/// The bound of that protection: a shard holds `max_keys / 64` keys (keys of one hash tag
/// share one), and one full of protected keys (held slots, suspensions) makes room for a new
/// key of any kind with the one closest to expiry. At 2 keys a shard, a held slot (lease
/// 600 ms) and a route's suspension (2 min) of one tenant: a new route of the tenant evicts
/// the slot, and the key admits a second request under N = 1 until the holder's next renewal
/// puts its slot back (then the key counts 2, over N, and admits nobody).
#[tokio::test]
async fn a_shard_full_of_protected_keys_loses_the_held_slot_closest_to_expiry() {
    let store = MemoryStore::with_max_keys(128);
    let lease = Duration::from_millis(600);
    let slots = slots(&store, 1, lease, "exports");
    let limiter = Ctx::default().limiter(store.clone());
    let key = slots.slots_key("k");
    let SlotOutcome::Acquired(_first) = slots.acquire("k").await else {
        panic!("the first slot")
    };
    limiter
        .suspend(Target::scoped("api", "k"), Duration::from_secs(120))
        .await
        .unwrap();
    // Other shards' floods do not reach it: its one other key is protected too, but longer.
    assert_eq!(held(&store, &key), 1);
    let quota = Quota::per_hour(1).unwrap();
    let web = Target::scoped("web", "k");
    assert!(limiter
        .check_quotas(web, &quota.into(), 1)
        .await
        .is_allowed());
    let lost = held(&store, &key);
    let second = slots.acquire("k").await;
    let in_flight = 1 + usize::from(matches!(second, SlotOutcome::Acquired(_)));
    let quotas = quota.into();
    let api = limiter
        .check_quotas(Target::scoped("api", "k"), &quotas, 1)
        .await;
    let suspended = api.decision().is_some_and(|d| d.suspended);
    let started = Instant::now();
    let mut counted = held(&store, &key);
    while counted < 2 && started.elapsed() < lease * 5 / 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        counted = held(&store, &key);
    }
    eprintln!(
        "slots counted after the new route: {lost}; then {in_flight} in flight, the route \
         suspended: {suspended}; {counted} counted {:?} later",
        started.elapsed()
    );
    assert_eq!((lost, in_flight, suspended, counted), (0, 2, true, 2));
    assert!(matches!(slots.acquire("k").await, SlotOutcome::Full { .. }));
}

/// Below that bound: at 1 key a shard, two scopes' held slots on one key (one hash tag, one
/// shard) never both count. The second acquisition evicts the first's slot, whose key then
/// admits a second request under N = 1; from then on each renewal puts its own slot back and
/// evicts the other's, and at no moment does the shard hold both.
#[tokio::test]
async fn held_slots_past_a_shards_share_never_all_count() {
    let store = MemoryStore::with_max_keys(64);
    let lease = Duration::from_millis(300);
    let (a, b) = (slots(&store, 1, lease, "a"), slots(&store, 1, lease, "b"));
    let (key_a, key_b) = (a.slots_key("k"), b.slots_key("k"));
    let SlotOutcome::Acquired(_a) = a.acquire("k").await else {
        panic!("a's slot")
    };
    let SlotOutcome::Acquired(_b) = b.acquire("k").await else {
        panic!("b's slot")
    };
    let after_b = (held(&store, &key_a), held(&store, &key_b));
    let again = a.acquire("k").await;
    let in_flight = 1 + usize::from(matches!(again, SlotOutcome::Acquired(_)));
    let mut both = 0;
    let started = Instant::now();
    while started.elapsed() < lease * 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        both += usize::from(held(&store, &key_a) > 0 && held(&store, &key_b) > 0);
    }
    eprintln!(
        "after b's acquisition (a, b) counted {after_b:?}; a then had {in_flight} in flight; \
         both counted at {both} samples over two leases"
    );
    assert_eq!((after_b, in_flight, both), ((0, 1), 2, 0));
}

/// Redis under `maxmemory` with an evicting policy evicts a held slot's key like any other
/// (`volatile-ttl`: its short TTL goes first). The key then admits a second request under
/// N = 1, and the holder's next renewal puts its slot back, as after a `FLUSHALL`.
#[tokio::test]
async fn a_slot_redis_evicts_under_maxmemory_is_put_back_at_its_renewal() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(600);
    let limiter = Ctx::default().redis(&redis);
    let slots = ConcurrencyLimiter::with_options(limiter, 1, lease, "exports").unwrap();
    let key = slots.slots_key("k");
    let SlotOutcome::Acquired(_first) = slots.acquire("k").await else {
        panic!("the first slot")
    };
    let mut conn = redis.conn();
    let config = |name: &str, value: String, conn: &mut redis::Connection| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query::<()>(conn)
            .expect("CONFIG SET");
    };
    let exists = |conn: &mut redis::Connection| -> bool {
        redis::cmd("EXISTS").arg(&key).query::<u64>(conn).unwrap() == 1
    };
    config("maxmemory-policy", "volatile-ttl".into(), &mut conn);
    config(
        "maxmemory",
        (redis.used_memory() + (1 << 20)).to_string(),
        &mut conn,
    );
    // Keys of an hour's TTL, 10 kB each, until Redis evicted the slot's (it may take a few
    // samples: Redis's eviction is approximate).
    let value = vec![b'x'; 10_000];
    let mut written = 0;
    while exists(&mut conn) && written < 5_000 {
        redis::cmd("SET")
            .arg(format!("fill-{written}"))
            .arg(&value)
            .arg("EX")
            .arg(3_600)
            .query::<()>(&mut conn)
            .expect("SET under maxmemory");
        written += 1;
    }
    let evicted = !exists(&mut conn);
    config("maxmemory", "0".into(), &mut conn);
    let second = slots.acquire("k").await;
    let in_flight = 1 + usize::from(matches!(second, SlotOutcome::Acquired(_)));
    let counted = |conn: &mut redis::Connection| -> u64 {
        redis::cmd("ZCARD").arg(&key).query(conn).unwrap()
    };
    let started = Instant::now();
    let mut held = counted(&mut conn);
    while held < 2 && started.elapsed() < lease * 5 / 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        held = counted(&mut conn);
    }
    eprintln!(
        "evicted after {written} keys of 10 kB: {evicted}; then {in_flight} in flight; {held} \
         counted {:?} later",
        started.elapsed()
    );
    assert_eq!((evicted, in_flight, held), (true, 2, 2));
    assert!(matches!(slots.acquire("k").await, SlotOutcome::Full { .. }));
}
