//! One key's lease in this process: the batches of units it holds, what Redis said at the last
//! renewal, and the rate that sizes the next one. Pure bookkeeping: no store, no locks, no
//! clock of its own (every call is given `now`, in the lease table's microseconds).

use std::collections::VecDeque;
use std::time::Duration;

use crate::algorithm::{Algorithm, Leasing};
use crate::decision::Decision;
use crate::quota::{Quota, Quotas};

/// An instance holds at most this share of a tier's capacity in one lease (1 / `SHARE`), so a
/// binding quota is shared out in small bites and the stranding bound stays small.
pub(super) const SHARE: u64 = 10;

/// k grows at most this much from one renewal to the next: a burst does not take a whole
/// interval's worth on the evidence of a few microseconds.
const GROWTH: u64 = 8;

/// Units leased in one renewal, spendable until `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Batch {
    pub(super) units: u64,
    /// The end of its validity: one lease interval after the renewal was sent (for a fixed
    /// window, no later than the window's end either).
    pub(super) until: u64,
    /// Fixed window only: when the window it was paid in ends, or earlier when that end is not
    /// known to the µs (never later). Giving units back after that would hand them to the next
    /// window.
    pub(super) window_end: Option<u64>,
    /// When its renewal was sent: no later than the store took the units.
    pub(super) sent: u64,
    /// When the store admitted its renewal, on the store's own clock, when it told
    /// ([`StoreExt::check_timed`](crate::store::StoreExt::check_timed)).
    pub(super) decided: Option<u64>,
}

impl Batch {
    /// `units` of the renewal that `decision` answered, sent at `sent` (the lease table's µs)
    /// and admitted at `decided` on the store's clock when it told: valid for one interval
    /// from `sent`, and a fixed window's no later than their window's end.
    pub(super) fn of(
        units: u64,
        decision: &Decision,
        (sent, decided): (u64, Option<u64>),
        sizing: &Sizing,
    ) -> Batch {
        let reset_us = u64::try_from(decision.reset_after.as_micros()).unwrap_or(u64::MAX);
        let window_end = (sizing.algorithm.spec().leasing == Leasing::WithinWindow).then(|| {
            // The window's end, from when the renewal was sent (so never after it): what is
            // left of the window at the time it was decided, exact; else the reply's time to
            // it, in whole ms rounded up, less 1 ms.
            // The scripts' period: whole µs, rounded up.
            let period = decision.quota.period_micros();
            // When it was decided, in µs since the Unix epoch (which windows are aligned to):
            // the store's time it told, or a client clock's (the table's µs).
            let aligned = decided.or(sizing.epoch_clock.then_some(sent));
            let left = match aligned {
                // An override may hold several windows and the reply names the longest's end
                // and the binding one's quota, neither of which bounds the shortest: the units
                // of a renewal that learnt of it end at once (it is not leased, see `cap`).
                _ if decision.overridden => 0,
                Some(at) if period > 0 => (period - at % period).min(reset_us),
                _ => reset_us.saturating_sub(1_000),
            };
            sent.saturating_add(left)
        });
        let until = sent
            .saturating_add(sizing.interval)
            .min(window_end.unwrap_or(u64::MAX));
        Batch {
            units,
            until,
            window_end,
            sent,
            decided,
        }
    }
}

/// When the units a request spent were reserved: by the renewal of the oldest batch it spent
/// from, sent at `sent` (the lease table's µs), admitted at `decided` on the store's clock when
/// the store told for every batch it spent from. Earlier than the truth for the newer units: a
/// refund dated so may be lost, never given to a window after theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reservation {
    pub(super) sent: u64,
    pub(super) decided: Option<u64>,
}

/// What Redis reported at the last renewal, for the headers of local admissions.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// Redis's `remaining` after the lease was taken: it does not count the units any instance
    /// holds.
    remaining: u64,
    reset_after: Duration,
    at: u64,
    limit: u64,
    quota: Quota,
    overridden: bool,
}

