//! One oracle per promise of the docs, each over what a run recorded, each with the bound the
//! docs give (cited beside it). An oracle that fires on correct behaviour is a defect of this
//! test: when in doubt, the bound is the generous reading of the doc.
//!
//! To add an oracle: a function `fn name(schedule, run, out)` that pushes a [`Violation`]
//! named after the promise, citing the doc line it restates, and a line in [`check`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use redlimit::clock::Clock;
use redlimit::limiter::{LeaseStats, LimiterStats};
use redlimit::Algorithm;

use crate::faults::Fault;
use crate::fleet::{one_window, per_window, Event, Outcome, Run, Timed, SLOT_LEASE, STORE_TIMEOUT};
use crate::generator::{Family, Policy, Schedule, Settlement};

/// A broken promise.
#[derive(Clone, Debug)]
pub struct Violation {
    /// The oracle's name: what was promised.
    pub oracle: &'static str,
    /// Which way it broke, when an oracle tells several apart (`TORTURE_KEEP_GOING` lists each).
    pub class: String,
    pub detail: String,
}

/// Every oracle that applies to `schedule`'s family, over `run`.
pub fn check(schedule: &Schedule, run: &Run) -> Vec<Violation> {
    let mut out = Vec::new();
    never_hangs(run, &mut out);
    remaining_within_burst(run, &mut out);
    within_timeout(run, &mut out);
    match schedule.config.family {
        Family::Rate => {
            // The `Clock` docs: "Instances whose clocks differ by more than `MAX_SKEW` fall
            // outside the guarantee: each call of the slower one repairs the state to its
            // earlier time and the faster one counts the difference as refill, so the fleet
            // can admit `rate × skew` more on every call." No bound on what is admitted, then:
            // what still holds is that "a key is never locked out" ([`clock_recovery`]).
            if Duration::from_micros(schedule.config.spread_us()) <= Clock::MAX_SKEW {
                admitted(schedule, run, &mut out);
                overrides(schedule, run, &mut out);
            }
            clock_recovery(run, &mut out);
            controls(schedule, run, &mut out);
            counters(run, &mut out);
            policy(schedule, run, &mut out);
            differential(run, &mut out);
        }
        Family::Settle if schedule.config.settlement == Settlement::Shadow => shadow(run, &mut out),
        Family::Settle if schedule.config.settlement == Settlement::ShadowTiers => {
            settled(schedule, run, &mut out);
            shadow_tiers(schedule, run, &mut out);
        }
        Family::Settle => settled(schedule, run, &mut out),
        Family::Concurrency => {
            in_flight(run, &mut out);
            slots_recovery(run, &mut out);
        }
        Family::Outbound => recovery(run, &mut out),
        Family::Batching => {
            store_decides(run, &mut out);
            out_of_memory(run, &mut out);
        }
    }
    out
}

/// What this machine may add to a decision's wait past its store timeout: the failure policy's
/// answer and the scheduling of the task that returns it, on two cores shared with other work.
pub const WAIT_SLACK: Duration = Duration::from_millis(150);

/// A stall of this process's threads longer than this (seen by the health monitor) excuses a
/// wait past [`WAIT_SLACK`].
const STARVED: Duration = Duration::from_millis(50);

/// The longest Redis may go without answering the health monitor while a decision waits for
/// the decision's timeout to still be the store's own: a fifth of the store timeout.
const STEADY: Duration = Duration::from_millis(50);

