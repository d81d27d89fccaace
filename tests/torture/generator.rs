//! Schedules from a seed: a configuration and a list of operations, both drawn from one
//! `fastrand` generator, so a seed is the whole schedule.
//!
//! To add an operation: a variant of [`Op`], a line in the family's `draw_*` that picks it, and
//! its arm in `fleet.rs`.

use std::fmt;

use redlimit::Algorithm;

use crate::faults::Fault;

/// What a schedule exercises: each family has its fleet, its operations and its oracles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Checks (leases on or off, deny cache on or off) and operator controls.
    Rate,
    /// `ConcurrencyLimiter` slots held for a while.
    Concurrency,
    /// `RateLimitLayer` reserving a cost and settling it from the response.
    Settle,
    /// `OutboundLayer` against a scripted upstream.
    Outbound,
    /// Stores shared by limiters of every algorithm, used from runtimes other than the one that
    /// built them, by tasks that work without yielding after their decision, by futures parked or
    /// dropped, at the largest `max_batch`, and while Redis is out of memory (`batching.rs`).
    Batching,
}

/// Where the fleet's state lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Redis,
    Memory,
    /// The run's 3-master Redis Cluster (started the first time a schedule draws it).
    Cluster,
}

/// The instances' failure policy (docs/failure.md's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    FailOpen,
    FailClosed,
    /// `LocalFallback::new(n)`: `1/n` of each quota per instance.
    LocalFallback(u64),
}

/// How the settlement family's layer settles (docs/modes.md, production modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// `cost_from_response`: the response tells what was used.
    Response,
    /// `cost_from_status([401])`: a 401 costs the reservation, anything else is free.
    Status,
    /// `shadow(true)`: decided and counted, never denied.
    Shadow,
    /// The response settles the enforced quota, and `shadow_quotas` adds a stricter tier of
    /// `Config::shadow_limit` per period in shadow (docs/modes.md, shadow tiers).
    ShadowTiers,
}

/// One schedule's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub family: Family,
    pub backend: Backend,
    pub algorithm: Algorithm,
    pub instances: usize,
    /// Units per period (the quota), or slots (concurrency).
    pub limit: u64,
    /// The quota's period on the manual clock, in ms.
    pub period_ms: u64,
    /// The lease interval in ms, when leases are on.
    pub lease_ms: Option<u64>,
    pub deny_cache: bool,
    /// How many keys the schedule spreads over (key 0 is the hot one).
    pub keys: usize,
    pub policy: Policy,
    pub settlement: Settlement,
    /// The shadow tier's limit per period ([`Settlement::ShadowTiers`]).
    pub shadow_limit: u64,
    /// Each instance's client clock ahead of the operator's by this many ms (rate schedules;
    /// all zero but in some). The spread is within `Clock::MAX_SKEW` in most of those, beyond
    /// it in some.
    pub offsets_ms: Vec<u64>,
    /// Whether the rate family's checks and `acquire`s are dropped at random. Half of its
    /// schedules drop none: a cancellation that breaks a key for good (it stops deciding)
    /// would hide whatever the rest of the schedule finds.
    pub cancels: bool,
    /// Whether the schedule injects faults. A third of the schedules inject none (a sixth of
    /// the concurrency family's): a data loss widens what the oracles allow, and fault-free
    /// schedules hold the tight bounds (and feed the differential oracle).
    pub faults: bool,
    /// Batching: each store connects from the fleet's runtime before the schedule (a
    /// service's startup check); in a quarter of the schedules not, and a store's first use
    /// may come from another runtime. Always on in the other families.
    pub warm: bool,
}

impl Config {
    /// How far apart the instances' clocks are, in µs.
    pub fn spread_us(&self) -> u64 {
        let max = self.offsets_ms.iter().max().copied().unwrap_or(0);
        let min = self.offsets_ms.iter().min().copied().unwrap_or(0);
        (max - min) * 1_000
    }

    /// Instance `inst`'s clock offset, in µs.
    pub fn offset_us(&self, inst: usize) -> u64 {
        self.offsets_ms.get(inst).copied().unwrap_or(0) * 1_000
    }
}

