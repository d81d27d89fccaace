//! What the layer does with an upstream's announcement (see [`announce`](super::announce)):
//! learn the quota fleet-wide (opt-in, below the caller's ceiling), and pace before the `429`
//! (a `remaining` of 0 with a reset suspends the key until then). See the
//! [module docs](super#provider-announcements).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use http::HeaderMap;

use super::announce::{self, Announcement};
use super::config::Limits;
use crate::limiter::{ControlError, Limiter, Target};
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
    /// ([`Limiter::set_quota`]).
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

    /// The counters.
    pub(crate) fn stats(&self) -> OutboundStats {
        OutboundStats {
            announcements: self.announcements.load(Ordering::Relaxed),
            learned: self.learned.load(Ordering::Relaxed),
            paced: self.paced.load(Ordering::Relaxed),
        }
    }
}

/// Reads what a response announces and returns the work it calls for (learning, pacing), if
/// any: the response future runs it before handing the response back. `retry_after`: the
/// response's `Retry-After` already suspends the key (it takes precedence over the fields).
pub(crate) fn on_response(
    limits: &Arc<Limits>,
    key: &Arc<str>,
    headers: &HeaderMap,
    retry_after: bool,
) -> Option<BoxFuture<'static, ()>> {
    let provider = &limits.provider;
    let pacing = limits.auto_suspend && !retry_after;
    if !provider.learns() && !pacing {
        return None;
    }
    let announced = announce::read(headers, SystemTime::now());
    if announced.is_empty() {
        return None;
    }
    provider.announcements.fetch_add(1, Ordering::Relaxed);
    let learn = provider
        .learn
        .as_ref()
        .and_then(|learn| learn.claim(&announced));
    let pause = pacing
        .then(|| pause(&announced, limits.max_auto_suspension))
        .flatten();
    if learn.is_none() && pause.is_none() {
        return None;
    }
    let (limits, key) = (limits.clone(), key.clone());
    Some(Box::pin(async move {
        if let Some(quotas) = learn {
            learn_quota(&limits, &key, quotas).await;
        }
        if let Some(wait) = pause {
            pace(&limits, &key, wait).await;
        }
    }))
}