/// docs/failure.md: "Every Redis call is bounded by a timeout" (on `NOSCRIPT` and Cluster
/// redirects, "at most 4 times within the timeout"), and every failure goes to the failure
/// policy; docs/production.md, batching: each decision keeps "its own reply, error and
/// timeout". So a decision that is one store call, polled to its end, returns within its
/// store's timeout plus the policy's answer: [`WAIT_SLACK`] for this machine.
///
/// Not judged: a decision whose wait overlapped a task's synchronous work on the fleet's
/// runtime (batching) (the task that tokio would run next on that worker waits for it, a test's task as
/// well as the crate's: [`store_decides`] judges those decisions by their answers), and one
/// during which the health monitor saw this process stalled. A stall is the store's when it
/// delays at least two decisions of one operation on one store ([`corroborated`]); one
/// decision late alone is this machine's.
fn within_timeout(run: &Run, out: &mut Vec<Violation>) {
    let late: Vec<&Timed> = run
        .timed
        .iter()
        .filter(|t| {
            let Some(timeout) = t.timeout else {
                return false;
            };
            let busy = run
                .busy
                .iter()
                .any(|(from, to)| t.started <= *to && *from <= t.ended);
            let starved = run.health.ran() && run.health.starved(t.started, t.ended, STARVED);
            t.ended - t.started > timeout + WAIT_SLACK && !busy && !starved
        })
        .collect();
    let late = corroborated(late);
    if let Some(t) = late.iter().max_by_key(|t| t.ended - t.started) {
        out.push(Violation {
            oracle: "within-timeout",
            class: format!("{} check", t.caller),
            detail: format!(
                "{} decisions waited past their store timeout plus {WAIT_SLACK:?}; longest: the {} check of op {} on instance {} ({:?}) waited {:?} (timeout {:?}), then {:?}{}",
                late.len(),
                t.caller,
                t.op,
                t.inst,
                t.algorithm,
                t.ended - t.started,
                t.timeout.unwrap_or_default(),
                t.outcome,
                t.error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
            ),
        });
    }
}

/// The decisions of `decisions` that share their operation and store with another of them
/// whose wait overlapped theirs: a store's stall delays every decision queued on it, a loaded
/// machine one now and then.
fn corroborated(decisions: Vec<&Timed>) -> Vec<&Timed> {
    decisions
        .iter()
        .filter(|t| {
            decisions.iter().any(|o| {
                !std::ptr::eq::<Timed>(**t, *o)
                    && o.op == t.op
                    && o.inst == t.inst
                    && o.started < t.ended
                    && t.started < o.ended
            })
        })
        .copied()
        .collect()
}

/// docs/headers.md, "The numbers agree": "`r ≤ q` ... on every response, for every algorithm",
/// `q` being the capacity `r` counts against (the burst) and `r` the decision's `remaining`
/// (docs/leases.md: an admission from a lease reports remaining too). On every decided verdict
/// (the store's, a lease's, a `LocalFallback`'s), and on every settled response's headers.
fn remaining_within_burst(run: &Run, out: &mut Vec<Violation>) {
    let over: Vec<String> = run
        .timed
        .iter()
        .filter_map(|t| {
            let (r, q) = t.header?;
            (r > q).then(|| {
                format!(
                    "the {} check of op {} on instance {} ({:?}, {:?}): remaining {r} > burst {q}",
                    t.caller, t.op, t.inst, t.algorithm, t.outcome
                )
            })
        })
        .chain(
            run.headers
                .iter()
                .filter(|(_, _, r, q)| r > q)
                .map(|(op, inst, r, q)| {
                    format!("a response of op {op} on instance {inst}: r={r} > q={q}")
                }),
        )
        .collect();
    if let Some(first) = over.first() {
        out.push(Violation {
            oracle: "remaining-within-burst",
            class: String::new(),
            detail: format!("{} decisions; first: {first}", over.len()),
        });
    }
}

