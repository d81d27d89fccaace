//! The keys of one [`MemoryStore`](super::MemoryStore) shard: a `Vec` of slots, an index from
//! key to slot, and two min-heaps of expiry times (one for the protected keys, one for the
//! others), so a full shard reclaims an expired key before it evicts a live one, and evicts
//! what loses the least.
//!
//! Eviction, when a new key finds the shard full: the expired keys go first (up to
//! [`EVICTION_BATCH`], the longest expired first). When none has expired, one live key goes:
//! of the [`CANDIDATES`] ordinary keys closest to expiry, the one with the least
//! [`loss`](Slot::loss) (the share of its quota in use: the share used at its last write,
//! falling linearly to 0 at its expiry, when its state is a fresh key's again). A protected key
//! (see [`protected`]: an override, a suspension, a tenant's controls, a block's offences,
//! learning's record, a concurrency limit's held slots) is evicted only when the shard holds no
//! other live key, the one closest to expiry first.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use super::driver::{decide_log, LogWrite, Refused};
use super::index::{Index, Indexed, KeyHasher, Lookup, Probe};
use crate::algorithm::{sliding_log, Packed};
use crate::store::wire::layout::{is_tenant_key, tenant_key, Controls, Reply};

/// The most expired keys a full shard drops at once to make room for a new key.
const EVICTION_BATCH: usize = 32;

/// How many ordinary keys, the closest to expiry, a full shard weighs to evict one.
pub(crate) const CANDIDATES: usize = 16;

/// A key's eviction class: the index of its heap.
const ORDINARY: usize = 0;
const PROTECTED: usize = 1;

/// The keys of one shard: stored in a `Vec`, with an index from key to slot and a min-heap of
/// their expiry times per class.
#[derive(Default)]
pub(crate) struct Shard {
    pub(super) index: Index,
    /// The store's hasher, which hashes the keys of the index.
    hasher: KeyHasher,
    pub(crate) slots: Vec<Slot>,
    /// Per class (ordinary, protected), `(expires_at, slot)` pairs: every slot has one at or
    /// before its expiry in its class's heap (see [`Shard::set_expiry`]), plus outdated ones
    /// (another key moved in, the key's expiry moved, or its class changed) corrected or
    /// dropped when they come to the top.
    pub(crate) expiries: [BinaryHeap<Reverse<(u64, usize)>>; 2],
    /// Sliding-log entries allocated by the logs in `slots`.
    pub(crate) log_entries: usize,
    /// Tenants' keys held (live or not): while there is none, a decision looks none up.
    tenants: usize,
}

pub(crate) struct Slot {
    pub(crate) key: Arc<str>,
    pub(crate) stored: Stored,
    /// When the key was last written (µs).
    written_at: u64,
    /// The share of its quota in use at its last write, from 0 to 1 (1 when the writer did not
    /// say, so a key of unknown use goes after those known to use less).
    used: f32,
    /// Holds controls or a block: evicted last.
    protected: bool,
}

impl Slot {
    /// The share of the key's quota in use at `now`, as evicting it would lose it: what was in
    /// use at the last write, falling linearly to 0 at the key's expiry (a token bucket's
    /// refill; an estimate for the windows).
    fn loss(&self, now: u64) -> f32 {
        let left = self.stored.expires_at.saturating_sub(now);
        let span = self
            .stored
            .expires_at
            .saturating_sub(self.written_at)
            .max(1);
        self.used * (left.min(span) as f32 / span as f32)
    }

    fn class(&self) -> usize {
        if self.protected {
            PROTECTED
        } else {
            ORDINARY
        }
    }
}

/// Whether `key` holding `state`, written at `now`, holds what a caller relies on and no
/// later write gives back: a tenant's controls (a suspension, an override, a reset), a block's
/// offences, controls that suspend or override (a route's string, a sliding log's controls,
/// learning's record), or a concurrency limit's held slots. Not a string whose controls hold
/// only the tenant's reset its states were written under: that is rate state, which a fresh
/// key's replaces, and it is ranked by its use like any other.
fn protected(key: &str, state: &KeyState, now: u64) -> bool {
    let held = match state {
        KeyState::Packed(packed) => holds_controls(packed.as_bytes(), now),
        KeyState::Bytes(bytes) => holds_controls(bytes, now),
        KeyState::Log(_) => false,
        KeyState::Slots(_) => true,
    };
    held || is_tenant_key(key) || key.ends_with("}#b")
}

