//! Fleet-wide concurrency limits: never more than N in flight per key across instances, and a
//! dead instance's slots come back within one lease.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use redlimit::concurrency::ConcurrencyLimitLayer;
use redlimit::concurrency::{ConcurrencyLimiter, SlotOutcome};
use redlimit::key::GlobalKey;
use redlimit::store::MemoryStore;
use redlimit::{Limiter, Quota};
use tower::{Layer, Service, ServiceExt};

use crate::support::{Ctx, RedisServer};

mod faults;
mod redis_count;

/// What the inner service counts: requests in it now, the most at once, and all it served.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
    served: AtomicUsize,
}

fn slow(
    counts: Arc<InFlight>,
    hold: Duration,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = std::convert::Infallible,
    Future = impl std::future::Future<
        Output = Result<Response<Full<Bytes>>, std::convert::Infallible>,
    > + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: Request<Full<Bytes>>| {
        let counts = counts.clone();
        async move {
            let now = counts.now.fetch_add(1, Ordering::SeqCst) + 1;
            counts.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            counts.now.fetch_sub(1, Ordering::SeqCst);
            counts.served.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    })
}

fn slots(redis: &RedisServer, lease: Duration) -> ConcurrencyLimiter {
    ConcurrencyLimiter::with_options(Ctx::default().redis(redis), 5, lease, "exports").unwrap()
}