/// docs/production.md and `redlimit::store` (batching): "a single caller or a quiet service
/// never waits for a batch", each decision "is still decided on its own, atomically, with its
/// own reply, error and timeout"; docs/failure.md: the failure policy answers when the store
/// fails. So while Redis answers, every decision polled to its end is decided by the store,
/// whatever other callers do: their runtimes (idle, shut down), their tasks (working without
/// yielding after their decision, on a runtime that hands its I/O and time driver to another
/// worker meanwhile: without that, tokio reads no reply and fires no timer anywhere on the
/// runtime until the work ends, whatever the store; `batching::DriverHandoff`), their futures
/// (parked, dropped), the size of the batch. A timeout counts only when the health monitor saw
/// Redis answer at least every [`STEADY`] throughout the decision's wait, and another decision
/// of the same operation on the same store timed out meanwhile ([`corroborated`]); any other
/// store error with Redis up (a batch dropped, a script that could not serve its batch) counts
/// always; an open circuit breaker is the consequence of the failures before it; and while
/// Redis is out of memory the policy answers by design ([`out_of_memory`]).
fn store_decides(run: &Run, out: &mut Vec<Violation>) {
    let out_of_memory = |t: &Timed| {
        run.out_of_memory.iter().any(|(began, _, lifted)| {
            t.ended >= *began && t.started <= *lifted + Duration::from_millis(100)
        })
    };
    // Per (caller, error): the decisions, in order.
    let mut failed: BTreeMap<(&str, String), Vec<&Timed>> = BTreeMap::new();
    for t in run
        .timed
        .iter()
        .filter(|t| t.timeout.is_some() && matches!(t.outcome, Outcome::Policy { .. }))
        .filter(|t| !out_of_memory(t))
    {
        let error = t.error.as_deref().unwrap_or("no error");
        // Redis refused the write: out of memory, by design (its lift may wait behind a
        // `DEBUG SLEEP`, past the window).
        let counts = if error.contains("circuit breaker") || error.contains("OOM") {
            false
        } else if error.contains("timed out") {
            run.health.steady(t.started, t.ended, STEADY)
        } else {
            true
        };
        if counts {
            failed
                .entry((t.caller, error_class(error)))
                .or_default()
                .push(t);
        }
    }
    for ((caller, error), decisions) in failed {
        // A timeout is the store's when it is not alone ([`corroborated`]).
        let decisions = match error.contains("timed out") {
            true => corroborated(decisions),
            false => decisions,
        };
        if decisions.is_empty() {
            continue;
        }
        let first = decisions[0];
        out.push(Violation {
            oracle: "store-decides",
            class: format!("{caller} check: {error}"),
            detail: format!(
                "{} {caller} checks answered by the failure policy while Redis answered; first: op {} on instance {} ({:?}) after {:?}: {}",
                decisions.len(),
                first.op,
                first.inst,
                first.algorithm,
                first.ended - first.started,
                first.error.as_deref().unwrap_or("no error")
            ),
        });
    }
}

/// What a store error says, without what varies (a script's hash, a line number).
fn error_class(error: &str) -> String {
    let known = [
        "timed out",
        "batch was dropped",
        "too many results to unpack",
        "broken pipe",
    ];
    match known.iter().find(|k| error.contains(*k)) {
        Some(known) => (*known).to_owned(),
        None => error.chars().take(60).collect(),
    }
}

/// The store under `maxmemory` with `noeviction` (docs/production.md: each decision is decided
/// "on its own, atomically"; Redis refuses a write past `maxmemory` with `OOM`, and the
/// decision goes to the failure policy): nothing is admitted and written past it. Every
/// admission writes (it consumes), so a decision that started once Redis was out of memory and
/// returned before the lift began is never admitted by the store. The detail says how many
/// other decisions on its store overlapped it (0: it went alone).
fn out_of_memory(run: &Run, out: &mut Vec<Violation>) {
    let overlapping = |t: &Timed| {
        run.timed
            .iter()
            .filter(|o| o.inst == t.inst && o.started < t.ended && t.started < o.ended)
            .count()
            - 1
    };
    let admitted: Vec<&Timed> = run
        .timed
        .iter()
        .filter(|t| t.outcome == Outcome::Allowed)
        .filter(|t| {
            run.out_of_memory
                .iter()
                .any(|(_, since, lifted)| t.started >= *since && t.ended <= *lifted)
        })
        .collect();
    let refused = run
        .timed
        .iter()
        .filter(|t| t.error.as_deref().is_some_and(|e| e.contains("OOM")))
        .count();
    // Apart per algorithm: those that went alone on their store, and those that may have
    // shared a call (a sliding log's expired entries are removed before its first write: Redis
    // then lets a script go on writing).
    let mut groups: BTreeMap<(String, &str), Vec<&Timed>> = BTreeMap::new();
    for t in admitted {
        let alone = match overlapping(t) {
            0 => "alone",
            _ => "with others in flight",
        };
        groups
            .entry((format!("{:?}", t.algorithm), alone))
            .or_default()
            .push(t);
    }
    for ((algorithm, alone), admitted) in groups {
        let first = admitted[0];
        out.push(Violation {
            oracle: "out-of-memory",
            class: format!("{algorithm} {alone}"),
            detail: format!(
                "{} {algorithm} decisions {alone} on their store admitted and written while Redis was past maxmemory ({refused} decisions refused with OOM); first: the {} check of op {} on instance {}, {} others in flight",
                admitted.len(),
                first.caller,
                first.op,
                first.inst,
                overlapping(first),
            ),
        });
    }
}

