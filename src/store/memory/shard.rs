//! The keys of one [`MemoryStore`](super::MemoryStore) shard: a `Vec` of slots, an index from
//! key to slot, and a min-heap of expiry times, so a full shard reclaims an expired key before
//! it evicts a live one.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use super::EVICTION_BATCH;
use crate::algorithm::{decide_log, sliding_log, tenant_key, LogWrite, Packed, Refused, Reply};

/// The keys of one shard: stored in a `Vec`, with an index from key to slot and a min-heap of
/// their expiry times.
#[derive(Default)]
pub(super) struct Shard {
    pub(super) index: HashMap<Arc<str>, usize>,
    pub(super) slots: Vec<Slot>,
    /// `(expires_at, slot)` pairs: every slot has one at or before its expiry (see
    /// [`Shard::set_expiry`]), plus outdated ones (another key moved in, or the key's expiry
    /// moved) corrected or dropped when they come to the top.
    pub(super) expiries: BinaryHeap<Reverse<(u64, usize)>>,
    /// Sliding-log entries allocated by the logs in `slots`.
    pub(super) log_entries: usize,
}

pub(super) struct Slot {
    pub(super) key: Arc<str>,
    pub(super) stored: Stored,
}

pub(super) struct Stored {
    pub(super) state: KeyState,
    /// µs time at which the key expires, as Redis's PEXPIRE would.
    pub(super) expires_at: u64,
}

/// The state of one key: a string, byte for byte what Redis holds (the controls and every tier's
/// state: see `lua/common.lua`), or a sliding log.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum KeyState {
    /// One plain state (no controls, one tier), kept without an allocation.
    Packed(Packed),
    Bytes(Vec<u8>),
    /// O(burst): changed in place, never copied.
    Log(sliding_log::Log),
}

impl KeyState {
    /// Sliding-log entries this state has allocated.
    pub(super) fn log_entries(&self) -> usize {
        match self {
            KeyState::Packed(_) | KeyState::Bytes(_) => 0,
            KeyState::Log(log) => log.capacity(),
        }
    }
}

/// The µs time at which a key written at `now` with a TTL of `ttl_ms` expires.
pub(super) fn expiry(now: u64, ttl_ms: u64) -> u64 {
    now.saturating_add(ttl_ms.saturating_mul(1000))
}

impl Shard {
    /// Stores `stored` under `key`, held at `held` (live, expired or of another algorithm) or new.
    pub(super) fn put(
        &mut self,
        held: Option<usize>,
        key: &str,
        stored: Stored,
        now: u64,
        max: usize,
    ) {
        match held {
            Some(slot) => {
                self.log_entries -= self.slots[slot].stored.state.log_entries();
                self.log_entries += stored.state.log_entries();
                let expires_at = stored.expires_at;
                self.slots[slot].stored.state = stored.state;
                self.set_expiry(slot, expires_at);
            }
            None => self.insert(key, stored, now, max),
        }
    }

    /// Where `key` is held (live, expired or of another kind), and whether it is live.
    /// The string of `key`'s tenant's controls (see `lua/common.lua`), when live: copied, as
    /// the decision then writes to the shard.
    pub(super) fn tenant(&self, key: &str, now: u64) -> Option<Vec<u8>> {
        let (_, live) = self.find(&tenant_key(key), now);
        live.and_then(|slot| self.bytes(slot)).map(<[u8]>::to_vec)
    }

    pub(super) fn find(&self, key: &str, now: u64) -> (Option<usize>, Option<usize>) {
        let held = self.index.get(key).copied();
        (
            held,
            held.filter(|&slot| self.slots[slot].stored.expires_at > now),
        )
    }

    /// The string held at `slot`, if it holds one.
    pub(super) fn bytes(&self, slot: usize) -> Option<&[u8]> {
        match &self.slots[slot].stored.state {
            KeyState::Packed(packed) => Some(packed.as_bytes()),
            KeyState::Bytes(bytes) => Some(bytes),
            KeyState::Log(_) => None,
        }
    }

