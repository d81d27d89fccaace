//! What the layer does with an upstream's announcement (see [`announce`](super::announce)):
//! learn the quota fleet-wide (opt-in, below the caller's ceiling), and pace before the `429`
//! (a `remaining` of 0 with a reset suspends the key until then). See the
//! [module docs](super#provider-announcements).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};

use super::announce::Announcement;
use crate::quota::{Quota, Quotas, MAX_TIERS};

/// The tests' cap on one pause: the layer's default `max_auto_suspension`.
#[cfg(test)]
const MAX_AUTO_SUSPENSION: Duration = crate::outbound::DEFAULT_MAX_AUTO_SUSPENSION;

/// What an [`OutboundLayer`](super::OutboundLayer) made of its upstream's announcements, in this
/// process, since it was built: see [`OutboundLayer::stats`](super::OutboundLayer::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboundStats {
    /// Responses that announced something readable (a quota, or what is left), counted when
    /// learning or auto-suspend is on.
    pub announcements: u64,
    /// Changes of a key's learned quota made by this process: a fleet-wide override set
    /// ([`Limiter::set_quota`](crate::Limiter::set_quota)), or a learned one cleared (it
    /// expired, or the upstream announced the layer's own tiers again).
    pub learned: u64,
    /// Suspensions set or extended because the upstream said nothing is left until a reset.
    pub paced: u64,
}

/// The longest window learning accepts by default: 5 minutes (see
/// [`OutboundLayerBuilder::max_learned_window`](super::OutboundLayerBuilder::max_learned_window)).
pub const DEFAULT_MAX_LEARNED_WINDOW: Duration = Duration::from_secs(5 * 60);

/// How long a learned quota lasts without an answer that confirms it, by default: 10 minutes
/// (see [`OutboundLayerBuilder::learned_ttl`](super::OutboundLayerBuilder::learned_ttl)).
pub const DEFAULT_LEARNED_TTL: Duration = Duration::from_secs(10 * 60);

/// How often one instance looks at (and may write) a key's learned quota, by default: every 30
/// seconds (see [`OutboundLayerBuilder::learn_period`](super::OutboundLayerBuilder::learn_period)).
pub const DEFAULT_LEARN_PERIOD: Duration = Duration::from_secs(30);

/// The keys one layer remembers what it learned for; past it, the longest idle is forgotten (and
/// read again from the store at its next response).
pub(crate) const MAX_LEARNING_KEYS: usize = 4096;

/// A learning round in flight for a key: the key's next acquisition in this process waits for it.
pub(crate) type Pending = Shared<BoxFuture<'static, ()>>;

/// The layer's side of announcements, shared by every clone and response future.
#[derive(Debug, Default)]
pub(crate) struct Provider {
    learn: Option<Learn>,
    pacing: Pacing,
    announcements: AtomicU64,
    learned: AtomicU64,
    paced: AtomicU64,
}

/// What learning is allowed: the ceiling, the layer's own tiers (kept as caps), the longest
/// window, the learned quota's lifetime and the period between two rounds on one key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub ceiling: Quota,
    pub configured: Quotas,
    pub max_window: Duration,
    pub ttl: Duration,
    pub period: Duration,
}

/// The pacing writes in flight (suspensions after a response), per key: each runs in a task of
/// its own, and the key's next acquisition in this process waits for it.
#[derive(Default)]
struct Pacing {
    next_id: AtomicU64,
    keys: Mutex<HashMap<Arc<str>, (u64, Pending)>>,
}

impl fmt::Debug for Pacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Pacing")
            .field("in_flight", &keys.len())
            .finish()
    }
}

/// Learning: its bounds, and what this process knows of each key it called.
#[derive(Debug)]
struct Learn {
    bounds: Bounds,
    keys: Mutex<HashMap<Arc<str>, KeyState>>,
}