/// Whether `bytes` start with controls holding an override or a suspension that has not ended
/// at `now`.
fn holds_controls(bytes: &[u8], now: u64) -> bool {
    match Controls::parse(bytes) {
        Controls::Some { until_us, n, .. } => n > 0 || until_us > now as f64,
        Controls::None | Controls::Corrupt => false,
    }
}

pub(crate) struct Stored {
    pub(crate) state: KeyState,
    /// µs time at which the key expires, as Redis's PEXPIRE would.
    pub(crate) expires_at: u64,
}

/// The state of one key: a string, byte for byte what Redis holds (the controls and every tier's
/// state: see `lua/common.lua`), or a sliding log.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KeyState {
    /// One plain state (no controls, one tier), kept without an allocation.
    Packed(Packed),
    Bytes(Vec<u8>),
    /// O(burst): changed in place, never copied.
    Log(sliding_log::Log),
    /// A concurrency limit's held slots (`lua/slots.lua`'s sorted set, in the encoding of
    /// [`slots_step`](crate::store::ops::slots::slots_step)): protected from eviction while held.
    Slots(Vec<u8>),
}

impl KeyState {
    /// Sliding-log entries this state has allocated.
    pub(crate) fn log_entries(&self) -> usize {
        match self {
            KeyState::Packed(_) | KeyState::Bytes(_) | KeyState::Slots(_) => 0,
            KeyState::Log(log) => log.capacity(),
        }
    }
}

/// The share of its binding quota a decision's key has in use after it (`reply`): 1 less
/// remaining over burst.
pub(crate) fn used_share(reply: &Reply, quotas: &[crate::quota::Quota]) -> f32 {
    let burst = match reply.overridden {
        Some((_, _, burst)) => burst,
        None => quotas.get(reply.tier).map_or(1, crate::quota::Quota::burst),
    };
    1.0 - (reply.remaining.min(burst) as f64 / burst.max(1) as f64) as f32
}

/// The µs time at which a key written at `now` with a TTL of `ttl_ms` expires.
pub(crate) fn expiry(now: u64, ttl_ms: u64) -> u64 {
    now.saturating_add(ttl_ms.saturating_mul(1000))
}

impl Shard {
    /// Stores `stored` under `key`, held at `held` (live, expired or of another algorithm) or
    /// new, as fully used (see [`set_used`](Self::set_used)); returns its slot.
    pub(crate) fn put(
        &mut self,
        held: Option<usize>,
        key: &str,
        stored: Stored,
        now: u64,
        max: usize,
    ) -> usize {
        match held {
            Some(slot) => {
                self.log_entries -= self.slots[slot].stored.state.log_entries();
                self.log_entries += stored.state.log_entries();
                let expires_at = stored.expires_at;
                let was = self.slots[slot].class();
                let held = &mut self.slots[slot];
                held.protected = protected(key, &stored.state, now);
                held.stored.state = stored.state;
                held.written_at = now;
                held.used = 1.0;
                if held.class() != was {
                    // Its pairs are in the other heap now: give it one in its own.
                    held.stored.expires_at = expires_at;
                    self.note_expiry(slot, expires_at);
                } else {
                    self.set_expiry(slot, expires_at);
                }
                slot
            }
            None => self.insert(key, stored, now, max),
        }
    }

    /// Records the share of its quota the key at `slot` has in use as of its last write (0 to
    /// 1), which orders eviction.
    pub(crate) fn set_used(&mut self, slot: usize, used: f32) {
        self.slots[slot].used = used.clamp(0.0, 1.0);
    }

    /// The string of `key`'s tenant's controls (see `lua/common.lua`), when live: copied, as
    /// the decision then writes to the shard.
    pub(crate) fn tenant(&self, key: &str, now: u64) -> Option<Vec<u8>> {
        // Nearly every shard holds no tenant's controls: no key to build, nothing to hash.
        if self.tenants == 0 {
            return None;
        }
        let (_, live) = self.find(&tenant_key(key), now);
        live.and_then(|slot| self.bytes(slot)).map(<[u8]>::to_vec)
    }

