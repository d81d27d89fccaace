//! Batched decisions whose callers go away: futures dropped at every await, parked after one
//! poll, dropped outside any runtime, or left unpolled on the wire. Each decision runs at most
//! once, consumes only what was sent, and no queue waits for a caller that never comes back.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::{CheckRequest, Store, StoreError, DEFAULT_MAX_BATCH};
use redlimit::Algorithm;

use super::sender::main_runtime;
use super::{
    all_decided_within, assert_later_decisions_go_alone, batched_and_unbatched, consumed, decide,
    decided_within, generous, keys, new_store, on_shared, request, runtime_and_store, shared_quota,
    show, text, timed_owned, together, together_owned, warm_store,
};
use crate::support::{self, RedisServer};

/// Polls `future` once with a waker that does nothing; `true` if it is still pending.
fn poll_once<F: Future + Unpin>(future: &mut F) -> bool {
    let waker = futures::task::noop_waker();
    let mut context = Context::from_waker(&waker);
    Pin::new(future).poll(&mut context).is_pending()
}

/// Decisions dropped at every await: a queued one before its batch is sent, after it is sent,
/// the lone leader after its call is on the wire, and one dropped outside any poll. Promise:
/// "A decision whose caller went away before its call was sent is left out of it and consumes
/// nothing"; nothing is decided twice; and the group's bookkeeping is left clean (later
/// decisions go alone, as if nothing had happened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_dropped_at_every_await_consume_only_what_was_sent_and_leave_no_call_counted() {
    let redis = RedisServer::start();
    let store = warm_store(&redis, Duration::from_secs(2), DEFAULT_MAX_BATCH).await;
    let key = "redlimit:{shared}";
    let quotas = shared_quota();
    for round in 0..3 {
        let before = consumed(&store, key).await;
        let sleeping = redis.asleep(Duration::from_millis(250)).await;
        // The leader: alone, its call on the wire behind the sleep.
        let mut lead = Box::pin(store.check(on_shared(key, &quotas, 1)));
        assert!(poll_once(&mut lead));
        // The first queued decision goes at once in a sender's call (behind the sleep too);
        // the rest wait for that call to end.
        let mut queued: Vec<_> = (0..20)
            .map(|_| Box::pin(store.check(on_shared(key, &quotas, 1))))
            .collect();
        for future in &mut queued {
            assert!(poll_once(future));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Dropped: the sender's first (already sent), every odd one (never sent), and on the
        // last round the leader (sent).
        let mut kept = Vec::new();
        for (i, future) in queued.into_iter().enumerate() {
            if i == 0 || i % 2 == 1 {
                drop(future);
            } else {
                kept.push(future);
            }
        }
        let lead_kept = if round == 2 {
            drop(lead);
            None
        } else {
            Some(lead)
        };
        let answers = join_all(kept).await;
        if let Some(lead) = lead_kept {
            lead.await.unwrap();
        }
        sleeping.join().unwrap();
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        // Sent: the leader, the first queued, the 9 kept even ones after the first (i = 2..18).
        let expected = 1 + 1 + answers.len() as u64;
        let after = consumed(&store, key).await;
        eprintln!(
            "round {round}: consumed {} for {expected} sent",
            after - before
        );
        assert_eq!(
            after - before,
            expected,
            "round {round}: consumed {} for {expected} decisions sent (10 dropped unsent)",
            after - before
        );
    }
    assert_later_decisions_go_alone(&redis, &store, "after-drops", "after the drops").await;
}

/// A queued decision polled once and then parked (never polled, never dropped) while its batch
/// is sent: the others queued with it are decided, the parked one is consumed once (its call
/// was sent), and later decisions go alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_queued_decision_holds_up_nothing_and_is_decided_once() {
    let redis = RedisServer::start();
    let store = warm_store(&redis, Duration::from_secs(1), DEFAULT_MAX_BATCH).await;
    let key = "redlimit:{parked-shared}";
    let quotas = shared_quota();
    let before = consumed(&store, key).await;
    let sleeping = redis.asleep(Duration::from_millis(200)).await;
    let lead = store.check(on_shared(key, &quotas, 1));
    let rest = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Two queued: one in the sender's first call, one behind it; then the parked one.
        let first = store.check(on_shared(key, &quotas, 1));
        let second = store.check(on_shared(key, &quotas, 1));
        let mut parked = Box::pin(store.check(on_shared(key, &quotas, 1)));
        let started = Instant::now();
        let (first, second, parked_pending) = {
            let both = futures::future::join(first, second);
            tokio::pin!(both);
            let pending = poll_once(&mut parked);
            let (first, second) = both.await;
            (first, second, pending)
        };
        let took = started.elapsed();
        let others = together(&store, "around-parked", 5).await;
        (first, second, parked_pending, parked, took, others)
    };
    let (lead, (first, second, parked_pending, parked, took, others)) = tokio::join!(lead, rest);
    sleeping.join().unwrap();
    assert!(parked_pending);
    assert!(
        lead.is_ok() && first.is_ok() && second.is_ok(),
        "{lead:?} {first:?} {second:?}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(
        all_decided_within(&others, Duration::from_millis(300)),
        "{}",
        show(&others)
    );
    let beside = "beside a parked queued future";
    assert_later_decisions_go_alone(&redis, &store, "after-parked", beside).await;
    // lead, first, second, parked: 4 consumed, whatever became of the parked future.
    let after = consumed(&store, key).await;
    drop(parked);
    assert_eq!(after - before, 4, "consumed");
}

