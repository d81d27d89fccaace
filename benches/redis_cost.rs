//! What a decision costs Redis, in instructions: a private `redis-server` runs under
//! `valgrind --tool=callgrind`, which counts only inside `evalShaCommand` (the script's call,
//! what `INFO commandstats` times as `usec_per_call`), so the figures carry no noise from the
//! machine's load, the client, the event loop or Redis's timers.
//!
//! ```text
//! cargo bench --bench redis_cost                  # needs valgrind (callgrind_control), redis-server
//! cargo bench --bench redis_cost -- token-bucket   # only the scenarios whose names contain a word
//! ```
//!
//! Each scenario runs on a key of its own: one connection, one decision at a time, a warm-up,
//! then `callgrind_control --zero`, [`DECISIONS`] decisions and `callgrind_control --dump`;
//! per decision is the dump's total over [`DECISIONS`]. Decisions go through
//! `Limiter::check` on a `RedisStore` (the server's clock), each one checked. Scenarios:
//!
//! - `reference`: the throughput bench's reference script (`TIME`, one `GET`, one
//!   `SET key value PX ttl`), by hand;
//! - each algorithm, on a quota of 1 an hour with a burst of 100 000: every decision admitted,
//!   on a key that stays alive (as a busy key's does), its state in the middle of its range (the
//!   sliding log holds one unit more on each decision, up to 2 200: its cost grows with them);
//! - the token bucket with controls: the tenant's override of every route, the route's own
//!   override (both 2 an hour), a suspension of the tenant (every decision a denial);
//! - the token bucket with two tiers (the same quota, and 1 a day with the same burst);
//! - `batched`: the token bucket's decisions [`BATCH`] at a time, on as many keys, through one
//!   store that batches: in each round the first goes alone and the rest queue behind it and
//!   share the next call (`src/store/redis/batch.rs`), so every round is the same two calls.
//!
//! Prints one line per group, `N (X.XX of reference)` per scenario. Words after `--` keep only
//! the scenarios whose names contain one of them (`gcra`, `sliding`, `override`, `two`; the
//! reference always runs), since each scenario takes minutes under callgrind. With
//! `REDIS_COST_DUMPS=<dir>` the dumps stay there, one a scenario in the order printed
//! (`callgrind.out.1` the reference's), for `callgrind_annotate`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redlimit::store::RedisStore;
use redlimit::{Algorithm, Limiter, Quota, Quotas, Target};

#[path = "support/mod.rs"]
mod support;
use support::PrivateRedis;

/// Decisions counted per scenario.
const DECISIONS: u64 = 2_000;
/// Decisions before the count: the script loaded, the key written, the allocator settled.
const WARM_UP: u64 = 200;
/// Decisions sent at once in the `batched` scenario: one alone, the rest in one call.
const BATCH: u64 = 64;

/// The throughput bench's reference script: only `TIME`, one `GET` and one `SET key value PX
/// ttl` on its key.
const REFERENCE_SCRIPT: &str = r"
redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, 0, 0, 0, 0}
";

/// A scenario: what one decision of it does.
#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    Reference,
    Plain(Algorithm),
    TenantOverride,
    RouteOverride,
    TenantSuspended,
    TwoTiers,
    Batched,
}

impl Scenario {
    fn name(self) -> String {
        match self {
            Scenario::Reference => "reference".into(),
            Scenario::Plain(algorithm) => algorithm.to_string(),
            Scenario::TenantOverride => "tenant override".into(),
            Scenario::RouteOverride => "route override".into(),
            Scenario::TenantSuspended => "tenant suspended".into(),
            Scenario::TwoTiers => "two tiers".into(),
            Scenario::Batched => format!("token-bucket batched {BATCH} at a time"),
        }
    }
}

/// The callgrind'ed server and what counts its instructions.
struct Counted {
    server: PrivateRedis,
    /// The file callgrind dumps to: dump n is `<out>.<n>`.
    out: PathBuf,
    dumps: u32,
}

impl Counted {
    fn start() -> Result<Counted, String> {
        // In the server's directory (removed at the end), or where REDIS_COST_DUMPS says, kept
        // for `callgrind_annotate`.
        let kept = std::env::var_os("REDIS_COST_DUMPS").map(PathBuf::from);
        let out_name = match &kept {
            Some(dir) => std::path::absolute(dir.join("callgrind.out"))
                .map_err(|e| e.to_string())?
                .display()
                .to_string(),
            None => "callgrind.out".to_owned(),
        };
        let wrapper = [
            "valgrind".to_owned(),
            "--tool=callgrind".to_owned(),
            "--toggle-collect=evalShaCommand".to_owned(),
            format!("--callgrind-out-file={out_name}"),
        ];
        let server = PrivateRedis::start_under(&wrapper, Duration::from_secs(60))?;
        let out = server.dir().join(out_name);
        Ok(Counted {
            server,
            out,
            dumps: 0,
        })
    }

