//! Redis Sentinel with real processes: a primary, its replica and three sentinels
//! (`redis-server sentinel.conf --sentinel`, quorum 2, `down-after-milliseconds 1000`).
//!
//! The primary is killed (SIGKILL); the sentinels promote the replica, and the limiter decides
//! on the new primary without a restart. Measured and printed (`--nocapture`): how long that
//! takes, what requests saw meanwhile (the failure policy, each within the timeout), and what
//! a key at its limit admits again after the failover (the consistency bound).
//!
//! Deadlines for the failover itself are generous (a loaded 2-core machine); what requests see
//! is asserted strictly: none waits longer than the timeout plus a margin.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redlimit::store::{RedisStore, StoreError, DEFAULT_TIMEOUT};
use redlimit::Verdict;
use redlimit::{Limiter, Quota};
use support::sentinel::{RedisSentinel, DOWN_AFTER, MASTER_NAME};
use tokio::runtime::Runtime;

/// The request stream's store has the defaults: 100 ms timeout, circuit breaker on.
const TIMEOUT: Duration = DEFAULT_TIMEOUT;
/// What one request may take at most, failover or not: the timeout plus a margin for a loaded
/// machine.
const BOUND: Duration = Duration::from_millis(500);
/// How long the sentinels and the limiter get to get over the failover (it takes a few
/// seconds; this is a deadline, not a goal).
const FAILOVER_DEADLINE: Duration = Duration::from_secs(20);
/// The quota of the keys whose admissions are counted: 10 an hour, so nothing refills during
/// the test.
const LIMIT: u64 = 10;
/// Concurrent request loops during the failover.
const STREAMS: usize = 4;

