//! Self-test of the real-Redis harness in `tests/support`.

use crate::support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redis::Commands;
use support::{RedisCluster, RedisServer};

#[test]
fn server_serves_stops_and_restarts_on_the_same_port() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    assert!((20000..45000).contains(&port), "port {port} out of range");
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{port}/"));
    assert!(redis.is_running());
    assert!(redis.log_tail(50).contains("Ready to accept connections"));

    let mut conn = redis.conn();
    let _: () = conn.set("greeting", "hello").unwrap();
    let value: String = conn.get("greeting").unwrap();
    assert_eq!(value, "hello");

    redis.stop();
    assert!(!redis.is_running());
    let err = redis
        .client()
        .get_connection()
        .err()
        .expect("connect to a stopped server must fail");
    assert!(
        err.is_connection_refusal(),
        "expected connection refused, got {err}"
    );

    redis.restart();
    assert!(redis.is_running());
    assert_eq!(redis.port(), port);
    let mut conn = redis.conn();
    let lost: Option<String> = conn.get("greeting").unwrap();
    assert_eq!(lost, None, "nothing is persisted across a restart");
    let _: () = conn.set("greeting", "again").unwrap();
    let value: String = conn.get("greeting").unwrap();
    assert_eq!(value, "again");
}

#[test]
fn parallel_servers_get_distinct_ports() {
    let servers: Vec<RedisServer> = (0..4).map(|_| RedisServer::start()).collect();
    let ports: HashSet<u16> = servers.iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), servers.len());
    assert!(!ports.contains(&6379));
    for server in &servers {
        let pong: String = redis::cmd("PING").query(&mut server.conn()).unwrap();
        assert_eq!(pong, "PONG");
    }
}

#[test]
fn debug_sleep_blocks_the_server() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let sleeper = redis.debug_sleep(Duration::from_millis(500));
    let started = Instant::now();
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    let waited = started.elapsed();
    assert_eq!(pong, "PONG");
    assert!(
        waited >= Duration::from_millis(400),
        "PING took only {waited:?}"
    );
    sleeper.join().unwrap();
}

#[test]
fn script_flush_forgets_loaded_scripts() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query(&mut conn)
        .unwrap();
    let mut loaded = || -> Vec<bool> {
        let mut exists = redis::cmd("SCRIPT");
        exists.arg("EXISTS").arg(&sha).query(&mut conn).unwrap()
    };
    assert_eq!(loaded(), vec![true]);

    redis.script_flush();
    assert_eq!(loaded(), vec![false]);
}

#[test]
fn command_calls_counts_and_reset_stats_zeroes() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    redis.reset_stats();
    assert_eq!(redis.command_calls("get"), 0);
    for _ in 0..3 {
        let _: Option<String> = conn.get("missing").unwrap();
    }
    assert_eq!(redis.command_calls("get"), 3);
    assert_eq!(redis.command_calls("GET"), 3, "names are case-insensitive");
    assert_eq!(redis.command_calls("evalsha"), 0);

    redis.reset_stats();
    assert_eq!(redis.command_calls("get"), 0);
}

#[test]
fn memory_dbsize_and_flushall() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    assert_eq!(redis.dbsize(), 0);
    assert!(redis.used_memory() > 0);
    for i in 0..10 {
        let _: () = conn.set(format!("key:{i}"), "x".repeat(100)).unwrap();
    }
    assert_eq!(redis.dbsize(), 10);
    let usage = redis
        .memory_usage("key:0")
        .expect("existing key has a memory usage");
    assert!(usage >= 100, "MEMORY USAGE {usage} smaller than the value");
    assert_eq!(redis.memory_usage("absent"), None);

    redis.flushall();
    assert_eq!(redis.dbsize(), 0);
}

#[test]
fn client_kill_normal_drops_open_connections() {
    let redis = RedisServer::start();
    let mut victim = redis.conn();
    let _: String = redis::cmd("PING").query(&mut victim).unwrap();

    redis.client_kill_normal();
    let result: redis::RedisResult<String> = redis::cmd("PING").query(&mut victim);
    assert!(
        result.is_err(),
        "a killed connection must fail, got {result:?}"
    );
    let pong: String = redis::cmd("PING").query(&mut redis.conn()).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn redis_server_version_is_reported() {
    let version = support::redis_server_version();
    let major: u32 = version.split('.').next().unwrap().parse().unwrap();
    assert!(
        major >= 7,
        "redis {version}: the harness needs 7.0+ for --enable-debug-command"
    );
}

#[test]
fn cluster_spreads_keys_and_survives_a_node_restart() {
    let mut cluster = RedisCluster::start();
    assert_eq!(cluster.nodes().len(), 3);
    assert_eq!(cluster.urls().len(), 3);

    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    set_100_keys_and_see_them_spread(&client, &cluster, "");
    let total: u64 = cluster.nodes().iter().map(RedisServer::dbsize).sum();
    assert_eq!(total, 100);

    for i in 0..100 {
        let key = format!("key:{i}");
        let node = &cluster.nodes()[cluster.node_for_key(&key)];
        let exists: bool = node.conn().exists(&key).unwrap();
        assert!(
            exists,
            "{key} is not on node {} that node_for_key names",
            node.port()
        );
    }

    cluster.script_flush_all();
    cluster.flushall();
    let total: u64 = cluster.nodes().iter().map(RedisServer::dbsize).sum();
    assert_eq!(total, 0);

    cluster.restart_node(0);
    assert!(cluster.node_mut(0).is_running());
    set_100_keys_and_see_them_spread(&client, &cluster, " after restart");
}

/// Sets `key:0` to `key:99` through `client` and asserts every node of `cluster` holds some
/// (`when` ends the message).
fn set_100_keys_and_see_them_spread(
    client: &redis::cluster::ClusterClient,
    cluster: &RedisCluster,
    when: &str,
) {
    let mut conn = client.get_connection().unwrap();
    for i in 0..100 {
        let _: () = conn.set(format!("key:{i}"), i).unwrap();
    }
    for node in cluster.nodes() {
        let port = node.port();
        assert!(node.dbsize() > 0, "node on port {port} holds no key{when}");
    }
}