/// docs/failure.md: "Every Redis call is bounded by a timeout ... a hung or dead Redis never
/// hangs a request"; DESIGN §6c: "No request may wait on work that nobody will finish". The
/// bound is `fleet::BOUND` (a few store timeouts, generously).
fn never_hangs(run: &Run, out: &mut Vec<Violation>) {
    for (op, what) in &run.hangs {
        out.push(Violation {
            oracle: "never-hangs",
            class: String::new(),
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

/// How long a control takes to reach every instance: docs/leases.md, "no instance admits a
/// request that started more than one lease interval after the control was set" (at once
/// without leases; 10 ms for this machine's scheduling).
fn control_delay(schedule: &Schedule) -> Duration {
    Duration::from_millis(schedule.config.lease_ms.map_or(0, |ms| ms + 10))
}

/// The largest limit that may have decided on `key` for checks started between `from` and
/// `to`: the schedule's, or an override's in force then (docs/leases.md: an override reaches
/// leasing instances within one lease interval, so it may still decide that long after it
/// ended).
fn limit_in_force(schedule: &Schedule, run: &Run, key: usize, from: Instant, to: Instant) -> u64 {
    let delay = control_delay(schedule);
    run.overrides
        .iter()
        .filter(|o| o.key == key && o.started <= to)
        .filter(|o| o.ended.is_none_or(|ended| ended + delay >= from))
        .map(|o| o.limit)
        .fold(schedule.config.limit, u64::max)
}

/// The first and last start of `events`.
fn span<'a>(events: impl Iterator<Item = &'a Event>) -> (Instant, Instant) {
    let now = Instant::now();
    events.fold((now, now - Duration::from_secs(3_600)), |(a, b), e| {
        (a.min(e.started), b.max(e.started))
    })
}

/// README / docs/algorithms.md: a quota admits at most its limit per window (fixed window), at
/// most the burst plus the rate times the time elapsed (token bucket, GCRA); docs/leases.md:
/// "a binding quota admits, per window, at most the quota (exactly: every admission was paid
/// for)", and "after a reset, units leased before it never come back" (DESIGN §6c), so a
/// segment after a reset or a data loss (a new bucket, one more window's worth) admits at most
/// a fresh quota plus the [`lease_slack`] of units leased before it. Only the store's decisions
/// count: the failure policy's admissions are apart. Under an override, the override's limit
/// (docs/fleet.md: "the override replaces the callers' quotas ... The key's state is kept
/// and capped to the new quotas"), so the largest limit in force bounds a window or a segment.
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
                // A segment's clock is the operator's; an instance's may be up to the spread
                // ahead of it.
                let spread_us = config.spread_us();
                let began_here = run.segments.iter().any(|s| {
                    s.key == key
                        && s.epoch == epoch
                        && s.clock_us / period_us <= window
                        && window <= (s.clock_us + spread_us) / period_us
                });
                let slack = if began_here {
                    lease_slack(schedule, run, key, epoch)
                } else {
                    0
                };
                let (from, to) = span(run.events.iter().filter(|e| {
                    keep(e) && e.key == key && e.epoch == epoch && e.clock_us / period_us == window
                }));
                let limit = limit_in_force(schedule, run, key, from, to);
                if units > limit + slack {
                    out.push(Violation {
                        oracle: "admitted",
                        class: String::new(),
                        detail: format!(
                            "key {key} window {window} segment {epoch}: admitted {units} of {limit} (+{slack} leased before the segment)",
                        ),
                    });
                }
            }
        }
        _ => {
            let admitted = run.events.iter().filter(|e| allowed(e));
            for ((key, epoch), (units, last_us)) in units_by(admitted, |e| (e.key, e.epoch)) {
                let start_us = run
                    .segments
                    .iter()
                    .find(|s| s.key == key && s.epoch == epoch)
                    .map_or(0, |s| s.clock_us);
                let start_us = start_us.max(crate::fleet::clock_start_us());
                let (from, to) = span(
                    run.events
                        .iter()
                        .filter(|e| allowed(e) && e.key == key && e.epoch == epoch),
                );
                let limit = limit_in_force(schedule, run, key, from, to);
                let refill = u128::from(limit) * u128::from(last_us - start_us.min(last_us))
                    / u128::from(period_us);
                let slack = lease_slack(schedule, run, key, epoch);
                let bound = limit + refill as u64 + 1 + slack;
                if units > bound {
                    out.push(Violation {
                        oracle: "admitted",
                        class: String::new(),
                        detail: format!(
                            "key {key} segment {epoch}: admitted {units}, bound {bound} (burst {limit} + refill {refill} + 1 + {slack} leased before)",
                        ),
                    });
                }
            }
        }
    }
}

