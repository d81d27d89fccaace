//! Token leases for hot keys (opt-in, [`LimiterBuilder::leases`]):
//! an instance takes k units of a key's quota in one store call, consumed in every tier first
//! (all or none, as any check of cost k), spends them in process, and renews in the background
//! when they run low. See the guide's [`leases`](crate::guide::leases) page.
//!
//! - [`Leases`]: the configuration (the lease interval, the most units one renewal takes, the
//!   idle time after which a key's lease ends);
//! - `state.rs`: one key's lease (its batches, the rate that sizes k), pure bookkeeping;
//! - `flow.rs`: the request path (spend, wait for the renewal in flight, or renew) and the
//!   background renewals, give-backs and sweeps.
//!
//! A feature above the core: its table is the limiter's [`Delegate`], which the core asks
//! first on every check and tells of every control and forgotten key; the core names none of
//! its types.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use futures::future::BoxFuture;

use crate::algorithm::{Algorithm, Leasing};
use crate::clock::Clock;
use crate::core::{
    Answer, Ask, ConfigError, Delegate, DelegateConfig, LeaseError, Limiter, LimiterBuilder,
    Renewal,
};
use crate::key::Prehashed;
use crate::quota::Quotas;
use crate::store::StoreRuntime;

mod flow;
mod state;

use self::state::{Reservation, Sizing, State};

/// The most units one renewal takes by default.
pub const DEFAULT_MAX_LEASE_UNITS: u64 = 65_536;

/// The most keys with a lease in one limiter by default.
pub const DEFAULT_MAX_LEASE_KEYS: usize = 100_000;

/// The longest lease interval: controls (a suspension, an override, a reset) reach a leasing
/// instance within one interval, so it stays short.
pub const MAX_LEASE_INTERVAL: Duration = Duration::from_secs(10);

/// Shards of the lease table.
const SHARDS: usize = 16;

/// Keys the deny cache holds when leases turn it on (a renewal's denial is served from it).
const LEASE_DENY_CACHE_KEYS: usize = 10_000;

/// Token leases for hot keys: the configuration given to
/// [`LimiterBuilder::leases`].
///
/// With leases on, an instance takes k units of a key's quota in one store call, consumed in
/// Redis first in every tier (all or none), spends them in process, and renews in the
/// background when half are spent, with at most one renewal in flight per key. A renewal runs
/// as a task of its own, so it ends whatever becomes of the request that started it (dropped,
/// parked, or on a runtime that idles or shuts down), and a request that waits for another's
/// renewal waits at most the store's [`call_timeout`](crate::store::Store::call_timeout), or
/// 1 s for a store that does not say, before the failure policy answers it (see the guide).
/// The renewals run on the runtime current when the limiter was built (as a
/// [`RedisStore`](crate::store::RedisStore)'s own tasks do): keep it running. k follows this
/// instance's own rate on the key, about rate × `interval`, at least 1, at most
/// [`max_units`](Self::max_units) and a tenth of the smallest capacity of the key's quotas; at
/// k = 1 every request is one store call, as without leases, with the same decisions and
/// headers. Units are spendable for one `interval` after their renewal was sent, so a control
/// set anywhere (a suspension, an override, a reset) reaches this instance within one
/// `interval`. Unspent units (at most instances × k per interval) go back to the store when a
/// lease ends early: idle, [`Limiter::forget`](crate::Limiter::forget),
/// [`Limiter::release_leases`](crate::Limiter::release_leases).
///
/// ```
/// use std::time::Duration;
/// use redlimit::{limiter::Leases, store::MemoryStore, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let limiter = Limiter::builder(MemoryStore::new())
///     .leases(Leases::new(Duration::from_millis(50)).max_units(10_000))
///     .build()
///     .unwrap();
/// let quota = Quota::per_second(1_000_000).unwrap();
/// for _ in 0..1_000 {
///     assert!(limiter.check("hot", &quota).await.is_allowed());
/// }
/// let leases = limiter.lease_stats();
/// assert!(leases.renewals < 1_000, "most decisions were served from a lease");
/// assert_eq!(leases.spent, 1_000);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leases {
    interval: Duration,
    max_units: u64,
    max_keys: usize,
    idle_after: Option<Duration>,
}