/// 3 instances, 60 concurrent slow requests on one key of N = 5, each retried after a 429
/// until served: the inner services never see more than 5 at once (and do see 5), all 60 are
/// served, and every 429 says when to come back and in which unit.
#[tokio::test]
async fn never_more_than_n_in_flight_across_three_instances() {
    let redis = RedisServer::start();
    let counts = Arc::new(InFlight::default());
    let services: Vec<_> = (0..3)
        .map(|_| {
            let layer = ConcurrencyLimitLayer::new(
                slots(&redis, Duration::from_secs(30)),
                GlobalKey::new("k"),
                "exports",
            )
            .unwrap();
            layer.layer(slow(counts.clone(), Duration::from_millis(60)))
        })
        .collect();
    let refused = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for i in 0..60 {
        let svc = services[i % 3].clone();
        let refused = refused.clone();
        clients.push(tokio::spawn(async move {
            loop {
                let response = svc
                    .clone()
                    .oneshot(Request::new(Full::new(Bytes::new())))
                    .await
                    .unwrap();
                if response.status() == StatusCode::OK {
                    // The slot goes back when the body ends.
                    response.into_body().collect().await.unwrap();
                    return;
                }
                assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(response.headers()["retry-after"], "1");
                assert_eq!(
                    response.headers()["ratelimit-policy"],
                    "\"exports\";q=5;qu=\"concurrent-requests\""
                );
                refused.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(counts.served.load(Ordering::SeqCst), 60);
    assert_eq!(
        counts.most.load(Ordering::SeqCst),
        5,
        "never more than 5, and 5 reached"
    );
    assert!(refused.load(Ordering::SeqCst) > 0);
    eprintln!(
        "concurrency: 60 served, at most {} at once, {} refusals",
        counts.most.load(Ordering::SeqCst),
        refused.load(Ordering::SeqCst)
    );
}

/// An instance holding 5 slots dies (its limiter and store dropped, nothing given back): the
/// other instances find the key full, then free again within one lease (1 s).
#[tokio::test]
async fn a_dead_instance_frees_its_slots_within_the_lease() {
    let redis = RedisServer::start();
    let lease = Duration::from_secs(1);
    let counts = Arc::new(InFlight::default());
    let layer =
        ConcurrencyLimitLayer::new(slots(&redis, lease), GlobalKey::new("k"), "exports").unwrap();
    let svc = layer.layer(slow(counts.clone(), Duration::from_secs(3_600)));
    let mut held = Vec::new();
    for _ in 0..5 {
        let svc = svc.clone();
        held.push(tokio::spawn(async move {
            svc.oneshot(Request::new(Full::new(Bytes::new()))).await
        }));
    }
    while counts.now.load(Ordering::SeqCst) < 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Kill the instance: first its limiter (every clone), then its requests.
    drop((svc, layer));
    let killed = Instant::now();
    for task in held {
        task.abort();
    }
    let other = slots(&redis, lease);
    assert!(
        matches!(other.acquire("k").await, SlotOutcome::Full { .. }),
        "still held"
    );
    let freed = loop {
        match other.acquire("k").await {
            SlotOutcome::Acquired(slot) => break (killed.elapsed(), slot),
            SlotOutcome::Full { wait } => {
                assert!(wait <= lease);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            outcome => panic!("{outcome:?}"),
        }
    };
    assert!(
        freed.0 <= lease + Duration::from_millis(300),
        "{:?}",
        freed.0
    );
    assert!(freed.0 >= lease / 2, "not given back early: {:?}", freed.0);
    eprintln!(
        "concurrency: a dead instance's 5 slots freed after {:?} (lease {lease:?})",
        freed.0
    );
}

/// Two instances of `limit` slots a key in `scope` (each a limiter on a connection of its own to
/// `redis`), with leases of `lease`.
fn two_instances(
    redis: &RedisServer,
    limit: u64,
    lease: Duration,
    scope: &str,
) -> [ConcurrencyLimiter; 2] {
    [(); 2].map(|_| {
        ConcurrencyLimiter::with_options(Ctx::default().redis(redis), limit, lease, scope).unwrap()
    })
}

/// A live holder renews its leases: a request longer than several leases keeps its slot.
#[tokio::test]
async fn a_live_holder_keeps_its_slot_past_the_lease() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(300);
    let [one, other] = two_instances(&redis, 1, lease, "long");
    let SlotOutcome::Acquired(slot) = one.acquire("k").await else {
        panic!()
    };
    tokio::time::sleep(lease * 4).await;
    assert!(matches!(other.acquire("k").await, SlotOutcome::Full { .. }));
    drop(slot);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(other.acquire("k").await, SlotOutcome::Acquired(_)));
}

/// The memory store's slots, the same way.
#[tokio::test]
async fn slots_in_memory() {
    let slots =
        ConcurrencyLimiter::with_options(Ctx::default().memory(), 2, Duration::from_secs(5), "m")
            .unwrap();
    let SlotOutcome::Acquired(a) = slots.acquire("k").await else {
        panic!()
    };
    assert_eq!(a.remaining(), 1);
    let SlotOutcome::Acquired(_b) = slots.acquire("k").await else {
        panic!()
    };
    assert!(matches!(slots.acquire("k").await, SlotOutcome::Full { .. }));
    assert!(matches!(
        slots.acquire("other").await,
        SlotOutcome::Acquired(_)
    ));
    drop(a);
    tokio::task::yield_now().await;
    assert!(matches!(slots.acquire("k").await, SlotOutcome::Acquired(_)));
}

/// The memory store loses slots too (a key evicted at its cap of keys): the holder puts them
/// back at its next renewal, as on Redis, and the key counts them again.
#[tokio::test]
async fn slots_evicted_from_memory_are_put_back() {
    let store = MemoryStore::with_max_keys(64); // one key per shard
    let lease = Duration::from_millis(300);
    let slots =
        ConcurrencyLimiter::with_options(Ctx::default().limiter(store.clone()), 2, lease, "m")
            .unwrap();
    let (SlotOutcome::Acquired(_a), SlotOutcome::Acquired(_b)) =
        (slots.acquire("k").await, slots.acquire("k").await)
    else {
        panic!("two slots")
    };
    let key = slots.slots_key("k");
    let held = |store: &MemoryStore| {
        let now = redlimit::clock::Clock::System.now_micros().unwrap();
        store
            .stored_state(&key, now)
            .map_or(0, |bytes| bytes.len() / 16)
    };
    // A flood of other keys evicts the slots' key.
    let flood = Limiter::new(store.clone());
    let quota = Quota::per_hour(10).unwrap();
    for client in 0..2_000 {
        flood.check(&format!("client-{client}"), &quota).await;
    }
    // No await yields in between (the memory store answers at once): no renewal ran yet.
    let lost = held(&store);
    assert_eq!(lost, 0, "the flood evicted the slots' key");
    let started = Instant::now();
    let mut counted = lost;
    while counted < 2 && started.elapsed() < lease * 5 / 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        counted = held(&store);
    }
    eprintln!(
        "memory: {lost} slots counted after the flood, {counted} after {:?} (2 held)",
        started.elapsed()
    );
    assert_eq!(counted, 2);
    assert!(matches!(slots.acquire("k").await, SlotOutcome::Full { .. }));
}

/// On Cluster: the slots of a key live in one slot (its hash tag), taken and given back.
#[tokio::test]
async fn slots_on_cluster() {
    let cluster = crate::support::RedisCluster::start();
    let limiter = Ctx::default().cluster(&cluster);
    let slots = ConcurrencyLimiter::with_options(limiter, 2, Duration::from_secs(5), "c").unwrap();
    for key in ["a", "b", "tenant-42"] {
        let SlotOutcome::Acquired(first) = slots.acquire(key).await else {
            panic!("{key}")
        };
        let SlotOutcome::Acquired(_second) = slots.acquire(key).await else {
            panic!("{key}")
        };
        assert!(
            matches!(slots.acquire(key).await, SlotOutcome::Full { .. }),
            "{key}"
        );
        drop(first);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            matches!(slots.acquire(key).await, SlotOutcome::Acquired(_)),
            "{key}"
        );
    }
}

/// A gRPC request that finds every slot taken gets a trailers-only RESOURCE_EXHAUSTED (HTTP
/// 200, `grpc-status: 8`, the retry hint in `grpc-retry-pushback-ms`), as the rate layer
/// answers it; a plain HTTP one gets 429. Both carry `Retry-After` and the policy's
/// `qu="concurrent-requests"`.
#[tokio::test]
async fn a_full_key_answers_grpc_in_grpc() {
    let slots =
        ConcurrencyLimiter::with_options(Ctx::default().memory(), 1, Duration::from_secs(5), "g")
            .unwrap();
    let counts = Arc::new(InFlight::default());
    let layer = ConcurrencyLimitLayer::new(slots, GlobalKey::new("k"), "grpc").unwrap();
    let svc = layer.layer(slow(counts.clone(), Duration::from_secs(3_600)));
    let holder = {
        let svc = svc.clone();
        tokio::spawn(async move { svc.oneshot(Request::new(Full::new(Bytes::new()))).await })
    };
    while counts.now.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let grpc = Request::builder()
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = svc.clone().oneshot(grpc).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let header = |name: &str| {
        answer
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(header("grpc-status").as_deref(), Some("8"));
    assert_eq!(header("content-type").as_deref(), Some("application/grpc"));
    assert_eq!(header("grpc-retry-pushback-ms").as_deref(), Some("1000"));
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    assert!(
        header("ratelimit-policy")
            .unwrap()
            .contains("qu=\"concurrent-requests\""),
        "{:?}",
        answer.headers()
    );
    let http = svc
        .clone()
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    assert_eq!(http.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        http.headers().get("retry-after").unwrap().to_str().unwrap(),
        "1"
    );
    assert_eq!(counts.served.load(Ordering::SeqCst), 0);
    holder.abort();
}
