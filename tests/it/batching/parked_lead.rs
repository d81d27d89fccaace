//! A store's check futures left behind by their callers on one key: a lead call alone in
//! flight parked (polled once, then neither polled nor dropped) while 63 decisions queue
//! behind it, and futures dropped after each of their first polls. Every decision is made
//! within the store's timeout, and Redis counts exactly the admissions.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::{RedisStore, Store, StoreError, DEFAULT_MAX_BATCH};
use redlimit::{Decision, Quota, Quotas};

use super::{
    assert_later_decisions_go_alone, batched_and_unbatched, on_shared as on, warm_store, SLACK,
};
use crate::support::RedisServer;

/// The quota of the one key: 40 an hour, fewer than the 64 decisions made on it.
const LIMIT: u64 = 40;

fn forty() -> Quotas {
    Quota::per_hour(LIMIT).unwrap().into()
}

/// Units Redis counts on `key` under [`forty`]: a peek (cost 0).
async fn counted(store: &RedisStore, key: &str) -> u64 {
    let quotas = forty();
    LIMIT - store.check(on(key, &quotas, 0)).await.unwrap().remaining
}

/// Polls `future` once with a waker that does nothing; `true` if it is still pending.
fn poll_once<F: Future + Unpin>(future: &mut F) -> bool {
    let waker = futures::task::noop_waker();
    let mut context = Context::from_waker(&waker);
    Pin::new(future).poll(&mut context).is_pending()
}

/// The store's timeout here.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The admissions among `answers`, each of which must be decided.
fn all_admitted(answers: &[Result<Decision, StoreError>]) -> u64 {
    let errors: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(errors.is_empty(), "undecided: {errors:?}");
    answers
        .iter()
        .filter(|a| a.as_ref().unwrap().allowed)
        .count() as u64
}

/// The decision of the parked `what` ("lead", "decision"), polled again at last: it must come
/// within the timeout.
async fn decided_at_last(
    parked: impl Future<Output = Result<Decision, StoreError>>,
    what: &str,
) -> Decision {
    tokio::time::timeout(TIMEOUT + SLACK, parked)
        .await
        .unwrap_or_else(|e| panic!("the parked {what} hangs: {e:?}"))
        .unwrap_or_else(|e| panic!("the parked {what} decided: {e:?}"))
}

/// Asserts that the 64 decisions on `key` admitted `admitted`, exactly [`LIMIT`], and that
/// Redis counts as many.
async fn assert_forty_counted(store: &RedisStore, key: &str, admitted: u64) {
    assert_eq!(admitted, LIMIT, "admitted of 64 under a quota of {LIMIT}");
    assert_eq!(counted(store, key).await, admitted, "Redis's count");
}

/// The lead (alone in flight behind a `DEBUG SLEEP`) polled once and parked; 63 decisions on
/// the same key queue behind it: each is decided within the timeout; the parked lead, polled
/// again at last, is decided too; 40 of the 64 are admitted and Redis counts 40.
async fn a_parked_lead_holds_up_none_of_63_queued_and_redis_counts_the_admissions_with(
    max_batch: usize,
) {
    let redis = RedisServer::start();
    let store = warm_store(&redis, TIMEOUT, max_batch).await;
    let key = "redlimit:{parked-lead}";
    let quotas = forty();
    let sleeping = redis.asleep(Duration::from_millis(300)).await;
    let mut parked = Box::pin(store.check(on(key, &quotas, 1)));
    assert!(poll_once(&mut parked), "the lead decided behind a sleep");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    let answers = join_all((0..63).map(|_| store.check(on(key, &quotas, 1)))).await;
    let took = started.elapsed();
    sleeping.join().unwrap();
    assert!(took <= TIMEOUT + SLACK, "the 63 took {took:?}");
    let decided = all_admitted(&answers);
    let lead = decided_at_last(parked, "lead").await;
    assert_forty_counted(&store, key, decided + u64::from(lead.allowed)).await;
}

batched_and_unbatched!(
    async fn a_parked_lead_holds_up_none_of_63_queued_and_redis_counts_the_admissions,
    a_parked_lead_holds_up_none_of_63_queued_and_redis_counts_the_admissions_unbatched =
        a_parked_lead_holds_up_none_of_63_queued_and_redis_counts_the_admissions_with
);

/// A queued decision parked (polled once, then neither polled nor dropped) among 63 others on
/// one key behind a lead in flight: the others and the lead are decided within the timeout,
/// and Redis counts their admissions plus the parked one's, once it is polled to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_queued_decision_holds_up_none_of_63_on_one_key_and_redis_counts_the_admissions() {
    let redis = RedisServer::start();
    let store = warm_store(&redis, TIMEOUT, DEFAULT_MAX_BATCH).await;
    let key = "redlimit:{parked-queued}";
    let quotas = forty();
    let sleeping = redis.asleep(Duration::from_millis(300)).await;
    let lead = store.check(on(key, &quotas, 1));
    let rest = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut parked = Box::pin(store.check(on(key, &quotas, 1)));
        assert!(poll_once(&mut parked));
        let started = Instant::now();
        let others = join_all((0..62).map(|_| store.check(on(key, &quotas, 1)))).await;
        (parked, others, started.elapsed())
    };
    let (lead, (parked, others, took)) = tokio::join!(lead, rest);
    sleeping.join().unwrap();
    assert!(took <= TIMEOUT + SLACK, "the others took {took:?}");
    let lead = lead.expect("the lead decided");
    let decided = all_admitted(&others);
    let parked = decided_at_last(parked, "decision").await;
    let admitted = decided + u64::from(lead.allowed) + u64::from(parked.allowed);
    assert_forty_counted(&store, key, admitted).await;
}

