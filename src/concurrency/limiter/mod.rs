//! [`ConcurrencyLimiter`]: at most N requests in flight per key across the fleet; the slots and
//! their background work (renewals, lost slots put back, give-backs).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

mod background;

use crate::core::{ConfigError, Limiter, Target};
use crate::decision::Verdict;
use crate::failure_policy::FailureContext;
use crate::quota::{Quota, Quotas};
use crate::store::ops::StoreExt;
use crate::store::{CheckRequest, SlotOp, SlotReply, SlotRequest, StoreError};

/// The default lease of a slot: a holder that dies frees its slots this long after its last
/// renewal at the latest.
pub const DEFAULT_SLOT_LEASE: Duration = Duration::from_secs(30);

/// The shortest lease of a slot: three times the default store timeout
/// ([`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT), 100 ms), so that with renewals every
/// third of a lease a slot outlives one renewal that times out.
pub const MIN_SLOT_LEASE: Duration = Duration::from_millis(300);

/// At most `limit` requests in flight per key, fleet-wide: each request takes a slot in the
/// store (one atomic script call, `lua/slots.lua`) and gives it back when it is done.
///
/// **Crash-safe.** Each slot carries a lease (30 s by default, at least [`MIN_SLOT_LEASE`]): a
/// live holder renews the leases of its slots in the background, every third of a lease, in one
/// call per key (the keys at once), so a slot held by a dead instance (or one cut off from
/// Redis) is free again one lease after its last renewal, by itself. A [`Slot`] whose limiter is
/// gone (every clone dropped, as when an instance is killed) is not given back either: its lease
/// runs out. Leases are timed by the store's clock (Redis `TIME`), never by the limiter's
/// client clock: an instance whose clock runs ahead cannot evict the others' live slots.
///
/// **Slots that Redis lost** (`FLUSHALL`, a restart without persistence, a failover to a
/// replica that lagged, Redis's eviction under `maxmemory` with any policy but `noeviction`, or
/// leases that ran out while Redis was unreachable) are put back under their ids at their next
/// renewal. So within one renewal period after the loss (a third of a lease, plus that round's
/// call) every request in flight is counted again. Requests admitted in between, while the key
/// counted fewer, stay admitted: the key is then over `limit` until enough requests end, and
/// admits nobody while it is.
///
/// A [`MemoryStore`](crate::store::MemoryStore) loses a held slot only when a new key finds the
/// slot's shard full of protected keys (held slots, suspensions, overrides, blocks; see its
/// docs): it evicts the one closest to expiry, and the slot is put back the same way. A shard
/// whose protected keys outnumber its share (`max_keys / 64`) never holds them all: each
/// renewal puts its slots' key back and evicts the protected key closest to expiry.
///
/// **A slot exists only while its request is in flight**, plus the time to reach the store. A
/// slot given back (the [`Slot`] dropped), an acquisition that failed (a timeout: the script may
/// have run) and an acquisition dropped at its await (a client gone, `tower::timeout`) are given
/// back by a background task, in bulk, retried every 10 to 250 ms until the store answers; one
/// still not answered for after a lease is left to its lease, which has ended by then.
///
/// **When the store fails**, the limiter's failure policy decides as for a check of `limit`
/// per lease: [`FailOpen`](crate::failure_policy::FailOpen) admits without a slot, [`FailClosed`](crate::failure_policy::FailClosed)
/// refuses, [`LocalFallback`](crate::failure_policy::LocalFallback) admits within its local share of that
/// rate (a rate, not a count of requests in flight: the closest an in-process stand-in gets).
///
/// ```
/// use redlimit::concurrency::{ConcurrencyLimiter, SlotOutcome};
/// use redlimit::{store::MemoryStore, Limiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let slots = ConcurrencyLimiter::new(Limiter::new(MemoryStore::new()), 2)?;
/// let SlotOutcome::Acquired(first) = slots.acquire("tenant-42").await else { panic!() };
/// let SlotOutcome::Acquired(_second) = slots.acquire("tenant-42").await else { panic!() };
/// assert!(matches!(slots.acquire("tenant-42").await, SlotOutcome::Full { .. }));
/// drop(first); // given back (by a task of the limiter's)
/// # tokio::task::yield_now().await;
/// assert!(matches!(slots.acquire("tenant-42").await, SlotOutcome::Acquired(_)));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimiter {
    inner: Arc<SlotsInner>,
}

