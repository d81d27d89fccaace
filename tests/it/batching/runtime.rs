//! The store's own runtime (`src/store/redis/runtime.rs`) and the runtimes of its callers: a
//! runtime that idles or shuts down, with decisions queued or on the wire, or with a connection,
//! a connection attempt or a script load of the store's in its hands, never stalls or fails a
//! decision of another runtime, and the store stays usable.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use redlimit::store::{RedisStore, RedisStoreBuilder, Store, DEFAULT_MAX_BATCH};
use redlimit::Algorithm;

use super::sender::main_runtime;
use super::{
    all_decided_within, batched_and_unbatched, consumed, decided_within, generous, helper_runtime,
    keys, new_store, none_past, on_shared, request, runtime_and_store, script_calls, shared_quota,
    show, store_without_breaker, timed, timed_owned, together, together_owned, Answer, SLACK,
};
use crate::support::{self, RedisCluster, RedisServer};

/// `count` lone decisions one after another, each on a key of its own.
async fn one_by_one(store: &RedisStore, prefix: &str, count: usize) -> Vec<Answer> {
    let mut answers = Vec::new();
    for i in 0..count {
        answers.push(timed(store, &format!("redlimit:{{{prefix}-{i}}}")).await);
    }
    answers
}

/// `lone` decisions one by one (keys `<prefix>-<i>`), then `queued` sent together (keys
/// `<prefix>-queued-<i>`).
async fn lone_then_queued(
    store: &RedisStore,
    prefix: &str,
    lone: usize,
    queued: usize,
) -> (Vec<Answer>, Vec<Answer>) {
    let lone = one_by_one(store, prefix, lone).await;
    let queued = together(store, &format!("{prefix}-queued"), queued).await;
    (lone, queued)
}

/// A store on `redis` with `timeout`, built (and connected) on a runtime of its own that then
/// shut down, nothing in flight; and the next runtime, where the store goes on.
fn outliving_its_runtime(
    redis: &RedisServer,
    timeout: Duration,
) -> (tokio::runtime::Runtime, RedisStore) {
    let (own, store) = runtime_and_store(main_runtime(), redis, timeout, 64);
    drop(own);
    (main_runtime(), store)
}

/// A store of `builder` (a timeout of 500 ms, no circuit breaker) that made its first
/// decisions on a runtime of its own, which then shut down, nothing in flight; and the next
/// runtime, where the store goes on.
fn outliving_its_first_runtime(
    builder: RedisStoreBuilder,
) -> (tokio::runtime::Runtime, RedisStore) {
    let own = main_runtime();
    let store = own.block_on(async {
        let builder = builder.timeout(Duration::from_millis(500));
        let store = builder.without_circuit_breaker().build().unwrap();
        store.verify().await.expect("the store reaches Redis");
        let _ = one_by_one(&store, "before", 3).await;
        store
    });
    drop(own);
    (main_runtime(), store)
}

/// A store on `redis` built on a runtime of its own as by [`runtime_and_store`], and the main
/// runtime its callers use: (own, store, main).
fn store_on_its_own_runtime(
    redis: &RedisServer,
    timeout: Duration,
    max_batch: usize,
) -> (tokio::runtime::Runtime, RedisStore, tokio::runtime::Runtime) {
    let (own, store) = runtime_and_store(main_runtime(), redis, timeout, max_batch);
    (own, store, main_runtime())
}

// ---------------------------------------------------------------------------------------------
// Other runtimes.
// ---------------------------------------------------------------------------------------------