/// Guards against (documented only for the connection's driver, not for the sender): a task that polls
/// a queued decision once and then blocks its worker with synchronous work. The first poll
/// spawns the group's sender from that worker, into its LIFO slot, which no other worker
/// steals (tokio-rs/tokio#4941): every decision queued in that sender's group waits for the
/// blocked task's work. The docs (src/store/mod.rs, "The store's runtime") name this hazard
/// for "the connection's driver, which it woke into that slot"; they do not say that a queued
/// decision's first poll wakes the batch sender there, holding up other callers' queued
/// decisions ("No queued decision waits for another caller: not for its call, its task
/// (parked, or busy with synchronous work)").
#[test]
fn a_queued_decisions_first_poll_then_synchronous_work_holds_up_no_other_queued_decision() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(800);
    let (main, store) = runtime_and_store(main_runtime(), &redis, timeout, 64);
    let (queued, busy) = main.block_on(async {
        let sleeping = redis.asleep(Duration::from_millis(150)).await;
        // The lone leader, behind the sleep, on a task of its own.
        let lead = tokio::spawn(timed_owned(&store, "redlimit:{busy-lead}"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A task polls its decision once (queued: it spawns the group's sender), then works.
        let busy = tokio::spawn({
            let store = store.clone();
            async move {
                let quotas = generous();
                let mut mine =
                    Box::pin(store.check(request("redlimit:{busy}", &quotas, Algorithm::Gcra)));
                let pending = poll_once(&mut mine);
                std::thread::sleep(Duration::from_millis(1500));
                (pending, mine.await.is_ok())
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let queued = tokio::spawn(together_owned(&store, "behind-busy-poll", 6))
            .await
            .unwrap();
        let _ = lead.await;
        let busy = busy.await.unwrap();
        sleeping.join().unwrap();
        (queued, busy)
    });
    assert!(busy.0, "the busy task's decision was queued");
    assert!(
        all_decided_within(&queued, timeout),
        "other callers' decisions queued behind a sender spawned by a task that then blocked: {}",
        show(&queued)
    );
}

/// A first call whose future is dropped outside any runtime (a future kept in a struct that a
/// plain thread drops) must still hand its queue on: the decisions queued behind it are then
/// decided by Redis, not failed, and the group is not left with a call in flight for good.
fn a_first_call_dropped_outside_a_runtime_still_hands_its_queue_on_with(max_batch: usize) {
    let redis = RedisServer::start();
    let store = new_store(&redis, Duration::from_millis(1000), max_batch);
    let runtime = support::current_thread_runtime();
    runtime.block_on(store.verify()).expect("Redis is up");
    let sleeping = redis.debug_sleep(Duration::from_millis(300));
    std::thread::sleep(Duration::from_millis(30));
    let mut first = Box::pin(decide(&store, "redlimit:{dropped-outside}"));
    let queued = runtime.block_on(async {
        // The first call goes on the wire and waits behind the sleep.
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut first)
            .await
            .is_err());
        let queued: Vec<_> = keys("behind-dropped", 5)
            .into_iter()
            .map(|key| {
                let store = store.clone();
                tokio::spawn(async move { decide(&store, &key).await })
            })
            .collect();
        // They queue behind the first call.
        tokio::time::sleep(Duration::from_millis(20)).await;
        queued
    });
    // Outside the runtime: no `Handle::try_current()`.
    drop(first);
    let answers: Vec<String> = runtime
        .block_on(join_all(queued))
        .into_iter()
        .map(|answer| text(&answer.expect("the task ran")))
        .collect();
    sleeping.join().unwrap();
    let later = runtime.block_on(decided_within(&store, "redlimit:{later}", 3));
    for answer in &answers {
        assert!(
            !answer.starts_with("error"),
            "the decisions queued behind a first call dropped outside the runtime: {answers:?}; \
             the next decisions: {later:?}"
        );
    }
    assert!(later.is_ok(), "the next decisions: {later:?}");
}

batched_and_unbatched! {
    fn a_first_call_dropped_outside_a_runtime_still_hands_its_queue_on,
    a_first_call_dropped_outside_a_runtime_still_hands_its_queue_on_unbatched
        = a_first_call_dropped_outside_a_runtime_still_hands_its_queue_on_with
}

/// Callers that go away anywhere (an outer timeout, a `select!` that takes another branch, an
/// aborted task), while queued or while their call is in flight, and a Redis that sleeps past
/// the store's timeout meanwhile: each decision runs at most once (never twice), each caller
/// that stays hears within the timeout, and afterwards the queue is not stuck (a lone decision
/// goes alone, at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_dropped_anywhere_run_at_most_once_and_leave_no_queue_stuck() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(150);
    let store = new_store(&redis, timeout, DEFAULT_MAX_BATCH);
    store.verify().await.unwrap();
    let keys = keys("drop", 400);
    let mut rng = fastrand::Rng::with_seed(31);
    let started = Instant::now();
    let sleeper = {
        let client = redis.client();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let sleeping = support::debug_sleep_via(&client, Duration::from_millis(250));
            tokio::task::spawn_blocking(move || sleeping.join())
                .await
                .unwrap()
                .unwrap();
        })
    };
    let mut tasks = Vec::new();
    for key in &keys {
        let (store, key) = (store.clone(), key.clone());
        let (kind, arrive, cut) = (rng.u8(0..4), rng.u64(0..500), rng.u64(0..200));
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(arrive)).await;
            let quotas = generous();
            let check = store.check(request(&key, &quotas, Algorithm::TokenBucket));
            let sent = Instant::now();
            let answer = match kind {
                1 => tokio::time::timeout(Duration::from_millis(cut), check)
                    .await
                    .ok(),
                2 => tokio::select! {
                    answer = check => Some(answer),
                    _ = tokio::time::sleep(Duration::from_millis(cut)) => None,
                },
                _ => Some(check.await),
            };
            answer.map(|answer| (answer, sent.elapsed()))
        });
        let abort = (kind == 3).then(|| {
            let handle = task.abort_handle();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(arrive + cut)).await;
                handle.abort();
            })
        });
        tasks.push((task, abort));
    }
    let mut answers = Vec::new();
    for (task, _) in tasks {
        answers.push(task.await.ok().flatten());
    }
    sleeper.await.unwrap();
    println!("{} decisions over {:?}", keys.len(), started.elapsed());
    let quotas = generous();
    let mut consumed = Vec::new();
    for key in &keys {
        let peek = store
            .check(CheckRequest {
                cost: 0,
                ..request(key, &quotas, Algorithm::TokenBucket)
            })
            .await
            .unwrap();
        consumed.push(1_000 - peek.remaining);
    }
    let (mut heard, mut ran) = (0, 0);
    for ((key, answer), consumed) in keys.iter().zip(&answers).zip(&consumed) {
        assert!(*consumed <= 1, "{key} ran {consumed} times");
        ran += consumed;
        if let Some((answer, elapsed)) = answer {
            heard += 1;
            assert!(
                *elapsed <= timeout + Duration::from_millis(100),
                "{key}: heard after {elapsed:?} ({})",
                text(answer)
            );
            match answer {
                Ok(decision) => {
                    assert!(decision.allowed, "{key}");
                    assert_eq!(*consumed, 1, "{key} was admitted, so it ran");
                }
                Err(StoreError::Timeout(_)) => {}
                Err(error) => panic!("{key}: only a timeout may fail a decision here: {error}"),
            }
        }
    }
    println!("{heard} callers heard, {ran} decisions ran");
    redis.reset_stats();
    let lone = Instant::now();
    let decision = decide(&store, "redlimit:{after-drops}").await.unwrap();
    assert!(decision.allowed);
    assert!(
        lone.elapsed() < Duration::from_millis(100),
        "{:?}",
        lone.elapsed()
    );
    assert_eq!(
        redis.command_calls("evalsha"),
        1,
        "a lone decision goes alone"
    );
}