/// How a layer request of the concurrency family ends, once the layer admitted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyEnd {
    /// The body is read to its end.
    Read,
    /// The body is dropped before its first poll.
    BeforePoll,
    /// The body is dropped after this many frames.
    After(u8),
    /// The response future is dropped after this many µs (before, while or after the inner
    /// service answers).
    Future(u64),
}

/// How an outbound upstream answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// `RateLimit-Policy` and `RateLimit` as the ceiling says, with units left.
    Honest,
    /// Announcement fields drawn at random (windows and resets from 0 to absurd).
    Lying {
        quota: u64,
        window_s: u64,
        remaining: u64,
        reset_s: u64,
    },
    /// `429` with a `Retry-After` of this many seconds.
    TooMany { retry_after_s: u64 },
}

/// One operation of a schedule.
#[derive(Clone, Debug)]
pub enum Op {
    /// `n` concurrent checks of `cost` on instance `inst`; with `cancel_us`, each is dropped
    /// after that long (some before the store call, some during it, some after).
    Burst {
        inst: usize,
        key: usize,
        n: usize,
        cost: u64,
        cancel_us: Option<u64>,
    },
    /// Moves the manual clock forward.
    Advance {
        ms: u64,
    },
    /// Lets real time pass (leases expire, renewals run, slots are renewed).
    Sleep {
        ms: u64,
    },
    /// `n` concurrent `check_blocking` of `cost` with a block of `block_ms`.
    Blocking {
        inst: usize,
        key: usize,
        n: usize,
        cost: u64,
        block_ms: u64,
    },
    /// `acquire_cost` waiting up to `wait_ms` for `cost`; with `cancel_us`, dropped after that.
    Acquire {
        inst: usize,
        key: usize,
        cost: u64,
        wait_ms: u64,
        cancel_us: Option<u64>,
    },
    /// Operator controls, from a limiter of their own. A reset may instead run through fleet
    /// instance `via`: a leasing limiter's own reset ends its lease on the key, which is
    /// stranded, never given back (docs/leases.md).
    Reset {
        key: usize,
        via: Option<usize>,
    },
    Suspend {
        key: usize,
        ms: u64,
    },
    Resume {
        key: usize,
    },
    /// `extend_suspension`: the end becomes the later of its own and now + `ms`.
    Extend {
        key: usize,
        ms: u64,
    },
    /// `set_quota` with the schedule's period and `limit` (raised or lowered), and
    /// `clear_quota`.
    SetQuota {
        key: usize,
        limit: u64,
    },
    ClearQuota {
        key: usize,
    },
    /// Moves the manual clock to `before_us` before the next window's boundary.
    Edge {
        before_us: u64,
    },
    /// Steps the manual clock back by `ms` (an NTP step): within `Clock::MAX_SKEW` a skew,
    /// beyond it a clock that stepped back.
    StepBack {
        ms: u64,
    },
    /// `Limiter::forget` and `Limiter::release_leases` on one instance.
    Forget {
        inst: usize,
        key: usize,
    },
    Release {
        inst: usize,
    },
    /// `n` slots taken on `inst` and held for `hold_ms` (in the background); with
    /// `cancel_us`, the `acquire` future is dropped after that long.
    Hold {
        inst: usize,
        key: usize,
        n: usize,
        hold_ms: u64,
        cancel_us: Option<u64>,
    },
    /// `n` layer requests reserving `reserve` and reporting `used`, each answered after
    /// `hold_ms` of real time (in the background).
    Request {
        inst: usize,
        key: usize,
        n: usize,
        reserve: u64,
        used: u64,
        hold_ms: u64,
    },
    /// `n` requests through instance `inst`'s `ConcurrencyLimitLayer`, whose inner service
    /// answers after `first_ms` with a body of `chunks` frames, `chunk_ms` apart, each ended
    /// as `end` says (in the background).
    Stream {
        inst: usize,
        key: usize,
        n: usize,
        first_ms: u64,
        chunks: u8,
        chunk_ms: u64,
        end: BodyEnd,
    },
    /// The scripted upstream answers this way from now on.
    SetUpstream(Upstream),
    /// `n` calls through instance `inst`'s outbound layer.
    Call {
        inst: usize,
        n: usize,
    },
    /// Batching: `n` concurrent checks on instance `inst`'s store, each of an algorithm and a key
    /// drawn from `seed`; with `cancel_us`, each is dropped after that long (at an await).
    Mixed {
        inst: usize,
        n: usize,
        seed: u64,
        cancel_us: Option<u64>,
    },
    /// Batching: a check on a runtime of its own (current-thread, driven by `block_on` in a
    /// thread of its own; multi-thread when `multi`), polled once; while its call is in flight,
    /// `n` checks of `seed` on the fleet's runtime; then that runtime goes idle for `idle_ms`
    /// without being driven while the schedule goes on, or, when `shutdown`, is shut down at once.
    Runtime {
        inst: usize,
        n: usize,
        seed: u64,
        idle_ms: u64,
        shutdown: bool,
        multi: bool,
    },
    /// Batching: a check whose task, once the check returned, works `work_ms` without yielding
    /// (CPU when `cpu`, else `std::thread::sleep`), as a handler may after the layer's check;
    /// while its call is in flight, `n` checks of `seed` from tasks of their own, and a lone
    /// check every quarter of the work.
    Busy {
        inst: usize,
        n: usize,
        seed: u64,
        work_ms: u64,
        cpu: bool,
    },
    /// Batching: a check future polled once, then kept `park_ms` neither polled nor dropped
    /// while the schedule goes on, then dropped (`then_drop`) or polled to its end; while its
    /// call is in flight, `n` checks of `seed`, and a lone check every quarter of the park.
    Park {
        inst: usize,
        n: usize,
        seed: u64,
        park_ms: u64,
        then_drop: bool,
    },
    /// Batching: on a store of its own with `max_batch` at its largest allowed value, the
    /// decisions of `seed` (more than fill one batch) queued at once on one group.
    Full {
        seed: u64,
    },
    /// A fault on the store.
    Fault(Fault),
}