/// docs/leases.md: "no instance admits a request that started more than one lease interval
/// after the control was set" (at once without leases); a suspension stays through a reset and
/// ends at its time (once reached, a clock stepping back does not renew it), a resume or a data
/// loss; `extend_suspension` (docs/fleet.md) keeps the later of its end and now + its duration.
/// Its time is the clock the control read plus its duration (docs/fleet.md, "Suspension": on
/// the client clock when one is configured), so only an admission decided before the earliest
/// such end (`end_us`, the clock after the decision, before it) contradicts it.
fn controls(schedule: &Schedule, run: &Run, out: &mut Vec<Violation>) {
    let delay = control_delay(schedule);
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
                class: String::new(),
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

/// docs/fleet.md: "the override replaces the callers' quotas ... The key's state is kept and
/// capped to the new quotas ... lowering it caps what is left"; docs/leases.md: no instance
/// admits a request that started more than one lease interval after the control was set. So
/// the checks that started after an override reached the fleet and before it ended admit at
/// most its limit per fixed window, or its burst plus its refill since it was set (token
/// bucket, GCRA), per segment, plus the [`lease_slack`] of a reset or data loss within it.
fn overrides(schedule: &Schedule, run: &Run, out: &mut Vec<Violation>) {
    let period_us = schedule.config.period_ms * 1_000;
    let delay = control_delay(schedule);
    for o in run.overrides.iter().filter(|o| o.sure) {
        let under = |e: &&Event| {
            e.key == o.key
                && e.outcome == Outcome::Allowed
                && e.started > o.at + delay
                && o.ended.is_none_or(|ended| e.started < ended)
        };
        // Per (window or segment, segment): units, and whether a segment began after the
        // override was set (its leases' slack).
        let fixed = schedule.config.algorithm == Algorithm::FixedWindow;
        let counted = run.events.iter().filter(under);
        let counted = counted.filter(|e| !fixed || one_window(e, period_us));
        let group = |e: &Event| (if fixed { e.clock_us / period_us } else { 0 }, e.epoch);
        for ((window, epoch), (units, last_us)) in units_by(counted, group) {
            let segment = run
                .segments
                .iter()
                .find(|s| s.key == o.key && s.epoch == epoch && s.at > o.started);
            let slack = match segment {
                Some(s) if !fixed || s.clock_us / period_us == window => {
                    lease_slack(schedule, run, o.key, epoch)
                }
                _ => 0,
            };
            let bound = if fixed {
                o.limit + slack
            } else {
                let from = segment.map_or(o.clock_us, |s| s.clock_us.max(o.clock_us));
                let refill = u128::from(o.limit) * u128::from(last_us.saturating_sub(from))
                    / u128::from(period_us);
                o.limit + refill as u64 + 1 + slack
            };
            if units > bound {
                out.push(Violation {
                    oracle: "override",
                    class: String::new(),
                    detail: format!(
                        "override of {} by op {} on key {}: {units} admitted under it in {} segment {epoch}, bound {bound} ({slack} leased before a reset in it)",
                        o.limit,
                        o.op,
                        o.key,
                        if fixed { format!("window {window}") } else { "its".to_owned() }
                    ),
                });
            }
        }
    }
}

/// The units charged by `events` and the latest clock any of them was decided at (`end_us`),
/// per group (`group` of each event).
fn units_by<'a, G: std::hash::Hash + Eq>(
    events: impl Iterator<Item = &'a Event>,
    group: impl Fn(&Event) -> G,
) -> HashMap<G, (u64, u64)> {
    let mut sums: HashMap<G, (u64, u64)> = HashMap::new();
    for e in events {
        let entry = sums.entry(group(e)).or_insert((0, 0));
        entry.0 += e.cost;
        entry.1 = entry.1.max(e.end_us);
    }
    sums
}

