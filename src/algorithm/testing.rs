//! Test helpers shared by the mirrors' unit tests: a sequence runner with written-out
//! expectations, and the invariants every algorithm must keep.

use std::fmt::Debug;

use proptest::prelude::*;

use super::sequences::Step;
use super::sliding_log::{self, Log};
use super::{ms_up, Args, Outcome, Packed, PackedStep, MAX_EXACT, MAX_REPLY_MS};

/// One tier's answer as the driver replies it: times in whole ms, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub allowed: bool,
    pub remaining: u64,
    /// -1: never.
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

impl Reply {
    /// The reply to `outcome`, the binding tier's.
    pub(crate) fn of<S>(outcome: &Outcome<S>) -> Self {
        Reply {
            allowed: outcome.allowed,
            remaining: outcome.remaining as u64,
            retry_after_ms: if outcome.retry_us >= 0.0 {
                ms_up(outcome.retry_us).min(MAX_REPLY_MS)
            } else {
                -1
            },
            reset_after_ms: ms_up(outcome.reset_us).min(MAX_REPLY_MS),
        }
    }
}

/// The TTL the driver writes for a state fresh again `reset_us` from now: whole ms, from 1 to
/// 2^53.
pub(crate) fn ttl_ms(reset_us: f64) -> u64 {
    ms_up(reset_us).clamp(1, MAX_EXACT as i64) as u64
}

/// The driver for one tier without controls, as the tests of each step run it: the step on the
/// stored state, and the state to write with its TTL in ms.
fn drive(step: PackedStep, stored: Option<&[u8]>, args: &Args) -> (Reply, Option<(Packed, u64)>) {
    let outcome = step(stored, args);
    let reply = Reply::of(&outcome);
    (reply, outcome.state.map(|s| (s, ttl_ms(outcome.reset_us))))
}

/// One algorithm's mirror, run on a state held by the caller, the way the store does.
pub(crate) trait Mirror: Copy + 'static {
    type State: Clone + Debug;
    /// Runs one step; returns the reply and, when it wrote, the TTL in ms.
    fn run(self, state: &mut Option<Self::State>, args: &Args) -> (Reply, Option<u64>);
}

/// A pure step over a packed state, through the driver as the store runs it.
impl Mirror for PackedStep {
    type State = Packed;
    fn run(self, state: &mut Option<Packed>, args: &Args) -> (Reply, Option<u64>) {
        let (reply, write) = drive(self, state.as_ref().map(Packed::as_bytes), args);
        match write {
            None => (reply, None),
            Some((packed, ttl_ms)) => {
                *state = Some(packed);
                (reply, Some(ttl_ms))
            }
        }
    }
}

/// The sliding log's step over its log, as the memory store runs it.
#[derive(Clone, Copy)]
pub(crate) struct SlidingLog;

impl Mirror for SlidingLog {
    type State = Log;
    fn run(self, state: &mut Option<Log>, args: &Args) -> (Reply, Option<u64>) {
        // An existing log changes in place, a fresh one is kept only when the step writes.
        let existed = state.is_some();
        let mut log = state.take().unwrap_or_default();
        let outcome = sliding_log::step(&mut log, args);
        let reply = Reply::of(&outcome);
        let ttl = outcome.state.map(|()| ttl_ms(outcome.reset_us));
        if existed || ttl.is_some() {
            *state = Some(log);
        }
        (reply, ttl)
    }
}

/// One second in µs, the unit of the clock the steps read.
pub(crate) const S: f64 = 1_000_000.0;

/// A key driven through a sequence of steps. It runs every step twice: on a state that
/// expires after the TTL the step wrote (like Redis and the memory store) and on one that
/// never expires, and panics if they ever answer differently while the clock moves
/// forward: expiry must never change a decision.
#[derive(Clone)]
pub(crate) struct Seq<M: Mirror> {
    mirror: M,
    args: Args,
    state: Option<M::State>,
    expires_at: f64,
    never_expires: Option<M::State>,
    monotone: bool,
    last_ttl: Option<u64>,
}