/// A seed's schedule.
#[derive(Clone)]
pub struct Schedule {
    pub seed: u64,
    pub config: Config,
    pub ops: Vec<Op>,
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} config {:?}", self.seed, self.config)?;
        for (i, op) in self.ops.iter().enumerate() {
            writeln!(f, "  {i:3}: {op:?}")?;
        }
        Ok(())
    }
}

/// The schedule of `seed`.
pub fn schedule(seed: u64) -> Schedule {
    let mut rng = fastrand::Rng::with_seed(seed);
    let family = match rng.u32(0..11) {
        0..=3 => Family::Rate,
        4..=5 => Family::Settle,
        6..=7 => Family::Concurrency,
        8 => Family::Outbound,
        _ => Family::Batching,
    };
    let config = config(&mut rng, family);
    let len = rng.usize(8..32);
    let mut ops = Vec::with_capacity(len);
    // After an operator's reset of a key that leasing instances may hold units of, half the
    // time the next few operations stay on that key (see [`after_reset`]).
    let mut focus: Option<(usize, usize)> = None;
    // After Redis ran out of memory, the next few operations decide while it is out (see
    // [`while_out_of_memory`]).
    let mut out_of_memory = 0;
    while ops.len() < len {
        let op = match focus {
            Some((key, left)) if left > 0 => {
                focus = Some((key, left - 1));
                after_reset(&mut rng, &config, key)
            }
            _ if out_of_memory > 0 => {
                out_of_memory -= 1;
                while_out_of_memory(&mut rng, &config)
            }
            _ => draw(&mut rng, &config),
        };
        if let Op::Fault(Fault::OutOfMemory { .. }) = op {
            out_of_memory = rng.usize(1..4);
        }
        if let Op::Reset { key, via: None } = op {
            if config.lease_ms.is_some() && rng.bool() {
                focus = Some((key, rng.usize(3..10)));
            }
        }
        ops.push(op);
    }
    Schedule { seed, config, ops }
}

/// An operation on `key` just after an operator reset it: the fleet spends the fresh quota in
/// bursts while an instance ends its leases (`forget`, `release_leases`, or idle for a while),
/// so units leased before the reset would show if any went back after it (docs/leases.md:
/// they never do).
fn after_reset(rng: &mut fastrand::Rng, config: &Config, key: usize) -> Op {
    let inst = rng.usize(0..config.instances);
    match rng.u32(0..10) {
        0..=5 => Op::Burst {
            inst,
            key,
            n: rng.usize(1..40),
            cost: 1,
            cancel_us: None,
        },
        6..=7 => Op::Forget { inst, key },
        8 => Op::Release { inst },
        _ => Op::Sleep {
            ms: rng.u64(1..400),
        },
    }
}

