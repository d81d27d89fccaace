//! How the layer acts on an upstream's answer: reads its announcements
//! ([`announce`](super::announce)), learns the quota and paces through the provider side
//! ([`learn`](super::learn)), on the layer's limiter ([`Limits`]). See the
//! [module docs](super#provider-announcements).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::{BoxFuture, FutureExt};
use http::HeaderMap;
use tokio::sync::oneshot;

use super::announce;
use super::config::Limits;
use super::learn::{pause, same_tiers, Pending, Round};
use crate::control::{OverrideSource, WriteKind, WriteTicket};
use crate::core::{ControlError, Target};
use crate::quota::Quotas;

/// Reads what a response announces and returns the pacing it calls for, if any: the response
/// future runs it after the response ([`spawn_pacing`]). Learning runs in a task of its own (the
/// response does not wait for its writes); this instance's next acquisition for the key waits
/// for it. `retry_after`: the response's `Retry-After` already suspends the key (it takes
/// precedence over the fields).
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
    if !announced.is_empty() {
        provider.count_announcement();
    }
    if let Some(round) = provider.round(key, &announced) {
        spawn_round(limits, key, round);
    }
    let pause = pacing
        .then(|| pause(&announced, limits.max_auto_suspension))
        .flatten()?;
    // Registered now, before the answer is handed back: a `suspend` or `resume` made through
    // the limiter after that wins over it.
    let ticket = (limits.limiter).start_write(limits.target(key), WriteKind::Suspension);
    let (limits, key) = (limits.clone(), key.clone());
    Some(Box::pin(async move {
        pace(&limits, &key, pause, &ticket).await
    }))
}

/// Runs `round` in a task of its own, registered as the key's round in flight before it is
/// spawned (so that a round ended at once is not taken for one still in flight).
fn spawn_round(limits: &Arc<Limits>, key: &Arc<str>, round: Round) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        limits.provider.finish(key, None);
        return;
    };
    let (pending, done) = in_flight();
    // Registered now, before the answer is handed back: a `set_quota` or `clear_quota` made
    // through the limiter after that wins over the round's write.
    let ticket = (limits.limiter).start_write(limits.target(key), WriteKind::Override);
    let ended = RoundEnded {
        limits: limits.clone(),
        key: key.clone(),
        learned_for: None,
        _done: done,
    };
    // Registered under the lock that `finish` takes: a task that ends at once (on another
    // worker) cannot finish before it is registered, which would leave it in flight for good.
    limits.provider.start(key, || {
        runtime.spawn(async move {
            let learned_for = learn_round(&ended.limits, &ended.key, round.target, &ticket).await;
            ended.learned(learned_for);
        });
        pending
    });
}

/// Records the end of a learning round when its task ends, however it ends (a panic, a
/// runtime shutting down), then wakes what waits for it.
struct RoundEnded {
    limits: Arc<Limits>,
    key: Arc<str>,
    learned_for: Option<Duration>,
    _done: oneshot::Sender<()>,
}

impl RoundEnded {
    /// How long the learned quota the round left in force lasts (`None`: none).
    fn learned(mut self, learned_for: Option<Duration>) {
        self.learned_for = learned_for;
    }
}

impl Drop for RoundEnded {
    fn drop(&mut self) {
        self.limits.provider.finish(&self.key, self.learned_for);
    }
}

/// What waits for a task (done when the sender is dropped, with the task that holds it).
fn in_flight() -> (Pending, oneshot::Sender<()>) {
    let (done, ended) = oneshot::channel::<()>();
    let pending: BoxFuture<'static, ()> = Box::pin(async move {
        let _ = ended.await;
    });
    (pending.shared(), done)
}

/// Runs the pacing `write` for `key` in a task of its own, registered as the key's pacing in
/// flight: the response does not wait for it, this instance's next acquisition for the key
/// does (at most [`Limits::wait_bound`]). A write for a key waits for the one before it (at most
/// as long). The task is spawned before the response is handed back, so dropping the response
/// future loses nothing. Without a runtime to spawn on, the write is handed back for the caller
/// to run.
pub(crate) fn spawn_pacing(
    limits: &Arc<Limits>,
    key: &Arc<str>,
    write: BoxFuture<'static, ()>,
) -> Option<BoxFuture<'static, ()>> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Some(write);
    };
    let (pending, done) = in_flight();
    let (earlier, id) = limits.provider.start_pacing(key, pending);
    let ended = Paced {
        limits: limits.clone(),
        key: key.clone(),
        id,
        _done: done,
    };
    let bound = limits.wait_bound();
    runtime.spawn(async move {
        if let Some(earlier) = earlier {
            let _ = tokio::time::timeout(bound, earlier).await;
        }
        write.await;
        drop(ended);
    });
    None
}