    /// A shard of keys hashed by `hasher` (the store's).
    pub(super) fn new(hasher: KeyHasher) -> Shard {
        // Field by field: a default shard would build a hasher of its own (keys and a cache)
        // only to drop it.
        Shard {
            index: Index::default(),
            hasher,
            slots: Vec::new(),
            expiries: Default::default(),
            log_entries: 0,
            tenants: 0,
        }
    }

    /// `key` as the index looks it up.
    fn probe<'k>(&self, key: &'k str) -> Probe<'k> {
        Probe {
            hash: self.hasher.hash(key).1,
            key,
        }
    }

    /// The slot of `key`, if the shard holds it (live or not).
    pub(crate) fn slot_of(&self, key: &str) -> Option<usize> {
        self.index.get(&self.probe(key) as &dyn Lookup).copied()
    }

    /// Where `key` is held (live, expired or of another kind), and whether it is live.
    pub(crate) fn find(&self, key: &str, now: u64) -> (Option<usize>, Option<usize>) {
        self.find_hashed(self.probe(key), now)
    }

    /// [`find`](Self::find) of a key whose hash in the index is known (see [`KeyHasher::hash`]).
    pub(super) fn find_hashed(&self, key: Probe<'_>, now: u64) -> (Option<usize>, Option<usize>) {
        let held = self.index.get(&key as &dyn Lookup).copied();
        (
            held,
            held.filter(|&slot| self.slots[slot].stored.expires_at > now),
        )
    }

    /// The string held at `slot`, if it holds one.
    pub(crate) fn bytes(&self, slot: usize) -> Option<&[u8]> {
        match &self.slots[slot].stored.state {
            KeyState::Packed(packed) => Some(packed.as_bytes()),
            KeyState::Bytes(bytes) => Some(bytes),
            KeyState::Log(_) | KeyState::Slots(_) => None,
        }
    }

    /// The concurrency slots held at `slot`, if it holds slots.
    pub(crate) fn held_slots(&self, slot: usize) -> Option<&[u8]> {
        match &self.slots[slot].stored.state {
            KeyState::Slots(bytes) => Some(bytes),
            KeyState::Packed(_) | KeyState::Bytes(_) | KeyState::Log(_) => None,
        }
    }

    /// The sliding log's decision: a live log changes in place (its expiry refreshed when the
    /// decision writes); a fresh one is stored only when it writes. Its controls live at
    /// `controls_key`, as in Redis.
    pub(crate) fn log_step(
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
                KeyState::Packed(_) | KeyState::Bytes(_) | KeyState::Slots(_) => {
                    (&mut fresh, false)
                }
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
    pub(crate) fn trim_logs(&mut self, keep: &str, budget: usize) {
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
    /// above): while it is full, make room. Returns its slot.
    pub(crate) fn insert(&mut self, key: &str, stored: Stored, now: u64, max: usize) -> usize {
        debug_assert!(self.slot_of(key).is_none());
        while self.slots.len() >= max.max(1) {
            self.make_room(now);
        }
        let protected = protected(key, &stored.state, now);
        self.tenants += usize::from(is_tenant_key(key));
        let key: Arc<str> = Arc::from(key);
        let slot = self.slots.len();
        self.log_entries += stored.state.log_entries();
        let hash = self.probe(&key).hash;
        let indexed = Indexed {
            hash,
            key: Arc::clone(&key),
        };
        self.index.insert(indexed, slot);
        let expires_at = stored.expires_at;
        self.slots.push(Slot {
            key,
            stored,
            written_at: now,
            used: 1.0,
            protected,
        });
        self.note_expiry(slot, expires_at);
        slot
    }

    /// Sets the expiry of the key at `slot`. A later expiry (nearly every write: a key's state
    /// is fresh again later after each admission) leaves the heap alone: its pair there is then
    /// earlier than the key's expiry, and is moved up when it comes to the top.
    pub(crate) fn set_expiry(&mut self, slot: usize, expires_at: u64) {
        let stored = &mut self.slots[slot].stored;
        let earlier = expires_at < stored.expires_at;
        stored.expires_at = expires_at;
        if earlier {
            self.note_expiry(slot, expires_at);
        }
    }

    /// Records in its class's heap that `slot` now expires at `expires_at`; compacts the heaps
    /// once their outdated pairs outnumber the keys (O(n) every n writes or more: O(1)
    /// amortized).
    pub(crate) fn note_expiry(&mut self, slot: usize, expires_at: u64) {
        let pairs: usize = self.expiries.iter().map(BinaryHeap::len).sum();
        if pairs > 2 * self.slots.len() + 64 {
            for (class, heap) in self.expiries.iter_mut().enumerate() {
                let mut pairs = std::mem::take(heap).into_vec();
                pairs.clear();
                pairs.extend(
                    (self.slots.iter().enumerate())
                        .filter(|(_, held)| held.class() == class)
                        .map(|(s, held)| Reverse((held.stored.expires_at, s))),
                );
                *heap = BinaryHeap::from(pairs);
            }
        } else {
            let class = self.slots[slot].class();
            self.expiries[class].push(Reverse((expires_at, slot)));
        }
    }

    /// The top of `class`'s heap once its outdated pairs are corrected or dropped: the key of
    /// that class closest to expiry, and its expiry.
    fn top(&mut self, class: usize) -> Option<(u64, usize)> {
        let heap = &mut self.expiries[class];
        while let Some(&Reverse((expires_at, slot))) = heap.peek() {
            let current = self
                .slots
                .get(slot)
                .filter(|held| held.class() == class)
                .map(|held| held.stored.expires_at);
            if current == Some(expires_at) {
                return Some((expires_at, slot));
            }
            heap.pop();
            // Its key expires later now: the pair moves there. An earlier expiry, another
            // class, or no key, has a pair of its own.
            if let Some(later) = current.filter(|&c| c > expires_at) {
                heap.push(Reverse((later, slot)));
            }
        }
        None
    }

    /// Removes at least one key (see the module docs): the expired ones, longest expired first
    /// (up to [`EVICTION_BATCH`]); when none has expired, the ordinary key that loses the least
    /// among the [`CANDIDATES`] closest to expiry; when the shard holds none, the protected key
    /// closest to expiry.
    pub(crate) fn make_room(&mut self, now: u64) {
        let mut removed = 0;
        while removed < EVICTION_BATCH {
            let expired = [ORDINARY, PROTECTED]
                .into_iter()
                .filter_map(|class| self.top(class).map(|top| (top, class)))
                .min();
            match expired {
                Some(((expires_at, slot), class)) if expires_at <= now => {
                    self.expiries[class].pop();
                    self.remove_slot(slot);
                    removed += 1;
                }
                _ => break,
            }
        }
        if removed > 0 {
            return;
        }
        if let Some(slot) = self.least_loss(now) {
            self.remove_slot(slot);
        } else if let Some((_, slot)) = self.top(PROTECTED) {
            self.expiries[PROTECTED].pop();
            self.remove_slot(slot);
        } else if !self.slots.is_empty() {
            // Unreachable (every slot has its pair in its heap); never loop forever on a bug.
            debug_assert!(false, "a held key without its expiry in the heap");
            self.remove_slot(0);
        }
    }

    /// Of the [`CANDIDATES`] ordinary keys closest to expiry, the one with the least loss (the
    /// closest to expiry among equals). The others' pairs go back into the heap.
    fn least_loss(&mut self, now: u64) -> Option<usize> {
        let mut looked = Vec::with_capacity(CANDIDATES);
        while looked.len() < CANDIDATES {
            let Some(pair) = self.top(ORDINARY) else {
                break;
            };
            self.expiries[ORDINARY].pop();
            looked.push(pair);
        }
        let victim = looked
            .iter()
            .enumerate()
            .min_by(|(_, a), (_, b)| {
                let (la, lb) = (self.slots[a.1].loss(now), self.slots[b.1].loss(now));
                la.total_cmp(&lb).then(a.0.cmp(&b.0))
            })
            .map(|(i, _)| i)?;
        let (_, slot) = looked.swap_remove(victim);
        for (expires_at, kept) in looked {
            self.expiries[ORDINARY].push(Reverse((expires_at, kept)));
        }
        Some(slot)
    }

    /// Whether `key` is held, and protected from eviction (see the module docs).
    #[cfg(test)]
    pub(crate) fn is_protected(&self, key: &str) -> Option<bool> {
        self.slot_of(key).map(|slot| self.slots[slot].protected)
    }

    pub(crate) fn remove_slot(&mut self, slot: usize) {
        let removed = self.slots.swap_remove(slot);
        self.log_entries -= removed.stored.state.log_entries();
        self.tenants -= usize::from(is_tenant_key(&removed.key));
        let gone = self.probe(&removed.key);
        self.index.remove(&gone as &dyn Lookup);
        if let Some(moved) = self.slots.get(slot) {
            let moved_key = self.probe(&moved.key);
            if let Some(index) = self.index.get_mut(&moved_key as &dyn Lookup) {
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
    use crate::store::wire::layout::CONTROLS;

    fn stored(expires_at: u64) -> Stored {
        Stored {
            state: KeyState::Bytes(vec![b'f'; 17]),
            expires_at,
        }
    }

    /// Every slot is indexed under its key, and nothing else is.
    pub(in crate::store::memory) fn assert_consistent(shard: &Shard) {
        assert_eq!(shard.index.len(), shard.slots.len());
        let tenants = shard.slots.iter().filter(|s| is_tenant_key(&s.key)).count();
        assert_eq!(shard.tenants, tenants, "tenants' keys counted");
        for (slot, held) in shard.slots.iter().enumerate() {
            assert_eq!(shard.slot_of(&held.key), Some(slot), "{}", held.key);
        }
    }

    /// A shard of at most `max_keys`, the `keys` with their expiries inserted at `now`.
    fn filled(now: u64, max_keys: usize, keys: &[(&str, u64)]) -> Shard {
        let mut shard = Shard::default();
        for &(key, expires_at) in keys {
            shard.insert(key, stored(expires_at), now, max_keys);
        }
        shard
    }

    /// Controls suspending until `until` (µs; 0: no suspension) with `n` override tiers (of
    /// zeros: only their length is read here).
    fn controls(until: u64, n: u8) -> Vec<u8> {
        let mut bytes = vec![CONTROLS];
        bytes.extend_from_slice(&(until as f64).to_le_bytes());
        bytes.push(n);
        bytes.resize(Controls::len(usize::from(n)), 0);
        bytes
    }

    /// A concurrency limit's slots: `held` of them, leases ending at `until`.
    fn slots(held: u64, until: u64) -> Stored {
        let bytes = (0..held)
            .flat_map(|id| {
                (until as f64)
                    .to_le_bytes()
                    .into_iter()
                    .chain(id.to_le_bytes())
            })
            .collect();
        Stored {
            state: KeyState::Slots(bytes),
            expires_at: until,
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
        let expiries = [
            ("soon", now + 1),
            ("late", now + 500),
            ("dead", now - 1),
            ("later", now + 900),
        ];
        let mut shard = filled(now, 4, &expiries);
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
    fn a_full_shard_evicts_the_key_that_loses_the_least_and_controls_last() {
        let now = 1_000;
        let mut shard = Shard::default();
        // Suspended until their expiry.
        let controls = |expires_at| Stored {
            state: KeyState::Bytes(controls(expires_at, 0)),
            expires_at,
        };
        // Closest to expiry first: a tenant's suspension, a route's override, a spent key, then
        // two keys with a tenth of their quota in use.
        shard.insert("{a}#t", controls(now + 10), now, 5);
        shard.insert("{b}", controls(now + 20), now, 5);
        let spent = shard.insert("spent", stored(now + 30), now, 5);
        shard.set_used(spent, 1.0);
        for (key, at) in [("light-1", now + 40), ("light-2", now + 50)] {
            let slot = shard.insert(key, stored(at), now, 5);
            shard.set_used(slot, 0.1);
        }
        let light = |shard: &mut Shard, key: &str| {
            let slot = shard.insert(key, stored(now + 1_000), now, 5);
            shard.set_used(slot, 0.1);
        };
        light(&mut shard, "new-1");
        assert_eq!(keys(&shard), ["light-2", "new-1", "spent", "{a}#t", "{b}"]);
        light(&mut shard, "new-2");
        light(&mut shard, "new-3");
        // The barely used keys go among themselves, closest to expiry first; the spent key and
        // the controls stay.
        assert_eq!(keys(&shard), ["new-2", "new-3", "spent", "{a}#t", "{b}"]);
        // A shard of nothing but controls: the one closest to expiry goes.
        let mut only_controls = Shard::default();
        only_controls.insert("{a}#t", controls(now + 10), now, 2);
        only_controls.insert("{b}", controls(now + 20), now, 2);
        only_controls.insert("x", stored(now + 1_000), now, 2);
        assert_eq!(keys(&only_controls), ["x", "{b}"]);
        assert_consistent(&shard);
        assert_consistent(&only_controls);
    }

    /// A held slot, closest to expiry and with the least loss of all (a lease's span is short,
    /// a third of it gone), stays while the shard holds any other live key: 100 new keys spending
    /// quotas of an hour each come and go around it.
    #[test]
    fn a_held_slot_is_evicted_after_every_ordinary_key() {
        let now = 10_000_000;
        let mut shard = Shard::default();
        // Written a third of a lease (300 ms) ago, as between two renewals.
        shard.insert("{k}:s#c", slots(1, now + 200_000), now - 100_000, 4);
        for i in 0..100 {
            let slot = shard.insert(&format!("{{c{i}}}"), stored(now + 3_600_000_000), now, 4);
            shard.set_used(slot, 1.0);
            assert!(shard.slot_of("{k}:s#c").is_some(), "evicted by key {i}");
        }
        assert_eq!(shard.slots.len(), 4);
        assert_consistent(&shard);
    }

    /// A shard of nothing but protected keys (held slots, a suspension, a tenant's controls) makes
    /// room for a new key of any kind with the one closest to expiry: the bound of the held
    /// slots' protection.
    #[test]
    fn a_shard_of_protected_keys_evicts_the_one_closest_to_expiry() {
        let now = 1_000;
        let mut shard = Shard::default();
        let suspended = Stored {
            state: KeyState::Bytes(controls(now + 20, 0)),
            expires_at: now + 20,
        };
        let tenant = Stored {
            state: KeyState::Bytes(controls(0, 1)),
            expires_at: now + 40,
        };
        shard.insert("{k}:r", suspended, now, 3);
        shard.insert("{k}:s#c", slots(2, now + 30), now, 3);
        shard.insert("{k}#t", tenant, now, 3);
        shard.insert("{k}:x", stored(now + 1_000), now, 3);
        assert_eq!(keys(&shard), ["{k}#t", "{k}:s#c", "{k}:x"]);
        // The ordinary key goes before any protected one, however far its expiry.
        shard.insert("{k}:y", stored(now + 1_000), now, 3);
        assert_eq!(keys(&shard), ["{k}#t", "{k}:s#c", "{k}:y"]);
        shard.insert("{k}:u#c", slots(1, now + 50), now, 3);
        assert_eq!(keys(&shard), ["{k}#t", "{k}:s#c", "{k}:u#c"]);
        // Nothing but protected keys: the held slots closest to expiry go.
        shard.insert("{k}:z", stored(now + 1_000), now, 3);
        assert_eq!(keys(&shard), ["{k}#t", "{k}:u#c", "{k}:z"]);
        assert_consistent(&shard);
    }

    /// What a caller relies on and no later write gives back is protected; rate state is not,
    /// even behind controls that hold nothing but the tenant's reset it was written under, or a
    /// suspension that has ended.
    #[test]
    fn what_a_caller_relies_on_is_protected_and_rate_state_is_not() {
        use crate::store::wire::layout::STAMP;
        let now = 1_000_000;
        let state = |bytes: Vec<u8>| KeyState::Bytes(bytes);
        let mut reset_only = controls(0, 0);
        reset_only.push(STAMP);
        reset_only.extend_from_slice(&500_000f64.to_le_bytes());
        reset_only.extend_from_slice(&[b't'; 17]);
        let mut overridden = controls(0, 1);
        overridden.extend_from_slice(&[b't'; 17]);
        let cases = [
            ("held slots", "p:{k}:s#c", slots(1, now + 1).state, true),
            (
                "a route's suspension",
                "p:{k}:r",
                state(controls(now + 1, 0)),
                true,
            ),
            ("a route's override", "p:{k}:r", state(overridden), true),
            (
                "a sliding log's override",
                "p:{k}:r#m",
                state(controls(0, 2)),
                true,
            ),
            (
                "learning's record",
                "p:{k}:r#l",
                state(controls(now + 9, 1)),
                true,
            ),
            (
                "a tenant's controls",
                "p:{k}#t",
                state(controls(0, 0)),
                true,
            ),
            ("a block's offences", "p:{k}#b", state(b"3".to_vec()), true),
            (
                "a suspension that ended",
                "p:{k}:r",
                state(controls(now, 0)),
                false,
            ),
            (
                "state under a tenant's reset",
                "p:{k}:r",
                state(reset_only),
                false,
            ),
            ("a state", "p:{k}:r", state(vec![b't'; 17]), false),
            (
                "corrupt controls",
                "p:{k}:r",
                state(vec![CONTROLS; 10]),
                false,
            ),
            (
                "a sliding log",
                "p:{k}:r",
                KeyState::Log(sliding_log::Log::new()),
                false,
            ),
        ];
        let wrong: Vec<&str> = cases
            .iter()
            .filter(|(_, key, state, expected)| protected(key, state, now) != *expected)
            .map(|(what, ..)| *what)
            .collect();
        assert!(wrong.is_empty(), "ranked wrong: {wrong:?}");
    }

    /// A key whose write changes what it holds changes class: suspended controls rewritten as
    /// plain state are evicted as ordinary state, held slots written over by a string too.
    #[test]
    fn a_rewritten_key_is_evicted_by_what_it_holds_now() {
        let now = 1_000;
        let mut shard = Shard::default();
        let suspended = Stored {
            state: KeyState::Bytes(controls(now + 500, 0)),
            expires_at: now + 500,
        };
        shard.insert("{a}", suspended, now, 3);
        shard.insert("{b}#c", slots(1, now + 10), now, 3);
        shard.insert("{c}", stored(now + 900), now, 3);
        let held = shard.slot_of("{a}");
        shard.put(held, "{a}", stored(now + 600), now, 3);
        shard.insert("{d}", stored(now + 1_000), now, 3);
        assert_eq!(keys(&shard), ["{b}#c", "{c}", "{d}"]);
        let held = shard.slot_of("{b}#c");
        shard.put(held, "{b}#c", stored(now + 100), now, 3);
        shard.insert("{e}", stored(now + 1_000), now, 3);
        assert_eq!(keys(&shard), ["{c}", "{d}", "{e}"]);
        assert_consistent(&shard);
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
            assert!(shard.slot_of(dead.as_str()).is_none(), "slot {dead_at}");
            for i in (0..MAX).filter(|&i| i != dead_at) {
                assert!(
                    shard.slot_of(format!("k{i}").as_str()).is_some(),
                    "k{i} evicted"
                );
            }
            // No key has expired now: the live ones go closest to expiry first.
            let live: Vec<usize> = (0..MAX).filter(|&i| i != dead_at).take(5).collect();
            for (n, i) in live.into_iter().enumerate() {
                shard.insert(&format!("new{}", n + 1), stored(now + 10_000_000), now, MAX);
                assert!(shard.slot_of(format!("k{i}").as_str()).is_none());
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
        let mut shard = filled(now, 3, &[("a", now + 10), ("b", now + 20), ("c", now + 30)]);
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
        assert!(shard.slot_of("k42").is_none());
        assert_eq!(shard.slots.len(), 100);
        assert_consistent(&shard);
    }

    /// A flood of new keys into a full store (the probe: 1 024 keys, then 20 000 new ones at
    /// 1 of 10 an hour) evicts the barely used keys, never a tenant's suspension nor a key that
    /// spent its quota.
    #[tokio::test(flavor = "current_thread")]
    async fn a_key_flood_evicts_the_barely_used_keys_before_a_suspension_or_a_spent_key() {
        use crate::core::Limiter;
        use crate::quota::Quota;
        use crate::store::MemoryStore;
        use std::time::Duration;

        let limiter = Limiter::new(MemoryStore::with_max_keys(1_024));
        limiter
            .suspend("tenant", Duration::from_secs(120))
            .await
            .unwrap();
        let per_minute = Quota::per_minute(3).unwrap();
        for _ in 0..3 {
            assert!(limiter.check("spent", &per_minute).await.is_allowed());
        }
        let per_hour = Quota::per_hour(10).unwrap();
        for i in 0..20_000 {
            limiter.check(&format!("flood-{i}"), &per_hour).await;
        }
        let suspended = *limiter.check("tenant", &per_hour).await.decision().unwrap();
        let spent = *limiter
            .check("spent", &per_minute)
            .await
            .decision()
            .unwrap();
        assert_eq!(
            (suspended.allowed, suspended.suspended, spent.allowed),
            (false, true, false),
            "(suspended key: allowed, suspended; spent key: allowed, with {} remaining)",
            spent.remaining
        );
    }
}