/// An operation while Redis is out of memory: queued decisions of every algorithm, so that
/// batches mix them (a sliding log's first, whose expired entries it removes before it adds).
fn while_out_of_memory(rng: &mut fastrand::Rng, config: &Config) -> Op {
    let inst = rng.usize(0..config.instances);
    match rng.u32(0..4) {
        0 => Op::Busy {
            inst,
            n: rng.usize(2..30),
            seed: rng.u64(..),
            work_ms: rng.u64(50..300),
            cpu: false,
        },
        _ => Op::Mixed {
            inst,
            n: rng.usize(2..60),
            seed: rng.u64(..),
            cancel_us: None,
        },
    }
}

fn config(rng: &mut fastrand::Rng, family: Family) -> Config {
    if family == Family::Batching {
        return batching_config(rng);
    }
    let backend = match family {
        Family::Rate if rng.u32(0..4) == 0 => Backend::Memory,
        Family::Rate | Family::Settle | Family::Concurrency if rng.u32(0..5) == 0 => {
            Backend::Cluster
        }
        _ => Backend::Redis,
    };
    let algorithm = match family {
        // Settlement's refund per window is the fixed window's subtle case.
        Family::Settle => Algorithm::FixedWindow,
        _ => [
            Algorithm::FixedWindow,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ][rng.usize(0..3)],
    };
    let lease_ms = (family == Family::Rate && rng.bool()).then(|| rng.u64(30..300));
    let instances = rng.usize(2..=4);
    let limit = match family {
        Family::Concurrency => rng.u64(1..5),
        Family::Outbound => 20,
        // Leases take at most a tenth of the capacity: large enough limits lease k > 1.
        Family::Rate => rng.u64(5..120),
        _ => rng.u64(5..60),
    };
    Config {
        family,
        backend,
        algorithm,
        instances,
        limit,
        period_ms: [1_000, 10_000, 60_000][rng.usize(0..3)],
        lease_ms,
        deny_cache: rng.bool(),
        keys: rng.usize(1..4),
        policy: match family {
            Family::Settle => Policy::FailClosed,
            Family::Rate => match rng.u32(0..3) {
                0 => Policy::FailOpen,
                1 => Policy::FailClosed,
                _ => Policy::LocalFallback(rng.u64(1..=4)),
            },
            // A layer request the policy admits without a slot reaches the inner service:
            // failing closed keeps what is in flight to requests that hold slots.
            Family::Concurrency => Policy::FailClosed,
            _ => Policy::FailOpen,
        },
        settlement: match rng.u32(0..5) {
            0 => Settlement::Status,
            1 => Settlement::Shadow,
            2 => Settlement::ShadowTiers,
            _ => Settlement::Response,
        },
        shadow_limit: rng.u64(1..=limit),
        offsets_ms: match family {
            // Per-instance clocks: within `Clock::MAX_SKEW` (5 s) in a third, beyond it in a
            // tenth.
            Family::Rate => match rng.u32(0..30) {
                0..=9 => (0..instances).map(|_| rng.u64(0..=5_000)).collect(),
                10..=12 => {
                    let mut offsets: Vec<u64> =
                        (0..instances).map(|_| rng.u64(0..=30_000)).collect();
                    offsets[0] = 0;
                    offsets[1] = rng.u64(5_001..=30_000);
                    offsets
                }
                _ => vec![0; instances],
            },
            _ => vec![0; instances],
        },
        cancels: family != Family::Rate || rng.bool(),
        // Concurrency's oracle has nothing to judge without a fault: few of its schedules
        // go without.
        faults: rng.u32(0..6) >= if family == Family::Concurrency { 1 } else { 2 },
        warm: true,
    }
}