/// Units to give back to the store: their count and whether the store may still take them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Released {
    /// Units the store may take back now.
    pub(super) returnable: u64,
    /// Units that cannot go back (a fixed window's that ended, or is about to): stranded.
    pub(super) stranded: u64,
    /// When the oldest returnable batch's renewal was sent: the give-back's reservation time
    /// (the store gives nothing back into a window or a reset after it).
    pub(super) reserved: Option<u64>,
    /// When the store admitted the oldest returnable batch's renewal, on its own clock, when it
    /// told for every returnable batch: the reservation time a give-back then sends.
    pub(super) decided: Option<u64>,
}

impl Released {
    /// What goes back of `batch` when it ends at `now` (see [`add`](Self::add)).
    pub(super) fn of(batch: &Batch, now: u64, interval: u64) -> Released {
        let mut released = Released::default();
        released.add(batch, now, interval);
        released
    }

    fn add(&mut self, batch: &Batch, now: u64, interval: u64) {
        // A give-back lands within a round trip; one interval of margin keeps a fixed window's
        // units from reaching the next window.
        let returnable = batch
            .window_end
            .is_none_or(|end| end.saturating_sub(now) > interval);
        if returnable {
            self.returnable += batch.units;
            self.decided = match self.reserved {
                None => batch.decided,
                Some(_) => self.decided.zip(batch.decided).map(|(a, b)| a.min(b)),
            };
            self.reserved = Some(self.reserved.map_or(batch.sent, |r| r.min(batch.sent)));
        } else {
            self.stranded += batch.units;
        }
    }
}

/// The lease configuration one state needs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizing {
    /// The lease interval in µs.
    pub(super) interval: u64,
    /// The most units one renewal takes.
    pub(super) max_units: u64,
    pub(super) algorithm: Algorithm,
    /// The table's µs are a client clock's, since the Unix epoch (else its own monotonic
    /// clock's).
    pub(super) epoch_clock: bool,
}

/// One key's lease.
#[derive(Debug)]
pub(super) struct State {
    /// The quotas the lease was taken under: a check under others does not use it.
    pub(super) quotas: Quotas,
    batches: VecDeque<Batch>,
    /// Units held, over every batch.
    held: u64,
    seen: Option<Seen>,
    /// The size of the next renewal.
    k: u64,
    /// Units spent per µs, smoothed over renewals.
    rate: f64,
    /// Units spent since `since` (the last renewal's start).
    spent_since: u64,
    since: u64,
    /// A renewal is in flight (one at most per key per instance).
    pub(super) renewing: bool,
    /// Counts finished renewals, so a waiter can tell that the one it waited for ended.
    pub(super) generation: u64,
    /// The last finished renewal failed (the store erred).
    pub(super) last_failed: bool,
    /// The request that started the renewal in flight is gone (dropped): what it would have
    /// spent stays held.
    pub(super) abandoned: bool,
    pub(super) last_used: u64,
    /// Removed from the table (forgotten, idle, released): units granted now go straight back.
    pub(super) detached: bool,
}

impl State {
    pub(super) fn new(quotas: Quotas, now: u64) -> State {
        State {
            quotas,
            batches: VecDeque::new(),
            held: 0,
            seen: None,
            k: 1,
            rate: 0.0,
            spent_since: 0,
            since: now,
            renewing: false,
            generation: 0,
            last_failed: false,
            abandoned: false,
            last_used: now,
            detached: false,
        }
    }

    /// Units held.
    pub(super) fn held(&self) -> u64 {
        self.held
    }

    /// Drops the batches whose validity ended.
    pub(super) fn expire(&mut self, now: u64, interval: u64) -> Released {
        let mut released = Released::default();
        while let Some(batch) = self.batches.front() {
            if batch.until > now {
                break;
            }
            released.add(batch, now, interval);
            self.held -= batch.units;
            self.batches.pop_front();
        }
        released
    }

