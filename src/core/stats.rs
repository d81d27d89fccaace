//! [`LimiterStats`]: what a limiter decided, counted without locks.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::decision::Decision;
use crate::decision::Verdict;

/// The `policy` label of checks made outside a layer ([`Limiter::check`](super::Limiter::check)
/// and its siblings) in the `metrics` feature's metrics; a layer's checks carry its policy name.
pub const DIRECT_POLICY_LABEL: &str = "direct";

/// What the `metrics` feature labels a check with: the layer's policy name, or
/// [`DIRECT_POLICY_LABEL`]. Without the feature it is empty and every use compiles away.
#[derive(Debug, Clone)]
pub(crate) struct PolicyLabel {
    #[cfg(feature = "metrics")]
    keys: &'static MetricKeys,
    /// A shadow check's (`src/layer/shadow.rs`): its denials are counted as `shadow_limited`.
    shadow: Shadow,
}

/// Whether a label's checks enforce, and how a shadow's are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shadow {
    /// Enforced: the usual counts.
    No,
    /// A layer in shadow: every decision counted as usual, a denial's metric outcome
    /// `shadow_limited` (and `LimiterStats::shadow_limited`).
    Layer,
    /// Shadow tiers beside enforced ones: only their denials are counted (the enforced check
    /// already counted the request), as `shadow_limited`.
    Tiers,
    /// A settlement's own checks after the response: not decisions, never counted as such.
    Uncounted,
}

impl PolicyLabel {
    /// The label of a layer's checks.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(policy_name: &str) -> Self {
        PolicyLabel {
            #[cfg(feature = "metrics")]
            keys: MetricKeys::of(policy_name),
            shadow: Shadow::No,
        }
    }

    /// The same label for checks made in shadow.
    pub(crate) fn shadowed(&self, shadow: Shadow) -> Self {
        // Not `..self.clone()`: without `metrics` the shadow is the only field.
        let mut label = self.clone();
        label.shadow = shadow;
        label
    }

    /// The label of checks made outside a layer.
    pub(crate) fn direct() -> Self {
        #[cfg(feature = "metrics")]
        static DIRECT: std::sync::OnceLock<&'static MetricKeys> = std::sync::OnceLock::new();
        PolicyLabel {
            #[cfg(feature = "metrics")]
            keys: DIRECT.get_or_init(|| MetricKeys::of(DIRECT_POLICY_LABEL)),
            shadow: Shadow::No,
        }
    }
}

/// The metrics the limiter records with the `metrics` feature (names and label values are
/// documented in the crate docs, section "Metrics"; the circuit gauge is the store's).
#[cfg(feature = "metrics")]
pub(crate) mod names {
    /// Counter: decisions, labelled `policy` and `outcome`.
    pub const DECISIONS: &str = "redlimit_decisions_total";
    /// Histogram: seconds a store call took (success or error), labelled `policy`.
    pub const STORE_LATENCY: &str = "redlimit_store_latency_seconds";
    /// Counter: requests a layer found no key for, labelled `policy`.
    pub const UNKEYED: &str = "redlimit_unkeyed_requests_total";
}

/// A decision's `outcome` label.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Allowed,
    Limited,
    Suspended,
    ShadowLimited,
    DenyCache,
    LocalFallback,
    StoreErrorAdmitted,
    StoreErrorRejected,
}

#[cfg(feature = "metrics")]
impl Outcome {
    /// Every outcome, in the order of [`MetricKeys::outcomes`].
    const ALL: [Outcome; 8] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::Suspended,
        Outcome::ShadowLimited,
        Outcome::DenyCache,
        Outcome::LocalFallback,
        Outcome::StoreErrorAdmitted,
        Outcome::StoreErrorRejected,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::Suspended => "suspended",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::DenyCache => "deny_cache",
            Outcome::LocalFallback => "local_fallback",
            Outcome::StoreErrorAdmitted => "store_error_admitted",
            Outcome::StoreErrorRejected => "store_error_rejected",
        }
    }
}

/// A policy's metric keys (name and labels), built once per policy name for the life of the
/// process, like [`interned`](crate::intern::interned) strings: a decision then records
/// without building a key (its labels and its hash) each time, and a label clones for free.
#[cfg(feature = "metrics")]
#[derive(Debug)]
struct MetricKeys {
    latency: metrics::Key,
    unkeyed: metrics::Key,
    outcomes: [metrics::Key; Outcome::ALL.len()],
}

