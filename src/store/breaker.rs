//! [`CircuitBreaker`]: after repeated failures, skip the store for a cool-down.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::failure::FailureLog;

/// When to stop calling a failing store, and for how long.
///
/// After `failure_threshold` consecutive transport failures (timeouts, I/O errors, a server that
/// cannot take calls: see [`StoreError::is_transport`](crate::store::StoreError::is_transport))
/// the circuit **opens**: for `cool_down`, calls skip Redis and go straight to the failure
/// policy (no waiting on a dead server). A script's error reply or an unreadable reply does not
/// count (and, as an answer from the server, ends a run of failures): it concerns one key, and
/// one corrupt key must not fail every key open. Then one call
/// at a time is let through as a probe: success closes the circuit, failure opens it for
/// another cool-down. A probe whose outcome has not come within twice the store's timeout (its
/// caller holds its future without polling it) is taken over by the next call, so that no
/// caller keeps the circuit open for the others; the outcome it brings later changes nothing. Every state change is logged with `tracing` (a warning when the circuit
/// opens, an info event when it closes) and, with the `metrics` feature, shown by the gauge
/// `redlimit_circuit_breaker_open` (1 open, 0 closed).
///
/// ```
/// use redlimit::store::{CircuitBreaker, RedisStore};
/// use std::time::Duration;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .circuit_breaker(CircuitBreaker { failure_threshold: 3, cool_down: Duration::from_secs(1) })
///     .build()?;
/// # Ok::<(), redlimit::store::BuildError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    /// Consecutive transport failures that open the circuit (5 by default; 0 counts as 1).
    pub failure_threshold: u32,
    /// How long the store is skipped once open (500 ms by default).
    pub cool_down: Duration,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            failure_threshold: 5,
            cool_down: Duration::from_millis(500),
        }
    }
}

/// Whether a call may go to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The circuit is closed: call.
    Call,
    /// The cool-down is over and this call is the one probe.
    Probe,
    /// The circuit is open: skip the store.
    Skip,
}

/// An admission, and for a probe its claim (when it was let through): only the probe that
/// still holds the claim changes the circuit with its outcome. One taken over (held past twice
/// the timeout) no longer does, so that a late outcome cannot end its successor's probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) admission: Admission,
    claim: u64,
}

impl Ticket {
    /// A call through a closed circuit (or a store without a breaker).
    pub(crate) const CALL: Ticket = Ticket {
        admission: Admission::Call,
        claim: 0,
    };
}

/// The breaker's state, shared by all clones of a store. Lock-free: the hot path (a closed
/// circuit) is one atomic load before and one store after the call.
#[derive(Debug)]
pub(crate) struct BreakerState {
    config: CircuitBreaker,
    epoch: Instant,
    consecutive_failures: AtomicU32,
    /// µs since `epoch` until which the circuit stays open; 0 while closed.
    open_until: AtomicU64,
    /// µs since `epoch` at which the probe in flight was let through; 0 when none is.
    probing: AtomicU64,
    /// How long a probe may stay in flight before the next call takes over (see
    /// [`CircuitBreaker`]).
    probe_limit_micros: u64,
}

impl BreakerState {
    /// A closed circuit of a store whose calls take at most `timeout`.
    pub(crate) fn new(config: CircuitBreaker, timeout: Duration) -> Self {
        set_open_gauge(false);
        BreakerState {
            config,
            epoch: Instant::now(),
            consecutive_failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicU64::new(0),
            probe_limit_micros: (timeout * 2).as_micros().min(u64::MAX as u128 / 4) as u64,
        }
    }

