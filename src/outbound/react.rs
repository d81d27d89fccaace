//! How the layer acts on an upstream's answer: reads its announcements
//! ([`announce`](super::announce)), learns the quota and paces through the provider side
//! ([`learn`](super::learn)), on the layer's limiter ([`Limits`]). See the
//! [module docs](super#provider-announcements).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use http::HeaderMap;

use super::announce;
use super::config::Limits;
use super::learn::pause;
use crate::limiter::{ControlError, Limiter, Target};
use crate::quota::Quotas;

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
    provider.count_announcement();
    let learn = provider.claim(&announced);
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

fn target<'a>(limits: &'a Limits, key: &'a str) -> Target<'a> {
    match &limits.scope {
        Some(scope) => Target::scoped(scope, key),
        None => Target::key(key),
    }
}

/// Sets `quotas` as the key's fleet-wide override, unless they are in force already (another
/// instance learned them first, or they are the layer's own); logs and counts a change once.
async fn learn_quota(limits: &Limits, key: &str, quotas: Quotas) {
    let provider = &limits.provider;
    if !provider.learns() {
        return;
    }
    let scope = limits.scope.as_deref().unwrap_or("");
    let limiter = &limits.limiter;
    let status = match limiter.inspect(target(limits, key)).await {
        Ok(status) => status,
        Err(error) => {
            provider.forget(quotas);
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
            provider.count_learned();
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
            provider.forget(quotas);
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
    use crate::quota::Quota;

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