/// A fallback's share: (instance, key, window or 0, era), summed as (units, first clock, last
/// clock).
type Share = (usize, usize, u64, u32);

/// docs/failure.md, the failure policies: `FailOpen` "the request passes unchecked",
/// `FailClosed` answers 503 (admits nothing), `LocalFallback::new(n)` decides "from an
/// in-process `MemoryStore` with `1/n` of each quota" (`LocalFallback::share`: the limit over
/// n, at least 1). The policy's answers are counted apart from the store's: per instance and
/// key, a fallback admits at most its share per fixed window, or the share's burst plus its
/// refill (token bucket, GCRA) between clock steps back beyond `Clock::MAX_SKEW`.
fn policy(schedule: &Schedule, run: &Run, out: &mut Vec<Violation>) {
    let config = &schedule.config;
    let by_policy = |e: &&Event| matches!(e.outcome, Outcome::Policy { .. });
    let allowed = |e: &Event| e.outcome == Outcome::Policy { allowed: true };
    match config.policy {
        Policy::FailOpen => {
            if let Some(e) = run.events.iter().filter(by_policy).find(|e| !allowed(e)) {
                out.push(Violation {
                    oracle: "failure-policy",
                    class: String::new(),
                    detail: format!(
                        "FailOpen denied a check of op {} on instance {}",
                        e.op, e.inst
                    ),
                });
            }
        }
        Policy::FailClosed => {
            let admitted: Vec<_> = run.events.iter().filter(|e| allowed(e)).collect();
            if let Some(e) = admitted.first() {
                out.push(Violation {
                    oracle: "failure-policy",
                    class: String::new(),
                    detail: format!(
                        "FailClosed admitted {} checks, first of op {} on instance {}",
                        admitted.len(),
                        e.op,
                        e.inst
                    ),
                });
            }
        }
        Policy::LocalFallback(n) => {
            let share = (config.limit / n).max(1);
            let period_us = config.period_ms * 1_000;
            let fixed = config.algorithm == Algorithm::FixedWindow;
            let mut sums: HashMap<Share, (u64, u64, u64)> = HashMap::new();
            for e in run.events.iter().filter(|e| allowed(e)) {
                if fixed && !one_window(e, period_us) {
                    continue;
                }
                let group = if fixed { e.clock_us / period_us } else { 0 };
                let entry = sums
                    .entry((e.inst, e.key, group, e.era))
                    .or_insert((0, u64::MAX, 0));
                entry.0 += e.cost;
                entry.1 = entry.1.min(e.clock_us);
                entry.2 = entry.2.max(e.end_us);
            }
            for ((inst, key, window, era), (units, first, last)) in sums {
                let bound = if fixed {
                    share
                } else {
                    // The first admission may find the share's state from long before.
                    let refill = u128::from(share) * u128::from(last - first.min(last))
                        / u128::from(period_us);
                    share + refill as u64 + 1
                };
                if units > bound {
                    out.push(Violation {
                        oracle: "failure-policy",
                        class: String::new(),
                        detail: format!(
                            "LocalFallback({n}) on instance {inst} key {key} (window {window}, era {era}): admitted {units}, its share allows {bound}"
                        ),
                    });
                }
            }
        }
    }
}

