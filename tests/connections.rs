//! `RedisStoreBuilder::connections(n)`: the store opens `n` connections, calls take them in
//! turn, and a killed one is replaced while the others keep answering.

mod support;

use std::time::{Duration, Instant};

use redis::ErrorKind;
use redlimit::store::RedisStore;
use redlimit::{Limiter, Quota};
use support::RedisServer;

/// A quota that never denies: these tests are about reaching Redis.
fn quota() -> Quota {
    Quota::per_second(1_000_000).unwrap()
}

/// One client of `CLIENT LIST`: its id and the last command it ran.
#[derive(Debug, Clone, PartialEq)]
struct Client {
    id: u64,
    cmd: String,
}

/// The clients connected to `redis`, but the connection that asks.
fn store_clients(redis: &RedisServer) -> Vec<Client> {
    let mut admin = redis.conn();
    let me: u64 = redis::cmd("CLIENT").arg("ID").query(&mut admin).unwrap();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).unwrap();
    list.lines()
        .map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_default()
                    .to_owned()
            };
            Client {
                id: field("id").parse().unwrap(),
                cmd: field("cmd"),
            }
        })
        .filter(|client| client.id != me)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_spread_over_n_connections_and_a_killed_one_is_replaced() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .connections(3)
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.expect("verify opens every connection");
    let clients = store_clients(&redis);
    assert_eq!(clients.len(), 3, "one client per connection: {clients:?}");

    let limiter = Limiter::new(store);
    for _ in 0..3 {
        limiter.try_check("k", &quota(), 1).await.unwrap();
    }
    let clients = store_clients(&redis);
    assert!(
        clients.iter().all(|client| client.cmd == "evalsha"),
        "3 calls, one on each connection: {clients:?}"
    );

    let killed = clients[0].id;
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(killed)
        .query(&mut redis.conn())
        .unwrap();
    let (mut ok, mut failed) = (0, Vec::new());
    for _ in 0..30 {
        match limiter.try_check("k", &quota(), 1).await {
            Ok(_) => ok += 1,
            Err(error) => failed.push(error.to_string()),
        }
    }
    println!("after CLIENT KILL of 1 of 3 connections: {ok} of 30 calls ok, failed {failed:?}");
    // Only a call that lands on the killed connection before it reconnects may fail.
    assert!(failed.len() <= 1, "{failed:?}");

    let started = Instant::now();
    let clients = loop {
        let clients = store_clients(&redis);
        if clients.len() == 3 || started.elapsed() > Duration::from_secs(5) {
            break clients;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(clients.len(), 3, "the killed one is replaced: {clients:?}");
    assert!(clients.iter().all(|client| client.id != killed));
    for _ in 0..30 {
        limiter.try_check("k", &quota(), 1).await.unwrap();
    }
    assert_eq!(store_clients(&redis).len(), 3, "no more connections");
}

#[test]
fn zero_connections_is_a_build_error() {
    let error = RedisStore::builder("redis://127.0.0.1:6379")
        .connections(0)
        .build()
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidClientConfig);
    assert!(error.to_string().contains("connections(0)"), "{error}");
    for builder in [
        RedisStore::cluster_builder(["redis://127.0.0.1:7000"]),
        RedisStore::sentinel_builder(["redis://127.0.0.1:26379"], "mymaster"),
    ] {
        let error = builder.connections(0).build().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidClientConfig);
    }
}