    fn control(&self, option: &str) -> Result<(), String> {
        let status = Command::new("callgrind_control")
            .arg(option)
            .arg(self.server.pid().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("callgrind_control: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("callgrind_control {option} failed ({status})"))
        }
    }

    /// Sets the counts to zero.
    fn zero(&self) -> Result<(), String> {
        self.control("--zero")
    }

    /// The instructions counted since [`Counted::zero`].
    fn dump(&mut self) -> Result<u64, String> {
        self.control("--dump")?;
        self.dumps += 1;
        let file = PathBuf::from(format!("{}.{}", self.out.display(), self.dumps));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(total) = read_total(&file) {
                return Ok(total);
            }
            if Instant::now() > deadline {
                return Err(format!("no callgrind dump at {}", file.display()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The `totals:` line of a finished dump (callgrind writes it last).
fn read_total(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("totals:"))
        .and_then(|total| total.split_whitespace().next())
        .and_then(|total| total.parse().ok())
}

/// Whether `program` runs at all.
fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// The quota of every scenario: 1 an hour with a burst of 100 000, so that every counted
/// decision is admitted and finds its key alive, its state in the middle of its range (what a
/// busy key reads and writes), while its TTL stays small enough for the usual one-integer reply.
fn admitting() -> Quota {
    Quota::per_hour(1)
        .and_then(|quota| quota.with_burst(100_000))
        .expect("a valid quota")
}

/// The overrides: the same with 2 an hour, so that they are not the callers' quota.
fn overriding() -> Quotas {
    Quotas::from(
        Quota::per_hour(2)
            .and_then(|quota| quota.with_burst(100_000))
            .expect("a valid quota"),
    )
}

/// Runs one scenario on a key of its own: its set-up, the warm-up, then the counted decisions.
async fn measure(counted: &mut Counted, scenario: Scenario) -> Result<u64, String> {
    let algorithm = match scenario {
        Scenario::Plain(algorithm) => algorithm,
        _ => Algorithm::TokenBucket,
    };
    if scenario == Scenario::Reference {
        return reference(counted, &scenario.name()).await;
    }
    let store = RedisStore::builder(counted.server.url().as_str())
        .timeout(Duration::from_secs(30))
        .without_circuit_breaker()
        .build()
        .map_err(|e| e.to_string())?;
    let limiter = Limiter::builder(store)
        .algorithm(algorithm)
        .prefix("redis-cost")
        .build()
        .map_err(|e| e.to_string())?;
    let key = scenario.name().replace(' ', "-");
    let quota = admitting();
    let mut quotas = Quotas::from(quota);
    let mut allowed = true;
    match scenario {
        Scenario::TenantOverride => {
            limiter
                .set_quota(Target::all_routes(&key), &overriding())
                .await
                .map_err(|e| e.to_string())?;
        }
        Scenario::RouteOverride => {
            limiter
                .set_quota(key.as_str(), &overriding())
                .await
                .map_err(|e| e.to_string())?;
        }
        Scenario::TenantSuspended => {
            limiter
                .suspend(Target::all_routes(&key), Duration::from_secs(3600))
                .await
                .map_err(|e| e.to_string())?;
            allowed = false;
        }
        Scenario::TwoTiers => {
            let per_day = Quota::per_day(1)
                .and_then(|quota| quota.with_burst(100_000))
                .expect("a valid quota");
            quotas = Quotas::new([quota, per_day]).expect("two valid quotas");
        }
        Scenario::Reference | Scenario::Plain(_) | Scenario::Batched => {}
    }
    if scenario == Scenario::Batched {
        return batched(counted, &limiter, &quotas).await;
    }
    let decide = |n: u64| {
        let (limiter, key, quotas) = (&limiter, &key, &quotas);
        async move {
            for _ in 0..n {
                let decision = limiter
                    .try_check_quotas(key.as_str(), quotas, 1)
                    .await
                    .map_err(|e| e.to_string())?;
                if decision.allowed != allowed {
                    return Err(format!("{}: an unexpected decision", scenario.name()));
                }
            }
            Ok::<(), String>(())
        }
    };
    decide(WARM_UP).await?;
    counted.zero()?;
    decide(DECISIONS).await?;
    counted.dump()
}

/// The `batched` scenario: rounds of [`BATCH`] decisions at once on as many keys; per decision
/// is the total over the decisions counted (a whole number of rounds).
async fn batched(counted: &mut Counted, limiter: &Limiter, quotas: &Quotas) -> Result<u64, String> {
    let keys: Vec<String> = (0..BATCH).map(|i| format!("batched-{i}")).collect();
    let round = || {
        futures::future::join_all(
            keys.iter()
                .map(|key| limiter.try_check_quotas(key.as_str(), quotas, 1)),
        )
    };
    for _ in 0..WARM_UP.div_ceil(BATCH) {
        round().await;
    }
    counted.zero()?;
    for _ in 0..DECISIONS / BATCH {
        for decision in round().await {
            if !decision.map_err(|e| e.to_string())?.allowed {
                return Err("batched: an unexpected denial".into());
            }
        }
    }
    // Scaled to DECISIONS, the divisor of every scenario.
    Ok(counted.dump()? * DECISIONS / (DECISIONS / BATCH * BATCH))
}

/// The reference script by hand, on one connection.
async fn reference(counted: &mut Counted, key: &str) -> Result<u64, String> {
    let client = redis::Client::open(counted.server.url()).map_err(|e| e.to_string())?;
    // Redis under callgrind answers tens of times slower than usual.
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(30)))
        .set_response_timeout(Some(Duration::from_secs(30)));
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| e.to_string())?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(REFERENCE_SCRIPT)
        .query_async(&mut connection)
        .await
        .map_err(|e| e.to_string())?;
    let mut call = async |n: u64| {
        for _ in 0..n {
            redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(key)
                .arg("1764500000000000:7")
                .arg(1000)
                .query_async::<redis::Value>(&mut connection)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok::<(), String>(())
    };
    call(WARM_UP).await?;
    counted.zero()?;
    call(DECISIONS).await?;
    counted.dump()
}

fn main() {
    for (program, arg) in [
        ("valgrind", "--version"),
        ("callgrind_control", "--version"),
        ("redis-server", "--version"),
    ] {
        if !runs(program, arg) {
            println!("redis_cost: skipped: {program} is not on PATH");
            return;
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let started = Instant::now();
    let mut counted = match Counted::start() {
        Ok(counted) => counted,
        Err(e) => {
            println!("redis_cost: skipped: redis-server under callgrind did not start: {e}");
            return;
        }
    };
    let groups: [(&str, Vec<Scenario>); 4] = [
        (
            "redis instructions per decision",
            [
                Algorithm::TokenBucket,
                Algorithm::Gcra,
                Algorithm::FixedWindow,
                Algorithm::SlidingWindow,
                Algorithm::SlidingLog,
            ]
            .map(Scenario::Plain)
            .to_vec(),
        ),
        (
            "redis instructions per decision, token bucket with controls",
            vec![
                Scenario::TenantOverride,
                Scenario::RouteOverride,
                Scenario::TenantSuspended,
            ],
        ),
        (
            "redis instructions per decision, token bucket",
            vec![Scenario::TwoTiers],
        ),
        (
            "redis instructions per decision, several in one call",
            vec![Scenario::Batched],
        ),
    ];
    // The scenarios asked for: every one, or those whose names contain a word given.
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let wanted =
        |scenario: &Scenario| words.is_empty() || words.iter().any(|w| scenario.name().contains(w));
    let per = |total: u64| total as f64 / DECISIONS as f64;
    let reference = per(runtime
        .block_on(measure(&mut counted, Scenario::Reference))
        .unwrap_or_else(|e| panic!("reference: {e}")));
    println!(
        "redis_cost: redis-server under callgrind, instructions inside evalShaCommand, {DECISIONS} \
         decisions per scenario, one at a time (batched: {BATCH} at once)"
    );
    println!("reference script (TIME + GET + SET PX): {reference:.0} instructions per call");
    for (title, scenarios) in groups {
        let figures: Vec<String> = scenarios
            .into_iter()
            .filter(wanted)
            .map(|scenario| {
                let cost = per(runtime
                    .block_on(measure(&mut counted, scenario))
                    .unwrap_or_else(|e| panic!("{}: {e}", scenario.name())));
                format!(
                    "{} {cost:.0} ({:.2} of reference)",
                    scenario.name(),
                    cost / reference
                )
            })
            .collect();
        if !figures.is_empty() {
            println!("{title}: {}", figures.join(", "));
        }
    }
    println!("redis_cost: {:.0} s", started.elapsed().as_secs_f64());
}