struct SlotsInner {
    limiter: Limiter,
    limit: u64,
    lease: Duration,
    scope: String,
    /// The slots this process holds, for their renewals: number → (storage key, id).
    held: Mutex<HashMap<u64, (String, String)>>,
    /// Slots to give back, per storage key: each id and when it was queued.
    releasing: Mutex<HashMap<String, Vec<(String, Instant)>>>,
    /// Wakes the task that gives slots back (also when the limiter is gone, so that it ends).
    wake: Arc<Notify>,
    next: AtomicU64,
    /// This process's part of every slot id, so that no two holders share one.
    process: u64,
    /// Whether the renewal and release tasks run.
    started: AtomicBool,
}

impl Drop for SlotsInner {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl fmt::Debug for ConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimiter")
            .field("limiter", &self.inner.limiter)
            .field("limit", &self.inner.limit)
            .field("lease", &self.inner.lease)
            .field("scope", &self.inner.scope)
            .finish()
    }
}

/// What [`ConcurrencyLimiter::acquire`] answers.
#[derive(Debug)]
#[non_exhaustive]
pub enum SlotOutcome {
    /// A slot is held until the [`Slot`] is dropped.
    Acquired(Slot),
    /// Every slot is taken. `wait`: the longest a slot can stay taken (until the oldest lease
    /// ends); one usually frees much sooner.
    Full {
        /// Until the oldest lease ends.
        wait: Duration,
    },
    /// The store failed and the failure policy admitted the request: no slot is held (one the
    /// failed call may have taken is given back once the store answers).
    FailedOpen,
    /// The store failed and the failure policy refused the request.
    FailedClosed {
        /// When to try again.
        retry_after: Duration,
    },
}

/// A slot the store may hold for this process: given back in the background when dropped,
/// unless disarmed (the store answered that it took none).
struct Claim {
    key: String,
    id: String,
    owner: Weak<SlotsInner>,
}

impl Claim {
    fn disarm(mut self) {
        self.owner = Weak::new();
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // A limiter that is gone gives nothing back: the lease runs out, as for a crash.
        if let Some(inner) = self.owner.upgrade() {
            let (key, id) = (std::mem::take(&mut self.key), std::mem::take(&mut self.id));
            inner.give_back(key, id);
        }
    }
}

/// A concurrency slot held; given back when dropped (see [`ConcurrencyLimiter`]).
pub struct Slot {
    number: u64,
    remaining: u64,
    claim: Claim,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key: it may be a secret.
        f.debug_struct("Slot")
            .field("id", &self.claim.id)
            .field("remaining", &self.remaining)
            .finish()
    }
}

impl Slot {
    /// The slots left for the key when this one was taken.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // No longer renewed; the claim, dropped next, gives it back.
        if let Some(inner) = self.claim.owner.upgrade() {
            inner.held().remove(&self.number);
        }
    }
}

impl SlotsInner {
    fn held(&self) -> MutexGuard<'_, HashMap<u64, (String, String)>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn releasing(&self) -> MutexGuard<'_, HashMap<String, Vec<(String, Instant)>>> {
        self.releasing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `id` of `key` for the release task.
    fn give_back(&self, key: String, id: String) {
        self.releasing()
            .entry(key)
            .or_default()
            .push((id, Instant::now()));
        self.wake.notify_one();
    }

    async fn call(&self, key: &str, ids: &[&str], op: SlotOp) -> Result<SlotReply, StoreError> {
        self.limiter
            .store()
            .slots(SlotRequest {
                key,
                op,
                ids,
                lease: self.lease,
                // The store's clock: every instance must time one key's leases by one clock.
                now_micros: None,
            })
            .await
    }
}

impl ConcurrencyLimiter {
    /// At most `limit` (at least 1) requests in flight per key, on `limiter`'s store, with
    /// [`DEFAULT_SLOT_LEASE`] and the scope `concurrency`.
    pub fn new(limiter: Limiter, limit: u64) -> Result<Self, ConfigError> {
        Self::with_options(limiter, limit, DEFAULT_SLOT_LEASE, "concurrency")
    }