/// A first call whose caller polls it onto the wire and then leaves it unpolled for a while
/// (kept, not dropped: a `select!` loop busy elsewhere, a future polled once by hand) must not
/// hold up other callers' decisions: Redis answers them at once, as it would without
/// batching, within their timeout.
async fn a_first_call_whose_caller_stops_polling_does_not_hold_up_the_others_with(
    max_batch: usize,
) {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let store = new_store(&redis, timeout, max_batch);
    store.verify().await.unwrap();
    let sleeping = redis.debug_sleep(Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut parked = Box::pin(decide(&store, "redlimit:{parked}"));
    assert!(tokio::time::timeout(Duration::from_millis(20), &mut parked)
        .await
        .is_err());
    let keys = keys("behind-parked", 5);
    let started = Instant::now();
    let answers = join_all(keys.iter().map(|key| decide(&store, key))).await;
    let elapsed = started.elapsed();
    sleeping.join().unwrap();
    let parked = parked.await;
    let texts: Vec<String> = answers.iter().map(text).collect();
    assert!(
        answers.iter().all(Result::is_ok),
        "5 decisions behind a first call whose caller stopped polling it, Redis healthy: \
         {texts:?} after {elapsed:?} (the parked one, polled again: {})",
        text(&parked)
    );
}

batched_and_unbatched! {
    async fn a_first_call_whose_caller_stops_polling_does_not_hold_up_the_others,
    a_first_call_whose_caller_stops_polling_does_not_hold_up_the_others_unbatched
        = a_first_call_whose_caller_stops_polling_does_not_hold_up_the_others_with
}