impl Default for Leases {
    /// A 50 ms lease interval.
    fn default() -> Self {
        Leases::new(Duration::from_millis(50))
    }
}

impl Leases {
    /// Leases of `interval` (50 ms is a good start): the target time one lease lasts, the
    /// longest a unit stays spendable, and the delay within which controls reach this
    /// instance. Zero, or more than [`MAX_LEASE_INTERVAL`], is refused at build time.
    pub fn new(interval: Duration) -> Self {
        Leases {
            interval,
            max_units: DEFAULT_MAX_LEASE_UNITS,
            max_keys: DEFAULT_MAX_LEASE_KEYS,
            idle_after: None,
        }
    }

    /// The most units one renewal takes ([`DEFAULT_MAX_LEASE_UNITS`] by default; at least 1).
    pub fn max_units(self, max_units: u64) -> Self {
        Leases { max_units, ..self }
    }

    /// The most keys with a lease at once ([`DEFAULT_MAX_LEASE_KEYS`] by default; at least
    /// 16): a key beyond them is checked as without leases until idle leases end (memory stays
    /// bounded whatever keys clients send).
    pub fn max_keys(self, max_keys: usize) -> Self {
        Leases { max_keys, ..self }
    }

    /// How long a key may go unused before its lease ends and its rate is forgotten (20 lease
    /// intervals by default; at least one interval). Its unspent units go back to the store.
    pub fn idle_after(self, idle_after: Duration) -> Self {
        Leases {
            idle_after: Some(idle_after),
            ..self
        }
    }

    /// The lease interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    fn idle(&self) -> Duration {
        self.idle_after.unwrap_or(self.interval.saturating_mul(20))
    }

    /// The configuration's errors under `algorithm`, checked by the builder.
    fn validate(&self, algorithm: Algorithm) -> Result<(), LeaseError> {
        if self.interval.is_zero() {
            return Err(LeaseError::ZeroInterval);
        }
        if self.interval > MAX_LEASE_INTERVAL {
            return Err(LeaseError::IntervalTooLong);
        }
        if self.max_units == 0 {
            return Err(LeaseError::ZeroMaxUnits);
        }
        if self.max_keys < SHARDS {
            return Err(LeaseError::TooFewKeys);
        }
        if self.idle() < self.interval {
            return Err(LeaseError::IdleShorterThanInterval);
        }
        if !leases_exactly(algorithm) {
            return Err(LeaseError::Unsupported(algorithm));
        }
        Ok(())
    }
}

/// Whether units of `algorithm` consumed now and spent within one interval admit no more than
/// the store would have (its spec's [`Leasing`]).
fn leases_exactly(algorithm: Algorithm) -> bool {
    algorithm.spec().leasing != Leasing::Refused
}

/// What this limiter's leases did since it was built; see
/// [`Limiter::lease_stats`](crate::Limiter::lease_stats).
///
/// Every unit Redis granted is spent, held, given back or stranded:
/// `leased = spent + held + returned + stranded`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Store calls that took a lease (each of cost k).
    pub renewals: u64,
    /// Units the store granted, over every renewal.
    pub leased: u64,
    /// Units admitted (each admitted request spends its cost).
    pub spent: u64,
    /// Units held now, spendable until their lease ends, and units on their way back to the
    /// store (a give-back not yet answered).
    pub held: u64,
    /// Units given back to the store (a give-back at least one tier took).
    pub returned: u64,
    /// Units that ended unspent and could not go back (a fixed window's that ended, a store
    /// error, a renewal that came back after its key was forgotten, a lease a reset through
    /// this limiter ended, a give-back no tier took anything of, as after a reset made
    /// elsewhere): the price of leasing,
    /// at most instances × k per interval.
    pub stranded: u64,
}