impl Seq<PackedStep> {
    /// A fresh key of a pure step over a packed state (see [`Seq::new`]).
    pub(crate) fn packed(step: PackedStep) -> Self {
        Seq::new(step)
    }
}

impl<M: Mirror> Seq<M> {
    /// A fresh key of `mirror` at time 0 with the quota 10 per minute.
    pub(crate) fn new(mirror: M) -> Self {
        Seq {
            mirror,
            args: Args {
                now: 0.0,
                cost: 1.0,
                limit: 10.0,
                period: 60_000_000.0,
                burst: 10.0,
            },
            state: None,
            expires_at: f64::INFINITY,
            never_expires: None,
            monotone: true,
            last_ttl: None,
        }
    }

    /// Uses the quota `limit` per `period` µs with capacity `burst` from now on.
    pub(crate) fn quota(mut self, limit: f64, period: f64, burst: f64) -> Self {
        self.args.limit = limit;
        self.args.period = period;
        self.args.burst = burst;
        self
    }

    /// Sets the clock (µs).
    pub(crate) fn at(&mut self, now: f64) -> &mut Self {
        if now < self.args.now {
            self.monotone = false;
        }
        self.args.now = now;
        self
    }

    /// Runs a request of `cost` at the current time.
    pub(crate) fn cost(&mut self, cost: f64) -> Reply {
        self.args.cost = cost;
        if self.args.now >= self.expires_at {
            self.state = None;
            self.expires_at = f64::INFINITY;
        }
        let (reply, ttl) = self.mirror.run(&mut self.state, &self.args);
        let (twin, _) = self.mirror.run(&mut self.never_expires, &self.args);
        if self.monotone {
            assert_eq!(
                reply, twin,
                "expiry changed a decision at {:?}: {:?} vs never expiring {:?}",
                self.args, self.state, self.never_expires
            );
        }
        if let Some(ttl) = ttl {
            self.expires_at = self.args.now + ttl as f64 * 1000.0;
        }
        self.last_ttl = ttl;
        reply
    }

    /// Whether the last step wrote.
    pub(crate) fn wrote(&self) -> bool {
        self.last_ttl.is_some()
    }

    /// The TTL (ms) the last step set, if it wrote.
    pub(crate) fn ttl_ms(&self) -> Option<u64> {
        self.last_ttl
    }

    /// Runs `steps` (a sequence of [`sequences`](super::sequences)) from here, asserting each
    /// decision and each check of what was written.
    #[track_caller]
    pub(crate) fn run(self, steps: &[Step]) {
        let mut s = self;
        for step in steps {
            match *step {
                Step::Quota(limit, period, burst) => {
                    s = s.quota(limit as f64, period as f64, burst as f64);
                }
                Step::At(at, cost, reply) => expect(s.at(at as f64).cost(cost as f64), reply),
                Step::Wrote(true) => assert!(s.wrote()),
                Step::Wrote(false) => assert!(!s.wrote()),
                Step::Ttl(ms) => assert_eq!(s.ttl_ms(), Some(ms)),
            }
        }
    }
}

/// Asserts `(allowed, remaining, retry_after_ms, reset_after_ms)`.
#[track_caller]
pub(crate) fn expect(reply: Reply, (allowed, remaining, retry, reset): (bool, u64, i64, i64)) {
    assert_eq!(
        (
            reply.allowed,
            reply.remaining,
            reply.retry_after_ms,
            reply.reset_after_ms
        ),
        (allowed, remaining, retry, reset),
        "(allowed, remaining, retry_after_ms, reset_after_ms)"
    );
}