/// Kills the primary of a Sentinel setup while requests flow, and measures how the limiter
/// gets over it: the time until it decides on the new primary, what requests saw meanwhile,
/// and what two keys at their limit admit again afterwards. One was replicated before the
/// failover (checked with `WAIT`), so the bound is 0 for it. The other was filled while the
/// replica was frozen and the primary's output buffer for it was full (its writes were in
/// the replication lag), so the bound is what it admitted.
#[test]
fn the_limiter_follows_a_sentinel_failover_and_readmits_at_most_the_lagged_writes() {
    let runtime = support::multi_thread_runtime();
    let mut setup = RedisSentinel::start();
    let urls = setup.sentinel_urls();
    let (old_port, new_port) = (setup.master.port(), setup.replica.port());
    assert_eq!(setup.named_master_ports(), vec![old_port; 3]);

    // The request stream: a store with the defaults.
    let store = RedisStore::sentinel(urls.iter().map(String::as_str), MASTER_NAME).unwrap();
    assert_eq!(store.timeout(), TIMEOUT);
    // Exact counts: a long timeout and no breaker, so that no admission goes unseen.
    let counting = RedisStore::sentinel_builder(urls.iter().map(String::as_str), MASTER_NAME)
        .timeout(Duration::from_secs(2))
        .without_circuit_breaker()
        .build()
        .unwrap();
    let server = runtime
        .block_on(store.verify())
        .expect("verify via Sentinel");
    assert!(server.version.is_some(), "{server}");
    runtime
        .block_on(counting.verify())
        .expect("verify via Sentinel");
    // A name the sentinels do not monitor is a clear error at the startup check.
    let unknown = RedisStore::sentinel(urls.iter().map(String::as_str), "no-such-master").unwrap();
    let error = runtime.block_on(unknown.verify()).unwrap_err().to_string();
    assert!(error.contains("not found"), "{error}");
    let limiter = Limiter::new(store);
    let counter = Limiter::new(counting);
    let quota = Quota::per_hour(LIMIT).unwrap();

    // A key at its limit, replicated: the replica has acknowledged every write.
    let replicated_before = runtime.block_on(admitted_until_denied(&counter, "replicated", &quota));
    assert_eq!(replicated_before, LIMIT);
    let acknowledged: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut setup.master.conn())
        .unwrap();
    assert_eq!(acknowledged, 1, "the replica acknowledged the writes");

    // A key at its limit whose writes stay in the replication lag: the replica is frozen and
    // the primary's output buffer for it is full, so they wait behind data the kernel cannot
    // take any more.
    setup.freeze_replica();
    fill_replication_buffers(&setup);
    let lagged_before = runtime.block_on(admitted_until_denied(&counter, "lagged", &quota));
    assert_eq!(lagged_before, LIMIT);
    let backlog = setup.replica_backlog_bytes();
    assert!(backlog > 0, "the lagged writes are not sent yet");

    // Requests flow; the primary dies.
    let stream = Stream::start(&runtime, &limiter);
    thread::sleep(Duration::from_millis(300));
    let kill_sent = Instant::now();
    setup.master.stop(); // SIGKILL, and waits until the process is gone
    let killed_at = Instant::now();
    setup.thaw_replica();

    let promoted = promoted_since(&setup, killed_at);
    let decided = wait_until(killed_at, || stream.decided_after(killed_at).is_some());
    assert!(
        decided.is_some(),
        "the limiter did not decide on the new primary within {FAILOVER_DEADLINE:?}; verdicts \
         since the kill: {:?}\n{}",
        stream.summary(killed_at),
        setup.sentinel_logs()
    );
    // The stream keeps going a moment on the new primary, then stops.
    thread::sleep(Duration::from_secs(1));
    let requests = stream.stop(&runtime);
    let first_decision = requests.decided_after(killed_at).unwrap();
    let since_kill = requests.since(killed_at);

    // After the failover: what the two keys admit again.
    let replicated_after = runtime.block_on(admitted_until_denied(&counter, "replicated", &quota));
    let lagged_after = runtime.block_on(admitted_until_denied(&counter, "lagged", &quota));

    println!(
        "sentinel failover (down-after {DOWN_AFTER:?}, timeout {TIMEOUT:?}): sentinels promoted \
         the replica {promoted:?} after the kill; the limiter decided on it {first_decision:?} \
         after the kill; requests since the kill: {} ({} decided by Redis, {} by the failure \
         policy), worst latency {:?} (before the kill {:?}); replicated key at its limit: \
         {replicated_before} admitted before, {replicated_after} after; lagged key \
         ({backlog} bytes unsent to the replica): {lagged_before} admitted before, \
         {lagged_after} after",
        since_kill.requests,
        since_kill.decided,
        since_kill.policy,
        since_kill.worst,
        requests.before(kill_sent).worst,
    );

    // Every request got an answer within the timeout plus the margin, failover or not.
    let worst = requests.worst();
    assert!(worst <= BOUND, "a request took {worst:?} (bound {BOUND:?})");
    // Requests answered before the kill were all decided by Redis, and the last ones were
    // decided on the new primary.
    let before = requests.before(kill_sent);
    assert!(before.decided > 0 && before.policy == 0, "{before:?}");
    assert!(
        since_kill.policy > 0,
        "the failover went through the policy"
    );
    assert!(
        requests.last_all_decided(20),
        "{:?}",
        requests.since(killed_at)
    );
    let all_switched = wait_until(killed_at, || {
        setup.named_master_ports() == vec![new_port; 3]
    });
    assert!(all_switched.is_some(), "{:?}", setup.named_master_ports());
    assert!(
        setup.replica.command_calls("evalsha") + setup.replica.command_calls("eval") > 0,
        "the scripts ran on the promoted replica"
    );
    // The consistency bound: a key re-admits at most what it admitted in the replication lag.
    assert_eq!(
        replicated_after, 0,
        "replicated before the failover: nothing is re-admitted"
    );
    assert!(
        lagged_after <= lagged_before,
        "re-admitted {lagged_after}, more than the {lagged_before} admitted in the lag"
    );
}

/// Writes junk to the primary until its output buffer for the (frozen) replica holds at
/// least 1 MiB: the kernel's socket buffers are full, so whatever the primary writes next
/// stays in its memory and dies with it.
fn fill_replication_buffers(setup: &RedisSentinel) {
    let mut conn = setup.master.conn();
    let junk = vec![b'x'; 1 << 20];
    for i in 0..160 {
        let _: () = redis::cmd("SET")
            .arg(format!("junk:{i}"))
            .arg(&junk)
            .query(&mut conn)
            .unwrap();
        if i % 8 == 7 && setup.replica_backlog_bytes() >= 1 << 20 {
            return;
        }
    }
    panic!(
        "the primary's output buffer for the frozen replica did not fill: {} bytes",
        setup.replica_backlog_bytes()
    );
}