/// docs/algorithms.md: each algorithm's step is "mirrored step for step in `src/algorithm/`
/// for the memory store, which stores the same bytes"; README: "In-memory store with the same
/// decisions". A fault-free schedule run one check at a time on both gives the same verdicts.
fn differential(run: &Run, out: &mut Vec<Violation>) {
    if let Some(first) = run.differences.first() {
        out.push(Violation {
            oracle: "differential",
            class: String::new(),
            detail: format!(
                "{} operations differ; first: {first}",
                run.differences.len()
            ),
        });
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
                    class: String::new(),
                    detail: format!("instance {inst}: a counter went back: {a:?} then {b:?}"),
                });
                break;
            }
        }
        if let Some((_, l)) = samples.last() {
            if l.leased != l.spent + l.held + l.returned + l.stranded {
                out.push(Violation {
                    oracle: "counters",
                    class: String::new(),
                    detail: format!("instance {inst}: leased != spent + held + returned + stranded at the end: {l:?}"),
                });
            }
        }
    }
}

/// docs/modes.md, shadow rollout: "without denying anyone: every request is decided and
/// recorded exactly as it would be ... and always goes on to the service"; "a shadow layer
/// forwards even what `FailClosed` would have answered 503: shadow never denies".
fn shadow(run: &Run, out: &mut Vec<Violation>) {
    if let Some((op, inst, status)) = run.refused_in_shadow.first() {
        out.push(Violation {
            oracle: "shadow",
            class: String::new(),
            detail: format!(
                "{} requests refused in shadow, first of op {op} on instance {inst}: {status}",
                run.refused_in_shadow.len()
            ),
        });
    }
}

/// The `Clock` docs, "Client clocks that disagree": a clock further behind its key's stored
/// time than `Clock::MAX_SKEW` "stepped back ... The state is repaired to `now` ..., so the key
/// is never locked out until the clock catches up", and within it "the key pauses for at most
/// that long". With each instance on its own clock, once the controls are lifted and the
/// clocks have moved past what the schedule stored, every instance's check of 1 on every key is
/// admitted within `fleet::RECOVERY` ([`fleet`]'s recovery probe).
fn clock_recovery(run: &Run, out: &mut Vec<Violation>) {
    if let Some((inst, key, outcome)) = run.stuck.first() {
        out.push(Violation {
            oracle: "clock-recovery",
            class: String::new(),
            detail: format!(
                "{} (instance, key) never admitted again within {:?}; first: instance {inst} key {key}: {outcome}",
                run.stuck.len(),
                crate::fleet::RECOVERY
            ),
        });
    }
}

