//! Connection tests: the store replaces a connection that is alive but useless, and reports
//! every timeout as `StoreError::Timeout`.
//!
//! A TCP proxy in front of real `redis-server` processes plays the network: it freezes the
//! connections open so far (no RST, no FIN), or sends new connections to another server. Each
//! test prints how long recovery took; see them with
//! `cargo test --test it connection:: -- --nocapture`.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::{RedisStore, StoreError, DEFAULT_TIMEOUT};
use redlimit::{Limiter, Quota};
use support::{RedisCluster, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// How long a test waits for the store to recover before it fails.
const RECOVERY_BOUND: Duration = Duration::from_secs(10);

/// A quota that never denies: these tests are about reaching Redis.
fn quota() -> Quota {
    Quota::per_second(1_000_000).unwrap()
}

fn addr(server: &RedisServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.port()))
}

/// Copies `from` to `to` until either side closes, or until the proxy's generation moves on
/// from `mine`: then it holds both sockets open and forwards nothing, for good.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    generation: Arc<AtomicU64>,
    mine: u64,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if generation.load(Ordering::SeqCst) != mine {
            let _keep = (from, to);
            return std::future::pending().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A TCP proxy in front of Redis: a VIP, a DNS name, a NAT. New connections go to the current
/// `upstream`; `freeze()` silently stops every connection open so far (a partition, a dead node
/// behind a VIP, a dropped conntrack entry: no RST, no FIN) while new ones forward normally.
///
/// With a connect delay ([`Proxy::start_slow`]) each new connection forwards nothing for that
/// long: a slow handshake (TLS, another zone).
struct Proxy {
    addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    generation: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        Self::start_slow(upstream, Duration::ZERO).await
    }

    /// A proxy that holds each new connection `connect_delay` before it forwards anything.
    async fn start_slow(upstream: SocketAddr, connect_delay: Duration) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let upstream = Arc::new(Mutex::new(upstream));
        let generation = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let (target, g, a) = (upstream.clone(), generation.clone(), accepted.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let target = *target.lock().unwrap();
                let g = g.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(connect_delay).await;
                    let Ok(server) = TcpStream::connect(target).await else {
                        return; // the client sees the connection closed
                    };
                    let mine = g.load(Ordering::SeqCst);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pump(cr, sw, g.clone(), mine));
                    tokio::spawn(pump(sr, cw, g.clone(), mine));
                });
            }
        });
        Proxy {
            addr,
            upstream,
            generation,
            accepted,
        }
    }

    fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Silently stops every connection open so far.
    fn freeze(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Sends new connections to `upstream`; open ones stay where they are.
    fn switch_to(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Checks until one succeeds, within [`RECOVERY_BOUND`].
async fn until_working(limiter: &Limiter) -> Result<(), StoreError> {
    let started = Instant::now();
    loop {
        match limiter.try_check_quotas("k", &quota().into(), 1).await {
            Ok(_) => return Ok(()),
            Err(e) if started.elapsed() > RECOVERY_BOUND => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// One check every 50 ms until one succeeds, within [`RECOVERY_BOUND`]: how long that took and
/// the errors seen until then.
async fn recover(limiter: &Limiter) -> (Option<Duration>, Vec<String>) {
    let started = Instant::now();
    let mut errors = Vec::new();
    while started.elapsed() < RECOVERY_BOUND {
        match limiter.try_check_quotas("k", &quota().into(), 1).await {
            Ok(_) => return (Some(started.elapsed()), errors),
            Err(e) => errors.push(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (None, errors)
}

/// `n` checks in a row; panics on the first failure.
async fn keeps_working(limiter: &Limiter, n: usize) {
    for i in 0..n {
        if let Err(e) = limiter.try_check_quotas("k", &quota().into(), 1).await {
            panic!("check {i} after recovery failed: {e}");
        }
    }
}

/// [`recover`], its distinct errors printed as `what` with the connections `proxy` opened;
/// panics with `never` when the store never recovered.
async fn recovered(
    limiter: &Limiter,
    proxy: &Proxy,
    what: &str,
    never: &str,
) -> (Duration, Vec<String>) {
    let (recovered, mut errors) = recover(limiter).await;
    errors.dedup();
    println!(
        "{what}: recovered after {recovered:?}, {} connections opened, errors {errors:?}",
        proxy.accepted()
    );
    (recovered.expect(never), errors)
}

/// A proxy in front of `redis`, and a limiter whose store works through the proxy.
async fn working_through_a_proxy(redis: &RedisServer) -> (Proxy, Limiter) {
    let proxy = Proxy::start(addr(redis)).await;
    let limiter = Limiter::new(RedisStore::new(proxy.url()).unwrap());
    until_working(&limiter)
        .await
        .expect("store never worked through the proxy");
    (proxy, limiter)
}

/// The connection goes silent while Redis stays reachable on new connections: the store gives
/// it up after a few timeouts and works again on a new one, instead of timing out for as long
/// as the kernel keeps the socket (~15 min of TCP retransmissions on Linux).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_connection_is_replaced() {
    let redis = RedisServer::start();
    let (proxy, limiter) = working_through_a_proxy(&redis).await;
    keeps_working(&limiter, 10).await;

    proxy.freeze();
    let never = "the store never replaced the silent connection";
    let (recovered, errors) = recovered(&limiter, &proxy, "silent connection", never).await;
    assert!(
        errors
            .iter()
            .all(|e| e.contains("timed out") || e.contains("unavailable")),
        "{errors:?}"
    );
    // 3 timeouts of 100 ms, 50 ms apart, then the new connection: ~0.5 s (1 s of margin).
    assert!(recovered < Duration::from_millis(1500), "{recovered:?}");
    assert_eq!(proxy.accepted(), 2, "one new connection");
    keeps_working(&limiter, 100).await;
}

/// The same under concurrent load: the calls that time out together replace the connection
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_timeouts_replace_the_connection_once() {
    let redis = RedisServer::start();
    let (proxy, limiter) = working_through_a_proxy(&redis).await;

    proxy.freeze();
    let started = Instant::now();
    let workers = (0..16).map(|_| {
        let limiter = limiter.clone();
        async move {
            let mut recovered = None;
            while started.elapsed() < RECOVERY_BOUND {
                if limiter
                    .try_check_quotas("k", &quota().into(), 1)
                    .await
                    .is_ok()
                {
                    recovered.get_or_insert(started.elapsed());
                    if started.elapsed() > Duration::from_secs(2) {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            recovered
        }
    });
    let recovered: Vec<Option<Duration>> = join_all(workers).await;
    println!(
        "silent connection, 16 workers: first recovered after {:?}, last after {:?}, {} connections opened",
        recovered.iter().flatten().min(),
        recovered.iter().flatten().max(),
        proxy.accepted()
    );
    assert!(
        recovered.iter().all(Option::is_some),
        "a worker never recovered: {recovered:?}"
    );
    assert_eq!(proxy.accepted(), 2, "replaced once");
    keeps_working(&limiter, 100).await;
}

/// Failover behind a stable address: the old primary A is demoted to a replica of B and the
/// address now leads to B. The store's connection to A is alive and answers READONLY; the
/// store drops it at the first READONLY and reconnects, to B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_to_a_demoted_primary_is_replaced() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    let (proxy, limiter) = working_through_a_proxy(&a).await;
    keeps_working(&limiter, 10).await;

    // Failover: B is the new primary, A its replica, the address leads to B.
    proxy.switch_to(addr(&b));
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(b.port())
        .query(&mut a.conn())
        .unwrap();
    let never = "the store never left the demoted primary";
    let (recovered, _) = recovered(&limiter, &proxy, "failover", never).await;
    assert!(recovered < Duration::from_secs(1), "{recovered:?}");
    keeps_working(&limiter, 100).await;
    assert!(b.dbsize() > 0, "the new primary holds the state");
    assert_eq!(proxy.accepted(), 2, "one new connection");
}

/// While Redis hangs, every failure is `StoreError::Timeout` (never a `StoreError::Redis` that
/// wraps redis-rs's own response timeout), so a policy can match on it; and the store works
/// again once Redis does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_timeout_is_store_error_timeout() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .without_circuit_breaker()
        .build()
        .unwrap();
    let limiter = Limiter::new(store);
    until_working(&limiter).await.expect("store never worked");

    let sleep = Duration::from_secs(3);
    let sleeper = redis.debug_sleep(sleep);
    let asleep = Instant::now();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (mut timeouts, mut others) = (0, Vec::new());
    // Well inside the sleep: every call must fail.
    while asleep.elapsed() < sleep - Duration::from_millis(500) {
        let started = Instant::now();
        match limiter.try_check_quotas("k", &quota().into(), 1).await {
            Err(StoreError::Timeout(after)) => {
                assert_eq!(after, DEFAULT_TIMEOUT);
                timeouts += 1;
            }
            other => others.push(format!("{other:?}")),
        }
        assert!(
            started.elapsed() < DEFAULT_TIMEOUT + Duration::from_millis(400),
            "a call took {:?}",
            started.elapsed()
        );
    }
    println!("during DEBUG SLEEP: {timeouts} StoreError::Timeout, others {others:?}");
    assert!(timeouts >= 10, "{timeouts} timeouts");
    assert!(others.is_empty(), "not StoreError::Timeout: {others:?}");

    sleeper.join().unwrap();
    let (recovered, _) = recover(&limiter).await;
    println!("after DEBUG SLEEP: recovered after {recovered:?}");
    recovered.expect("the store never worked again after the sleep");
    keeps_working(&limiter, 100).await;
}

/// How long the slow proxy holds each new connection: three times the default timeout.
const SLOW_CONNECT: Duration = Duration::from_millis(300);

/// Checks every 20 ms until one succeeds (within [`RECOVERY_BOUND`]): how long that took, how
/// many failed first, and whether every failure was a timeout (the failure policy's case).
async fn first_success(limiter: &Limiter) -> (Option<Duration>, usize, Vec<String>) {
    let started = Instant::now();
    let mut errors = Vec::new();
    while started.elapsed() < RECOVERY_BOUND {
        match limiter.try_check_quotas("k", &quota().into(), 1).await {
            Ok(_) => return (Some(started.elapsed()), errors.len(), errors),
            Err(e) => errors.push(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (None, errors.len(), errors)
}

/// The first Cluster connection goes through a seed whose handshake takes longer than the
/// default 100 ms timeout: it is made in the background, not restarted by every call, and
/// the store works with the default timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_cluster_connection_is_made_in_the_background() {
    let cluster = RedisCluster::start();
    let proxy = Proxy::start_slow(addr(&cluster.nodes()[0]), SLOW_CONNECT).await;
    let store = RedisStore::cluster([proxy.url()]).unwrap();
    assert_eq!(store.timeout(), DEFAULT_TIMEOUT);
    let limiter = Limiter::new(store);
    let (connected, failures, mut errors) = first_success(&limiter).await;
    errors.dedup();
    println!(
        "cluster behind a {SLOW_CONNECT:?} handshake: first success after {connected:?}, \
         {failures} calls failed first, {} seed connections, errors {errors:?}",
        proxy.accepted()
    );
    connected.expect("the cluster connection was never made");
    assert!(
        errors
            .iter()
            .all(|e| e.contains("timed out") || e.contains("unavailable")),
        "{errors:?}"
    );
    keeps_working(&limiter, 100).await;
}

/// The same for a single node: one connection, made in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_connection_is_made_in_the_background() {
    let redis = RedisServer::start();
    let proxy = Proxy::start_slow(addr(&redis), SLOW_CONNECT).await;
    let limiter = Limiter::new(RedisStore::new(proxy.url()).unwrap());
    let (connected, failures, _) = first_success(&limiter).await;
    println!(
        "single node behind a {SLOW_CONNECT:?} handshake: first success after {connected:?}, \
         {failures} calls failed first, {} connections",
        proxy.accepted()
    );
    connected.expect("the connection was never made");
    assert_eq!(proxy.accepted(), 1, "one connection attempt");
    keeps_working(&limiter, 100).await;
}