#[cfg(feature = "metrics")]
impl MetricKeys {
    fn of(policy_name: &str) -> &'static MetricKeys {
        use std::collections::BTreeMap;
        use std::sync::{Mutex, PoisonError};
        static KEYS: Mutex<BTreeMap<&'static str, &'static MetricKeys>> =
            Mutex::new(BTreeMap::new());
        let policy = crate::intern::interned(policy_name);
        let mut keys = KEYS.lock().unwrap_or_else(PoisonError::into_inner);
        keys.entry(policy).or_insert_with(|| {
            let key = |name: &'static str, outcome: Option<Outcome>| {
                let mut labels = vec![metrics::Label::from_static_parts("policy", policy)];
                if let Some(outcome) = outcome {
                    labels.push(metrics::Label::from_static_parts(
                        "outcome",
                        outcome.label(),
                    ));
                }
                metrics::Key::from_parts(name, labels)
            };
            Box::leak(Box::new(MetricKeys {
                latency: key(names::STORE_LATENCY, None),
                unkeyed: key(names::UNKEYED, None),
                outcomes: Outcome::ALL.map(|outcome| key(names::DECISIONS, Some(outcome))),
            }))
        })
    }
}

/// What `metrics::counter!` and `histogram!` would pass the recorder from this module.
#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// Records one decision's outcome; nothing without the `metrics` feature.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn record_outcome(label: &PolicyLabel, outcome: Outcome) {
    #[cfg(feature = "metrics")]
    {
        let key = &label.keys.outcomes[outcome as usize];
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA).increment(1));
    }
}

/// Measures a store call for the latency histogram; nothing without the `metrics` feature.
#[derive(Debug)]
pub(crate) struct StoreTimer {
    #[cfg(feature = "metrics")]
    start: std::time::Instant,
}

impl StoreTimer {
    #[inline]
    pub(crate) fn start() -> Self {
        StoreTimer {
            #[cfg(feature = "metrics")]
            start: std::time::Instant::now(),
        }
    }

    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn stop(self, label: &PolicyLabel) {
        #[cfg(feature = "metrics")]
        metrics::with_recorder(|recorder| {
            recorder
                .register_histogram(&label.keys.latency, &METADATA)
                .record(self.start.elapsed())
        });
    }
}

/// What a limiter has decided since it was built; see [`Limiter::stats`](super::Limiter::stats).
///
/// Export it to your metrics: a rising `store_errors` means Redis is in trouble while the
/// failure policy keeps requests flowing; a rising `unkeyed` means requests reach the layer
/// without a key (see [`MissingKey`](crate::layer::MissingKey)).
///
/// ```
/// # use std::time::Duration;
/// # use futures::future::BoxFuture;
/// # use redlimit::{store::{CheckRequest, Store, StoreError}, Decision};
/// # #[derive(Debug)]
/// # struct Down;
/// # impl Store for Down {
/// #     fn check<'a>(
/// #         &'a self,
/// #         _: CheckRequest<'a>,
/// #     ) -> BoxFuture<'a, Result<Decision, StoreError>> {
/// #         Box::pin(async { Err(StoreError::Timeout(Duration::from_millis(100))) })
/// #     }
/// # }
/// use redlimit::{limiter::LimiterStats, Limiter, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // `Down` is a store whose every call times out (see the `policy` module docs).
/// let limiter = Limiter::new(Down);
/// assert!(limiter.check("k", &Quota::per_second(1).unwrap()).await.is_allowed());
/// let stats = limiter.stats();
/// assert_eq!(stats, LimiterStats { store_errors: 1, failed_open: 1, ..LimiterStats::default() });
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimiterStats {
    /// Requests the store admitted.
    pub allowed: u64,
    /// Requests denied: by the store, or by the deny cache without asking the store (those are
    /// also counted in `deny_cached`).
    pub denied: u64,
    /// Denials answered by the local deny cache, without the store (see
    /// [`LimiterBuilder::deny_cache`](super::LimiterBuilder::deny_cache)); included in `denied`.
    pub deny_cached: u64,
    /// Store calls that failed (each then went through the failure policy).
    pub store_errors: u64,
    /// Failures the policy admitted unchecked.
    pub failed_open: u64,
    /// Failures the policy rejected.
    pub failed_closed: u64,
    /// Failures the policy decided locally (e.g. [`LocalFallback`](crate::failure_policy::LocalFallback)).
    pub fallback_decisions: u64,
    /// Requests a [`RateLimitLayer`](crate::RateLimitLayer) found no key for and counted against
    /// the shared key of [`MissingKey::Shared`](crate::layer::MissingKey::Shared). Usually a
    /// misconfiguration: `PeerIp` without a peer address.
    pub unkeyed: u64,
    /// Denials because the key was suspended ([`Limiter::suspend`](crate::Limiter::suspend));
    /// included in `denied`.
    pub suspended: u64,
    /// Denials of checks made in shadow (a layer's `shadow(true)`, or its shadow tiers): the
    /// request went on to the service. A shadow layer's are also counted in `denied`.
    pub shadow_limited: u64,
    /// Settlements after the response (a refund or a charge) that failed; see
    /// [`RateLimitLayerBuilder::cost_from_response`](crate::layer::RateLimitLayerBuilder::cost_from_response).
    pub settle_failures: u64,
}