    fn now(&self) -> u64 {
        // +1 keeps 0 free to mean "closed".
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    /// Whether a call may go now, as its [`ticket`](Self::ticket) says.
    #[cfg(test)]
    pub(crate) fn admit(&self) -> Admission {
        self.ticket().admission
    }

    /// Whether a call may go now, with a probe's claim.
    pub(crate) fn ticket(&self) -> Ticket {
        let skip = Ticket {
            admission: Admission::Skip,
            claim: 0,
        };
        let open_until = self.open_until.load(Ordering::Acquire);
        if open_until == 0 {
            return Ticket::CALL;
        }
        let now = self.now();
        if now < open_until {
            return skip;
        }
        let probing = self.probing.load(Ordering::Acquire);
        if probing != 0 && now < probing.saturating_add(self.probe_limit_micros) {
            return skip;
        }
        match self
            .probing
            .compare_exchange(probing, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ticket {
                admission: Admission::Probe,
                claim: now,
            },
            Err(_) => skip,
        }
    }

    /// The ticket of the probe in flight now, for an outcome told by its admission alone.
    fn current(&self, admission: Admission) -> Ticket {
        Ticket {
            admission,
            claim: self.probing.load(Ordering::Acquire),
        }
    }

    /// Whether `ticket` is the probe in flight, which alone may end it.
    fn holds_probe(&self, ticket: Ticket) -> bool {
        ticket.admission == Admission::Probe
            && ticket.claim != 0
            && self.probing.load(Ordering::Acquire) == ticket.claim
    }

    /// Whether the next [`admit`](Self::admit) may let a probe through (the circuit open, its
    /// cool-down over): a call that is not polled yet waits for its first poll to ask, so that
    /// a future held unpolled holds no probe.
    pub(crate) fn probe_due(&self) -> bool {
        let open_until = self.open_until.load(Ordering::Acquire);
        open_until != 0 && self.now() >= open_until
    }

    /// [`on_success_of`](Self::on_success_of) for a call or the probe in flight.
    pub(crate) fn on_success(&self, admission: Admission) {
        self.on_success_of(self.current(admission));
    }

    /// A call that the store answered. A probe that still holds its claim closes the circuit.
    pub(crate) fn on_success_of(&self, ticket: Ticket) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        if self.holds_probe(ticket) {
            self.open_until.store(0, Ordering::Release);
            let _ =
                self.probing
                    .compare_exchange(ticket.claim, 0, Ordering::AcqRel, Ordering::Acquire);
            set_open_gauge(false);
            tracing::info!("rate limit store recovered; circuit closed");
        }
    }

    /// [`on_failure_of`](Self::on_failure_of) for a call or the probe in flight.
    pub(crate) fn on_failure(&self, admission: Admission, log: &FailureLog) {
        self.on_failure_of(self.current(admission), log);
    }

    /// A transport failure of a call admitted with `ticket`. Its changes of state are told
    /// through the store's `log` (a `warn` only as an outage's first line). A probe taken over
    /// changes nothing: its successor's outcome decides.
    pub(crate) fn on_failure_of(&self, ticket: Ticket, log: &FailureLog) {
        match ticket.admission {
            Admission::Probe => {
                if !self.holds_probe(ticket) {
                    return;
                }
                self.open_until
                    .store(self.now() + self.cool_down_micros(), Ordering::Release);
                let _ = self.probing.compare_exchange(
                    ticket.claim,
                    0,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                if log.may_tell() {
                    tracing::warn!(cool_down = ?self.config.cool_down, "rate limit store probe failed; circuit stays open");
                } else {
                    tracing::debug!(cool_down = ?self.config.cool_down, "rate limit store probe failed; circuit stays open");
                }
            }
            Admission::Call => {
                let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
                if failures >= self.config.failure_threshold.max(1)
                    && self
                        .open_until
                        .compare_exchange(
                            0,
                            self.now() + self.cool_down_micros(),
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                {
                    set_open_gauge(true);
                    if log.may_tell() {
                        tracing::warn!(
                            failures,
                            cool_down = ?self.config.cool_down,
                            "rate limit store keeps failing; circuit opened"
                        );
                    } else {
                        tracing::debug!(
                            failures,
                            cool_down = ?self.config.cool_down,
                            "rate limit store keeps failing; circuit opened"
                        );
                    }
                }
            }
            Admission::Skip => {}
        }
    }

    /// [`on_abandoned_of`](Self::on_abandoned_of) for a call or the probe in flight.
    #[cfg(test)]
    pub(crate) fn on_abandoned(&self, admission: Admission) {
        self.on_abandoned_of(self.current(admission));
    }

    /// A call with `ticket` whose caller went away before it finished (its future was dropped:
    /// a client disconnect, an outer timeout). It tells nothing about the store, but a probe
    /// that still holds its claim must hand it over: otherwise no call would probe again until
    /// the claim runs out.
    pub(crate) fn on_abandoned_of(&self, ticket: Ticket) {
        if self.holds_probe(ticket)
            && self
                .probing
                .compare_exchange(ticket.claim, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            tracing::debug!("rate limit store probe abandoned by its caller; the next call probes");
        }
    }

    fn cool_down_micros(&self) -> u64 {
        self.config.cool_down.as_micros().min(u64::MAX as u128 / 2) as u64
    }

    /// Whether calls are being skipped now.
    pub(crate) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }
}

/// The `metrics` feature's circuit gauge; nothing without the feature.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn set_open_gauge(open: bool) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("redlimit_circuit_breaker_open").set(if open { 1.0 } else { 0.0 });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A breaker of `failure_threshold` and `cool_down`, and the failure log its calls report to.
    /// A breaker of a store whose calls take at most `timeout`, and its log.
    fn breaker_of(
        failure_threshold: u32,
        cool_down: Duration,
        timeout: Duration,
    ) -> (BreakerState, FailureLog) {
        let config = CircuitBreaker {
            failure_threshold,
            cool_down,
        };
        (BreakerState::new(config, timeout), FailureLog::default())
    }