/// The live counters behind [`LeaseStats`].
#[derive(Debug, Default)]
struct Counters {
    renewals: AtomicU64,
    leased: AtomicU64,
    spent: AtomicU64,
    returned: AtomicU64,
    stranded: AtomicU64,
    /// Units on their way back to the store (a give-back in flight): still counted as held.
    returning: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// One key's lease, shared by the requests on it and its renewal.
#[derive(Debug)]
struct Lease {
    /// Its storage key (the table indexes leases by the key's hash).
    key: Box<str>,
    /// The quotas it was taken under (also in its state, which sizes k from them).
    quotas: Quotas,
    state: Mutex<State>,
    /// Wakes the requests waiting for the renewal in flight, when it ends or the lease does.
    renewed: Notify,
}

/// Leases by their key's hash (hashed once per request; a key whose hash another key's lease
/// holds is checked as without leases).
type Shard = Mutex<HashMap<u64, Arc<Lease>, BuildHasherDefault<Prehashed>>>;

/// Every key's lease in this limiter.
pub(crate) struct LeaseTable {
    config: Leases,
    sizing: Sizing,
    shards: Box<[Shard]>,
    /// The most leases in one shard.
    per_shard: usize,
    hasher: RandomState,
    origin: Instant,
    counters: Counters,
    sweeping: AtomicBool,
    /// Where the leases' own work runs (renewals, give-backs, the sweeper): never on the
    /// runtime of whichever request started it.
    runtime: StoreRuntime,
}

impl std::fmt::Debug for LeaseTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseTable")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LeaseTable {
    /// The table of `config`'s leases for `algorithm`; `epoch_clock`: the limiter has a client
    /// clock (the table reads its µs, since the Unix epoch).
    fn new(config: Leases, algorithm: Algorithm, epoch_clock: bool) -> LeaseTable {
        LeaseTable {
            config,
            sizing: Sizing {
                interval: micros(config.interval),
                max_units: config.max_units,
                algorithm,
                epoch_clock,
            },
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: config.max_keys / SHARDS,
            hasher: RandomState::new(),
            origin: Instant::now(),
            counters: Counters::default(),
            sweeping: AtomicBool::new(false),
            runtime: StoreRuntime::current(),
        }
    }