/// A helper thread's current-thread runtime that, after `CLIENT KILL`, makes the store's first
/// calls (as a health check or a second service on its own runtime may), then idles undriven.
/// Returns the helper's answers and a sender that releases (and drops) its runtime.
fn helper_calls_then_idles(
    store: &RedisStore,
) -> (Vec<String>, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (answers, release, helper) = helper_runtime(store, |store| async move {
        let mut texts = Vec::new();
        for i in 0..4 {
            let (answer, took) = timed(&store, &format!("redlimit:{{helper-{i}}}")).await;
            texts.push(format!("{:?} {took:.0?}", answer.map(|d| d.allowed)));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        texts
    });
    (answers.recv().unwrap(), release, helper)
}

/// The main runtime, and a store on `redis` built on it with a timeout of 500 ms, whose
/// connection Redis then dropped (`CLIENT KILL`): the next call to meet it remakes it.
fn store_with_a_dropped_connection(redis: &RedisServer) -> (tokio::runtime::Runtime, RedisStore) {
    let (main, store) = runtime_and_store(
        main_runtime(),
        redis,
        Duration::from_millis(500),
        DEFAULT_MAX_BATCH,
    );
    redis.client_kill_normal();
    std::thread::sleep(Duration::from_millis(50));
    (main, store)
}

/// Guards against: the single-node connection is a redis-rs `ConnectionManager`, which reconnects by
/// itself with `tokio::spawn` on the runtime of the call that met the dropped connection
/// (redis-rs 1.8.1 `aio/connection_manager.rs`, `reconnect`: `internals.runtime.spawn`, and
/// the new `MultiplexedConnection`'s driver is spawned wherever that future is polled). So
/// after a dropped connection (`CLIENT KILL`, a Redis restart, a network blip) the new
/// connection's driver lives on whichever caller's runtime met it first, not on the store's:
/// when that runtime idles, every later decision of every runtime times out.
///
/// Promise (src/store/mod.rs, "The store's runtime"): the store runs "its connection (the
/// connection attempts, and the driver task redis-rs spawns for a connection)" on its own
/// runtime, "never a caller's"; "another runtime idling, blocking or shutting down touches no
/// other caller's decision".
#[test]
fn a_connection_remade_by_another_runtimes_call_stalls_no_decision_when_that_runtime_idles() {
    let redis = RedisServer::start();
    let (main, store) = store_with_a_dropped_connection(&redis);
    // The helper's calls are the first to meet the dropped connection.
    let (helper, release, thread) = helper_calls_then_idles(&store);
    let (lone, queued) = main.block_on(lone_then_queued(&store, "after-helper", 4, 8));
    release.send(()).unwrap();
    thread.join().unwrap();
    // Redis idle, nothing in flight: each decision takes a few ms.
    let within = Duration::from_millis(200);
    assert!(
        all_decided_within(&lone, within) && all_decided_within(&queued, within),
        "the helper (its runtime then idle): {helper:?}\nlone decisions on the main runtime: \
         {}\nqueued: {}",
        show(&lone),
        show(&queued)
    );
}

/// Guards against (same cause as the test above): the helper runtime that remade the connection shuts
/// down, and the decisions of the main runtime made at that moment fail with the dropped
/// connection's error, though it was not their runtime.
#[test]
fn a_connection_remade_by_another_runtimes_call_fails_no_decision_when_that_runtime_shuts_down() {
    let redis = RedisServer::start();
    let (main, store) = store_with_a_dropped_connection(&redis);
    let (helper, release, thread) = helper_calls_then_idles(&store);
    let answers = main.block_on(async {
        // Decisions every 5 ms, through the helper runtime's shutdown 100 ms in.
        let run = tokio::spawn({
            let store = store.clone();
            async move {
                let mut answers = Vec::new();
                for i in 0..60 {
                    answers.push(timed(&store, &format!("redlimit:{{through-{i}}}")).await);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                answers
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        release.send(()).unwrap();
        run.await.unwrap()
    });
    thread.join().unwrap();
    let failed: Vec<_> = answers
        .iter()
        .filter(|(answer, _)| answer.is_err())
        .collect();
    assert!(
        failed.is_empty(),
        "helper: {helper:?}\n{} of {} decisions of the main runtime failed when the helper's \
         runtime shut down: {}",
        failed.len(),
        answers.len(),
        show(&answers)
    );
}

/// The store's own runtime (a current-thread one the store was built in) stops being driven
/// while a lone call is on its connection and decisions are queued behind it, then shuts down.
/// Promise (src/store/mod.rs, "The store's runtime"): "If the store's own runtime shuts down,
/// the calls in flight on it fail (a decision that may have run is not sent again), queued
/// decisions not yet sent are sent by their callers alone".
///
/// Guards against: the queued decisions were handed to a sender task that the store's runtime never
/// polled (`spawn_sender` moves the batch into the task at spawn time); dropped unpolled with
/// the runtime, it drops their answer channels, and each hears SENDER_GONE "the store's
/// runtime shut down with this decision's call in flight (it may have run)" although no call
/// carried it (Redis ran no script meanwhile). They are not sent alone.
#[test]
fn queued_decisions_never_sent_are_sent_alone_when_the_stores_runtime_shuts_down() {
    let redis = RedisServer::start();
    let own = support::current_thread_runtime();
    let timeout = Duration::from_millis(1500);
    let (own, store) = runtime_and_store(own, &redis, timeout, DEFAULT_MAX_BATCH);
    let main = main_runtime();
    redis.reset_stats();
    // `own` is no longer driven: the connection's driver and any sender on it wait.
    let lead = main.spawn(timed_owned(&store, "redlimit:{lead}"));
    std::thread::sleep(Duration::from_millis(30));
    let queued = main.spawn(together_owned(&store, "queued", 3));
    std::thread::sleep(Duration::from_millis(50));
    let (calls_before, _) = script_calls(&redis);
    drop(own);
    let (lead, queued) = main.block_on(async { (lead.await.unwrap(), queued.await.unwrap()) });
    let later = main.block_on(one_by_one(&store, "later", 3));
    assert_eq!(calls_before, 0, "nothing reached Redis before the shutdown");
    let gone = queued.iter().filter(
        |(answer, _)| matches!(answer, Err(error) if error.to_string().contains("may have run")),
    );
    assert_eq!(
        gone.count(),
        0,
        "queued decisions no call carried told they may have run: lead {}; queued {}; later {}",
        show(&[lead]),
        show(&queued),
        show(&later)
    );
}

/// After the store's own runtime shut down (nothing in flight), the next runtime's decisions are
/// decided. Promise: "the store binds the runtime of its next call and reconnects there, so a
/// store outlives a runtime".
///
/// Guards against (single node): the first decision(s) after the shutdown fail with the dropped
/// connection's error: the `ConnectionManager` still holds the connection whose driver died
/// with the runtime, and only that failure makes it reconnect.
#[test]
fn after_the_stores_runtime_shut_down_the_next_decisions_are_decided() {
    let redis = RedisServer::start();
    let (next, store) = outliving_its_runtime(&redis, Duration::from_millis(500));
    let answers = next.block_on(one_by_one(&store, "next", 5));
    assert!(
        answers.iter().all(|(answer, _)| answer.is_ok()),
        "decisions after the store's runtime shut down: {}",
        show(&answers)
    );
}

/// The same on Cluster.
///
/// Guards against (Cluster): see the assertion's figures: the cluster connection's driver died with the
/// runtime, and nothing replaces the connection (`stale_server` names only `READONLY` and
/// `MASTERDOWN`), so decisions keep failing.
#[test]
fn on_cluster_after_the_stores_runtime_shut_down_the_next_decisions_are_decided() {
    let cluster = RedisCluster::start();
    let (next, store) = outliving_its_first_runtime(RedisStore::cluster_builder(cluster.urls()));
    let answers = next.block_on(async {
        let mut answers = one_by_one(&store, "next", 5).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        answers.extend(one_by_one(&store, "next-later", 5).await);
        answers
    });
    let failed = answers.iter().filter(|(answer, _)| answer.is_err()).count();
    assert!(
        answers[5..].iter().all(|(answer, _)| answer.is_ok()),
        "{failed} of {} decisions after the store's runtime shut down failed: {}",
        answers.len(),
        show(&answers)
    );
}

/// The store's own runtime idles (a current-thread runtime it was built in, no longer driven),
/// which the docs forbid ("It must keep running while the store is used"). What must still hold
/// (the brief's oracle): every decision of another runtime ends with a clear error or a
/// decision within its own timeout, never a stall past it.
#[test]
fn no_decision_waits_past_its_timeout_while_the_stores_runtime_idles() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let (own, store) = runtime_and_store(support::current_thread_runtime(), &redis, timeout, 64);
    let main = main_runtime();
    let (lone, queued) = main.block_on(lone_then_queued(&store, "idle-own", 2, 20));
    drop(own);
    eprintln!("lone: {}\nqueued: {}", show(&lone), show(&queued));
    assert!(
        none_past(&lone, timeout + SLACK) && none_past(&queued, timeout + SLACK),
        "lone: {}\nqueued: {}",
        show(&lone),
        show(&queued)
    );
}

/// A store built outside any runtime binds its first caller's: here a short-lived helper
/// runtime (a startup check) that is then dropped. The main runtime's decisions are decided,
/// and none waits past its timeout.
#[test]
fn a_store_built_outside_any_runtime_outlives_its_first_callers_runtime() {
    let redis = RedisServer::start();
    let store = store_without_breaker(&redis, Duration::from_millis(500), DEFAULT_MAX_BATCH);
    {
        let startup = support::current_thread_runtime();
        startup.block_on(store.verify()).expect("Redis is up");
    }
    let main = main_runtime();
    let (mut answers, queued) = main.block_on(lone_then_queued(&store, "after-startup", 5, 10));
    answers.extend(queued);
    let failed = answers.iter().filter(|(answer, _)| answer.is_err()).count();
    eprintln!("{failed} failed: {}", show(&answers));
    assert!(
        none_past(&answers, Duration::from_millis(500) + SLACK),
        "{}",
        show(&answers)
    );
    assert!(
        answers[1..].iter().all(|(answer, _)| answer.is_ok()),
        "{failed} failed: {}",
        show(&answers)
    );
}

/// `SCRIPT FLUSH` after the store's own runtime shut down (the script load then runs on the
/// runtime the store binds next): queued decisions and lone ones are decided.
#[test]
fn a_script_flush_after_the_stores_runtime_shut_down_is_survived_by_batches() {
    let redis = RedisServer::start();
    let (next, store) = outliving_its_runtime(&redis, Duration::from_secs(1));
    let (first, queued, lone) = next.block_on(async {
        // Let the store reconnect on this runtime (see the finding above: a first call may fail).
        let first = one_by_one(&store, "rebind", 3).await;
        redis.script_flush();
        let sleeping = redis.asleep(Duration::from_millis(150)).await;
        let lead = timed(&store, "redlimit:{flush-lead}");
        let rest = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            together(&store, "flush-queued", 30).await
        };
        let (lead, mut queued) = tokio::join!(lead, rest);
        sleeping.join().unwrap();
        queued.insert(0, lead);
        let lone = one_by_one(&store, "flush-lone", 3).await;
        (first, queued, lone)
    });
    assert!(
        all_decided_within(&queued, Duration::from_secs(1))
            && all_decided_within(&lone, Duration::from_secs(1)),
        "first after the rebind: {}\nqueued after SCRIPT FLUSH: {}\nlone: {}",
        show(&first),
        show(&queued),
        show(&lone)
    );
}

/// A store's first connection attempt runs on the store's runtime (here the runtime it was built
/// in); that runtime shuts down while the attempt waits for a server that accepted the TCP
/// connection but has not answered yet. Once the server answers, the next runtime's decisions
/// are decided. Promise (src/store/mod.rs, "The store's runtime"): "the store binds the runtime
/// of its next call and reconnects there, so a store outlives a runtime".
///
/// Guards against: the attempt's task is dropped with the runtime and never records an outcome, so the
/// connection slot stays `Attempt::Running` with a future that has already ended
/// (`Replaceable::wait_ready`, src/store/redis/connection.rs): every later call joins it, hears
/// "connection attempt abandoned" at once, and no new attempt ever starts (`settle` replaces
/// only a slot that has a connection). The store never connects again.
#[test]
fn a_connection_attempt_dropped_with_the_stores_runtime_is_made_again_on_the_next() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    redis.stop();
    // A server that accepts (the kernel's backlog) and never answers `HELLO`.
    let silent = std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port again");
    let own = main_runtime();
    let store = {
        let _inside = own.enter();
        RedisStore::builder(format!("redis://127.0.0.1:{port}/"))
            .timeout(Duration::from_millis(300))
            .without_circuit_breaker()
            .build()
            .unwrap()
    };
    let first = own.block_on(timed(&store, "redlimit:{first}"));
    // The attempt goes on in the background (up to 10 s): the runtime shuts down meanwhile.
    own.shutdown_timeout(Duration::from_millis(100));
    drop(silent);
    redis.restart();
    let next = main_runtime();
    let answers = next.block_on(async {
        let mut answers = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(4) {
            answers.push(timed(&store, &format!("redlimit:{{next-{}}}", answers.len())).await);
            if answers.last().unwrap().0.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        answers
    });
    assert!(
        answers.last().unwrap().0.is_ok(),
        "first (its attempt then dropped): {}\n{} decisions over 4 s after the restart: {}",
        show(&[first]),
        answers.len(),
        show(&answers[answers.len().saturating_sub(3)..])
    );
}

/// Guards against: a `SCRIPT LOAD` task dropped with the store's runtime before it ran (the runtime's
/// workers busy, then shut down) leaves its `Reloads` entry `running` for good (only the task
/// clears it, src/store/redis/reload.rs): every later `NOSCRIPT` joins that ended load, hears
/// "SCRIPT LOAD task ended without an answer", and sends the whole script body with `EVAL`.
/// Promise (src/store/redis/reload.rs, and src/store/mod.rs: "the one `SCRIPT LOAD` after
/// `NOSCRIPT`"): one flush costs one load per script, not one `EVAL` of the body per call.
#[test]
fn a_script_load_dropped_with_the_stores_runtime_leaves_one_load_per_flush() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let (own, store, main) = store_on_its_own_runtime(&redis, timeout, 1);
    let rebound = main.block_on(async {
        // The connection is made again from this runtime (its driver then lives here: see the
        // first finding), so that only the store's own tasks are left on `own`.
        redis.client_kill_normal();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut rebound = Vec::new();
        for i in 0..5 {
            rebound.push(timed(&store, &format!("redlimit:{{rebind-{i}}}")).await);
            if rebound.last().unwrap().0.is_ok() {
                break;
            }
        }
        rebound
    });
    // Both of `own`'s workers busy: the load after the next NOSCRIPT waits in its queue.
    for _ in 0..2 {
        own.spawn(async { std::thread::sleep(Duration::from_millis(1200)) });
    }
    std::thread::sleep(Duration::from_millis(100));
    redis.script_flush();
    let stalled = main.block_on(timed(&store, "redlimit:{stalled}"));
    own.shutdown_background();
    std::thread::sleep(Duration::from_millis(1500));
    redis.script_flush();
    redis.reset_stats();
    let answers = main.block_on(together(&store, "after-flush", 50));
    let loads = redis.command_calls("script|load");
    let evals = redis.command_calls("eval");
    let figures = format!(
        "after a flush, 50 concurrent decisions sent {loads} SCRIPT LOAD and {evals} EVAL \
         (rebind: {}; the decision whose load waited on the busy runtime: {}; answers: {})",
        show(&rebound),
        show(&[stalled]),
        show(&answers[..3])
    );
    eprintln!("{figures}");
    assert!(all_decided_within(&answers, timeout + SLACK), "{figures}");
    assert!(loads <= 1 && evals <= 1, "{figures}");
}

/// The store's own runtime (multi-thread) shuts down with a batch on the wire and decisions
/// queued behind it: those on the wire hear that they may have run (not a stall), those never
/// sent are sent alone and decided, each within its timeout plus the slack, and nothing is
/// consumed twice.
///
/// Guards against (same cause as `after_the_stores_runtime_shut_down_the_next_decisions_are_decided`):
/// of the nine decisions never sent, the first sent alone fails with `broken pipe`, the error
/// of the connection whose driver died with the runtime; the other eight are decided.
#[test]
fn the_stores_runtime_shut_down_mid_batch_fails_only_what_was_on_the_wire() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(1500);
    let (own, store, main) = store_on_its_own_runtime(&redis, timeout, 64);
    let key = "redlimit:{mid-batch}";
    let before = main.block_on(consumed(&store, key));
    let sleeping = redis.debug_sleep(Duration::from_millis(400));
    std::thread::sleep(Duration::from_millis(20));
    let one = |store: &RedisStore| {
        let store = store.clone();
        async move {
            let quotas = shared_quota();
            let started = Instant::now();
            let answer = store
                .check(on_shared("redlimit:{mid-batch}", &quotas, 1))
                .await;
            (answer, started.elapsed())
        }
    };
    let lead = main.spawn(one(&store));
    std::thread::sleep(Duration::from_millis(20));
    let queued: Vec<_> = (0..10).map(|_| main.spawn(one(&store))).collect();
    std::thread::sleep(Duration::from_millis(60));
    own.shutdown_timeout(Duration::from_millis(100));
    let (lead, queued) = main.block_on(async {
        let lead = lead.await.unwrap();
        let mut answers = Vec::new();
        for task in queued {
            answers.push(task.await.unwrap());
        }
        (lead, answers)
    });
    sleeping.join().unwrap();
    let used = main.block_on(async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        consumed(&store, key).await
    }) - before;
    let decided = queued.iter().filter(|(a, _)| a.is_ok()).count();
    let figures = format!(
        "consumed {used}; lead {}; queued ({decided} decided): {}",
        show(std::slice::from_ref(&lead)),
        show(&queued)
    );
    eprintln!("{figures}");
    assert!(none_past(&queued, timeout + SLACK), "{figures}");
    // The first queued decision went in the sender's call; the other nine were never sent.
    assert!(decided >= 9, "{figures}");
    assert!(used <= 11 && used as usize >= decided, "{figures}");
}