    /// The sliding log's decision: a live log changes in place (its expiry refreshed when the
    /// decision writes); a fresh one is stored only when it writes. Its controls live at
    /// `controls_key`, as in Redis.
    pub(super) fn log_step(
        &mut self,
        key: &str,
        controls_key: &str,
        quotas: &[crate::quota::Quota],
        now: u64,
        cost: f64,
        max: usize,
    ) -> Result<Reply, Refused> {
        let tenant = self.tenant(key, now);
        let (_, controls_live) = self.find(controls_key, now);
        let controls = controls_live
            .and_then(|slot| self.bytes(slot))
            .map(<[u8]>::to_vec);
        let (held, live) = self.find(key, now);
        let mut fresh = sliding_log::Log::new();
        let (log, existing) = match live {
            Some(slot) => match &mut self.slots[slot].stored.state {
                KeyState::Log(log) => (log, true),
                KeyState::Packed(_) | KeyState::Bytes(_) => (&mut fresh, false),
            },
            None => (&mut fresh, false),
        };
        let before = log.capacity();
        let (reply, write) = decide_log(
            controls.as_deref(),
            tenant.as_deref(),
            log,
            now as f64,
            cost,
            quotas,
        )?;
        let LogWrite {
            log_ttl,
            controls: controls_write,
        } = write;
        if let Some(slot) = live.filter(|_| existing) {
            self.log_entries =
                self.log_entries - before + self.slots[slot].stored.state.log_entries();
            if let Some(ttl) = log_ttl {
                self.set_expiry(slot, expiry(now, ttl));
            }
        } else if let Some(ttl) = log_ttl {
            let stored = Stored {
                state: KeyState::Log(fresh),
                expires_at: expiry(now, ttl),
            };
            self.put(held, key, stored, now, max);
        }
        if let Some((head, ttl)) = controls_write {
            let stored = Stored {
                state: KeyState::Bytes(head),
                expires_at: expiry(now, ttl),
            };
            // The log's slot may have moved: find the controls' again.
            let (held, _) = self.find(controls_key, now);
            self.put(held, controls_key, stored, now, max);
        }
        Ok(reply)
    }