    /// Runs `work` as a task on the leases' runtime: the one current when the limiter was
    /// built, or, built outside any (or after that one shut down), the one of the first call
    /// that needs it, as a store binds its own ([`StoreRuntime`]). Hands `work` back when no
    /// Tokio runtime is bound nor current: the caller then runs it or drops it.
    fn spawn<F>(&self, work: F) -> Result<(), F>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.runtime.epoch() == 0 {
            return Err(work);
        }
        let _ = self.runtime.spawn(work);
        // As the store's batch sender: spawned from a worker of that runtime, the task lands in
        // the worker's LIFO slot, which no other worker steals (tokio-rs/tokio#4941), so a
        // request polled once and then blocking its worker would hold it. A second spawn moves
        // it to the worker's queue, where an idle worker steals it.
        if self.runtime.is_current() {
            let _ = self.runtime.spawn(async {});
        }
        Ok(())
    }

    /// The leases' time in µs: the client clock's when there is one (so a
    /// [`ManualClock`](crate::clock::ManualClock) drives them in tests), else a local monotonic clock.
    fn now(&self, clock: &Clock) -> u64 {
        clock
            .now_micros()
            .unwrap_or_else(|| micros(self.origin.elapsed()))
    }

    /// The renewal that reserved `reservation`, as a settlement dates it (as a give-back of the
    /// lease's units is dated, `flow.rs`): on a client clock its time, else the store's time of
    /// its admission when it told, or the instant it was sent on this table's monotonic clock.
    fn renewal(&self, clock: &Clock, reservation: Reservation) -> Renewal {
        let Reservation { sent, decided } = reservation;
        match clock.now_micros() {
            Some(now) => Renewal {
                // Unused with a client clock (its time dates the refund).
                sent: Instant::now()
                    .checked_sub(Duration::from_micros(now.saturating_sub(sent)))
                    .unwrap_or(self.origin),
                client_micros: Some(sent),
                store_micros: None,
            },
            None => Renewal {
                sent: self.origin + Duration::from_micros(sent),
                client_micros: None,
                store_micros: decided,
            },
        }
    }

    /// The hash of `key` and its shard.
    fn slot(&self, key: &str) -> (u64, &Shard) {
        let hash = self.hasher.hash_one(key);
        // Middle bits pick the shard: the map's buckets come from the low bits, its tags from
        // the high ones.
        (
            hash,
            &self.shards[(hash >> 32) as usize % self.shards.len()],
        )
    }

    /// Whether a check of `cost` under `quotas` leases: it consumes, and a window-bound algorithm
    /// has one tier (the reply names the end of the longest window only).
    fn applies(&self, quotas: &Quotas, cost: u64) -> bool {
        cost > 0
            && (self.sizing.algorithm.spec().leasing != Leasing::WithinWindow || quotas.len() == 1)
    }

    /// The lease of `key` under `quotas`, made when there is none; `None` when the key's lease
    /// was taken under other quotas, or the table is full (that check goes to the store as
    /// without leases).
    fn lease(&self, key: &str, quotas: &Quotas, now: u64) -> Option<Arc<Lease>> {
        let (hash, shard) = self.slot(key);
        let mut shard = shard.lock().expect("lease shard");
        if let Some(lease) = shard.get(&hash) {
            return (*lease.key == *key && lease.quotas == *quotas).then(|| lease.clone());
        }
        if shard.len() >= self.per_shard {
            return None;
        }
        let lease = Arc::new(Lease {
            key: key.into(),
            quotas: *quotas,
            state: Mutex::new(State::new(*quotas, now)),
            renewed: Notify::new(),
        });
        shard.insert(hash, lease.clone());
        Some(lease)
    }

    /// The lease of `key` under `quotas`, if there is one (made by nothing).
    fn find(&self, key: &str, quotas: &Quotas) -> Option<Arc<Lease>> {
        let (hash, shard) = self.slot(key);
        let shard = shard.lock().expect("lease shard");
        let lease = shard.get(&hash)?;
        (*lease.key == *key && lease.quotas == *quotas).then(|| lease.clone())
    }

    /// Removes `key`'s lease; its quotas and its units to give back.
    fn remove(&self, key: &str, now: u64) -> Option<(Quotas, state::Released)> {
        let (hash, shard) = self.slot(key);
        let lease = {
            let mut shard = shard.lock().expect("lease shard");
            if shard.get(&hash).is_none_or(|lease| *lease.key != *key) {
                return None;
            }
            shard.remove(&hash)?
        };
        let mut state = lease.state.lock().expect("lease");
        state.detached = true;
        let released = state.clear(now, self.sizing.interval);
        drop(state);
        // Its waiters check as without leases.
        lease.renewed.notify_waiters();
        Some((lease.quotas, released))
    }

    /// Removes the leases of every key that starts with `tenant` (a tenant's unscoped storage
    /// key: its own lease and its scopes'), for a control: a look at every lease, since
    /// controls are rare and leases are indexed by their whole key.
    fn remove_tenant(&self, tenant: &str, now: u64) -> Vec<(Box<str>, Quotas, state::Released)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            shard.lock().expect("lease shard").retain(|_, lease| {
                if !lease.key.starts_with(tenant) {
                    return true;
                }
                let mut state = lease.state.lock().expect("lease");
                state.detached = true;
                let released = state.clear(now, self.sizing.interval);
                out.push((lease.key.clone(), state.quotas, released));
                drop(state);
                // Its waiters decide again without it, as after `remove`.
                lease.renewed.notify_waiters();
                false
            });
        }
        out
    }

    /// Removes every lease (for [`Limiter::release_leases`](crate::Limiter::release_leases)).
    fn drain(&self, now: u64) -> Vec<(Box<str>, Quotas, state::Released)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            for (_, lease) in shard.lock().expect("lease shard").drain() {
                let mut state = lease.state.lock().expect("lease");
                state.detached = true;
                let released = state.clear(now, self.sizing.interval);
                drop(state);
                lease.renewed.notify_waiters();
                out.push((lease.key.clone(), lease.quotas, released));
            }
        }
        out
    }

    /// Ends the leases past their time: expired batches out, idle keys removed. What to give
    /// back.
    fn sweep(&self, now: u64) -> Vec<(Box<str>, Quotas, state::Released)> {
        let idle = micros(self.config.idle());
        let interval = self.sizing.interval;
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().expect("lease shard");
            shard.retain(|_, lease| {
                let mut state = lease.state.lock().expect("lease");
                let gone = !state.renewing && now.saturating_sub(state.last_used) >= idle;
                let released = if gone {
                    state.detached = true;
                    state.clear(now, interval)
                } else {
                    state.expire(now, interval)
                };
                if released != state::Released::default() {
                    out.push((lease.key.clone(), state.quotas, released));
                }
                if gone {
                    drop(state);
                    lease.renewed.notify_waiters();
                }
                !gone
            });
        }
        out
    }

    fn snapshot(&self) -> LeaseStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let held = self
            .shards
            .iter()
            .map(|shard| {
                let shard = shard.lock().expect("lease shard");
                shard
                    .values()
                    .map(|l| l.state.lock().expect("lease").held())
                    .sum::<u64>()
            })
            .sum::<u64>()
            + self.counters.returning.load(Ordering::Relaxed);
        let c = &self.counters;
        LeaseStats {
            renewals: load(&c.renewals),
            leased: load(&c.leased),
            spent: load(&c.spent),
            held,
            returned: load(&c.returned),
            stranded: load(&c.stranded),
        }
    }
}