    /// A breaker whose probes never outlast the test.
    fn breaker(failure_threshold: u32, cool_down: Duration) -> (BreakerState, FailureLog) {
        breaker_of(failure_threshold, cool_down, Duration::from_secs(3600))
    }

    #[test]
    fn opens_after_threshold_and_probes_once() {
        let (breaker, log) = breaker(2, Duration::ZERO);
        assert_eq!(breaker.admit(), Admission::Call);
        breaker.on_failure(Admission::Call, &log);
        assert!(!breaker.is_open());
        breaker.on_failure(Admission::Call, &log);
        assert!(breaker.is_open());
        // Cool-down of zero: the next call probes, concurrent ones skip.
        assert_eq!(breaker.admit(), Admission::Probe);
        assert_eq!(breaker.admit(), Admission::Skip);
        breaker.on_failure(Admission::Probe, &log);
        assert_eq!(breaker.admit(), Admission::Probe);
        breaker.on_success(Admission::Probe);
        assert!(!breaker.is_open());
        assert_eq!(breaker.admit(), Admission::Call);
    }

    #[test]
    fn an_abandoned_probe_hands_over_to_the_next_call() {
        let (breaker, log) = breaker(1, Duration::ZERO);
        breaker.on_failure(Admission::Call, &log);
        assert_eq!(breaker.admit(), Admission::Probe);
        assert_eq!(breaker.admit(), Admission::Skip);
        breaker.on_abandoned(Admission::Probe);
        assert!(breaker.is_open(), "an abandoned probe proves nothing");
        assert_eq!(breaker.admit(), Admission::Probe);
        breaker.on_success(Admission::Probe);
        assert!(!breaker.is_open());
        // Abandoned calls of a closed circuit change nothing.
        breaker.on_abandoned(Admission::Call);
        assert_eq!(breaker.admit(), Admission::Call);
    }

    #[test]
    fn skips_during_cool_down_and_success_resets_the_count() {
        let (breaker, log) = breaker(2, Duration::from_secs(3600));
        breaker.on_failure(Admission::Call, &log);
        breaker.on_success(Admission::Call);
        breaker.on_failure(Admission::Call, &log);
        assert!(!breaker.is_open(), "failures must be consecutive");
        breaker.on_failure(Admission::Call, &log);
        assert_eq!(breaker.admit(), Admission::Skip);
    }

    #[test]
    fn a_probe_held_past_twice_the_timeout_is_taken_over_by_the_next_call() {
        let (breaker, log) = breaker_of(1, Duration::ZERO, Duration::from_millis(5));
        breaker.on_failure(Admission::Call, &log);
        assert!(breaker.probe_due());
        assert_eq!(breaker.admit(), Admission::Probe);
        assert_eq!(breaker.admit(), Admission::Skip, "one probe at a time");
        std::thread::sleep(Duration::from_millis(12));
        assert_eq!(
            breaker.admit(),
            Admission::Probe,
            "the held probe is taken over"
        );
        assert_eq!(breaker.admit(), Admission::Skip);
        breaker.on_success(Admission::Probe);
        assert!(!breaker.is_open());
        assert!(!breaker.probe_due());
    }

    #[test]
    fn a_taken_over_probes_outcome_leaves_its_successors_probe_alone() {
        let (breaker, log) = breaker_of(1, Duration::ZERO, Duration::from_millis(5));
        breaker.on_failure(Admission::Call, &log);
        let stale = breaker.ticket();
        assert_eq!(stale.admission, Admission::Probe);
        std::thread::sleep(Duration::from_millis(12));
        let current = breaker.ticket();
        assert_eq!(current.admission, Admission::Probe, "taken over");
        // The stale probe's failure, success or drop ends nothing: one probe stays in flight.
        breaker.on_failure_of(stale, &log);
        assert_eq!(breaker.admit(), Admission::Skip);
        breaker.on_success_of(stale);
        assert!(breaker.is_open());
        breaker.on_abandoned_of(stale);
        assert_eq!(breaker.admit(), Admission::Skip);
        // The current probe's outcome decides.
        breaker.on_success_of(current);
        assert!(!breaker.is_open());
    }
}