/// Runs `first`, then `then` (when there is one).
pub(crate) fn then(
    first: BoxFuture<'static, ()>,
    then: Option<BoxFuture<'static, ()>>,
) -> BoxFuture<'static, ()> {
    match then {
        None => first,
        Some(then) => Box::pin(async move {
            first.await;
            then.await;
        }),
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
fn pause(announced: &Announcement, cap: Duration) -> Option<Duration> {
    let left = announced.left?;
    let reset = left.reset.filter(|reset| !reset.is_zero())?;
    (left.remaining == 0).then(|| reset.min(cap).min(crate::limiter::MAX_SUSPENSION))
}

fn target<'a>(limits: &'a Limits, key: &'a str) -> Target<'a> {
    match &limits.scope {
        Some(scope) => Target::scoped(scope, key),
        None => Target::key(key),
    }
}

/// Sets `quotas` as the key's fleet-wide override, unless they are in force already (another
/// instance learned them first, or they are the layer's own); logs and counts a change once.
async fn learn_quota(limits: &Limits, key: &str, quotas: Quotas) {
    let Some(learn) = &limits.provider.learn else {
        return;
    };
    let scope = limits.scope.as_deref().unwrap_or("");
    let limiter = &limits.limiter;
    let status = match limiter.inspect(target(limits, key)).await {
        Ok(status) => status,
        Err(error) => {
            learn.forget(quotas);
            tracing::warn!(%error, scope, "upstream announced a quota, but the store could not be read: not learned");
            return;
        }
    };
    let in_force = status.quota_override.unwrap_or(limits.quotas);
    if in_force == quotas {
        return;
    }
    match limiter.set_quota(target(limits, key), &quotas).await {
        Ok(_) => {
            limits.provider.learned.fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            metrics::counter!(names::LEARNED, "scope" => scope.to_owned()).increment(1);
            tracing::info!(
                scope,
                quotas = ?quotas.as_slice(),
                previous = ?in_force.as_slice(),
                "upstream announced a different quota: learned for the whole fleet"
            );
        }
        Err(error) => {
            learn.forget(quotas);
            tracing::warn!(%error, scope, quotas = ?quotas.as_slice(), "upstream announced a quota that could not be set: not learned");
        }
    }
}

/// Suspends the key fleet-wide for `wait`, unless it already is for longer.
async fn pace(limits: &Limits, key: &str, wait: Duration) {
    let scope = limits.scope.as_deref().unwrap_or("");
    match suspend_at_least(&limits.limiter, target(limits, key), wait).await {
        Ok(false) => {}
        Ok(true) => {
            limits.provider.paced.fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            metrics::counter!(names::PACED, "scope" => scope.to_owned()).increment(1);
            tracing::debug!(
                scope,
                suspended_ms = wait.as_millis() as u64,
                "upstream announced nothing left until its reset: key suspended for the whole fleet"
            );
        }
        Err(error) => tracing::warn!(
            %error,
            scope,
            "upstream announced nothing left, but the key could not be suspended: \
             the other workers keep calling"
        ),
    }
}

/// Suspends `target` for at least `wait` unless its suspension already lasts that long:
/// `Ok(true)` when it set or extended one. The write is [`Limiter::extend_suspension`], atomic
/// in the store, so a suspension only ever extends even when instances race; the look before it
/// only spares the write (and the count) when nothing would change.
async fn suspend_at_least(
    limiter: &Limiter,
    target: Target<'_>,
    wait: Duration,
) -> Result<bool, ControlError> {
    let status = limiter.inspect(target).await?;
    if status.suspended_for.is_some_and(|left| left >= wait) {
        return Ok(false);
    }
    limiter.extend_suspension(target, wait).await.map(|_| true)
}

/// The metrics of announcements (`metrics` feature).
#[cfg(feature = "metrics")]
pub(crate) mod names {
    /// Counter: quotas learned from an upstream (fleet-wide overrides set), labelled `scope`.
    pub const LEARNED: &str = "redlimit_outbound_quota_learned_total";
    /// Counter: suspensions set or extended because an upstream said nothing is left until
    /// its reset, labelled `scope`.
    pub const PACED: &str = "redlimit_outbound_paced_total";
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

    #[cfg(feature = "metrics")]
    #[test]
    fn a_learned_quota_and_a_pause_are_counted_in_the_metrics() {
        use crate::outbound::OutboundLayer;
        use crate::store::MemoryStore;
        use http::HeaderValue;
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                let limiter = Limiter::new(MemoryStore::new());
                let layer = OutboundLayer::builder(limiter.clone(), quota(50, 1), "api")
                    .learn_quota(quota(50, 1))
                    .build()
                    .unwrap();
                let limits = layer.limits();
                let mut headers = HeaderMap::new();
                headers.insert("ratelimit-policy", HeaderValue::from_static("p;q=20;w=1"));
                headers.insert("ratelimit", HeaderValue::from_static("p;r=0;t=30"));
                let key: Arc<str> = "api".into();
                on_response(&limits, &key, &headers, false).unwrap().await;
                // A shorter reset: nothing to learn, the suspension already lasts longer.
                headers.insert("ratelimit", HeaderValue::from_static("p;r=0;t=5"));
                if let Some(work) = on_response(&limits, &key, &headers, false) {
                    work.await;
                }
                let stats = layer.stats();
                assert_eq!((stats.announcements, stats.learned, stats.paced), (2, 1, 1));
            })
        });
        let counters: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Counter(n) => Some((key.key().name().to_owned(), n)),
                _ => None,
            })
            .collect();
        assert!(
            counters.contains(&(names::LEARNED.to_owned(), 1)),
            "{counters:?}"
        );
        assert!(
            counters.contains(&(names::PACED.to_owned(), 1)),
            "{counters:?}"
        );
    }
}