/// Futures dropped after one poll: the lead alone in flight and 20 queued behind it, all on
/// one key behind a `DEBUG SLEEP`. Redis counts at least the lead (sent) and at most the 21;
/// later decisions go alone, and 10 more decisions count exactly 10 more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_dropped_after_one_poll_queued_and_alone_count_at_most_once_and_block_nothing() {
    let redis = RedisServer::start();
    let store = warm_store(&redis, TIMEOUT, DEFAULT_MAX_BATCH).await;
    let key = "redlimit:{dropped-all}";
    let quotas: Quotas = Quota::per_hour(100_000).unwrap().into();
    let peek = |store: &RedisStore| {
        let store = store.clone();
        async move {
            let quotas: Quotas = Quota::per_hour(100_000).unwrap().into();
            100_000 - store.check(on(key, &quotas, 0)).await.unwrap().remaining
        }
    };
    let sleeping = redis.asleep(Duration::from_millis(250)).await;
    let mut lead = Box::pin(store.check(on(key, &quotas, 1)));
    assert!(poll_once(&mut lead));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut queued: Vec<_> = (0..20)
        .map(|_| Box::pin(store.check(on(key, &quotas, 1))))
        .collect();
    for future in &mut queued {
        assert!(poll_once(future));
    }
    drop(lead);
    drop(queued);
    sleeping.join().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let count = peek(&store).await;
    assert!(
        (1..=21).contains(&count),
        "Redis counts {count} of 21 sent at most"
    );
    assert_later_decisions_go_alone(&redis, &store, "after-drops", "after dropped checks").await;
    let more = join_all((0..10).map(|_| store.check(on(key, &quotas, 1)))).await;
    assert!(more.iter().all(Result::is_ok), "{more:?}");
    assert_eq!(peek(&store).await, count + 10, "10 more decisions");
}

/// A batching and an unbatched store, 64 concurrent decisions of cost 1 each on one key of
/// quota 40 queued behind a `DEBUG SLEEP`: both admit exactly 40 and Redis counts 40 for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batching_and_an_unbatched_store_admit_the_same_under_one_quota() {
    let redis = RedisServer::start();
    let mut admitted_by = Vec::new();
    for (name, max_batch) in [("batching", DEFAULT_MAX_BATCH), ("unbatched", 1)] {
        let store = warm_store(&redis, TIMEOUT, max_batch).await;
        let key = format!("redlimit:{{compare-{name}}}");
        let quotas = forty();
        let sleeping = redis.asleep(Duration::from_millis(200)).await;
        let answers = join_all((0..64).map(|_| store.check(on(&key, &quotas, 1)))).await;
        sleeping.join().unwrap();
        let admitted = answers
            .iter()
            .map(|a| a.as_ref().expect("decided"))
            .filter(|d| d.allowed)
            .count() as u64;
        assert_eq!(
            counted(&store, &key).await,
            admitted,
            "{name}: Redis's count"
        );
        admitted_by.push(admitted);
    }
    assert_eq!(admitted_by, [LIMIT, LIMIT], "batching, unbatched");
}

/// Checks dropped after 1 to 3 polls (a yield between polls), Redis idle, each alone in flight
/// when dropped, 30 times on one key: Redis counts each at most once, the group is left clean
/// (later decisions go alone), and 10 more decisions count exactly 10 more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_alone_in_flight_dropped_after_each_poll_count_at_most_once_and_leave_no_call_counted(
) {
    let redis = RedisServer::start();
    let store = warm_store(&redis, TIMEOUT, DEFAULT_MAX_BATCH).await;
    let key = "redlimit:{dropped-alone}";
    let quotas: Quotas = Quota::per_hour(100_000).unwrap().into();
    let peek = || async { 100_000 - store.check(on(key, &quotas, 0)).await.unwrap().remaining };
    let mut pending_drops = 0;
    for round in 0..30 {
        let mut check = Box::pin(store.check(on(key, &quotas, 1)));
        let mut pending = true;
        for _ in 0..=(round % 3) {
            pending = poll_once(&mut check);
            if !pending {
                break;
            }
            tokio::task::yield_now().await;
        }
        pending_drops += u64::from(pending);
        drop(check);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let count = peek().await;
    assert!(count <= 30, "Redis counts {count} of 30 checks");
    assert!(pending_drops > 0, "every check decided within its polls");
    assert_later_decisions_go_alone(&redis, &store, "after-alone", "after dropped lone checks")
        .await;
    let more = join_all((0..10).map(|_| store.check(on(key, &quotas, 1)))).await;
    assert!(more.iter().all(Result::is_ok), "{more:?}");
    assert_eq!(peek().await, count + 10, "10 more decisions");
}