    /// Drops every batch (the lease ends).
    pub(super) fn clear(&mut self, now: u64, interval: u64) -> Released {
        let mut released = Released::default();
        for batch in self.batches.drain(..) {
            released.add(&batch, now, interval);
        }
        self.held = 0;
        released
    }

    /// Spends `cost` held units, oldest first, and answers as an admission, with the
    /// reservation of the oldest batch spent from; `None` when fewer than `cost` are held (or
    /// none were ever leased). Call [`expire`](Self::expire) first.
    pub(super) fn take(&mut self, cost: u64, now: u64) -> Option<(Decision, Reservation)> {
        let seen = self.seen?;
        if cost == 0 || self.held < cost {
            return None;
        }
        let oldest = self.batches.front().expect("held counts the batches");
        let mut reservation = Reservation {
            sent: oldest.sent,
            decided: oldest.decided,
        };
        let mut left = cost;
        while left > 0 {
            let front = self.batches.front_mut().expect("held counts the batches");
            // The store's time only when it told for every batch spent from (the oldest's).
            reservation.decided = reservation
                .decided
                .zip(front.decided)
                .map(|(a, b)| a.min(b));
            let spend = left.min(front.units);
            front.units -= spend;
            left -= spend;
            if front.units == 0 {
                self.batches.pop_front();
            }
        }
        self.held -= cost;
        self.spent_since += cost;
        Some((self.report(&seen, now), reservation))
    }

    /// The decision a local admission reports: Redis's `remaining` at the last renewal plus
    /// the units this instance still holds (both as of that renewal, less what this instance
    /// spent since), at most the burst ([`remaining`]), and the time to full counted down from
    /// the renewal.
    fn report(&self, seen: &Seen, now: u64) -> Decision {
        let elapsed = Duration::from_micros(now.saturating_sub(seen.at));
        Decision {
            allowed: true,
            limit: seen.limit,
            remaining: remaining(seen.remaining, self.held, &seen.quota),
            retry_after: Duration::ZERO,
            reset_after: round_up_ms(seen.reset_after.saturating_sub(elapsed)),
            suspended: false,
            quota: seen.quota,
            overridden: seen.overridden,
        }
    }

    /// Whether to renew in the background now: the lease is large enough to be worth it
    /// (k ≥ 2) and runs low (half of k left) or its oldest units near their end.
    pub(super) fn wants_prefetch(&self, now: u64, sizing: &Sizing) -> bool {
        if self.renewing || self.detached || self.k < 2 || self.seen.is_none() {
            return false;
        }
        let low = self.held <= self.k / 2;
        let ending = self
            .batches
            .front()
            .is_some_and(|b| b.until.saturating_sub(now) <= sizing.interval / 2);
        low || ending
    }

    /// Sizes the lease from the rate spent since the last renewal: k is about rate × half an
    /// interval (so units are spent well within their interval), at least 1, at most
    /// [`Sizing::max_units`] and a [`SHARE`] of the smallest capacity in play. Returns what
    /// to ask for: enough to hold k again (an instance never holds more than k units), and at
    /// least `cost`, the request waiting for it.
    pub(super) fn plan(&mut self, now: u64, cost: u64, sizing: &Sizing) -> u64 {
        let (rate, k) = self.sized(now, sizing);
        self.commit(rate, k, now);
        k.saturating_sub(self.held).max(cost)
    }

    /// Starts a background renewal when one is due ([`wants_prefetch`](Self::wants_prefetch))
    /// and would take at least one unit: marks the lease renewing and returns what to ask for
    /// (as [`plan`](Self::plan) with no request waiting). After the rate falls the lease may
    /// hold k units already; then nothing is sent and the rate's sample keeps growing.
    pub(super) fn start_prefetch(&mut self, now: u64, sizing: &Sizing) -> Option<u64> {
        if !self.wants_prefetch(now, sizing) {
            return None;
        }
        let (rate, k) = self.sized(now, sizing);
        let ask = k.saturating_sub(self.held);
        if ask == 0 {
            return None;
        }
        self.commit(rate, k, now);
        self.renewing = true;
        Some(ask)
    }