/// What this process knows of one key's learning.
struct KeyState {
    /// No round starts before this (the damping period after the last one).
    next_round: Instant,
    /// When the learned quota in force ends, as the last round read it (`None`: none in force).
    learned_until: Option<Instant>,
    /// The round in flight.
    pending: Option<Pending>,
    /// For forgetting the longest idle key first.
    touched: Instant,
}

impl fmt::Debug for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyState")
            .field("learned_until", &self.learned_until)
            .field("pending", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

/// A learning round to run for a key: what the announcement calls for (`None`: nothing usable
/// was announced; the round only expires a learned quota past its time).
pub(crate) struct Round {
    pub target: Option<Quotas>,
}

impl Provider {
    /// A provider side that learns within `bounds`, or only paces (`None`).
    pub(crate) fn new(bounds: Option<Bounds>) -> Self {
        Provider {
            learn: bounds.map(|bounds| Learn {
                bounds,
                keys: Mutex::new(HashMap::new()),
            }),
            ..Provider::default()
        }
    }

    /// Whether the layer learns quotas.
    pub(crate) fn learns(&self) -> bool {
        self.learn.is_some()
    }

    /// The ceiling learning stays under, if it learns.
    pub(crate) fn ceiling(&self) -> Option<Quota> {
        self.learn.as_ref().map(|learn| learn.bounds.ceiling)
    }

    /// Learning's bounds, if it learns.
    pub(crate) fn bounds(&self) -> Option<Bounds> {
        self.learn.as_ref().map(|learn| learn.bounds)
    }

    /// Counts a response that announced something readable.
    pub(crate) fn count_announcement(&self) {
        self.announcements.fetch_add(1, Ordering::Relaxed);
    }

    /// The round to run for `key` after a response that announced `announced`, when one is due:
    /// at most one per key per period, none while one is in flight, and without a usable
    /// announcement only for a key not read yet or whose learned quota is past its time.
    pub(crate) fn round(&self, key: &Arc<str>, announced: &Announcement) -> Option<Round> {
        let learn = self.learn.as_ref()?;
        let target = learn.bounds.target(announced);
        let now = Instant::now();
        let mut keys = learn.lock();
        if let Some(state) = keys.get_mut(key) {
            state.touched = now;
            let expired = state.learned_until.is_some_and(|until| until <= now);
            if state.pending.is_some() || now < state.next_round || target.is_none() && !expired {
                return None;
            }
        } else {
            if keys.len() >= MAX_LEARNING_KEYS {
                forget_the_longest_idle(&mut keys);
            }
            keys.insert(
                key.clone(),
                KeyState {
                    next_round: now,
                    learned_until: None,
                    pending: None,
                    touched: now,
                },
            );
        }
        Some(Round { target })
    }

    /// Records the round in flight for `key`: its next acquisition waits for it.
    /// `spawn` runs under the lock that [`finish`](Self::finish) takes, so that a round that
    /// ends at once is never left registered as in flight.
    pub(crate) fn start(&self, key: &Arc<str>, spawn: impl FnOnce() -> Pending) {
        if let Some(learn) = &self.learn {
            let mut keys = learn.lock();
            let pending = spawn();
            if let Some(state) = keys.get_mut(key) {
                state.pending = Some(pending);
            }
        }
    }

    /// Records the end of a round for `key`: when the learned quota in force ends (`None`:
    /// none), and the next round not before a period from now.
    pub(crate) fn finish(&self, key: &Arc<str>, learned_for: Option<Duration>) {
        if let Some(learn) = &self.learn {
            let now = Instant::now();
            if let Some(state) = learn.lock().get_mut(key) {
                state.pending = None;
                state.next_round = now + learn.bounds.period;
                state.learned_until = learned_for.map(|left| now + left);
            }
        }
    }

    /// What is in flight for `key`: its pacing write, then its learning round (either may be
    /// absent).
    pub(crate) fn pending(&self, key: &str) -> Option<Pending> {
        let paced = self.pacing.lock().get(key).map(|(_, p)| p.clone());
        let learned = self.learn.as_ref().and_then(|learn| {
            let keys = learn.lock();
            keys.get(key).and_then(|state| state.pending.clone())
        });
        match (paced, learned) {
            (Some(a), Some(b)) => {
                let both: BoxFuture<'static, ()> = Box::pin(async move {
                    a.await;
                    b.await;
                });
                Some(both.shared())
            }
            (a, b) => a.or(b),
        }
    }

    /// Everything in flight: every pacing write and learning round.
    pub(crate) fn all_pending(&self) -> Vec<Pending> {
        let mut all: Vec<Pending> = self
            .pacing
            .lock()
            .values()
            .map(|(_, p)| p.clone())
            .collect();
        if let Some(learn) = &self.learn {
            let keys = learn.lock();
            all.extend(keys.values().filter_map(|state| state.pending.clone()));
        }
        all
    }

    /// Registers `pending`, a pacing write for `key`, as what the key's next acquisition waits
    /// for; returns the write already in flight for it (which the new one waits for) and the
    /// new one's id for [`paced`](Self::paced).
    pub(crate) fn start_pacing(&self, key: &Arc<str>, pending: Pending) -> (Option<Pending>, u64) {
        let id = self.pacing.next_id.fetch_add(1, Ordering::Relaxed);
        let earlier = self.pacing.lock().insert(key.clone(), (id, pending));
        (earlier.map(|(_, earlier)| earlier), id)
    }

    /// Records the end of the pacing write `id` for `key` (unless a later one took its place).
    pub(crate) fn paced(&self, key: &str, id: u64) {
        let mut keys = self.pacing.lock();
        if keys.get(key).is_some_and(|(current, _)| *current == id) {
            keys.remove(key);
        }
    }

    /// Counts a quota learned (a fleet-wide override set by this process).
    pub(crate) fn count_learned(&self) {
        self.learned.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a suspension set or extended because the upstream said nothing is left.
    pub(crate) fn count_paced(&self) {
        self.paced.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters.
    pub(crate) fn stats(&self) -> OutboundStats {
        OutboundStats {
            announcements: self.announcements.load(Ordering::Relaxed),
            learned: self.learned.load(Ordering::Relaxed),
            paced: self.paced.load(Ordering::Relaxed),
        }
    }
}

impl Pacing {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, (u64, Pending)>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Learn {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, KeyState>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Forgets the key idle longest without a round in flight (one scan, only when the map is full).
fn forget_the_longest_idle(keys: &mut HashMap<Arc<str>, KeyState>) {
    let oldest = keys
        .iter()
        .filter(|(_, state)| state.pending.is_none())
        .min_by_key(|(_, state)| state.touched)
        .map(|(key, _)| key.clone());
    if let Some(key) = oldest {
        keys.remove(&key);
    }
}

impl Bounds {
    /// The quotas `announced` calls for: each announced quota with a window of at most
    /// `max_window` (a policy without one, `X-RateLimit-Limit`, counts per the ceiling's
    /// period), at most the ceiling's rate and with the ceiling's burst-to-limit ratio; then
    /// every configured tier and the ceiling as caps, the tightest limit and burst per period,
    /// in order of period. `None` when it announced no usable quota.
    pub(crate) fn target(&self, announced: &Announcement) -> Option<Quotas> {
        let ceiling = self.ceiling;
        let mut learned: Vec<Quota> = Vec::new();
        for policy in &announced.policies {
            let window = policy.window.unwrap_or(ceiling.period());
            if window > self.max_window {
                continue;
            }
            let Ok(quota) = Quota::new(policy.limit, window) else {
                continue;
            };
            let quota = if faster(&quota, &ceiling) {
                ceiling
            } else if ceiling.burst() < ceiling.limit() {
                let burst = u128::from(quota.limit()) * u128::from(ceiling.burst())
                    / u128::from(ceiling.limit());
                let burst = u64::try_from(burst).unwrap_or(u64::MAX).max(1);
                quota.with_burst(burst).unwrap_or(quota)
            } else {
                quota
            };
            learned.push(quota);
        }
        if learned.is_empty() {
            return None;
        }
        // The caps first, so that the learned tiers are the ones left out past MAX_TIERS.
        let mut tiers: Vec<Quota> = Vec::new();
        let caps = self.configured.as_slice().iter().chain([&ceiling]);
        for quota in caps.chain(learned.iter()) {
            match tiers.iter().position(|t| t.period() == quota.period()) {
                Some(at) => tiers[at] = tightest(&tiers[at], quota),
                None if tiers.len() < MAX_TIERS => tiers.push(*quota),
                None => {}
            }
        }
        tiers.sort_by_key(Quota::period);
        Quotas::new(tiers).ok()
    }
}

/// The tighter of two quotas of one period: the lower limit, and the lower burst.
fn tightest(a: &Quota, b: &Quota) -> Quota {
    let limit = a.limit().min(b.limit());
    let burst = a.burst().min(b.burst()).min(limit);
    Quota::new(limit, a.period())
        .and_then(|q| q.with_burst(burst))
        .unwrap_or(*a)
}

/// Whether two lists of tiers hold the same quotas, in any order.
pub(crate) fn same_tiers(a: &Quotas, b: &Quotas) -> bool {
    let sorted = |q: &Quotas| {
        let mut v = q.as_slice().to_vec();
        v.sort_by_key(|q| (q.period(), q.limit(), q.burst()));
        v
    };
    sorted(a) == sorted(b)
}

/// Whether `quota` allows more per second than `ceiling` (exact: cross-multiplied).
fn faster(quota: &Quota, ceiling: &Quota) -> bool {
    let rate = |q: &Quota, other: &Quota| u128::from(q.limit()) * other.period().as_micros();
    rate(quota, ceiling) > rate(ceiling, quota)
}

/// How long the fleet must pause: the reset, when nothing is left (at most `cap`, the layer's
/// `max_auto_suspension`).
pub(super) fn pause(announced: &Announcement, cap: Duration) -> Option<Duration> {
    let left = announced.left?;
    let reset = left.reset.filter(|reset| !reset.is_zero())?;
    (left.remaining == 0).then(|| reset.min(cap).min(crate::core::MAX_SUSPENSION))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::announce::{Left, Policy};
    use futures::FutureExt;

    fn quota(limit: u64, secs: u64) -> Quota {
        Quota::new(limit, Duration::from_secs(secs)).unwrap()
    }

    fn announced(policies: &[(u64, Option<u64>)]) -> Announcement {
        Announcement {
            policies: policies
                .iter()
                .map(|&(limit, window)| Policy {
                    limit,
                    window: window.map(Duration::from_secs),
                })
                .collect(),
            left: None,
        }
    }

    fn bounds(ceiling: Quota) -> Bounds {
        Bounds {
            ceiling,
            configured: Quotas::from(ceiling),
            max_window: DEFAULT_MAX_LEARNED_WINDOW,
            ttl: DEFAULT_LEARNED_TTL,
            period: DEFAULT_LEARN_PERIOD,
        }
    }

    fn tiers(quotas: &[Quota]) -> Option<Vec<Quota>> {
        Some(quotas.to_vec())
    }

    #[test]
    fn the_target_is_the_announced_quota_under_every_cap() {
        let b = bounds(quota(50, 1));
        let t = |p: &[(u64, Option<u64>)]| b.target(&announced(p)).map(|q| q.as_slice().to_vec());
        assert_eq!(t(&[(20, Some(1))]), tiers(&[quota(20, 1)]));
        // No window: the ceiling's.
        assert_eq!(t(&[(20, None)]), tiers(&[quota(20, 1)]));
        // Faster than the ceiling: the ceiling.
        assert_eq!(t(&[(100, Some(1))]), tiers(&[quota(50, 1)]));
        assert_eq!(t(&[(3001, Some(60))]), tiers(&[quota(50, 1)]));
        // A longer window at the ceiling's rate or below keeps the ceiling as a cap.
        assert_eq!(
            t(&[(3000, Some(60))]),
            tiers(&[quota(50, 1), quota(3000, 60)])
        );
        // Several tiers; duplicates once; unusable ones skipped.
        assert_eq!(
            t(&[(10, Some(1)), (500, Some(60)), (10, Some(1)), (0, Some(1))]),
            tiers(&[quota(10, 1), quota(500, 60)])
        );
        assert_eq!(t(&[(0, Some(1))]), None);
        assert_eq!(t(&[]), None);
        // A window past the bound is not learned.
        assert_eq!(t(&[(1, Some(301))]), None);
        assert_eq!(t(&[(1, Some(300))]), tiers(&[quota(50, 1), quota(1, 300)]));
        assert_eq!(t(&[(1, Some(3_153_600_000))]), None);
        // The ceiling's burst ratio is kept.
        let smooth = bounds(quota(50, 1).with_burst(5).unwrap());
        let got = smooth.target(&announced(&[(20, Some(1))])).unwrap();
        assert_eq!(got[0], quota(20, 1).with_burst(2).unwrap());
    }

    #[test]
    fn every_configured_tier_stays_a_cap() {
        let b = Bounds {
            configured: Quotas::new([quota(10, 1), quota(500, 60)]).unwrap(),
            ..bounds(quota(10, 1))
        };
        let t = |p: &[(u64, Option<u64>)]| b.target(&announced(p)).map(|q| q.as_slice().to_vec());
        assert_eq!(t(&[(5, None)]), tiers(&[quota(5, 1), quota(500, 60)]));
        assert_eq!(
            t(&[(800, Some(60))]),
            tiers(&[quota(10, 1), quota(500, 60)])
        );
        assert_eq!(
            t(&[(100, Some(60))]),
            tiers(&[quota(10, 1), quota(100, 60)])
        );
        assert!(same_tiers(
            &Quotas::new([quota(500, 60), quota(10, 1)]).unwrap(),
            &b.configured
        ));
    }

    #[test]
    fn a_key_gets_one_round_per_period_and_none_in_flight() {
        let provider = Provider::new(Some(bounds(quota(50, 1))));
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let twenty = announced(&[(20, Some(1))]);
        assert!(provider.round(&a, &twenty).is_some());
        provider.start(&a, || futures::future::pending().boxed().shared());
        assert!(provider.round(&a, &twenty).is_none());
        // Another key has its own.
        assert!(provider.round(&b, &twenty).is_some());
        provider.finish(&a, None);
        // Within the period: none, whatever is announced.
        assert!(provider.round(&a, &announced(&[(30, Some(1))])).is_none());
        assert!(provider.pending("a").is_none());
    }

    #[test]
    fn the_keys_remembered_are_bounded() {
        let provider = Provider::new(Some(bounds(quota(50, 1))));
        let twenty = announced(&[(20, Some(1))]);
        for i in 0..MAX_LEARNING_KEYS + 10 {
            let key: Arc<str> = format!("k{i}").into();
            provider.round(&key, &twenty);
        }
        let len = provider.learn.as_ref().unwrap().lock().len();
        assert_eq!(len, MAX_LEARNING_KEYS);
    }

    #[test]
    fn only_nothing_left_with_a_reset_pauses_capped() {
        let with = |remaining, reset: Option<u64>| Announcement {
            policies: Vec::new(),
            left: Some(Left {
                remaining,
                reset: reset.map(Duration::from_secs),
            }),
        };
        assert_eq!(
            pause(&with(0, Some(3)), MAX_AUTO_SUSPENSION),
            Some(Duration::from_secs(3))
        );
        assert_eq!(pause(&with(1, Some(3)), MAX_AUTO_SUSPENSION), None);
        assert_eq!(pause(&with(0, Some(0)), MAX_AUTO_SUSPENSION), None);
        assert_eq!(pause(&with(0, None), MAX_AUTO_SUSPENSION), None);
        assert_eq!(
            pause(&with(0, Some(86_400 * 365)), MAX_AUTO_SUSPENSION),
            Some(MAX_AUTO_SUSPENSION)
        );
    }
}