    /// Evicts other sliding-log keys, the closest to expiry first, until the shard's log entries
    /// fit in `budget` or only `keep`'s log is left.
    pub(super) fn trim_logs(&mut self, keep: &str, budget: usize) {
        while self.log_entries > budget {
            let victim = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.stored.state.log_entries() > 0 && &*s.key != keep)
                .min_by_key(|(_, s)| s.stored.expires_at)
                .map(|(slot, _)| slot);
            match victim {
                Some(slot) => self.remove_slot(slot),
                None => break,
            }
        }
    }

    /// Stores `key`, which the shard does not hold, keeping the shard within `max` keys (never
    /// above): while it is full, make room.
    pub(super) fn insert(&mut self, key: &str, stored: Stored, now: u64, max: usize) {
        debug_assert!(!self.index.contains_key(key));
        while self.slots.len() >= max.max(1) {
            self.make_room(now);
        }
        let key: Arc<str> = Arc::from(key);
        let slot = self.slots.len();
        self.log_entries += stored.state.log_entries();
        self.index.insert(Arc::clone(&key), slot);
        let expires_at = stored.expires_at;
        self.slots.push(Slot { key, stored });
        self.note_expiry(slot, expires_at);
    }

    /// Sets the expiry of the key at `slot`. A later expiry (nearly every write: a key's state
    /// is fresh again later after each admission) leaves the heap alone: its pair there is then
    /// earlier than the key's expiry, and is moved up when it comes to the top.
    pub(super) fn set_expiry(&mut self, slot: usize, expires_at: u64) {
        let stored = &mut self.slots[slot].stored;
        let earlier = expires_at < stored.expires_at;
        stored.expires_at = expires_at;
        if earlier {
            self.note_expiry(slot, expires_at);
        }
    }

    /// Records in the heap that `slot` now expires at `expires_at`; compacts the heap once its
    /// outdated pairs outnumber the keys (O(n) every n writes or more: O(1) amortized).
    pub(super) fn note_expiry(&mut self, slot: usize, expires_at: u64) {
        if self.expiries.len() > 2 * self.slots.len() + 64 {
            let mut pairs = std::mem::take(&mut self.expiries).into_vec();
            pairs.clear();
            pairs.extend(
                (self.slots.iter().enumerate())
                    .map(|(s, held)| Reverse((held.stored.expires_at, s))),
            );
            self.expiries = BinaryHeap::from(pairs);
        } else {
            self.expiries.push(Reverse((expires_at, slot)));
        }
    }

    /// Removes at least one key: the expired ones, longest expired first (up to
    /// [`EVICTION_BATCH`]), or when none has expired the one closest to expiry.
    pub(super) fn make_room(&mut self, now: u64) {
        let mut removed = 0;
        while let Some(&Reverse((expires_at, slot))) = self.expiries.peek() {
            let current = self.slots.get(slot).map(|held| held.stored.expires_at);
            if current != Some(expires_at) {
                self.expiries.pop();
                // Its key expires later now: the pair moves there. An earlier expiry, or no key,
                // has a pair of its own.
                if let Some(later) = current.filter(|&c| c > expires_at) {
                    self.expiries.push(Reverse((later, slot)));
                }
                continue;
            }
            if removed > 0 && (expires_at > now || removed == EVICTION_BATCH) {
                return;
            }
            self.expiries.pop();
            self.remove_slot(slot);
            removed += 1;
        }
        if removed == 0 && !self.slots.is_empty() {
            // Unreachable (every slot has its pair in the heap); never loop forever on a bug.
            debug_assert!(false, "a held key without its expiry in the heap");
            self.remove_slot(0);
        }
    }

    pub(super) fn remove_slot(&mut self, slot: usize) {
        let removed = self.slots.swap_remove(slot);
        self.log_entries -= removed.stored.state.log_entries();
        self.index.remove(&*removed.key);
        if let Some(moved) = self.slots.get(slot) {
            if let Some(index) = self.index.get_mut(&*moved.key) {
                *index = slot;
            }
            // Its pairs name its old slot: give it one for the new.
            let expires_at = moved.stored.expires_at;
            self.note_expiry(slot, expires_at);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn stored(expires_at: u64) -> Stored {
        Stored {
            state: KeyState::Bytes(vec![b'f'; 17]),
            expires_at,
        }
    }

    /// Every slot is indexed under its key, and nothing else is.
    pub(in crate::store::memory) fn assert_consistent(shard: &Shard) {
        assert_eq!(shard.index.len(), shard.slots.len());
        for (slot, held) in shard.slots.iter().enumerate() {
            assert_eq!(shard.index.get(&*held.key), Some(&slot), "{}", held.key);
        }
    }

    fn keys(shard: &Shard) -> Vec<&str> {
        let mut keys: Vec<&str> = shard.slots.iter().map(|s| &*s.key).collect();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn a_full_shard_reclaims_an_expired_key_before_evicting_a_live_one() {
        let now = 1_000;
        let mut shard = Shard::default();
        shard.insert("soon", stored(now + 1), now, 4);
        shard.insert("late", stored(now + 500), now, 4);
        shard.insert("dead", stored(now - 1), now, 4);
        shard.insert("later", stored(now + 900), now, 4);
        // Full: the expired key makes room, not the live key closest to expiry.
        shard.insert("new", stored(now + 1_000), now, 4);
        assert_consistent(&shard);
        assert_eq!(keys(&shard), ["late", "later", "new", "soon"]);
        // Full of live keys: the one closest to expiry goes.
        shard.insert("newer", stored(now + 1_000), now, 4);
        assert_consistent(&shard);
        assert_eq!(keys(&shard), ["late", "later", "new", "newer"]);
    }

    #[test]
    fn a_full_shard_drops_every_expired_key_in_its_sample() {
        let now = 1_000;
        let mut shard = Shard::default();
        for i in 0..10 {
            let expires_at = if i % 2 == 0 { now } else { now + 1 };
            shard.insert(&format!("k{i}"), stored(expires_at), now, 10);
        }
        shard.insert("new", stored(now + 1), now, 10);
        assert_consistent(&shard);
        assert_eq!(keys(&shard), ["k1", "k3", "k5", "k7", "k9", "new"]);
    }

    /// An expired key anywhere in a full shard of live keys is reclaimed by the very next new
    /// key, before any live key; then the live key closest to expiry goes, and so on in order of
    /// expiry. (The earlier sampled eviction looked at 32 keys from a rotating cursor: with the
    /// expired key outside them it evicted k0, a live key, and took up to 64 new keys to reach
    /// the expired one.)
    #[test]
    fn an_expired_key_anywhere_is_reclaimed_before_any_live_key() {
        const MAX: usize = 1_000;
        let now = 1_000_000;
        for dead_at in [500, MAX - 1, 32, 31, 0] {
            let mut shard = Shard::default();
            for i in 0..MAX {
                let expires_at = if i == dead_at {
                    now
                } else {
                    now + 1 + i as u64
                };
                shard.insert(&format!("k{i}"), stored(expires_at), now, MAX);
            }
            // A new key outlives every key already held, so it is never the one evicted.
            shard.insert("new0", stored(now + 10_000_000), now, MAX);
            assert_consistent(&shard);
            assert_eq!(shard.slots.len(), MAX, "the cap is hard");
            let dead = format!("k{dead_at}");
            assert!(!shard.index.contains_key(dead.as_str()), "slot {dead_at}");
            for i in (0..MAX).filter(|&i| i != dead_at) {
                assert!(
                    shard.index.contains_key(format!("k{i}").as_str()),
                    "k{i} evicted"
                );
            }
            // No key has expired now: the live ones go closest to expiry first.
            let live: Vec<usize> = (0..MAX).filter(|&i| i != dead_at).take(5).collect();
            for (n, i) in live.into_iter().enumerate() {
                shard.insert(&format!("new{}", n + 1), stored(now + 10_000_000), now, MAX);
                assert!(!shard.index.contains_key(format!("k{i}").as_str()));
                assert_eq!(shard.slots.len(), MAX);
            }
            assert_consistent(&shard);
        }
    }

    /// A key whose expiry moved later (a write leaves its earlier pair in the heap) is ordered
    /// by its new expiry: the key that now expires first goes, not the one whose pair is oldest.
    #[test]
    fn an_extended_key_is_evicted_by_its_new_expiry() {
        let now = 1_000;
        let mut shard = Shard::default();
        shard.insert("a", stored(now + 10), now, 3);
        shard.insert("b", stored(now + 20), now, 3);
        shard.insert("c", stored(now + 30), now, 3);
        let held = shard.find("a", now).0;
        shard.put(held, "a", stored(now + 100), now, 3);
        shard.insert("new", stored(now + 1_000), now, 3);
        assert_eq!(keys(&shard), ["a", "c", "new"]);
        shard.insert("newer", stored(now + 1_000), now, 3);
        assert_eq!(keys(&shard), ["a", "new", "newer"]);
        shard.insert("newest", stored(now + 1_000), now, 3);
        assert_eq!(keys(&shard), ["new", "newer", "newest"]);
        assert_consistent(&shard);
    }

    /// The heap of expiry times stays within a constant factor of the keys however often they
    /// are rewritten (outdated pairs are compacted away), and still finds the right key.
    #[test]
    fn rewrites_do_not_grow_the_expiry_heap() {
        let mut shard = Shard::default();
        let mut now = 1_000;
        for i in 0..100 {
            shard.insert(&format!("k{i}"), stored(now + 1_000), now, 100);
        }
        for round in 0..1_000u64 {
            now += 1;
            for i in 0..100 {
                let held = shard.find(&format!("k{i}"), now).0;
                let expires_at = if i == 42 { now } else { now + 1_000 + round };
                shard.put(held, &format!("k{i}"), stored(expires_at), now, 100);
            }
            assert!(
                shard.expiries.len() <= 2 * 100 + 64 + 1,
                "{}",
                shard.expiries.len()
            );
        }
        now += 1; // k42 has expired
        shard.insert("new", stored(now + 10_000), now, 100);
        assert!(!shard.index.contains_key("k42"));
        assert_eq!(shard.slots.len(), 100);
        assert_consistent(&shard);
    }
}