/// Unregisters a pacing write when its task ends, however it ends, then wakes what waits for
/// it.
struct Paced {
    limits: Arc<Limits>,
    key: Arc<str>,
    id: u64,
    _done: oneshot::Sender<()>,
}

impl Drop for Paced {
    fn drop(&mut self) {
        self.limits.provider.paced(&self.key, self.id);
    }
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

/// One learning round for `key` (at most one per key per period in this process): reads the
/// key's override and who set it, then
/// - leaves an operator's override alone;
/// - sets `target` as the key's learned override when it differs from the one in force, or
///   only renews its time when it is the same (the answer confirmed it);
/// - clears a learned override whose time is over when nothing usable confirms it, and one the
///   announcement no longer calls for (the target is the layer's own tiers).
///
/// Under an operator's override of every route, a learned override on the route is cleared
/// (it would shadow the operator's). Each write is one atomic store call that marks the
/// override as learned (its record, `<key>#l`) and refuses to replace an operator's, and sets
/// nothing (clearing the learned one) once the tenant holds an override of every route, so an
/// operator's `set_quota` racing the round always wins (see
/// [`OverrideSource`](crate::limiter::OverrideSource)); the write goes through `ticket`, taken
/// before the answer was handed back, so that a `set_quota` or `clear_quota` made through the
/// limiter since wins over it. Returns how long the learned quota in force lasts (`None`:
/// none).
async fn learn_round(
    limits: &Limits,
    key: &str,
    target: Option<Quotas>,
    ticket: &WriteTicket,
) -> Option<Duration> {
    let bounds = limits.provider.bounds()?;
    let scope = limits.scope.as_deref().unwrap_or("");
    let at = limits.target(key);
    let status = match limits.limiter.inspect(at).await {
        Ok(status) => status,
        Err(error) => {
            tracing::warn!(%error, scope, "could not read the key's quota: nothing learned this period");
            // Not known: the next round (a period from now) reads it again, even without an
            // announcement, so that a learned quota past its time is still cleared.
            return Some(Duration::ZERO);
        }
    };
    let in_force = status.quota_override;
    let left = match status.override_source {
        Some(OverrideSource::Operator) => {
            // An operator's override: learning never changes it.
            tracing::debug!(scope, "an operator's override is in force: not learned");
            return None;
        }
        // A time left beyond this layer's `learned_ttl` was not set under it (an instance
        // configured with a longer one, or bytes no learning write makes): read as over, so
        // that this instance replaces, renews or clears the quota as its own time says.
        Some(OverrideSource::Learned { left }) => left.filter(|left| *left <= bounds.ttl),
        _ => None,
    };
    let ours = in_force.filter(|_| status.override_source.is_some());
    if status.all_routes_override.is_some() {
        // An operator's override of every route, shadowed by the learned one on the route:
        // learning never loosens an operator's choice, so its own goes (whatever the period).
        let cleared = limits.limiter.unlearn_quota(ticket, at).await;
        match cleared {
            // A `set_quota` or `clear_quota` made since wins: nothing of learning's is left.
            Ok(None) => return None,
            Ok(Some(_)) => {
                limits.provider.count_learned();
                tracing::info!(
                    scope,
                    previous = ?in_force.map(|q| q.as_slice().to_vec()),
                    "an operator's override of every route is in force: the learned quota is cleared"
                );
                return None;
            }
            Err(error) => {
                tracing::warn!(%error, scope, "could not clear the learned quota under an operator's override");
                return Some(Duration::ZERO);
            }
        }
    }
    // Set less than a period ago (by any instance): no change before the period is over.
    let young = left.is_some_and(|left| bounds.ttl.saturating_sub(left) < bounds.period);
    let wanted = target.filter(|t| !same_tiers(t, &limits.quotas));
    let written = match (wanted, ours) {
        (Some(wanted), Some(ours)) if wanted == ours => {
            // Confirmed: renew its time once a period has passed since it was set.
            if young {
                return left;
            }
            limits
                .limiter
                .learn_quota(ticket, at, &wanted, bounds.ttl)
                .await
                .map(|status| status.map(|status| (status, false)))
        }
        (_, Some(_)) if young => return left,
        (Some(wanted), _) => limits
            .limiter
            .learn_quota(ticket, at, &wanted, bounds.ttl)
            .await
            .map(|status| status.map(|status| (status, true))),
        (None, None) => return None,
        (None, Some(_)) if target.is_none() && left.is_some() => return left,
        (None, Some(_)) => limits
            .limiter
            .unlearn_quota(ticket, at)
            .await
            .map(|status| status.map(|status| (status, true))),
    };
    match written {
        Ok(None) => {
            // A `set_quota` or `clear_quota` made through the limiter since the answer wins.
            tracing::debug!(scope, "an operator's control made since wins: not learned");
            None
        }
        Ok(Some((status, changed))) => {
            let learned_now =
                matches!(status.override_source, Some(OverrideSource::Learned { .. }));
            if wanted.is_some() && !learned_now {
                // An operator's override landed first: it stays.
                tracing::debug!(scope, "an operator's override is in force: not learned");
                return None;
            }
            if changed {
                limits.provider.count_learned();
                #[cfg(feature = "metrics")]
                metrics::counter!(names::LEARNED, "scope" => scope.to_owned()).increment(1);
                match wanted {
                    Some(quotas) => tracing::info!(
                        scope,
                        quotas = ?quotas.as_slice(),
                        previous = ?in_force.map(|q| q.as_slice().to_vec()),
                        "upstream announced a different quota: learned for the whole fleet"
                    ),
                    None => tracing::info!(
                        scope,
                        previous = ?in_force.map(|q| q.as_slice().to_vec()),
                        "learned quota expired or withdrawn: the key is back to its own tiers"
                    ),
                }
            }
            wanted.map(|_| bounds.ttl)
        }
        Err(error) => {
            tracing::warn!(%error, scope, "upstream announced a quota that could not be set: not learned");
            // Read again at the next round (a period from now), announcement or not.
            Some(Duration::ZERO)
        }
    }
}

/// Suspends the key fleet-wide for `wait`, unless it already is for longer, or a `suspend` or
/// `resume` made through the limiter since `ticket` was taken wins.
async fn pace(limits: &Limits, key: &str, wait: Duration, ticket: &WriteTicket) {
    let scope = limits.scope.as_deref().unwrap_or("");
    match suspend_at_least(limits, ticket, limits.target(key), wait).await {
        Ok(false) => {}
        Ok(true) => {
            limits.provider.count_paced();
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
/// `Ok(true)` when it set or extended one. The write is an extension
/// ([`Limiter::extend_suspension`](crate::Limiter::extend_suspension)), atomic in the store, so
/// a suspension only ever extends even when instances race, made through `ticket`, so that a
/// `suspend` or `resume` made through the limiter since wins (`Ok(false)`); the look before it
/// only spares the write (and the count) when nothing would change.
async fn suspend_at_least(
    limits: &Limits,
    ticket: &WriteTicket,
    target: Target<'_>,
    wait: Duration,
) -> Result<bool, ControlError> {
    let limiter = &limits.limiter;
    let status = limiter.inspect(target).await?;
    if status.suspended_for.is_some_and(|left| left >= wait) {
        return Ok(false);
    }
    let written = limiter.extend_suspension_by(ticket, target, wait).await?;
    Ok(written.is_some())
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
    use crate::quota::Quota;

    #[cfg(feature = "metrics")]
    #[test]
    fn a_learned_quota_and_a_pause_are_counted_in_the_metrics() {
        use crate::core::Limiter;
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
                let layer =
                    OutboundLayer::builder(limiter.clone(), Quota::per_second(50).unwrap(), "api")
                        .learn_quota(Quota::per_second(50).unwrap())
                        .build()
                        .unwrap();
                let limits = layer.limits();
                let mut headers = HeaderMap::new();
                headers.insert("ratelimit-policy", HeaderValue::from_static("p;q=20;w=1"));
                headers.insert("ratelimit", HeaderValue::from_static("p;r=0;t=30"));
                let key: Arc<str> = "api".into();
                on_response(&limits, &key, &headers, false).unwrap().await;
                layer.settled().await;
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
