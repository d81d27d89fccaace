//! One oracle per promise of the docs, each over what a run recorded, each with the bound the
//! docs give (cited beside it). An oracle that fires on correct behaviour is a defect of this
//! test: when in doubt, the bound is the generous reading of the doc.
//!
//! To add an oracle: a function `fn name(schedule, run, out)` that pushes a [`Violation`]
//! named after the promise, citing the doc line it restates, and a line in [`check`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redlimit::clock::Clock;
use redlimit::limiter::{LeaseStats, LimiterStats};
use redlimit::Algorithm;

use crate::faults::Fault;
use crate::fleet::{one_window, per_window, Outcome, Run, SLOT_LEASE};
use crate::generator::{Family, Schedule};

/// A broken promise.
#[derive(Clone, Debug)]
pub struct Violation {
    /// The oracle's name: what was promised.
    pub oracle: &'static str,
    pub detail: String,
}

/// Every oracle that applies to `schedule`'s family, over `run`.
pub fn check(schedule: &Schedule, run: &Run) -> Vec<Violation> {
    let mut out = Vec::new();
    never_hangs(run, &mut out);
    match schedule.config.family {
        Family::Rate => {
            admitted(schedule, run, &mut out);
            controls(schedule, run, &mut out);
            counters(run, &mut out);
        }
        Family::Settle => settled(schedule, run, &mut out),
        Family::Concurrency => in_flight(run, &mut out),
        Family::Outbound => recovery(run, &mut out),
    }
    out
}

/// docs/failure.md: "Every Redis call is bounded by a timeout ... a hung or dead Redis never
/// hangs a request"; DESIGN §6c: "No request may wait on work that nobody will finish". The
/// bound is `fleet::BOUND` (a few store timeouts, generously).
fn never_hangs(run: &Run, out: &mut Vec<Violation>) {
    for (op, what) in &run.hangs {
        out.push(Violation {
            oracle: "never-hangs",
            detail: format!("op {op}: {what}"),
        });
    }
}

/// Units that leases taken before segment `s` may still spend after it. After a reset: each
/// instance's held units at that moment, at most what it admitted within one lease interval
/// after it (docs/leases.md: "its units live one interval at most"; "units leased before a
/// reset are never given back after it"). After a data loss: every unit held at that moment
/// (docs/leases.md, "After a data loss": each is spent by its holder or given back into the
/// fresh state, once).
fn lease_slack(schedule: &Schedule, run: &Run, key: usize, epoch: u32) -> u64 {
    let Some(interval) = schedule.config.lease_ms.map(Duration::from_millis) else {
        return 0;
    };
    let Some(segment) = run
        .segments
        .iter()
        .find(|s| s.key == key && s.epoch == epoch)
    else {
        return 0;
    };
    if segment.loss {
        return segment.held.iter().sum();
    }
    let until = segment.at + interval + Duration::from_millis(20);
    segment
        .held
        .iter()
        .enumerate()
        .map(|(inst, held)| {
            let spent: u64 = run
                .events
                .iter()
                .filter(|e| e.inst == inst && e.key == key && e.epoch == epoch)
                .filter(|e| e.outcome == Outcome::Allowed && e.started <= until)
                .map(|e| e.cost)
                .sum();
            spent.min(*held)
        })
        .sum()
}

/// README / docs/algorithms.md: a quota admits at most its limit per window (fixed window), at
/// most the burst plus the rate times the time elapsed (token bucket, GCRA); docs/leases.md:
/// "a binding quota admits, per window, at most the quota (exactly: every admission was paid
/// for)", and "after a reset, units leased before it never come back" (DESIGN §6c), so a
/// segment after a reset or a data loss (a new bucket, one more window's worth) admits at most
/// a fresh quota plus the [`lease_slack`] of units leased before it. Only the store's decisions
/// count: the failure policy's admissions are apart.
fn admitted(schedule: &Schedule, run: &Run, out: &mut Vec<Violation>) {
    let config = &schedule.config;
    let period_us = config.period_ms * 1_000;
    let allowed = |e: &crate::fleet::Event| e.outcome == Outcome::Allowed;
    match config.algorithm {
        Algorithm::FixedWindow => {
            // A check that straddled a window's end is left out (its window is unknown).
            let keep = |e: &crate::fleet::Event| allowed(e) && one_window(e, period_us);
            for ((key, window, epoch), units) in
                per_window(&run.events, period_us, keep, |e| e.cost)
            {
                // A segment's slack is for the window it began in: a fixed window's units end
                // with their window.
                let began_here = run
                    .segments
                    .iter()
                    .any(|s| s.key == key && s.epoch == epoch && s.clock_us / period_us == window);
                let slack = if began_here {
                    lease_slack(schedule, run, key, epoch)
                } else {
                    0
                };
                if units > config.limit + slack {
                    out.push(Violation {
                        oracle: "admitted",
                        detail: format!(
                            "key {key} window {window} segment {epoch}: admitted {units} of {} (+{slack} leased before the segment)",
                            config.limit
                        ),
                    });
                }
            }
        }
        _ => {
            let mut segments: HashMap<(usize, u32), (u64, u64)> = HashMap::new();
            for e in run.events.iter().filter(|e| allowed(e)) {
                let entry = segments.entry((e.key, e.epoch)).or_insert((0, 0));
                entry.0 += e.cost;
                entry.1 = entry.1.max(e.end_us);
            }
            for ((key, epoch), (units, last_us)) in segments {
                let start_us = run
                    .segments
                    .iter()
                    .find(|s| s.key == key && s.epoch == epoch)
                    .map_or(0, |s| s.clock_us);
                let start_us = start_us.max(crate::fleet::clock_start_us());
                let refill = u128::from(config.limit) * u128::from(last_us - start_us.min(last_us))
                    / u128::from(period_us);
                let slack = lease_slack(schedule, run, key, epoch);
                let bound = config.limit + refill as u64 + 1 + slack;
                if units > bound {
                    out.push(Violation {
                        oracle: "admitted",
                        detail: format!(
                            "key {key} segment {epoch}: admitted {units}, bound {bound} (burst {} + refill {refill} + 1 + {slack} leased before)",
                            config.limit
                        ),
                    });
                }
            }
        }
    }
}