/// A moderate quota (limit, period µs, burst) and steps (clock move in µs, cost); with
/// `back`, about one step in nine moves the clock back.
pub(crate) fn scenario(back: bool) -> impl Strategy<Value = ((f64, f64, f64), Vec<(f64, f64)>)> {
    let quota = (
        prop_oneof![1u32..=20, 1u32..=1_000],
        prop_oneof![
            Just(1_000_000u64),
            Just(60_000_000),
            1u64..=10_000,
            1u64..=100_000_000_000
        ],
        prop_oneof![Just(0u32), 1u32..=20, 1u32..=200],
    )
        .prop_map(|(limit, period, burst)| {
            let burst = if burst == 0 { limit } else { burst };
            (limit as f64, period as f64, burst as f64)
        });
    let step = (
        prop_oneof![
            6 => Just(0i64),
            6 => 0i64..=2_000_000,
            // Whole milliseconds, as clients read retry_after: exactness both ways shows there.
            6 => (0i64..=5_000).prop_map(|ms| ms * 1_000),
            3 => 0i64..=200_000_000,
            2 => -100_000_000i64..0,
        ],
        prop_oneof![4 => Just(1u32), 1 => Just(0), 2 => 0u32..=25, 1 => 150u32..=250],
    )
        .prop_map(move |(dt, cost)| {
            let dt = if back { dt } else { dt.abs() };
            (dt as f64, cost as f64)
        });
    (quota, prop::collection::vec(step, 1..60))
}

/// Runs `steps` (clock move in µs, cost) on `seq` from the time `now`, and after each step
/// checks `bound` with the time and the units admitted after a given time.
pub(crate) fn check_admitted<M: Mirror>(
    mut seq: Seq<M>,
    mut now: f64,
    steps: &[(f64, f64)],
    mut bound: impl FnMut(f64, &dyn Fn(f64) -> f64) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let mut admitted: Vec<(f64, f64)> = Vec::new();
    for &(dt, cost) in steps {
        now += dt;
        if seq.at(now).cost(cost).allowed && cost > 0.0 {
            admitted.push((now, cost));
        }
        let admitted_after = |from: f64| -> f64 {
            admitted
                .iter()
                .filter(|(t, _)| *t > from)
                .map(|(_, c)| c)
                .sum()
        };
        bound(now, &admitted_after)?;
    }
    Ok(())
}

/// The invariants every algorithm keeps, checked after each step of a scenario:
/// - expiry never changes a decision (checked by [`Seq`]);
/// - a peek and a denial never write, except to persist a clock stepped back;
/// - a denied request with a retry time is allowed at exactly that time and denied 1 ms
///   before it (exact both ways, for every algorithm);
/// - `remaining` cost-1 requests pass right now, and not one more;
/// - a cost above the capacity is never allowed, and nothing else is ever told "never".
pub(crate) fn check_invariants<M: Mirror>(
    mirror: M,
    (limit, period, burst): (f64, f64, f64),
    steps: &[(f64, f64)],
) -> Result<(), TestCaseError> {
    let mut seq = Seq::new(mirror).quota(limit, period, burst);
    let mut now = 1_700_000_000_000_000.0;
    let mut latest = now;
    seq.at(now);
    for &(dt, cost) in steps {
        now += dt;
        // Stored state may lie in the future until the clock is back where it was.
        let behind = now < latest;
        latest = latest.max(now);
        let reply = seq.at(now).cost(cost);
        prop_assert!(reply.reset_after_ms >= 0);
        if cost == 0.0 {
            prop_assert!(reply.allowed);
        }
        if (cost == 0.0 || !reply.allowed) && !behind {
            prop_assert!(!seq.wrote(), "a peek or denial wrote");
        }
        if reply.allowed {
            prop_assert_eq!(reply.retry_after_ms, 0);
        } else if cost > burst {
            prop_assert_eq!(reply.retry_after_ms, -1);
        } else {
            prop_assert!(reply.retry_after_ms >= 1, "denied with {:?}", reply);
            let retry = reply.retry_after_ms as f64 * 1000.0;
            let mut later = seq.clone();
            prop_assert!(
                later.at(now + retry).cost(cost).allowed,
                "denied again after retry_after"
            );
            // Exact both ways: one ms earlier (whole ms, as a client reads the reply) is denied.
            let mut early = seq.clone();
            prop_assert!(
                !early.at(now + retry - 1000.0).cost(cost).allowed,
                "allowed 1 ms before retry_after {:?}",
                reply
            );
        }
        let mut rest = seq.clone();
        for _ in 0..reply.remaining {
            prop_assert!(rest.cost(1.0).allowed, "remaining overstated");
        }
        prop_assert!(!rest.cost(1.0).allowed, "remaining understated");
    }
    Ok(())
}