impl LimiterBuilder {
    /// Turns on token leases for hot keys (off by default): each instance takes several units
    /// of a busy key's quota in one store call, spends them in process and renews in the
    /// background; a slow key (k = 1) is checked exactly as without leases. See [`Leases`] and
    /// the guide's [`leases`](crate::guide::leases) page for the bounds (controls reach a
    /// leasing instance within one lease interval; at most instances × k units per interval
    /// end unspent).
    ///
    /// Leases need token bucket, GCRA or fixed window; a zero interval or another algorithm is
    /// refused by [`build`](Self::build) ([`ConfigError::Lease`](crate::limiter::ConfigError::Lease)). They turn on the deny cache
    /// (10 000 keys unless [`deny_cache`](Self::deny_cache) says otherwise): a renewal's
    /// denial is served from it until its `retry_after`, for one lease interval at most.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{limiter::Leases, store::MemoryStore, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .leases(Leases::new(Duration::from_millis(50)))
    ///     .build()
    ///     .unwrap();
    /// let quota = Quota::per_hour(40).unwrap();
    /// let admitted = futures::future::join_all((0..100).map(|_| limiter.check("k", &quota))).await;
    /// assert_eq!(admitted.iter().filter(|v| v.is_allowed()).count(), 40);
    /// # }
    /// ```
    pub fn leases(mut self, leases: Leases) -> Self {
        self.delegate = Some(Box::new(leases));
        self
    }
}

impl DelegateConfig for Leases {
    fn validate(&self, algorithm: Algorithm) -> Result<(), ConfigError> {
        Ok(Leases::validate(self, algorithm)?)
    }

    /// A renewal's denial is served from the deny cache until its `retry_after`, for one lease
    /// interval at most.
    fn deny_cache(&self) -> (usize, Duration) {
        (LEASE_DENY_CACHE_KEYS, self.interval)
    }

    fn build(&self, algorithm: Algorithm, clock: &Clock) -> Arc<dyn Delegate> {
        Arc::new(LeaseTable::new(
            *self,
            algorithm,
            !matches!(clock, Clock::Server),
        ))
    }
}

impl Delegate for LeaseTable {
    /// A check that blocks on a denial is one store call: the block is the script's.
    fn takes(&self, ask: &Ask<'_>) -> bool {
        ask.block.is_none()
    }

    fn answer_now(&self, limiter: &Limiter, ask: Ask<'_>) -> Option<Answer> {
        limiter.check_leased_now(self, ask)
    }

    fn answer_later<'a>(&'a self, limiter: &'a Limiter, ask: Ask<'a>) -> BoxFuture<'a, Answer> {
        Box::pin(limiter.decide_leased(self, ask))
    }

    fn forget(&self, limiter: &Limiter, storage_key: &str) {
        limiter.end_lease(self, storage_key);
    }

    fn forget_tenant(&self, limiter: &Limiter, tenant: &str, give_back: bool) {
        limiter.end_tenant_leases(self, tenant, give_back);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