    /// [`new`](Self::new) with a slot's `lease` ([`MIN_SLOT_LEASE`] to 30 days; renewed every
    /// third of it while held) and a `scope` of its own (a name as
    /// [`RateLimitLayerBuilder::scope`](crate::layer::RateLimitLayerBuilder::scope) takes it), so
    /// that several concurrency limits on one key stay apart.
    pub fn with_options(
        limiter: Limiter,
        limit: u64,
        lease: Duration,
        scope: &str,
    ) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::Quota(crate::quota::QuotaError::ZeroLimit));
        }
        if limit > crate::quota::MAX_COUNT {
            return Err(ConfigError::Quota(crate::quota::QuotaError::CountTooLarge));
        }
        if lease < MIN_SLOT_LEASE || lease > crate::core::MAX_SUSPENSION {
            return Err(ConfigError::InvalidLease);
        }
        if !crate::core::is_name(scope) {
            return Err(ConfigError::InvalidScope);
        }
        let process = {
            use std::hash::{BuildHasher, Hasher};
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u128(crate::clock::system_now_micros() as u128);
            hasher.finish()
        };
        Ok(ConcurrencyLimiter {
            inner: Arc::new(SlotsInner {
                limiter,
                limit,
                lease,
                scope: scope.to_owned(),
                held: Mutex::default(),
                releasing: Mutex::default(),
                wake: Arc::new(Notify::new()),
                next: AtomicU64::new(0),
                process,
                started: AtomicBool::new(false),
            }),
        })
    }

    /// The most requests in flight per key.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// How long a slot is held without a renewal.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The storage key of `key`'s slots: `<prefix>:{<id>}:<scope>#c` (a sorted set).
    pub fn slots_key(&self, key: &str) -> String {
        let route = self
            .inner
            .limiter
            .target_key(Target::scoped(&self.inner.scope, key));
        [route.as_str(), "#c"].concat()
    }

    /// Takes a slot for `key` if fewer than [`limit`](Self::limit) are held fleet-wide.
    ///
    /// Cancel-safe: dropped while its call is on the way, it gives back the slot the call may
    /// take (see [`ConcurrencyLimiter`]).
    pub async fn acquire(&self, key: &str) -> SlotOutcome {
        let inner = &self.inner;
        // Before the call: a claim dropped during it needs the release task.
        self.start_background();
        let number = inner.next.fetch_add(1, Ordering::Relaxed);
        let claim = Claim {
            key: self.slots_key(key),
            id: format!("{:016x}-{number}", inner.process),
            owner: Arc::downgrade(inner),
        };
        let op = SlotOp::Acquire { limit: inner.limit };
        match inner.call(&claim.key, &[claim.id.as_str()], op).await {
            Ok(reply) if reply.ok => {
                inner
                    .held()
                    .insert(number, (claim.key.clone(), claim.id.clone()));
                SlotOutcome::Acquired(Slot {
                    number,
                    remaining: reply.remaining,
                    claim,
                })
            }
            Ok(reply) => {
                claim.disarm();
                SlotOutcome::Full { wait: reply.wait }
            }
            // The script may have run: the claim, dropped, gives its slot back.
            Err(error) => self.on_store_error(&claim.key, &error),
        }
    }

    /// A failed acquisition, as the failure policy sees a check of `limit` per lease.
    fn on_store_error(&self, storage_key: &str, error: &StoreError) -> SlotOutcome {
        let inner = &self.inner;
        let limiter = &inner.limiter;
        limiter.counters().count_store_error();
        let quota = Quota::new(inner.limit, inner.lease).ok();
        let Some(quotas) = quota.map(Quotas::from) else {
            return SlotOutcome::FailedOpen;
        };
        let request = CheckRequest {
            key: storage_key,
            algorithm: limiter.algorithm(),
            quotas: &quotas,
            cost: 1,
            now_micros: limiter.clock().now_micros(),
        };
        let verdict = limiter
            .policy()
            .on_store_error(&FailureContext { error, request });
        if let Some(suppressed) = crate::store::failure_log_gate() {
            tracing::warn!(%error, allowed = verdict.is_allowed(), suppressed, "concurrency slot store failed; the failure policy decided");
        }
        match verdict {
            Verdict::FailedClosed { retry_after } => SlotOutcome::FailedClosed { retry_after },
            Verdict::Decided(decision) if !decision.allowed => SlotOutcome::FailedClosed {
                retry_after: decision.retry_after,
            },
            _ => SlotOutcome::FailedOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ConcurrencyLimiter;
    use crate::core::ConfigError;
    use crate::core::Limiter;
    use crate::store::MemoryStore;

    /// A lease too short to be renewed in time (a third of it between renewals, less than
    /// one store timeout) is refused when the limiter is built.
    #[test]
    fn a_lease_too_short_to_renew_is_refused() {
        let build = |ms| {
            let limiter = Limiter::new(MemoryStore::new());
            ConcurrencyLimiter::with_options(limiter, 1, Duration::from_millis(ms), "s")
        };
        let accepted: Vec<u64> = [1, 2, 3, 299]
            .into_iter()
            .filter(|&ms| !matches!(build(ms), Err(ConfigError::InvalidLease)))
            .collect();
        assert!(accepted.is_empty(), "leases accepted (ms): {accepted:?}");
        assert!(build(300).is_ok());
    }
}