/// The same on Sentinel (a plain connection to the primary, replaced when dropped).
#[test]
fn through_sentinel_after_the_stores_runtime_shut_down_the_next_decisions_are_decided() {
    use support::sentinel::{RedisSentinel, MASTER_NAME};
    let setup = RedisSentinel::start();
    let builder = RedisStore::sentinel_builder(setup.sentinel_urls(), MASTER_NAME);
    let (next, store) = outliving_its_first_runtime(builder);
    let answers = next.block_on(one_by_one(&store, "next", 5));
    let failed = answers.iter().filter(|(answer, _)| answer.is_err()).count();
    eprintln!("sentinel: {failed} failed: {}", show(&answers));
    assert!(
        answers[1..].iter().all(|(answer, _)| answer.is_ok()),
        "{failed} of {} decisions after the store's runtime shut down failed: {}",
        answers.len(),
        show(&answers)
    );
}

/// A runtime that shuts down while a full queue's call is in flight (the sender task of that
/// call dropped with the runtime, never finishing) must not leave the group's call counted as
/// in flight for good: a store outlives a runtime (a test's, an application's that restarts its
/// runtime), and the next runtime's decisions must reach Redis.
fn a_runtime_shut_down_with_a_full_queue_in_flight_leaves_the_store_usable_with(max_batch: usize) {
    let redis = RedisServer::start();
    let store = new_store(&redis, Duration::from_millis(500), max_batch);
    let first = support::current_thread_runtime();
    let sleeping = first.block_on(async {
        store.verify().await.expect("Redis is up");
        let sleeping = redis.debug_sleep(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(30)).await;
        // One call alone on the wire, then a full queue behind it (sent at once by a task).
        for (i, key) in keys("shutdown", DEFAULT_MAX_BATCH + 1)
            .into_iter()
            .enumerate()
        {
            let store = store.clone();
            tokio::spawn(async move {
                let quotas = generous();
                let _ = store
                    .check(request(&key, &quotas, Algorithm::TokenBucket))
                    .await;
            });
            if i == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        sleeping
    });
    // Every task is dropped with the runtime, while Redis still sleeps.
    drop(first);
    sleeping.join().unwrap();
    redis.reset_stats();

    let second = support::current_thread_runtime();
    let decided = second.block_on(decided_within(&store, "redlimit:{after-shutdown}", 10));
    let calls = redis.command_calls("evalsha") + redis.command_calls("eval");
    assert!(
        decided.is_ok(),
        "after a runtime shut down with a full queue in flight, no decision of the next \
         runtime reached Redis ({calls} script calls): {decided:?}"
    );
}

batched_and_unbatched! {
    fn a_runtime_shut_down_with_a_full_queue_in_flight_leaves_the_store_usable,
    a_runtime_shut_down_with_a_full_queue_in_flight_leaves_the_store_usable_unbatched
        = a_runtime_shut_down_with_a_full_queue_in_flight_leaves_the_store_usable_with
}