    /// The smoothed rate and the k a renewal sent at `now` would set (see [`plan`](Self::plan)).
    fn sized(&self, now: u64, sizing: &Sizing) -> (f64, u64) {
        let elapsed = now.saturating_sub(self.since).max(1);
        let sample = self.spent_since as f64 / elapsed as f64;
        let rate = if self.rate == 0.0 {
            sample
        } else {
            (self.rate + sample) / 2.0
        };
        let want = (rate * sizing.interval as f64 / 2.0).ceil();
        let want = if want.is_finite() && want >= 1.0 {
            want.min(u64::MAX as f64) as u64
        } else {
            1
        };
        let k = want
            .min(self.k.saturating_mul(GROWTH))
            .min(self.cap(sizing))
            .max(1);
        (rate, k)
    }

    /// Records the sizing of a renewal sent at `now`; the next rate sample starts then.
    fn commit(&mut self, rate: f64, k: u64, now: u64) {
        self.rate = rate;
        self.k = k;
        self.spent_since = 0;
        self.since = now;
    }

    /// The most one renewal takes.
    fn cap(&self, sizing: &Sizing) -> u64 {
        let mut capacity = self.quotas.iter().map(Quota::burst).min().unwrap_or(1);
        if let Some(seen) = &self.seen {
            if seen.overridden {
                capacity = capacity.min(seen.quota.burst());
                if sizing.algorithm.spec().leasing == Leasing::WithinWindow {
                    // An override may hold several windows; the reply names the end of none but
                    // the longest, so a window-bound lease under an override is not leased.
                    return 1;
                }
            }
        }
        (capacity / SHARE).clamp(1, sizing.max_units)
    }

    /// Records a renewal Redis admitted: `units` more held (the renewal's cost less what the
    /// request that waited for it spends at once, `spent`), valid from `sent` (when it was
    /// sent: earlier than Redis decided), admitted at `decided` on the store's clock when the
    /// store told. Returns the decision the waiting request gets.
    pub(super) fn granted(
        &mut self,
        units: u64,
        spent: u64,
        decision: &Decision,
        (sent, decided): (u64, Option<u64>),
        sizing: &Sizing,
    ) -> Decision {
        if units > 0 {
            self.batches
                .push_back(Batch::of(units, decision, (sent, decided), sizing));
            self.held += units;
        }
        self.spent_since += spent;
        self.seen = Some(Seen {
            remaining: decision.remaining,
            reset_after: decision.reset_after,
            at: sent,
            limit: decision.limit,
            quota: decision.quota,
            overridden: decision.overridden,
        });
        Decision {
            remaining: remaining(decision.remaining, self.held, &decision.quota),
            ..*decision
        }
    }

    /// A renewal ended: wake the waiters' bookkeeping.
    pub(super) fn finish(&mut self, failed: bool) {
        self.renewing = false;
        self.abandoned = false;
        self.generation += 1;
        self.last_failed = failed;
    }
}

/// What a request answered under a lease reports as `remaining`: Redis's `remaining` at the last
/// renewal plus the units held, at most the burst of the quota that decided it. The sum alone
/// can pass the burst: units held from an earlier renewal were paid in Redis before, and the
/// key may have refilled since (or been reset, or lost by Redis), so the renewal found it full.
fn remaining(redis: u64, held: u64, quota: &Quota) -> u64 {
    redis.saturating_add(held).min(quota.burst())
}

