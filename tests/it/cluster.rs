//! Redis Cluster: a real three-master cluster from tests/support.

use crate::support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::RedisStore;
use redlimit::{Algorithm, Limiter, Quota};
use support::{cluster_limiter, RedisCluster};

/// Many keys land on every node, and every key admits exactly its limit even when 4 limiters on
/// 4 cluster connections race on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_spread_over_all_nodes_and_counts_are_exact() {
    let cluster = RedisCluster::start();
    let quota = Quota::per_hour(10).unwrap();
    for &algorithm in Algorithm::ALL {
        let limiters: Vec<Limiter> = (0..4)
            .map(|_| cluster_limiter(&cluster, algorithm))
            .collect();
        let keys: Vec<String> = (0..24).map(|i| format!("{algorithm}-tenant-{i}")).collect();

        let nodes: BTreeSet<usize> = keys
            .iter()
            .map(|key| cluster.node_for_key(&limiters[0].storage_key(key)))
            .collect();
        assert_eq!(
            nodes.len(),
            3,
            "{algorithm}: keys must spread over all three masters"
        );

        let checks = keys.iter().flat_map(|key| {
            limiters
                .iter()
                .cycle()
                .take(30)
                .map(move |limiter| async move {
                    (key, limiter.try_check_quotas(key, &quota.into(), 1).await)
                })
        });
        let results = join_all(checks).await;
        for key in &keys {
            let admitted = results
                .iter()
                .filter(|(k, r)| *k == key && r.as_ref().expect("cluster answers").allowed)
                .count();
            assert_eq!(
                admitted, 10,
                "{algorithm}: {key} admitted {admitted} of 30, limit 10"
            );
        }
        println!("{algorithm}: 24 keys x 30 concurrent checks on 4 connections: exactly 10 admitted per key");
    }
    for (i, node) in cluster.nodes().iter().enumerate() {
        assert!(node.dbsize() > 0, "node {i} holds no limiter key");
    }
}

/// After SCRIPT FLUSH on every node the scripts reload by themselves: no call fails.
#[tokio::test]
async fn script_flush_on_all_nodes_reloads() {
    let cluster = RedisCluster::start();
    let limiter = cluster_limiter(&cluster, Algorithm::TokenBucket);
    // One token every 3.6 s: none refills between the rounds, even on a loaded machine.
    let quota = Quota::per_hour(1000).unwrap();
    for i in 0..20 {
        limiter
            .try_check_quotas(&format!("k{i}"), &quota.into(), 1)
            .await
            .expect("first round");
    }
    cluster.script_flush_all();
    for i in 0..20 {
        let decision = limiter
            .try_check_quotas(&format!("k{i}"), &quota.into(), 1)
            .await
            .expect("a NOSCRIPT reply reloads the script");
        assert_eq!(decision.remaining, 998);
    }
    assert_eq!(limiter.stats().store_errors, 0);
}

/// A master killed and restarted: the limiter serves again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_recovers() {
    let mut cluster = RedisCluster::start();
    let limiter = cluster_limiter(&cluster, Algorithm::TokenBucket);
    let quota = Quota::per_minute(1000).unwrap();
    // A key served by node 0.
    let key = (0..)
        .map(|i| format!("victim-{i}"))
        .find(|k| cluster.node_for_key(&limiter.storage_key(k)) == 0)
        .unwrap();
    limiter
        .try_check_quotas(&key, &quota.into(), 1)
        .await
        .expect("before");

    cluster.node_mut(0).stop();
    let down = limiter.try_check_quotas(&key, &quota.into(), 1).await;
    assert!(down.is_err(), "a dead master cannot decide: {down:?}");

    cluster.restart_node(0);
    let restarted = Instant::now();
    let deadline = restarted + Duration::from_secs(10);
    let recovered = loop {
        if limiter
            .try_check_quotas(&key, &quota.into(), 1)
            .await
            .is_ok()
        {
            break restarted.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "no recovery within 10 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("cluster node restart: serving again {recovered:?} after cluster_state:ok");
    // Keys on the other nodes were never affected.
    let other = (0..)
        .map(|i| format!("bystander-{i}"))
        .find(|k| cluster.node_for_key(&limiter.storage_key(k)) == 1)
        .unwrap();
    assert!(limiter
        .try_check_quotas(&other, &quota.into(), 1)
        .await
        .is_ok());
}

/// A TCP proxy in front of one cluster node that, while `cut` is set, forwards a script call
/// (`EVALSHA`/`EVAL`) to Redis and then closes the client's connection before the reply: the
/// script ran, and the client sees a dropped connection.
struct CuttingProxy {
    port: u16,
    cut: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
}

impl CuttingProxy {
    async fn start(upstream: SocketAddr) -> CuttingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU64::new(0));
        let (c, n) = (cut.clone(), cuts.clone());
        let accepted = Arc::new(AtomicU64::new(0));
        let a = accepted.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (c, n) = (c.clone(), n.clone());
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let replies = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    });
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let read = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(read) => read,
                        };
                        let chunk = &buf[..read];
                        let script = chunk.windows(4).any(|w| w.eq_ignore_ascii_case(b"EVAL"));
                        let cut_here = script && c.load(Ordering::SeqCst);
                        if cut_here {
                            // No reply reaches the client from now on.
                            replies.abort();
                            n.fetch_add(1, Ordering::SeqCst);
                        }
                        if sw.write_all(chunk).await.is_err() {
                            break;
                        }
                        if cut_here {
                            // Give Redis time to run it, then drop the client's connection.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            break;
                        }
                    }
                    replies.abort();
                });
            }
        });
        CuttingProxy {
            port,
            cut,
            cuts,
            accepted,
        }
    }
}