/// docs/leases.md: "no instance admits a request that started more than one lease interval
/// after the control was set" (at once without leases); a suspension stays through a reset and
/// ends at its time, a resume or a data loss. Its time is the clock the control read plus its
/// duration (docs/fleet.md, "Suspension": on the client clock when one is configured), so only
/// an admission decided before the earliest such end (`end_us`, the clock after the decision,
/// before it) contradicts it.
fn controls(schedule: &Schedule, run: &Run, out: &mut Vec<Violation>) {
    let delay = Duration::from_millis(schedule.config.lease_ms.map_or(0, |ms| ms + 10));
    for s in &run.suspensions {
        let late = run.events.iter().filter(|e| {
            e.key == s.key
                && e.outcome == Outcome::Allowed
                && e.started > s.at + delay
                && s.ended.is_none_or(|ended| e.started < ended)
                && e.end_us < s.until_us
        });
        if let Some(e) = late.clone().next() {
            out.push(Violation {
                oracle: "controls",
                detail: format!(
                    "suspension of op {} on key {}: {} admitted after it, first at op {} on instance {}, {:?} after the suspension returned",
                    s.op,
                    s.key,
                    late.count(),
                    e.op,
                    e.inst,
                    e.started - s.at
                ),
            });
        }
    }
}

fn limiter_counts(s: &LimiterStats) -> [u64; 11] {
    [
        s.allowed,
        s.denied,
        s.deny_cached,
        s.store_errors,
        s.failed_open,
        s.failed_closed,
        s.fallback_decisions,
        s.unkeyed,
        s.suspended,
        s.shadow_limited,
        s.settle_failures,
    ]
}

fn lease_counts(s: &LeaseStats) -> [u64; 5] {
    [s.renewals, s.leased, s.spent, s.returned, s.stranded]
}

/// docs/leases.md: "always `leased = spent + held + returned + stranded`"; and counters
/// (`LimiterStats`, `LeaseStats` but `held`) never go backwards.
fn counters(run: &Run, out: &mut Vec<Violation>) {
    for (inst, samples) in run.stats.iter().enumerate() {
        for pair in samples.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let limiter = limiter_counts(&a.0)
                .iter()
                .zip(limiter_counts(&b.0))
                .any(|(x, y)| *x > y);
            let lease = lease_counts(&a.1)
                .iter()
                .zip(lease_counts(&b.1))
                .any(|(x, y)| *x > y);
            if limiter || lease {
                out.push(Violation {
                    oracle: "counters",
                    detail: format!("instance {inst}: a counter went back: {a:?} then {b:?}"),
                });
                break;
            }
        }
        if let Some((_, l)) = samples.last() {
            if l.leased != l.spent + l.held + l.returned + l.stranded {
                out.push(Violation {
                    oracle: "counters",
                    detail: format!("instance {inst}: leased != spent + held + returned + stranded at the end: {l:?}"),
                });
            }
        }
    }
}

/// docs/modes.md, cost settled after the response: "The reservation makes it exact under
/// concurrency"; "less than the reservation is refunded"; DESIGN §6c: a refund "goes [to the
/// window it was charged to] or nowhere". So per key and fixed window, the units the admitted
/// requests used (their reservations less their refunds) are at most the quota, plus one
/// quota per data loss in that window (a flushed window starts empty).
fn settled(schedule: &Schedule, run: &Run, out: &mut Vec<Violation>) {
    let config = &schedule.config;
    let period_us = config.period_ms * 1_000;
    let used = per_window(
        &run.events,
        period_us,
        |e| one_window(e, period_us),
        |e| e.used,
    );
    for ((key, window, _), units) in used {
        let losses = run
            .segments
            .iter()
            .filter(|s| s.key == key && s.clock_us / period_us == window)
            .count() as u64;
        let bound = config.limit * (1 + losses + repairs(run, key, window, period_us));
        if units > bound {
            let reserved: u64 = run
                .events
                .iter()
                .filter(|e| {
                    e.key == key && e.clock_us / period_us == window && one_window(e, period_us)
                })
                .map(|e| e.cost)
                .sum();
            out.push(Violation {
                oracle: "settled",
                detail: format!(
                    "key {key} window {window}: admitted requests used {units} (reserved {reserved}) of {bound}"
                ),
            });
        }
    }
}

