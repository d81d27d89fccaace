//! The batch scenario (`RedisStoreBuilder::max_batch`): a token-bucket `Limiter::check` over a
//! `RedisStore` that batches (the default `max_batch`) against the same over `max_batch(1)`
//! (every decision alone), on [`KEYS`] keys, at concurrency 64 and at concurrency 1; and the
//! leanest peer's script ([`PEER_SCRIPT`]: `INCR` + `PEXPIRE`, no clock) sent with raw
//! redis-rs `EVALSHA` at concurrency 64 on the same number of keys. The five runs are
//! interleaved round by round, starting at a rotating place.
//!
//! - Redis time per decision: `cmdstat_evalsha`'s `usec` (the total since `CONFIG RESETSTAT`)
//!   over the run's decisions, not `usec_per_call` (a batched call carries many); the ratio
//!   compares each side's least-disturbed round at c = 64;
//! - decisions a second at c = 64 and p50 latency at c = 1: the medians of the per-round
//!   ratios;
//! - decisions per call of the batched side (decisions over `cmdstat_evalsha` calls), and the
//!   peer's `usec_per_call` (least-disturbed round).
//!
//! `cargo bench --bench throughput -- --quick batch` runs only this scenario.

use super::*;

/// The leanest peer's store as a script: a counter per key and its expiry, without a clock.
pub(crate) const PEER_SCRIPT: &str = r"
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
";

/// The concurrency of the throughput and Redis-cost comparison, and of the latency one.
const LOADED: Shape = Shape::new(RATIO_CONCURRENCY, Keys::Spread);
const ALONE: Shape = Shape::new(1, Keys::Spread);

/// A run of the scenario, in the order of a round (before its rotation).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    /// `Limiter::check` at `shape`, batched or not.
    Check { batched: bool, shape: Shape },
    /// The peer's script by raw `EVALSHA`.
    Peer,
}

const STEPS: [Step; 5] = [
    Step::Check {
        batched: true,
        shape: LOADED,
    },
    Step::Check {
        batched: false,
        shape: LOADED,
    },
    Step::Check {
        batched: true,
        shape: ALONE,
    },
    Step::Check {
        batched: false,
        shape: ALONE,
    },
    Step::Peer,
];

/// Raw redis-rs `EVALSHA` of [`PEER_SCRIPT`] on one multiplexed connection; `true` on a count.
struct PeerOp {
    connection: MultiplexedConnection,
    sha: Arc<str>,
    keys: Arc<Vec<String>>,
    shape: Shape,
    task: usize,
}

impl Op for PeerOp {
    async fn run(&mut self, n: u64) -> bool {
        let key = &self.keys[self.shape.key(self.task, n)];
        evalsha_is_an_integer(&mut self.connection, &self.sha, key, 1000).await
    }
}

/// A token-bucket limiter on a store of its own, batching (the default) or not
/// (`max_batch(1)`), checked once so that a dead Redis fails here.
async fn limiter(admin: &Admin, batched: bool) -> Checked<Limiter> {
    let builder = RedisStore::builder(admin.url.as_str()).timeout(TIMEOUT);
    let builder = if batched {
        builder
    } else {
        builder.max_batch(1)
    };
    let store = builder.build().expect("a valid Redis URL");
    let side = if batched { "batched" } else { "unbatched" };
    let algorithm = Algorithm::TokenBucket;
    let limiter = Limiter::builder(store)
        .algorithm(algorithm)
        .prefix(format!("{PREFIX}-batch-{side}"))
        .build()
        .expect("a valid limiter");
    limiter
        .try_check_quotas("warm-up", &admitting(algorithm).into(), 1)
        .await
        .map_err(|e| failure!("Redis at {} does not answer: {e}", admin.url))?;
    Ok(limiter)
}

/// The runs of one step, round by round.
type Runs = Vec<Run>;

/// Runs the scenario and prints its lines.
pub(crate) async fn batch_bench(settings: &Settings, admin: &Admin) -> Checked {
    let keys = KeySet::new();
    let batched = limiter(admin, true).await?;
    let unbatched = limiter(admin, false).await?;
    let mut connection = connect(&admin.url).await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(PEER_SCRIPT)
        .query_async(&mut connection)
        .await
        .map_err(|e| failure!("SCRIPT LOAD of the peer's script: {e}"))?;
    let sha: Arc<str> = sha.into();
    let peer_keys: Arc<Vec<String>> = Arc::new(
        keys.plain
            .iter()
            .map(|k| format!("{PREFIX}-peer:{{{k}}}"))
            .collect(),
    );
    let quota = admitting(Algorithm::TokenBucket);

    let mut runs: Vec<Runs> = vec![Vec::new(); STEPS.len()];
    for round in 0..settings.rounds {
        for step in 0..STEPS.len() {
            let i = (step + round) % STEPS.len();
            let run = match STEPS[i] {
                Step::Check { batched: b, shape } => {
                    let limiter = if b { &batched } else { &unbatched };
                    let ops = (0..shape.concurrency)
                        .map(|task| CheckOp {
                            limiter: limiter.clone(),
                            quota,
                            spent: spent(),
                            expect_allowed: true,
                            keys: keys.clone(),
                            shape,
                            task,
                        })
                        .collect();
                    measure(settings, admin, ops).await?.0
                }
                Step::Peer => {
                    let ops = (0..LOADED.concurrency)
                        .map(|task| PeerOp {
                            connection: connection.clone(),
                            sha: sha.clone(),
                            keys: peer_keys.clone(),
                            shape: LOADED,
                            task,
                        })
                        .collect();
                    measure(settings, admin, ops).await?.0
                }
            };
            ensure!(
                run.failures == 0,
                "batch scenario {:?}: {} of {} operations failed: the figures would not be valid",
                STEPS[i],
                run.failures,
                run.ops
            );
            runs[i].push(run);
        }
    }
    for (limiter, side) in [(&batched, "batched"), (&unbatched, "unbatched")] {
        let scenario = format!("batch scenario, {side}");
        assert_only(limiter, &scenario, "allowed", |s| {
            s.denied == 0 && s.store_errors == 0
        })?;
    }
    let [batched64, unbatched64, batched1, unbatched1, peer] = &runs[..] else {
        unreachable!("one list of runs per step");
    };
    report(
        settings,
        admin,
        [batched64, unbatched64, batched1, unbatched1],
        peer,
    );
    Ok(())
}

