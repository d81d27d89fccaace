//! The example server `examples/tonic.rs`, run as a user runs it and called by a real tonic client:
//! its flags, its store choice, `listening on ADDR`, and the gRPC statuses clients receive. Every
//! test uses a private Redis (or a dead port), never the machine's.

#[path = "../../examples/common/greeter.rs"]
mod greeter;
#[path = "../support/grpc.rs"]
mod grpc;
use crate::support;

use greeter::{GreeterClient, HelloRequest};
use grpc::metadata;
use support::example::{self, dead_redis_url, Example};
use support::RedisServer;
use tonic::metadata::MetadataValue;
use tonic::Code;

/// Starts the tonic example on a free port with `flags` and `envs`, and waits for `listening on
/// ADDR`.
fn start(flags: &str, envs: &[(&str, &str)]) -> Example {
    Example::start("tonic", flags, envs)
}

/// Starts the tonic example on `redis` (`--redis URL`) with `flags`.
fn start_on(redis: &RedisServer, flags: &str) -> Example {
    start(&format!("--redis {} {flags}", redis.url()), &[])
}

/// A gRPC client connected to `example`.
async fn connect(example: &Example) -> GreeterClient {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", example.addr))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("cannot connect: {e}; {}", example.output()));
    GreeterClient::new(channel)
}

/// `SayHello`, optionally with an `x-api-key`: the reply's message, or the status code.
async fn call(client: &mut GreeterClient, api_key: Option<&str>) -> Result<String, tonic::Status> {
    let mut request = tonic::Request::new(HelloRequest {
        name: "example".to_owned(),
    });
    if let Some(key) = api_key {
        let key = MetadataValue::try_from(key).unwrap();
        request.metadata_mut().insert("x-api-key", key);
    }
    client
        .say_hello(request)
        .await
        .map(|reply| reply.into_inner().message)
}

/// The status codes of three calls to `example`, each with an `x-api-key` of its own:
/// `PREFIX-0`, `PREFIX-1`, `PREFIX-2`.
async fn one_call_per_key(example: &Example, prefix: &str) -> Vec<Code> {
    let mut client = connect(example).await;
    let mut seen = Vec::new();
    for i in 0..3 {
        let key = format!("{prefix}-{i}");
        seen.push(codes(&mut client, Some(&key), 1).await[0]);
    }
    seen
}

/// The status codes of `n` calls (OK for a reply).
async fn codes(client: &mut GreeterClient, api_key: Option<&str>, n: usize) -> Vec<Code> {
    let mut codes = Vec::new();
    for _ in 0..n {
        codes.push(match call(client, api_key).await {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        });
    }
    codes
}

#[test]
fn help_prints_usage_and_every_algorithm() {
    let usage = example::help_naming(
        "tonic",
        "'cargo run --example tonic' 127.0.0.1:50051 --bind --redis --redis-cluster --limit \
         --period --burst --algorithm --on-redis-error --instances local '--key ip|api-key' \
         '(gRPC: metadata)' authenticated",
    );
    example::assert_names_every_algorithm(&usage);
}

#[test]
fn bad_flags_exit_non_zero_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--limit", "0"], "--limit must be at least 1"),
        (&["--algorithm", "leaky-bucket"], "unknown algorithm"),
        (&["--frobnicate"], "unknown argument"),
        (&["--period", "10x"], "--period"),
        (
            &["--on-redis-error", "maybe"],
            "expected open, closed or local",
        ),
        (
            &["--on-redis-error", "local", "--instances", "0"],
            "--instances must be at least 1",
        ),
        (
            &["--instances", "3"],
            "--instances applies only to --on-redis-error local",
        ),
        (
            &["--on-redis-error", "closed", "--instances", "3"],
            "--instances applies only to --on-redis-error local",
        ),
        (&["--bind", "localhost"], "--bind"),
        (&["--redis", "not a url"], "--redis"),
        (&["--key", "metadata"], "--key: expected ip or api-key"),
        // A flag given twice is refused, not "the last one wins".
        (&["--limit", "3", "--limit", "4"], "give --limit once"),
        (&["--key=ip", "--key", "ip"], "give --key once"),
        (
            &["--redis", "redis://a/", "--redis", "redis://b/"],
            "give --redis once",
        ),
    ];
    example::assert_usage_errors("tonic", cases);
}