/// Admissions on `key` that may have repaired its state back from `window` to an earlier one:
/// the `Clock` docs ("Client clocks that disagree"; docs/algorithms.md, README's **Clocks**): a
/// call whose clock is behind its key's stored time by more than `Clock::MAX_SKEW` is "a clock
/// that stepped back. The state is repaired to `now` (...; a window of a later time reads as
/// empty)", and "instances whose clocks differ by more than `MAX_SKEW` fall outside the
/// guarantee: each call of the slower one repairs the state to its earlier time". A layer
/// request whose check read the shared manual clock before an `Advance` and reached the store
/// after it is such a call (its `now` is the clock before the jump): its admission writes its
/// own earlier window over the later one, whose next check then counts from empty. So each
/// admission that started more than `MAX_SKEW` before `window` began and was decided in it or
/// later may let `window` admit one more quota (a fixed window's count is at most the quota when
/// it is wiped).
fn repairs(run: &Run, key: usize, window: u64, period_us: u64) -> u64 {
    let start_us = window * period_us;
    let skew_us = Clock::MAX_SKEW.as_micros() as u64;
    run.events
        .iter()
        .filter(|e| e.key == key && e.outcome == Outcome::Allowed && e.cost > 0)
        .filter(|e| e.clock_us + skew_us < start_us && e.end_us >= start_us)
        .count() as u64
}

/// docs/modes.md: "`ConcurrencyLimiter` allows at most N requests in flight per key across the
/// fleet"; DESIGN §6c: after a data loss, state an instance holds "is re-asserted at its next
/// renewal" (every third of a lease). Allowed: an admission that leaves more than N in flight
/// within one lease (plus 300 ms) of a data loss or of a stall that stops renewals
/// (`DEBUG SLEEP`, a restart). Such requests "stay admitted: the key is then over N until
/// enough requests end" (docs/modes.md, "Slots that Redis lost are put back"; "the excess
/// drains as requests end and is never added to"), so what is judged is each admission, when
/// it was made: the in-flight samples taken later are not.
fn in_flight(run: &Run, out: &mut Vec<Violation>) {
    let allowance = SLOT_LEASE + Duration::from_millis(300);
    // The end of each fault's allowance: a data loss's or a stall's (renewals stop during a
    // `DEBUG SLEEP`).
    let ends: Vec<Instant> = run
        .faults
        .iter()
        .filter_map(|(when, fault)| match fault {
            Fault::DebugSleep { ms } => Some(*when + Duration::from_millis(*ms) + allowance),
            f if f.loses_data() => Some(*when + allowance),
            _ => None,
        })
        .collect();
    let excused = |at: Instant| {
        run.faults
            .iter()
            .zip(&ends)
            .any(|((when, _), end)| *when <= at && at <= *end)
    };
    // The sampler's records (op `usize::MAX`) follow from admissions, each recorded itself.
    let late: Vec<_> = run
        .over
        .iter()
        .filter(|(at, _, _, op)| *op != usize::MAX && !excused(*at))
        .collect();
    if let Some((at, key, n, op)) = late.iter().max_by_key(|(_, _, n, _)| *n) {
        let since = run
            .faults
            .iter()
            .filter(|(when, f)| f.loses_data() && when <= at)
            .map(|(when, f)| format!("{:?} after {f:?}", *at - *when))
            .next_back()
            .unwrap_or_else(|| "no data loss before".to_owned());
        out.push(Violation {
            oracle: "concurrency",
            detail: format!(
                "key {key}: {n} in flight over a limit of {} at an admission of op {op}, {} admissions over it outside the allowance ({since})",
                run.limit,
                late.len()
            ),
        });
    }
}

/// docs/outbound.md: an upstream's pause is "capped at `max_auto_suspension`", a learned quota
/// is "never faster than the ceiling" and (DESIGN §6c) what learning may set is bounded: once
/// the upstream is honest again, past the cap, every instance reaches it within `max_wait` or
/// is told its next unit is at most `fleet::LOCKOUT` (a minute) away.
fn recovery(run: &Run, out: &mut Vec<Violation>) {
    for (inst, what) in &run.lockouts {
        out.push(Violation {
            oracle: "outbound-recovery",
            detail: format!("instance {inst}: {what}"),
        });
    }
}