/// Checks `key` until the store denies it; how many it admitted. A timeout (the script may
/// have run) fails the test; other errors (a connection that the failover dropped) are retried.
async fn admitted_until_denied(limiter: &Limiter, key: &str, quota: &Quota) -> u64 {
    let deadline = Instant::now() + FAILOVER_DEADLINE;
    let mut admitted = 0;
    loop {
        match limiter.try_check_quotas(key, &quota.into(), 1).await {
            Ok(decision) if decision.allowed => admitted += 1,
            Ok(_) => return admitted,
            Err(StoreError::Timeout(timeout)) => {
                panic!("{key}: timed out after {timeout:?}: the count would be uncertain")
            }
            Err(error) => {
                assert!(Instant::now() < deadline, "{key}: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(admitted <= 2 * LIMIT, "{key}: {admitted} admitted");
    }
}

/// Polls `done` every 20 ms until [`FAILOVER_DEADLINE`] after `since`; how long it took.
/// How long after `since` the sentinels promoted the replica; panics, with their logs, past
/// [`FAILOVER_DEADLINE`].
fn promoted_since(setup: &RedisSentinel, since: Instant) -> Duration {
    let promoted = wait_until(since, || setup.replica_promoted());
    promoted.unwrap_or_else(|| {
        panic!(
            "the sentinels did not promote the replica within {FAILOVER_DEADLINE:?}\n{}",
            setup.sentinel_logs()
        )
    })
}

fn wait_until(since: Instant, mut done: impl FnMut() -> bool) -> Option<Duration> {
    while since.elapsed() < FAILOVER_DEADLINE {
        if done() {
            return Some(since.elapsed());
        }
        thread::sleep(Duration::from_millis(20));
    }
    None
}

/// One request of the stream: when it started, how long it took, whether Redis decided it.
#[derive(Debug, Clone, Copy)]
struct Request {
    at: Instant,
    latency: Duration,
    decided: bool,
}

/// Request loops on the limiter, each on a key of its own, every 5 ms.
struct Stream {
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Stream {
    fn start(runtime: &Runtime, limiter: &Limiter) -> Stream {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let quota = Quota::per_second(1_000_000).unwrap();
        let tasks = (0..STREAMS)
            .map(|i| {
                let (limiter, requests, stop) = (limiter.clone(), requests.clone(), stop.clone());
                runtime.spawn(async move {
                    let key = format!("stream-{i}");
                    while !stop.load(Ordering::Relaxed) {
                        let at = Instant::now();
                        let verdict = limiter.check(&key, &quota).await;
                        let latency = at.elapsed();
                        let decided = matches!(verdict, Verdict::Decided(_));
                        requests.lock().unwrap().push(Request {
                            at,
                            latency,
                            decided,
                        });
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            })
            .collect();
        Stream {
            requests,
            stop,
            tasks,
        }
    }

    fn decided_after(&self, since: Instant) -> Option<Duration> {
        Requests(self.requests.lock().unwrap().clone()).decided_after(since)
    }

    fn summary(&self, since: Instant) -> Summary {
        Requests(self.requests.lock().unwrap().clone()).since(since)
    }

    fn stop(self, runtime: &Runtime) -> Requests {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            runtime.block_on(task).unwrap();
        }
        let requests = self.requests.lock().unwrap().clone();
        Requests(requests)
    }
}

/// What the stream saw.
struct Requests(Vec<Request>);

/// Counts over some of the stream's requests.
#[derive(Debug, Default)]
struct Summary {
    requests: usize,
    decided: usize,
    policy: usize,
    worst: Duration,
}

impl Requests {
    fn summarize<'a>(requests: impl Iterator<Item = &'a Request>) -> Summary {
        requests.fold(Summary::default(), |mut summary, request| {
            summary.requests += 1;
            if request.decided {
                summary.decided += 1;
            } else {
                summary.policy += 1;
            }
            summary.worst = summary.worst.max(request.latency);
            summary
        })
    }

    fn since(&self, since: Instant) -> Summary {
        Self::summarize(self.0.iter().filter(|request| request.at >= since))
    }

    /// The requests answered before `until`.
    fn before(&self, until: Instant) -> Summary {
        Self::summarize(
            self.0
                .iter()
                .filter(|request| request.at + request.latency < until),
        )
    }

    fn worst(&self) -> Duration {
        Self::summarize(self.0.iter()).worst
    }

    /// How long after `since` the first request that started after it got a decision from
    /// Redis (the old primary is dead by then: only the new one decides).
    fn decided_after(&self, since: Instant) -> Option<Duration> {
        self.0
            .iter()
            .filter(|request| request.at >= since && request.decided)
            .map(|request| request.at + request.latency - since)
            .min()
    }

    /// Whether the last `n` requests were all decided by Redis.
    fn last_all_decided(&self, n: usize) -> bool {
        let mut requests = self.0.clone();
        requests.sort_by_key(|request| request.at);
        requests.len() >= n && requests.iter().rev().take(n).all(|request| request.decided)
    }
}

/// A failover asked of the sentinels (`SENTINEL FAILOVER`): the old primary stays up, and
/// keeps taking writes until Sentinel demotes it seconds later. The limiter moves to the new
/// primary within about the watcher's period (1 s) of the promotion, without a restart, and
/// no request waits beyond the bound.
#[test]
fn the_limiter_follows_a_failover_asked_of_the_sentinels() {
    let runtime = support::multi_thread_runtime();
    let setup = RedisSentinel::start();
    let store = setup.verified_store(&runtime);
    let limiter = Limiter::new(store);
    let stream = Stream::start(&runtime, &limiter);
    thread::sleep(Duration::from_millis(200));

    let asked_at = Instant::now();
    setup.ask_failover();
    let promoted = promoted_since(&setup, asked_at);
    let moved = wait_until(asked_at, || {
        setup.replica.command_calls("evalsha") + setup.replica.command_calls("eval") > 0
    });
    thread::sleep(Duration::from_secs(1));
    let requests = stream.stop(&runtime);
    let since = requests.since(asked_at);
    println!(
        "SENTINEL FAILOVER: replica promoted {promoted:?} after the command; the limiter ran \
         its scripts on it {moved:?} after; requests since: {} ({} decided by Redis, {} by the \
         failure policy), worst latency {:?}",
        since.requests, since.decided, since.policy, since.worst
    );
    let moved = moved
        .unwrap_or_else(|| panic!("the limiter never ran a script on the new primary: {since:?}"));
    // The old primary stays up and takes writes until Sentinel demotes it (about 10 s after the
    // promotion here): the store's watcher, asking a sentinel every second, moves well before.
    assert!(
        moved - promoted < Duration::from_secs(5),
        "the limiter moved {:?} after the promotion",
        moved - promoted
    );
    let worst = requests.worst();
    assert!(worst <= BOUND, "a request took {worst:?} (bound {BOUND:?})");
    assert!(requests.last_all_decided(20), "{since:?}");
}

/// What the README says narrows the window: with `min-replicas-to-write 1` a primary without an
/// acknowledging replica refuses the scripts (`NOREPLICAS`), and the failure policy decides.
#[tokio::test]
async fn min_replicas_to_write_refuses_decisions_without_a_replica() {
    let redis = support::RedisServer::start();
    // A generous timeout: the first connection on a loaded machine must not fail the test.
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let limiter = Limiter::new(store);
    let quota = Quota::per_hour(LIMIT).unwrap();
    assert!(support::admits(&limiter, "k", &quota).await);

    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("min-replicas-to-write")
        .arg(1)
        .query(&mut redis.conn())
        .unwrap();
    let error = limiter
        .try_check_quotas("k", &quota.into(), 1)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("NOREPLICAS"), "{error}");
    assert!(matches!(
        limiter.check("k", &quota).await,
        Verdict::FailedOpen
    ));
}