/// Prints the informational lines, then the contract lines.
fn report(settings: &Settings, admin: &Admin, checks: [&Runs; 4], peer: &Runs) {
    let [batched64, unbatched64, batched1, unbatched1] = checks;
    let of = |runs: &Runs, f: fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
    let per_round = |a: &Runs, b: &Runs, f: fn(&Run) -> f64| {
        Ratio::of(of(a, f).iter().zip(of(b, f)).map(|(a, b)| a / b).collect())
    };
    let usec = |runs: &Runs| Costs::least(&of(runs, Run::usec_per_decision));
    // Decisions over calls, all rounds together.
    let per_call = |runs: &Runs| {
        let decisions: u64 = runs.iter().map(|r| r.ops).sum();
        let calls: u64 = runs.iter().filter_map(|r| r.redis).map(|s| s.calls).sum();
        if calls == 0 {
            f64::NAN
        } else {
            decisions as f64 / calls as f64
        }
    };
    let peer_usec = Costs::least(
        &peer
            .iter()
            .map(|r| r.redis.map_or(f64::NAN, |s| s.usec_per_call()))
            .collect::<Vec<f64>>(),
    );
    let rounds = settings.rounds;
    let usec_ratio = usec(batched64) / usec(unbatched64);
    let usec_rounds = per_round(batched64, unbatched64, Run::usec_per_decision);
    let rate = per_round(batched64, unbatched64, Run::rate);
    let p50 = per_round(batched1, unbatched1, |r| r.p50_us);

    println!();
    println!(
        "batch scenario: token bucket, {KEYS} keys, max_batch {} against 1, {rounds} interleaved \
         rounds",
        redlimit::store::DEFAULT_MAX_BATCH
    );
    if !admin.stats {
        println!("(CONFIG RESETSTAT refused by this Redis: no Redis time figures)");
    }
    println!(
        "batched redis usec per decision at c=64: {:.2}, unbatched: {:.2} (least-disturbed \
         rounds; per round ratio median {:.2}, range {:.2}-{:.2})",
        usec(batched64),
        usec(unbatched64),
        usec_rounds.median,
        usec_rounds.min,
        usec_rounds.max
    );
    println!(
        "batched decisions per call: c=64 {:.2}, c=1 {:.2}",
        per_call(batched64),
        per_call(batched1)
    );
    println!(
        "decisions/s at c=64: batched {:.0}, unbatched {:.0} (medians; per round ratio range \
         {:.2}-{:.2})",
        median(of(batched64, Run::rate)),
        median(of(unbatched64, Run::rate)),
        rate.min,
        rate.max
    );
    println!(
        "p50 at c=1: batched {:.1} µs, unbatched {:.1} µs (medians; per round ratio range \
         {:.2}-{:.2})",
        median(of(batched1, |r| r.p50_us)),
        median(of(unbatched1, |r| r.p50_us)),
        p50.min,
        p50.max
    );
    println!(
        "Redis CPU per decision at c=64 (medians): batched {:.2} µs, unbatched {:.2} µs, peer \
         {:.2} µs",
        median(of(batched64, Run::redis_cpu_us)),
        median(of(unbatched64, Run::redis_cpu_us)),
        median(of(peer, Run::redis_cpu_us))
    );
    println!(
        "bench CPU per decision at c=64 (medians): batched {:.2} µs, unbatched {:.2} µs; \
         allocations per decision: batched {:.1}, unbatched {:.1}",
        median(of(batched64, Run::own_cpu_us)),
        median(of(unbatched64, Run::own_cpu_us)),
        median(of(batched64, Run::allocations_per_op)),
        median(of(unbatched64, Run::allocations_per_op))
    );
    println!("leanest peer (INCR + PEXPIRE, no clock): {peer_usec:.2} usec per call");
    println!("batched redis usec per decision / unbatched: {usec_ratio:.2}");
    println!(
        "batched/unbatched decisions per second at c=64: {:.2}",
        rate.median
    );
    println!("batched/unbatched p50 at c=1: {:.2}", p50.median);
}

/// `cargo bench --bench throughput -- batch`: only this scenario.
pub(crate) async fn only(settings: Settings) -> Checked {
    let admin = Admin::connect().await?;
    batch_bench(&settings, &admin).await
}