/// docs/modes.md, shadow tiers: "once [the enforced quotas] admit a request, the shadow tiers
/// are checked ...: they admit and consume as a real check would, and when they would deny
/// they consume nothing, the request goes on, and a `ShadowLimited` with their denial is in
/// its extensions (counted as `shadow_limited`)". So each instance's `shadow_limited` counts
/// exactly the requests that reached its service with a `ShadowLimited` (the enforced tiers'
/// bound is [`settled`]'s); and, before any fault could make a shadow check fail ("Shadow
/// tiers whose check fails are skipped"), the requests that reached the service without one
/// used, per key and fixed window, at most the shadow tier's limit (settled like the enforced
/// tiers), plus what a clock repair allows ([`repairs`]).
fn shadow_tiers(schedule: &Schedule, run: &Run, out: &mut Vec<Violation>) {
    let config = &schedule.config;
    for (inst, counted) in run.shadow_counted.iter().enumerate() {
        let seen = run
            .events
            .iter()
            .zip(&run.shadow_limited)
            .filter(|(e, limited)| e.inst == inst && **limited)
            .count() as u64;
        if seen != *counted {
            out.push(Violation {
                oracle: "shadow-tiers",
                class: String::new(),
                detail: format!(
                    "instance {inst}: {seen} requests reached the service with a ShadowLimited, shadow_limited counts {counted}"
                ),
            });
        }
    }
    // What reached the service before the first fault began (a sum over fewer requests than
    // a window had is still bounded).
    let first_fault = run.fault_starts.first().copied();
    let period_us = config.period_ms * 1_000;
    let mut used: HashMap<(usize, u64), u64> = HashMap::new();
    for (e, _) in run
        .events
        .iter()
        .zip(&run.shadow_limited)
        .filter(|(e, limited)| !**limited && one_window(e, period_us))
        .filter(|(e, _)| first_fault.is_none_or(|at| e.started < at))
    {
        *used.entry((e.key, e.clock_us / period_us)).or_insert(0) += e.used;
    }
    for ((key, window), units) in used {
        let bound = config.shadow_limit * (1 + repairs(run, key, window, period_us));
        if units > bound {
            out.push(Violation {
                oracle: "shadow-tiers",
                class: String::new(),
                detail: format!(
                    "key {key} window {window}: requests the shadow tier admitted used {units} of its {bound}"
                ),
            });
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
                class: String::new(),
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
/// fleet"; "Slots that Redis lost are put back": each holder re-asserts its slots at its next
/// renewal, "so within one renewal period after the loss (a third of a lease, plus that round's
/// call; a round Redis did not answer, as the first after a restart, is retried within 10 ms to
/// 250 ms instead of a period later) every request in flight is counted again and no
/// acquisition is admitted while N or more are". Allowed, then: an admission that leaves more
/// than N in flight between a data loss's start and [`put_back`] after its end (a stall that
/// stops renewals, `DEBUG SLEEP`, counts from its end). Such requests "stay admitted ... the
/// excess drains as requests end and is never added to", so what is judged is each admission,
/// when it was made: the in-flight samples taken later are not.
fn in_flight(run: &Run, out: &mut Vec<Violation>) {
    let allowance = put_back();
    // Each fault's allowance, from when it began (a data loss may happen anywhere during its
    // injection) to a data loss's or a stall's end plus the allowance.
    let windows: Vec<(Instant, Instant)> = run
        .faults
        .iter()
        .zip(&run.fault_starts)
        .filter_map(|((when, fault), began)| match fault {
            Fault::DebugSleep { ms } => {
                Some((*began, *when + Duration::from_millis(*ms) + allowance))
            }
            f if f.loses_data() => Some((*began, *when + allowance)),
            _ => None,
        })
        .collect();
    let excused = |at: Instant| {
        windows
            .iter()
            .any(|(began, end)| *began <= at && at <= *end)
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
            class: String::new(),
            detail: format!(
                "key {key}: {n} in flight over a limit of {} at an admission of op {op}, {} admissions over it outside the allowance ({since})",
                run.limit,
                late.len()
            ),
        });
    }
}

/// How long after Redis lost slots (or answers again) they are all counted again
/// (docs/modes.md, "Slots that Redis lost are put back"): the next round, at most a third of
/// [`SLOT_LEASE`] away, and its call, at most [`STORE_TIMEOUT`]; or, when the round in flight
/// was not answered, that round's call, a retry within 250 ms and its call. Plus 250 ms for this
/// machine: an admission is recorded when its call has returned, on two shared cores.
fn put_back() -> Duration {
    const RETRY_MAX: Duration = Duration::from_millis(250);
    const MARGIN: Duration = Duration::from_millis(250);
    let next_round = SLOT_LEASE / 3 + STORE_TIMEOUT;
    let retried = STORE_TIMEOUT + RETRY_MAX + STORE_TIMEOUT;
    next_round.max(retried) + MARGIN
}

/// docs/modes.md: a slot is held until its response body ends "or its future or body is
/// dropped (a client that disconnects gives it back)"; one not given back is "left to its
/// lease". Once every request ended and a lease passed, each key takes its N slots again
/// (`fleet`'s probe, within `fleet::RECOVERY`).
fn slots_recovery(run: &Run, out: &mut Vec<Violation>) {
    for (inst, key, what) in &run.stuck {
        out.push(Violation {
            oracle: "concurrency-recovery",
            class: String::new(),
            detail: format!("key {key} on instance {inst}: {what}"),
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
            class: String::new(),
            detail: format!("instance {inst}: {what}"),
        });
    }
}