/// A batching schedule's configuration: single-node Redis (where `maxmemory` is set), every
/// algorithm on each instance's store (`algorithm` is unused), no leases and no deny cache (every
/// check reaches the store), quotas large enough that most checks are admitted (an admission
/// writes), on windows short enough that a sliding log's entries expire within a schedule.
fn batching_config(rng: &mut fastrand::Rng) -> Config {
    let instances = rng.usize(2..=3);
    let limit = rng.u64(20..2_000);
    Config {
        family: Family::Batching,
        backend: Backend::Redis,
        algorithm: Algorithm::TokenBucket,
        instances,
        limit,
        period_ms: [1_000, 1_000, 10_000][rng.usize(0..3)],
        lease_ms: None,
        deny_cache: false,
        keys: rng.usize(1..4),
        policy: match rng.u32(0..3) {
            0 => Policy::FailOpen,
            1 => Policy::FailClosed,
            _ => Policy::LocalFallback(rng.u64(1..=4)),
        },
        settlement: Settlement::Response,
        shadow_limit: limit,
        offsets_ms: vec![0; instances],
        cancels: rng.bool(),
        faults: rng.u32(0..3) > 0,
        warm: rng.u32(0..4) > 0,
    }
}

/// The batching family's operations: rolls below 8 are Redis running out of memory.
fn draw_batching(rng: &mut fastrand::Rng, config: &Config) -> Op {
    let inst = rng.usize(0..config.instances);
    let n = rng.usize(1..40);
    let seed = rng.u64(..);
    match rng.u32(if config.faults { 0 } else { 8 }..100) {
        0..=7 => Op::Fault(crate::faults::draw(rng, config)),
        8..=39 => Op::Mixed {
            inst,
            n,
            seed,
            cancel_us: if config.cancels && rng.u32(0..3) == 0 {
                cancel(rng)
            } else {
                None
            },
        },
        40..=54 => Op::Runtime {
            inst,
            n,
            seed,
            idle_ms: rng.u64(300..2_500),
            shutdown: rng.u32(0..3) == 0,
            multi: rng.bool(),
        },
        55..=67 => Op::Busy {
            inst,
            n,
            seed,
            work_ms: rng.u64(300..900),
            cpu: rng.u32(0..3) == 0,
        },
        68..=77 => Op::Park {
            inst,
            n,
            seed,
            park_ms: rng.u64(50..1_500),
            then_drop: rng.bool(),
        },
        78..=80 => Op::Full { seed },
        _ => Op::Sleep {
            ms: rng.u64(1..400),
        },
    }
}

/// A key index, hot (key 0) most of the time.
fn key(rng: &mut fastrand::Rng, config: &Config) -> usize {
    if rng.u32(0..3) == 0 {
        rng.usize(0..config.keys)
    } else {
        0
    }
}

/// A cancellation delay: most are short (before or during the store call), some long.
fn cancel(rng: &mut fastrand::Rng) -> Option<u64> {
    match rng.u32(0..4) {
        0 => Some(rng.u64(0..200)),
        1 => Some(rng.u64(200..3_000)),
        _ => None,
    }
}

