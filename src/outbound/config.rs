//! The [`Config`] every clone of an outbound service shares, and how it acquires.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use super::learn::Provider;
use crate::core::{AcquireError, Limiter, Target};
use crate::decision::Verdict;
use crate::quota::Quotas;

/// Which key a request is acquired for.
pub(crate) enum KeySource<K> {
    /// The same key for every request: acquired in `poll_ready`.
    Fixed(Arc<str>),
    /// A key from each request's head: acquired in the response future.
    PerRequest(K),
}

/// What every clone of an [`Outbound`] service shares.
pub(crate) struct Config<K> {
    pub limits: Arc<Limits>,
    pub key: KeySource<K>,
}

/// The limiter side of the config, shared with the response futures (which need no extractor).
pub(crate) struct Limits {
    pub limiter: Limiter,
    pub quotas: Quotas,
    pub scope: Option<String>,
    pub max_wait: Duration,
    pub auto_suspend: bool,
    /// What the layer does with the upstream's announcements (learning, its counters).
    pub provider: Provider,
    /// The cap on one automatic suspension.
    pub max_auto_suspension: Duration,
}

/// How long an acquisition waits for the key's write in flight when the store does not say how
/// long its calls may take.
pub(crate) const WAIT_BOUND: Duration = Duration::from_secs(1);

/// A pending acquisition.
pub(crate) type Acquire = BoxFuture<'static, Result<Verdict, AcquireError>>;

impl Limits {
    /// Whether response futures look at the upstream's answer (auto-suspend or learning).
    pub(crate) fn reads_responses(&self) -> bool {
        self.auto_suspend || self.provider.learns()
    }

    /// The target of `key` in the layer's scope.
    pub(crate) fn target<'a>(&'a self, key: &'a str) -> Target<'a> {
        match &self.scope {
            Some(scope) => Target::scoped(scope, key),
            None => Target::key(key),
        }
    }

    /// The longest an acquisition waits for the key's pacing write or learning round in flight:
    /// the store's call timeout, or [`WAIT_BOUND`] for a store that does not say.
    pub(crate) fn wait_bound(&self) -> Duration {
        self.limiter.store_call_timeout().unwrap_or(WAIT_BOUND)
    }

    /// Waits (at most `max_wait` from now) until the quotas admit one request for `key`.
    pub(crate) fn acquire(self: &Arc<Self>, key: Arc<str>) -> Acquire {
        let now = Instant::now();
        // A huge max_wait would overflow `Instant`: a year is forever here.
        let deadline = now
            .checked_add(self.max_wait)
            .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
            .unwrap_or(now);
        let limits = self.clone();
        Box::pin(async move {
            // A pacing write or learning round in flight for the key: decide under what it
            // sets. Bounded, so that a write a slow store still holds keeps nothing waiting.
            if let Some(pending) = limits.provider.pending(&key) {
                let _ = tokio::time::timeout(limits.wait_bound(), pending).await;
            }
            let Limits {
                limiter, quotas, ..
            } = &*limits;
            match &limits.scope {
                Some(scope) => {
                    limiter
                        .acquire_cost(Target::scoped(scope, &key), quotas, 1, deadline)
                        .await
                }
                None => limiter.acquire(&*key, quotas, deadline).await,
            }
        })
    }
}

impl<K: fmt::Debug> fmt::Debug for Config<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits = &self.limits;
        let mut out = f.debug_struct("Config");
        match &self.key {
            // The fixed key is the caller's own constant, but keys are never logged.
            KeySource::Fixed(_) => out.field("key", &"fixed"),
            KeySource::PerRequest(extractor) => out.field("extractor", extractor),
        };
        out.field("limiter", &limits.limiter)
            .field("quotas", &limits.quotas)
            .field("scope", &limits.scope)
            .field("max_wait", &limits.max_wait)
            .field("auto_suspend", &limits.auto_suspend)
            .field("learn_ceiling", &limits.provider.ceiling())
            .finish()
    }
}
