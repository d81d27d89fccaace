//! Redis Cluster: a real three-master cluster from tests/support.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::RedisStore;
use redlimit::{Algorithm, Limiter, Quota};
use support::RedisCluster;

fn cluster_limiter(cluster: &RedisCluster, algorithm: Algorithm) -> Limiter {
    // Correctness tests, not latency tests: a generous timeout keeps a loaded CI machine from
    // turning a slow first connection into a failure.
    let store = RedisStore::cluster_builder(cluster.urls())
        .timeout(Duration::from_secs(2))
        .build()
        .expect("valid urls");
    Limiter::builder(store)
        .algorithm(algorithm)
        .build()
        .expect("valid limiter")
}

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
                .map(move |limiter| async move { (key, limiter.try_check(key, &quota, 1).await) })
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
    let quota = Quota::per_minute(1000).unwrap();
    for i in 0..20 {
        limiter
            .try_check(&format!("k{i}"), &quota, 1)
            .await
            .expect("first round");
    }
    cluster.script_flush_all();
    for i in 0..20 {
        let decision = limiter
            .try_check(&format!("k{i}"), &quota, 1)
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
    limiter.try_check(&key, &quota, 1).await.expect("before");

    cluster.node_mut(0).stop();
    let down = limiter.try_check(&key, &quota, 1).await;
    assert!(down.is_err(), "a dead master cannot decide: {down:?}");

    cluster.restart_node(0);
    let restarted = Instant::now();
    let deadline = restarted + Duration::from_secs(10);
    let recovered = loop {
        if limiter.try_check(&key, &quota, 1).await.is_ok() {
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
    assert!(limiter.try_check(&other, &quota, 1).await.is_ok());
}