fn draw(rng: &mut fastrand::Rng, config: &Config) -> Op {
    if config.family == Family::Batching {
        return draw_batching(rng, config);
    }
    let inst = rng.usize(0..config.instances);
    let key = key(rng, config);
    // Rolls below 6 are faults (below 10 in the concurrency family, whose oracle judges what
    // follows a data loss).
    let faulty = if config.family == Family::Concurrency {
        10
    } else {
        6
    };
    let roll = rng.u32(if config.faults { 0 } else { faulty }..100);
    if roll < faulty {
        return Op::Fault(crate::faults::draw(rng, config));
    }
    match config.family {
        Family::Rate => match roll {
            6..=8 => Op::Blocking {
                inst,
                key,
                n: rng.usize(1..20),
                cost: 1,
                block_ms: rng.u64(1..1_500),
            },
            9..=11 => Op::Acquire {
                inst,
                key,
                cost: rng.u64(1..4),
                wait_ms: rng.u64(1..1_500),
                cancel_us: cancel(rng).filter(|_| config.cancels),
            },
            12..=42 => Op::Burst {
                inst,
                key,
                n: rng.usize(1..40),
                cost: if rng.u32(0..4) == 0 { rng.u64(1..4) } else { 1 },
                // Fewer cancellations here: a broken key stops deciding, which hides what a
                // schedule would find after it.
                cancel_us: if rng.u32(0..3) == 0 {
                    cancel(rng).filter(|_| config.cancels)
                } else {
                    None
                },
            },
            43..=47 => Op::Advance {
                ms: advance(rng, config),
            },
            48..=49 => Op::Edge {
                before_us: rng.u64(0..3_000),
            },
            // Inside `Clock::MAX_SKEW` (5 s) most of the time, beyond it sometimes.
            50 => Op::StepBack {
                ms: if rng.bool() {
                    rng.u64(1..=5_000)
                } else {
                    rng.u64(5_001..120_000)
                },
            },
            51..=57 => Op::Sleep {
                ms: rng.u64(1..400),
            },
            58..=66 => Op::Reset {
                key,
                via: rng.bool().then_some(inst),
            },
            67..=69 => Op::Suspend {
                key,
                ms: rng.u64(1..2_000),
            },
            70..=71 => Op::Resume { key },
            72..=73 => Op::Extend {
                key,
                ms: rng.u64(1..2_000),
            },
            74..=77 => Op::SetQuota {
                key,
                limit: rng.u64(1..=2 * config.limit),
            },
            78..=79 => Op::ClearQuota { key },
            80..=89 => Op::Forget { inst, key },
            _ => Op::Release { inst },
        },
        // Some holds and sleeps span seconds: a schedule then lasts long enough in real time
        // for holders to outlive a data loss by more than the renewal period that puts their
        // slots back, while others acquire.
        Family::Concurrency => match roll {
            6..=50 => Op::Hold {
                inst,
                key,
                n: rng.usize(1..6),
                hold_ms: if rng.u32(0..3) == 0 {
                    rng.u64(2_000..8_000)
                } else {
                    rng.u64(10..4_000)
                },
                cancel_us: cancel(rng),
            },
            51..=72 => Op::Stream {
                inst,
                key,
                n: rng.usize(1..6),
                first_ms: rng.u64(0..300),
                chunks: rng.u8(0..6),
                chunk_ms: rng.u64(0..400),
                end: match rng.u32(0..4) {
                    0 => BodyEnd::Read,
                    1 => BodyEnd::BeforePoll,
                    2 => BodyEnd::After(rng.u8(0..4)),
                    _ => BodyEnd::Future(rng.u64(0..400_000)),
                },
            },
            _ => Op::Sleep {
                ms: if rng.u32(0..3) == 0 {
                    rng.u64(600..2_500)
                } else {
                    rng.u64(1..600)
                },
            },
        },
        Family::Settle => match roll {
            6..=60 => {
                let reserve = rng.u64(1..6);
                Op::Request {
                    inst,
                    key,
                    n: rng.usize(1..25),
                    reserve,
                    used: rng.u64(0..=reserve),
                    hold_ms: rng.u64(0..300),
                }
            }
            61..=80 => Op::Advance {
                ms: advance(rng, config),
            },
            _ => Op::Sleep {
                ms: rng.u64(1..400),
            },
        },
        Family::Outbound => match roll {
            6..=60 => Op::Call {
                inst,
                n: rng.usize(1..6),
            },
            61..=85 => Op::SetUpstream(upstream(rng)),
            _ => Op::Sleep {
                ms: rng.u64(1..300),
            },
        },
        Family::Batching => unreachable!("drawn by draw_batching"),
    }
}

/// A clock step: within a window, to its edge, or across several.
fn advance(rng: &mut fastrand::Rng, config: &Config) -> u64 {
    match rng.u32(0..3) {
        0 => rng.u64(1..config.period_ms / 4),
        1 => config.period_ms,
        _ => rng.u64(1..3 * config.period_ms),
    }
}

fn upstream(rng: &mut fastrand::Rng) -> Upstream {
    // Magnitudes from honest to absurd.
    let any = |rng: &mut fastrand::Rng| {
        [
            0,
            1,
            2,
            20,
            60,
            3_600,
            86_400,
            1_000_000_000,
            999_999_999_999_999,
        ][rng.usize(0..9)]
    };
    match rng.u32(0..3) {
        0 => Upstream::Honest,
        1 => Upstream::Lying {
            quota: any(rng),
            window_s: any(rng),
            remaining: any(rng),
            reset_s: any(rng),
        },
        _ => Upstream::TooMany {
            retry_after_s: any(rng),
        },
    }
}