/// A duration rounded up to whole milliseconds, as every [`Decision`] reports.
fn round_up_ms(d: Duration) -> Duration {
    let ms = d.as_micros().div_ceil(1_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: u64 = 50_000;

    fn sizing(algorithm: Algorithm) -> Sizing {
        Sizing {
            interval: INTERVAL,
            max_units: 1_000,
            algorithm,
            epoch_clock: false,
        }
    }

    /// A fresh key's state under `per_second` a second, and the sizing of `algorithm`'s leases.
    fn fresh(per_second: u64, algorithm: Algorithm) -> (Quota, State, Sizing) {
        let quota = Quota::per_second(per_second).unwrap();
        (quota, State::new(quota.into(), 0), sizing(algorithm))
    }

    fn admitted(remaining: u64, reset_ms: u64, quota: Quota) -> Decision {
        Decision {
            allowed: true,
            limit: quota.limit(),
            remaining,
            retry_after: Duration::ZERO,
            reset_after: Duration::from_millis(reset_ms),
            suspended: false,
            quota,
            overridden: false,
        }
    }

    #[test]
    fn a_renewal_of_one_unit_reports_exactly_what_redis_said() {
        let (quota, mut state, s) = fresh(100, Algorithm::TokenBucket);
        assert_eq!(state.plan(1_000_000, 1, &s), 1);
        let redis = admitted(99, 10, quota);
        assert_eq!(state.granted(0, 1, &redis, (0, None), &s), redis);
        assert_eq!(state.held(), 0);
        assert_eq!(state.take(1, 10), None);
    }

    #[test]
    fn local_admissions_count_down_from_redis_remaining_plus_held_units() {
        let (quota, mut state, s) = fresh(1_000, Algorithm::Gcra);
        // Redis admitted 10 (one for the waiting request): 990 left in Redis, 9 held.
        let first = state.granted(9, 1, &admitted(990, 10, quota), (100, None), &s);
        assert_eq!(first.remaining, 999);
        let (next, _) = state.take(1, 200).unwrap();
        assert_eq!((next.remaining, next.allowed), (998, true));
        assert_eq!(next.reset_after, Duration::from_millis(10));
        assert_eq!(state.take(8, 300).unwrap().0.remaining, 990);
        assert_eq!(state.take(1, 400), None);
    }

    #[test]
    fn units_held_from_an_earlier_renewal_never_lift_remaining_above_the_burst() {
        let quota = Quota::per_second(200).unwrap().with_burst(60).unwrap();
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::FixedWindow,
        ] {
            let (mut state, s) = (State::new(quota.into(), 0), sizing(algorithm));
            state.granted(6, 0, &admitted(54, 30, quota), (0, None), &s);
            state.take(3, 100).unwrap();
            // The key refilled (or was reset, or lost): the next renewal of 6 finds it full.
            // 54 in Redis and 9 held were 63.
            let answer = state.granted(5, 1, &admitted(54, 30, quota), (200, None), &s);
            assert_eq!(answer.remaining, 60, "{algorithm}");
            let (next, _) = state.take(1, 300).unwrap();
            assert_eq!(next.remaining, 60, "{algorithm}");
            assert_eq!(state.take(4, 400).unwrap().0.remaining, 57, "{algorithm}");
        }
    }

    #[test]
    fn batches_end_one_interval_after_they_were_sent_and_are_spent_oldest_first() {
        let (quota, mut state, s) = fresh(1_000, Algorithm::TokenBucket);
        state.granted(5, 0, &admitted(900, 100, quota), (0, None), &s);
        state.granted(5, 0, &admitted(890, 100, quota), (30_000, None), &s);
        assert!(state.take(7, 40_000).is_some()); // 5 of the first, 2 of the second
        assert_eq!(state.expire(INTERVAL, INTERVAL), Released::default());
        assert_eq!(state.held(), 3);
        let released = state.expire(30_000 + INTERVAL, INTERVAL);
        assert_eq!(released.returnable, 3);
        assert_eq!(state.held(), 0);
    }

    #[test]
    fn a_request_spent_from_a_lease_is_reserved_by_its_oldest_batchs_renewal() {
        let (quota, mut state, s) = fresh(1_000, Algorithm::FixedWindow);
        state.granted(2, 0, &admitted(900, 900, quota), (100, Some(7_100)), &s);
        state.granted(5, 0, &admitted(890, 900, quota), (200, Some(7_200)), &s);
        let (_, first) = state.take(1, 300).unwrap();
        assert_eq!((first.sent, first.decided), (100, Some(7_100)));
        // Across two batches: the older one's.
        let (_, both) = state.take(2, 400).unwrap();
        assert_eq!((both.sent, both.decided), (100, Some(7_100)));
        let (_, last) = state.take(1, 500).unwrap();
        assert_eq!((last.sent, last.decided), (200, Some(7_200)));
        // The store's time only when it told for every batch spent from.
        state.granted(5, 0, &admitted(880, 900, quota), (600, None), &s);
        let (_, mixed) = state.take(4, 700).unwrap();
        assert_eq!((mixed.sent, mixed.decided), (200, None));
    }

    #[test]
    fn a_fixed_window_lease_never_outlives_its_window_nor_goes_back_into_the_next() {
        let (quota, mut state, s) = fresh(1_000, Algorithm::FixedWindow);
        // 20 ms left in the window, in whole ms rounded up: it ends from 19 to 20 ms after
        // Redis decided, which is after the renewal was sent. The batch ends 19 ms after that,
        // not one interval later, nor in the window's last ms, which may be the next window's.
        state.granted(10, 0, &admitted(500, 20, quota), (0, None), &s);
        assert!(state.take(1, 18_999).is_some());
        assert_eq!(state.expire(18_999, INTERVAL), Released::default());
        let released = state.expire(19_000, INTERVAL);
        assert_eq!(
            released,
            Released {
                returnable: 0,
                stranded: 9,
                reserved: None,
                decided: None,
            }
        );
        // With the window's end far off, units go back.
        state.granted(10, 0, &admitted(400, 900, quota), (100_000, None), &s);
        assert_eq!(state.clear(100_000, INTERVAL).returnable, 10);
    }

    #[test]
    fn a_fixed_window_lease_told_its_decisions_time_ends_exactly_with_its_window() {
        let (quota, mut state, s) = fresh(1_000, Algorithm::FixedWindow);
        // Decided 0.5 ms before a window's end (1 s windows): the reply says 1 ms, the batch
        // ends 0.5 ms after it was sent.
        let at = Some(7_999_500);
        state.granted(10, 0, &admitted(500, 1, quota), (1_000, at), &s);
        assert!(state.take(1, 1_499).is_some());
        assert_eq!(state.expire(1_499, INTERVAL), Released::default());
        assert_eq!(state.expire(1_500, INTERVAL).stranded, 9);
        // 20 ms before it: 20 ms, the whole of it, where the reply alone leaves 19.
        let at = Some(8_980_000);
        state.granted(10, 0, &admitted(400, 20, quota), (2_000, at), &s);
        assert!(state.take(1, 21_999).is_some());
        assert_eq!(state.expire(22_000, INTERVAL).stranded, 9);
    }

    #[test]
    fn a_fixed_window_lease_counts_the_period_in_whole_micros_rounded_up_as_the_scripts_do() {
        // 1 s + 0.5 µs: the scripts' windows are 1 000 001 µs, aligned to the epoch.
        let quota = Quota::new(1_000, Duration::from_nanos(1_000_000_500)).unwrap();
        let (mut state, s) = (State::new(quota.into(), 0), sizing(Algorithm::FixedWindow));
        // Decided 1.5 ms before a window's end, which falls 999 ms into a whole second: the
        // reply says 2 ms, a period of 1 000 000 µs would say 2.5 ms.
        let end = 1_699_999_000 * 1_000_001;
        state.granted(10, 0, &admitted(500, 2, quota), (0, Some(end - 1_500)), &s);
        assert!(state.take(1, 1_499).is_some());
        assert_eq!(state.expire(1_500, INTERVAL).stranded, 9);
    }

    #[test]
    fn a_fixed_window_renewal_that_learns_of_an_override_leases_nothing() {
        let (_, mut state, s) = fresh(1_000, Algorithm::FixedWindow);
        // The override's binding quota and its longest window's end say nothing of its
        // shortest window: the units beyond the request's own end at once.
        let overridden = Decision {
            overridden: true,
            ..admitted(90, 1_000, Quota::per_second(100).unwrap())
        };
        let answer = state.granted(9, 1, &overridden, (0, Some(7_000_000)), &s);
        assert!(answer.allowed);
        assert_eq!(state.expire(0, INTERVAL).stranded, 9);
        assert_eq!(state.take(1, 0), None);
    }

    #[test]
    fn k_follows_the_rate_grows_in_steps_and_stays_within_a_share_of_the_capacity() {
        let (quota, mut state, s) = fresh(1_000_000, Algorithm::TokenBucket);
        // 1 unit per ms: 25 per half a 50 ms interval.
        let mut now = 0;
        let mut asks = Vec::new();
        for _ in 0..6 {
            state.granted(0, 0, &admitted(1, 1, quota), (now, None), &s);
            state.spent_since = 10;
            now += 10_000;
            asks.push(state.plan(now, 0, &s));
        }
        assert_eq!(asks, [8, 25, 25, 25, 25, 25]);
        // A renewal tops the lease up to k: an instance never holds more than k units.
        state.granted(10, 0, &admitted(1, 1, quota), (now, None), &s);
        state.spent_since = 10;
        assert_eq!(state.plan(now + 10_000, 0, &s), 15);
        // A slow key (one a second) leases one unit at a time.
        let mut slow = State::new(quota.into(), 0);
        slow.spent_since = 1;
        assert_eq!(slow.plan(1_000_000, 1, &s), 1);
        // Capacity 40: at most 4 at once.
        let small = Quota::per_hour(40).unwrap();
        let mut state = State::new(small.into(), 0);
        state.spent_since = 1_000;
        assert_eq!(state.plan(1_000, 1, &s), 4);
    }

    #[test]
    fn prefetch_starts_at_low_water_only_for_leases_of_two_or_more() {
        let (quota, mut state, s) = fresh(1_000_000, Algorithm::TokenBucket);
        state.granted(0, 1, &admitted(10, 1, quota), (0, None), &s);
        assert!(
            !state.wants_prefetch(1, &s),
            "k = 1: never in the background"
        );
        state.k = 10;
        state.granted(10, 0, &admitted(10, 1, quota), (0, None), &s);
        assert!(!state.wants_prefetch(1, &s));
        state.take(5, 2).unwrap();
        assert!(state.wants_prefetch(3, &s));
        state.renewing = true;
        assert!(
            !state.wants_prefetch(3, &s),
            "one renewal in flight at most"
        );
    }

    #[test]
    fn after_the_rate_falls_a_lease_that_holds_enough_sends_no_background_renewal() {
        let (quota, mut state, s) = fresh(1_000_000, Algorithm::TokenBucket);
        // 1 unit per µs for a while: k = 25 000 capped at max_units, 1 000.
        let mut now = 0;
        for _ in 0..4 {
            state.spent_since = 10_000;
            now += 10_000;
            let ask = state.plan(now, 1, &s);
            state.granted(ask - 1, 1, &admitted(900_000, 1, quota), (now, None), &s);
        }
        assert_eq!(state.held(), 999);
        state.take(600, now).unwrap();
        // The rate fell to one unit per 100 µs over the last renewals, and stays there: the
        // 399 held outlast half an interval at it (k = 250).
        state.rate = 0.01;
        now += 60_000;
        assert!(state.wants_prefetch(now, &s), "low water");
        assert_eq!(state.start_prefetch(now, &s), None);
        assert!(!state.renewing);
        // The rate picks up again (10 units per µs since the last renewal): a renewal tops
        // the lease up to the new k.
        state.spent_since = 1_000_000;
        let ask = state.start_prefetch(now + 100_000, &s).unwrap();
        assert!(state.renewing);
        assert_eq!(ask, 1_000 - 399);
    }
}