/// One counter on a cache line of its own (128 bytes: x86-64 prefetches lines in pairs), so
/// that cores counting different outcomes do not contend for one line.
#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl Padded {
    #[inline]
    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn load(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The live counters behind [`LimiterStats`].
#[derive(Default)]
pub(crate) struct Counters {
    allowed: Padded,
    denied: Padded,
    deny_cached: Padded,
    store_errors: Padded,
    failed_open: Padded,
    failed_closed: Padded,
    fallback_decisions: Padded,
    unkeyed: Padded,
    suspended: Padded,
    shadow_limited: Padded,
    settle_failures: Padded,
}

impl Counters {
    pub(crate) fn count_decision(&self, decision: &Decision, label: &PolicyLabel) {
        if label.shadow != Shadow::No {
            return self.count_shadow(decision.allowed, decision.suspended, label);
        }
        if decision.allowed {
            self.allowed.add();
        } else {
            self.denied.add();
            if decision.suspended {
                self.suspended.add();
            }
        }
        record_outcome(
            label,
            if decision.allowed {
                Outcome::Allowed
            } else if decision.suspended {
                Outcome::Suspended
            } else {
                Outcome::Limited
            },
        );
    }

    /// A decision made in shadow (see [`Shadow`]).
    fn count_shadow(&self, allowed: bool, suspended: bool, label: &PolicyLabel) {
        if label.shadow == Shadow::Uncounted {
            return;
        }
        let tiers = label.shadow == Shadow::Tiers;
        if allowed {
            if !tiers {
                self.allowed.add();
                record_outcome(label, Outcome::Allowed);
            }
            return;
        }
        self.shadow_limited.add();
        if !tiers {
            self.denied.add();
            if suspended {
                self.suspended.add();
            }
        }
        record_outcome(label, Outcome::ShadowLimited);
    }

    /// A settlement that failed.
    pub(crate) fn count_settle_failure(&self) {
        self.settle_failures.add();
    }

    /// A denial answered from the deny cache.
    pub(crate) fn count_cached_denial(&self, label: &PolicyLabel) {
        if label.shadow != Shadow::No {
            self.deny_cached.add();
            return self.count_shadow(false, false, label);
        }
        self.denied.add();
        self.deny_cached.add();
        record_outcome(label, Outcome::DenyCache);
    }

    pub(crate) fn count_store_error(&self) {
        self.store_errors.add();
    }

    pub(crate) fn count_failure(&self, verdict: &Verdict, label: &PolicyLabel) {
        let (counter, outcome) = match verdict {
            Verdict::Decided(_) => (&self.fallback_decisions, Outcome::LocalFallback),
            Verdict::FailedOpen => (&self.failed_open, Outcome::StoreErrorAdmitted),
            Verdict::FailedClosed { .. } => (&self.failed_closed, Outcome::StoreErrorRejected),
        };
        counter.add();
        record_outcome(label, outcome);
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn count_unkeyed(&self, label: &PolicyLabel) {
        self.unkeyed.add();
        #[cfg(feature = "metrics")]
        metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&label.keys.unkeyed, &METADATA)
                .increment(1)
        });
    }

    pub(crate) fn snapshot(&self) -> LimiterStats {
        LimiterStats {
            allowed: self.allowed.load(),
            denied: self.denied.load(),
            deny_cached: self.deny_cached.load(),
            store_errors: self.store_errors.load(),
            failed_open: self.failed_open.load(),
            failed_closed: self.failed_closed.load(),
            fallback_decisions: self.fallback_decisions.load(),
            unkeyed: self.unkeyed.load(),
            suspended: self.suspended.load(),
            shadow_limited: self.shadow_limited.load(),
            settle_failures: self.settle_failures.load(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_sit_on_their_own_cache_lines() {
        assert_eq!(std::mem::align_of::<Padded>(), 128);
        assert!(std::mem::size_of::<Counters>() >= 11 * 128);
    }
}