/// The example on a real Redis: the limit holds, then `RESOURCE_EXHAUSTED` with the retry hint;
/// with `--key api-key` an API key is a client of its own.
#[tokio::test]
async fn limits_with_redis_and_answers_resource_exhausted() {
    let redis = RedisServer::start();
    let url = redis.url();
    let example = start_on(&redis, "--limit 3 --period 1m --key api-key");
    // Verified at start, as the axum example does: the store line names the server's version.
    example.assert_printed(&example::redis_store_line(&url));
    example
        .assert_printed("quota: 3 per 60s (burst 3), algorithm token-bucket, on-redis-error open");

    let mut client = connect(&example).await;
    for left in [2, 1, 0] {
        let message = call(&mut client, None).await.unwrap();
        assert_eq!(message, format!("Hello example! ({left} calls left)"));
    }
    let denied = call(&mut client, None).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    assert_eq!(denied.message(), "rate limit exceeded");
    let retry_after: u64 = metadata(&denied, "retry-after").parse().unwrap();
    let pushback_ms: u64 = metadata(&denied, "grpc-retry-pushback-ms").parse().unwrap();
    // 3 a minute: one call comes back every 20 s.
    assert!((1..=20).contains(&retry_after), "{denied:?}");
    assert_eq!(pushback_ms.div_ceil(1000), retry_after, "{denied:?}");

    assert_eq!(
        codes(&mut client, Some("tenant-1"), 4).await,
        [Code::Ok, Code::Ok, Code::Ok, Code::ResourceExhausted]
    );
    let keys = redis.keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    // The layer's scope follows its policy name and quota: `default:token-bucket:3/60s`.
    assert!(
        keys.contains(&"redlimit:{ip:127.0.0.1}:default:token-bucket:3/60s".to_owned()),
        "{keys:?}"
    );
    assert!(keys.iter().all(|k| !k.contains("tenant-1")), "{keys:?}");
}

/// Redis down: `closed` answers `UNAVAILABLE`, `local --instances 2` enforces half the quota in
/// memory, `open` admits everything.
#[tokio::test]
async fn redis_down_closed_local_and_open() {
    let dead = dead_redis_url();

    let closed = start(&format!("--redis {dead} --on-redis-error closed"), &[]);
    closed.assert_printed_starting(&format!("store: redis {dead} (not reachable yet: "));
    let failed = call(&mut connect(&closed).await, None).await.unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable, "{failed:?}");
    assert_eq!(failed.message(), "rate limiter unavailable");
    assert_eq!(metadata(&failed, "retry-after"), "1");
    assert_eq!(metadata(&failed, "grpc-retry-pushback-ms"), "1000");
    drop(closed);

    let local = start(
        &format!("--redis {dead} --limit 4 --on-redis-error local --instances 2"),
        &[],
    );
    local.assert_printed(
        "quota: 4 per 60s (burst 4), algorithm token-bucket, on-redis-error local (instances 2)",
    );
    let mut client = connect(&local).await;
    // This instance's share: 4 / 2 = 2.
    assert_eq!(
        codes(&mut client, None, 3).await,
        [Code::Ok, Code::Ok, Code::ResourceExhausted]
    );
    drop(local);

    let open = start(&format!("--redis {dead} --limit 2"), &[]);
    // More than the limit: nothing is counted while Redis is away.
    assert_eq!(
        codes(&mut connect(&open).await, None, 4).await,
        [Code::Ok; 4]
    );
    assert!(open.stderr.lock().unwrap().contains("does not answer"));
}

/// Without a store flag and no Redis reachable it says so, uses memory, and still limits.
#[tokio::test]
async fn without_redis_it_says_memory_and_still_limits() {
    let dead = dead_redis_url();
    let example = start("--limit 2", &[("REDIS_URL", &dead)]);
    example.assert_printed(&format!("store: memory (no Redis reachable at {dead})"));
    assert_eq!(
        codes(&mut connect(&example).await, None, 3).await,
        [Code::Ok, Code::Ok, Code::ResourceExhausted]
    );
}

/// The default key is the client's IP address: fresh `x-api-key` metadata on every call buys
/// no fresh quota; `--key api-key` counts each key apart.
#[tokio::test]
async fn the_default_key_is_the_ip_and_a_fresh_api_key_does_not_evade_it() {
    let dead = dead_redis_url();
    let example = start("--limit 2", &[("REDIS_URL", &dead)]);
    let seen = one_call_per_key(&example, "random").await;
    assert_eq!(seen, [Code::Ok, Code::Ok, Code::ResourceExhausted]);
    drop(example);

    let keyed = start("--limit 2 --key api-key", &[("REDIS_URL", &dead)]);
    assert_eq!(one_call_per_key(&keyed, "tenant").await, [Code::Ok; 3]);
}