/// A connection that drops after a script call was written (the script ran) must not make
/// the store send the script again: one request, counted once. (With redis-rs's Cluster
/// retries on (`.retries(2)`), the dropped connection is retried and the request counted
/// twice: remaining 8.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_may_have_run_is_not_sent_again() {
    let cluster = RedisCluster::start();
    let node = &cluster.nodes()[0];
    let proxy = CuttingProxy::start(SocketAddr::from(([127, 0, 0, 1], node.port()))).await;
    let store = RedisStore::cluster_builder([cluster.nodes()[1].url()])
        .timeout(Duration::from_secs(2))
        .without_circuit_breaker()
        .build()
        .unwrap();
    let limiter = Limiter::new(store);
    let quota = Quota::per_hour(10).unwrap();
    let on_node_0 = |prefix: &'static str| {
        (0..)
            .map(move |i| format!("{prefix}-{i}"))
            .find(|k| cluster.node_for_key(&limiter.storage_key(k)) == 0)
            .unwrap()
    };
    let (warm, key) = (on_node_0("warm"), on_node_0("counted"));
    let announced = format!("127.0.0.1:{}@", proxy.port);
    // Node 0 tells clients to reach it through the proxy; its cluster bus stays where it is.
    let mut admin = node.conn();
    for (name, value) in [
        ("cluster-announce-bus-port", node.port() + 10000),
        ("cluster-announce-port", proxy.port),
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut admin)
            .unwrap();
    }
    // Wait until node 1 (the seed) has heard of it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut cluster.nodes()[1].conn())
            .unwrap();
        if nodes.contains(&announced) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "gossip never told node 1: {nodes}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    limiter
        .try_check_quotas(&warm, &quota.into(), 1)
        .await
        .expect("works through the proxy");

    proxy.cut.store(true, Ordering::SeqCst);
    let cut = limiter.try_check_quotas(&key, &quota.into(), 1).await;
    proxy.cut.store(false, Ordering::SeqCst);
    println!(
        "connection dropped after the script call: {cut:?}, {} cut(s), {} proxied connections",
        proxy.cuts.load(Ordering::SeqCst),
        proxy.accepted.load(Ordering::SeqCst)
    );
    assert!(
        cut.is_err(),
        "the caller sees the dropped connection: {cut:?}"
    );

    // Peek (cost 0) once the connection is back.
    let deadline = Instant::now() + Duration::from_secs(10);
    let remaining = loop {
        match limiter.try_check_quotas(&key, &quota.into(), 0).await {
            Ok(decision) => break decision.remaining,
            Err(e) if Instant::now() > deadline => panic!("no recovery: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    println!("remaining after one request: {remaining} of 10");
    assert_eq!(
        remaining, 9,
        "the request ran once (10 = never, less = re-sent)"
    );
}

// ---------------------------------------------------------------------------------------------
// Slot migration: a real slot moved between two masters while traffic runs.
// ---------------------------------------------------------------------------------------------

/// Decisions counted by one traffic task.
#[derive(Debug, Default)]
struct MigrationCounts {
    decisions: u64,
    during_move: u64,
    failed: u64,
    failed_during_move: u64,
    /// The distinct error messages.
    errors: Vec<String>,
    /// Decisions on the tenant suspended before the move, during the move: denied as
    /// suspended, and admitted (must stay 0). Its failures count in `failed`.
    suspended_denied: u64,
    suspended_admitted: u64,
}

/// One slot of node 0 moves to node 1 (`CLUSTER SETSLOT … IMPORTING/MIGRATING`, `MIGRATE` two
/// keys at a time, `SETSLOT … NODE`) while every algorithm checks keys of that slot: keys
/// used before the move and keys first seen during it. The store follows `ASK` (with `ASKING`,
/// to the node the error names) and `MOVED`, so no decision fails (none would fail open): a
/// call that got `ASK` and was sent by slot to the source again would give up, and every new
/// or moved key of the slot would go to the failure policy for the whole migration. And a
/// decision reads the route's key and the tenant's (for the sliding log also its controls'),
/// which Redis refuses in a migrating slot while some exist and some do not (`TRYAGAIN
/// Multiple keys request during rehashing of slot`): the store then takes the split form
/// (lua/common.lua), so that no decision fails either, and a tenant suspended before the move
/// (its key exists, its route's does not) stays denied throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_under_traffic_fails_no_decision_open() {
    let cluster = RedisCluster::start();
    let (from, to) = (0, 1);
    let slot: u16 = 1000; // node 0 serves 0..=5460
                          // Keys whose hash tag (the key itself: `<prefix>:{<key>}`) falls in that slot.
    let in_slot: Vec<String> = (0u64..)
        .map(|i| format!("mig-{i}"))
        .filter(|k| support::key_slot(k.as_bytes()) == slot)
        .take(17)
        .collect();
    let (existing, fresh) = in_slot[..16].split_at(8);
    let (existing, fresh) = (existing.to_vec(), fresh.to_vec());
    let suspended = in_slot[16].clone();
    // Enough that no decision is denied (the sliding log keeps one entry per admission).
    let quota = Quota::per_hour(50_000).unwrap();
    let limiters: Vec<Limiter> = Algorithm::ALL
        .iter()
        .map(|&algorithm| {
            let store = RedisStore::cluster_builder(cluster.urls())
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap();
            Limiter::builder(store)
                .algorithm(algorithm)
                .prefix(format!("m-{algorithm}"))
                .build()
                .unwrap()
        })
        .collect();
    assert_eq!(
        cluster.slot_of(&limiters[0].storage_key(&existing[0])),
        slot
    );
    for limiter in &limiters {
        for key in &existing {
            limiter
                .try_check_quotas(key, &quota.into(), 1)
                .await
                .expect("before the move");
        }
        limiter
            .suspend(suspended.as_str(), Duration::from_secs(600))
            .await
            .expect("a tenant suspended before the move");
    }
    let keys_before = cluster.keys_in_slot(from, slot);

    let moving = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = limiters
        .iter()
        .cloned()
        .map(|limiter| {
            let (moving, stop) = (moving.clone(), stop.clone());
            let (existing, fresh) = (existing.clone(), fresh.clone());
            let suspended = suspended.clone();
            tokio::spawn(async move {
                let mut counts = MigrationCounts::default();
                let mut fresh_seen = 0;
                while !stop.load(Ordering::SeqCst) {
                    let during = moving.load(Ordering::SeqCst);
                    // A new key joins the traffic every round once the move has begun.
                    if during && fresh_seen < fresh.len() {
                        fresh_seen += 1;
                    }
                    for key in existing.iter().chain(&fresh[..fresh_seen]) {
                        let result = limiter.try_check_quotas(key, &quota.into(), 1).await;
                        counts.decisions += 1;
                        counts.during_move += u64::from(during);
                        if let Err(error) = result {
                            counts.failed += 1;
                            counts.failed_during_move += u64::from(during);
                            let error = error.to_string();
                            if !counts.errors.contains(&error) {
                                counts.errors.push(error);
                            }
                        }
                    }
                    let result = limiter.try_check_quotas(&suspended, &quota.into(), 1).await;
                    counts.decisions += 1;
                    counts.during_move += u64::from(during);
                    match result {
                        Ok(decision) if during => {
                            if decision.allowed {
                                counts.suspended_admitted += 1;
                            } else if decision.suspended {
                                counts.suspended_denied += 1;
                            }
                        }
                        Ok(_) => {}
                        Err(error) => {
                            counts.failed += 1;
                            counts.failed_during_move += u64::from(during);
                            let error = format!("suspended tenant: {error}");
                            if !counts.errors.contains(&error) {
                                counts.errors.push(error);
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                (limiter.algorithm(), counts)
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(200)).await;
    let cluster = Arc::new(cluster);
    let driver = {
        let (cluster, moving) = (cluster.clone(), moving.clone());
        tokio::task::spawn_blocking(move || {
            cluster.begin_slot_migration(slot, from, to);
            moving.store(true, Ordering::SeqCst);
            // New keys are asked for on the target while the old ones are still on the source.
            std::thread::sleep(Duration::from_millis(300));
            let mut moved = 0;
            loop {
                let n = cluster.migrate_keys(slot, from, to, 2);
                if n == 0 {
                    break;
                }
                moved += n;
                std::thread::sleep(Duration::from_millis(40));
            }
            // Everything on the target, the slot still open: the source answers ASK for all.
            std::thread::sleep(Duration::from_millis(300));
            cluster.finish_slot_migration(slot, from, to);
            moving.store(false, Ordering::SeqCst);
            moved
        })
    };
    let moved = driver.await.unwrap();
    // After the move: MOVED for a client whose slot map is stale, then by slot.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);

    let (mut during_move, mut failed_during_move, mut failed) = (0, 0, 0);
    for task in tasks {
        let (algorithm, counts) = task.await.unwrap();
        println!(
            "{algorithm}: {} decisions, {} during the move, {} failed ({} during the move); \
             suspended tenant during the move: {} denied, {} admitted {:?}",
            counts.decisions,
            counts.during_move,
            counts.failed,
            counts.failed_during_move,
            counts.suspended_denied,
            counts.suspended_admitted,
            counts.errors
        );
        assert!(
            counts.during_move > 0,
            "{algorithm}: traffic ran during the move"
        );
        assert!(
            counts.suspended_denied > 0 && counts.suspended_admitted == 0,
            "{algorithm}: a tenant suspended before the move stays suspended during it"
        );
        during_move += counts.during_move;
        failed_during_move += counts.failed_during_move;
        failed += counts.failed;
    }
    println!(
        "slot {slot}: {moved} keys moved ({keys_before} before), node {from} -> node {to}; \
         {during_move} decisions during the move, {failed_during_move} failed (would fail open), \
         {failed} failed in all"
    );
    assert_eq!(cluster.keys_in_slot(from, slot), 0);
    assert!(cluster.keys_in_slot(to, slot) >= keys_before);
    assert_eq!(failed, 0, "no decision fails open during a slot migration");
}

/// The split form that a migrating slot needs (see the test above) decides exactly as the
/// normal one: with the slot migrating, for every algorithm, a tenant's override of every
/// route (5 an hour, over the caller's 100) admits exactly 5 of 10 requests, and a tenant
/// reset after the route's 5 an hour were used gives exactly 5 more, never the 10 that a reset
/// applied again on every call would give (the sliding log trims by score there). Half the
/// requests go while the keys are still on the source, half once they are all on the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_keeps_tenant_controls_exact() {
    let cluster = RedisCluster::start();
    let (from, to, slot) = (0, 1, 1000u16);
    let in_slot: Vec<String> = (0u64..)
        .map(|i| format!("ctl-{i}"))
        .filter(|k| support::key_slot(k.as_bytes()) == slot)
        .take(2)
        .collect();
    let (overridden, reset) = (in_slot[0].as_str(), in_slot[1].as_str());
    let five = Quota::per_hour(5).unwrap();
    let hundred = Quota::per_hour(100).unwrap();
    let mut limiters = Vec::new();
    for &algorithm in Algorithm::ALL {
        let store = RedisStore::cluster_builder(cluster.urls())
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let limiter = Limiter::builder(store)
            .algorithm(algorithm)
            .prefix(format!("c-{algorithm}"))
            .build()
            .unwrap();
        limiter
            .set_quota(
                redlimit::Target::all_routes(overridden),
                &redlimit::Quotas::from(&five),
            )
            .await
            .unwrap();
        for _ in 0..5 {
            assert!(support::admits(&limiter, reset, &five).await);
        }
        assert!(
            !limiter
                .try_check_quotas(reset, &five.into(), 1)
                .await
                .unwrap()
                .allowed
        );
        limiter.reset(reset).await.unwrap();
        limiters.push(limiter);
    }
    cluster.begin_slot_migration(slot, from, to);
    let mut admitted = vec![(0, 0); limiters.len()];
    for half in 0..2 {
        if half == 1 {
            while cluster.migrate_keys(slot, from, to, 10) > 0 {}
        }
        for (limiter, admitted) in limiters.iter().zip(&mut admitted) {
            for _ in 0..5 {
                let algorithm = limiter.algorithm();
                let over = limiter
                    .try_check_quotas(overridden, &hundred.into(), 1)
                    .await;
                let over = over.unwrap_or_else(|e| panic!("{algorithm}: {e}"));
                admitted.0 += u32::from(over.allowed);
                let after_reset = limiter.try_check_quotas(reset, &five.into(), 1).await;
                let after_reset = after_reset.unwrap_or_else(|e| panic!("{algorithm}: {e}"));
                admitted.1 += u32::from(after_reset.allowed);
            }
        }
    }
    cluster.finish_slot_migration(slot, from, to);
    for (limiter, admitted) in limiters.iter().zip(&admitted) {
        let algorithm = limiter.algorithm();
        println!(
            "{algorithm}: in the migrating slot, under the tenant's override {} of 10 admitted, \
             after the tenant's reset {} of 10",
            admitted.0, admitted.1
        );
        assert_eq!(*admitted, (5, 5), "{algorithm}");
    }
}
