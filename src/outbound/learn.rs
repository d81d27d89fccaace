//! What the layer does with an upstream's announcement (see [`announce`](super::announce)):
//! learn the quota fleet-wide (opt-in, below the caller's ceiling), and pace before the `429`
//! (a `remaining` of 0 with a reset suspends the key until then). See the
//! [module docs](super#provider-announcements).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::announce::Announcement;
use crate::quota::{Quota, Quotas};

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
    /// Quotas learned: each a fleet-wide override set by this process
    /// ([`Limiter::set_quota`](crate::Limiter::set_quota)).
    pub learned: u64,
    /// Suspensions set or extended because the upstream said nothing is left until a reset.
    pub paced: u64,
}

/// The layer's side of announcements, shared by every clone and response future.
#[derive(Debug, Default)]
pub(crate) struct Provider {
    learn: Option<Learn>,
    announcements: AtomicU64,
    learned: AtomicU64,
    paced: AtomicU64,
}

/// Learning: the ceiling, and the quotas this process believes in force (`None`: not known yet,
/// the store is asked first).
#[derive(Debug)]
struct Learn {
    ceiling: Quota,
    in_force: Mutex<Option<Quotas>>,
}

impl Provider {
    /// A provider side that learns below `ceiling`, or only paces (`None`).
    pub(crate) fn new(ceiling: Option<Quota>) -> Self {
        Provider {
            learn: ceiling.map(|ceiling| Learn {
                ceiling,
                in_force: Mutex::new(None),
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
        self.learn.as_ref().map(|learn| learn.ceiling)
    }

    /// Counts a response that announced something readable.
    pub(crate) fn count_announcement(&self) {
        self.announcements.fetch_add(1, Ordering::Relaxed);
    }

    /// The quotas to learn from `announced` (see [`Learn::claim`]); `None` when the layer does
    /// not learn or they are in force already.
    pub(crate) fn claim(&self, announced: &Announcement) -> Option<Quotas> {
        self.learn.as_ref().and_then(|learn| learn.claim(announced))
    }

    /// Forgets what is in force after a failed change: the next announcement tries again.
    pub(crate) fn forget(&self, target: Quotas) {
        if let Some(learn) = &self.learn {
            learn.forget(target);
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

impl Learn {
    /// The quotas `announced` calls for, each at most the ceiling's rate: a policy without a
    /// window (`X-RateLimit-Limit`) counts per the ceiling's period, and keeps the ceiling's
    /// burst-to-limit ratio. `None` when it announced no usable quota.
    fn target(&self, announced: &Announcement) -> Option<Quotas> {
        let ceiling = self.ceiling;
        let mut tiers: Vec<Quota> = Vec::new();
        for policy in &announced.policies {
            let window = policy.window.unwrap_or(ceiling.period());
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
            if !tiers.contains(&quota) {
                tiers.push(quota);
            }
        }
        Quotas::new(tiers).ok()
    }

    /// The quotas to learn from `announced`, when they differ from what this process believes
    /// in force; from then on it believes them (so the responses in flight do not all learn).
    fn claim(&self, announced: &Announcement) -> Option<Quotas> {
        let target = self.target(announced)?;
        let mut in_force = self.in_force.lock().unwrap_or_else(PoisonError::into_inner);
        if *in_force == Some(target) {
            return None;
        }
        *in_force = Some(target);
        Some(target)
    }

    /// Forgets what is in force after a failed change: the next announcement tries again.
    fn forget(&self, target: Quotas) {
        let mut in_force = self.in_force.lock().unwrap_or_else(PoisonError::into_inner);
        if *in_force == Some(target) {
            *in_force = None;
        }
    }
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
    (left.remaining == 0).then(|| reset.min(cap).min(crate::limiter::MAX_SUSPENSION))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::announce::{Left, Policy};

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

    fn learn(ceiling: Quota) -> Learn {
        Learn {
            ceiling,
            in_force: Mutex::new(None),
        }
    }

    #[test]
    fn the_target_is_the_announced_quota_at_most_the_ceiling() {
        let l = learn(quota(50, 1));
        let t = |p: &[(u64, Option<u64>)]| l.target(&announced(p)).map(|q| q.as_slice().to_vec());
        assert_eq!(t(&[(20, Some(1))]), Some(vec![quota(20, 1)]));
        // No window: the ceiling's.
        assert_eq!(t(&[(20, None)]), Some(vec![quota(20, 1)]));
        // Faster than the ceiling: the ceiling.
        assert_eq!(t(&[(100, Some(1))]), Some(vec![quota(50, 1)]));
        assert_eq!(t(&[(3001, Some(60))]), Some(vec![quota(50, 1)]));
        assert_eq!(t(&[(3000, Some(60))]), Some(vec![quota(3000, 60)]));
        // Several tiers; duplicates once; unusable ones skipped.
        assert_eq!(
            t(&[(10, Some(1)), (500, Some(60)), (10, Some(1)), (0, Some(1))]),
            Some(vec![quota(10, 1), quota(500, 60)])
        );
        assert_eq!(t(&[(0, Some(1))]), None);
        assert_eq!(t(&[]), None);
        // The ceiling's burst ratio is kept.
        let smooth = learn(quota(50, 1).with_burst(5).unwrap());
        let got = smooth.target(&announced(&[(20, Some(1))])).unwrap();
        assert_eq!(got[0], quota(20, 1).with_burst(2).unwrap());
    }

    #[test]
    fn a_quota_is_claimed_once_until_it_changes() {
        let l = learn(quota(50, 1));
        let twenty = announced(&[(20, Some(1))]);
        assert!(l.claim(&twenty).is_some());
        assert!(l.claim(&twenty).is_none());
        assert!(l.claim(&announced(&[(30, Some(1))])).is_some());
        l.forget(Quotas::from(quota(30, 1)));
        assert!(l.claim(&announced(&[(30, Some(1))])).is_some());
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
