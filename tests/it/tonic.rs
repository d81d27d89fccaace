//! The layer on a real tonic server, called by a real tonic client over HTTP/2, deciding in a
//! private `redis-server`: what a gRPC client receives (status code, message, retry metadata),
//! and that `PeerIp` keys clients by the address tonic's `TcpConnectInfo` reports (the crate's
//! `tonic` feature).

use crate::greeter;
use crate::grpc::metadata;
use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use greeter::{GreeterClient, GreeterServer, HelloRequest};
use redlimit::key::{KeyExtractor, PeerIp};
use redlimit::store::RedisStore;
use redlimit::{failure_policy::FailClosed, Limiter, Quota, RateLimitLayer};
use support::{Ctx, RedisServer};
use tokio::task::JoinHandle;
use tonic::Code;

/// A tonic server with the layer in front of the greeter; aborted on drop.
pub(crate) struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Serves on 127.0.0.1 (a free port), so clients on 127.0.0.2 can reach it too.
    pub(crate) async fn start<K>(layer: RateLimitLayer<K>) -> Server
    where
        K: KeyExtractor + Send + Sync + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .layer(layer)
                .add_service(GreeterServer)
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
        Server { addr, task }
    }

    /// A client whose connection leaves from `local_ip` (a 127.0.0.0/8 address).
    pub(crate) async fn client_from(&self, local_ip: &str) -> GreeterClient {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .local_address(Some(local_ip.parse::<IpAddr>().unwrap()))
            .connect()
            .await
            .unwrap();
        GreeterClient::new(channel)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server whose layer allows each peer address 2 calls a minute, on `redis`.
async fn two_a_minute_per_peer(redis: &RedisServer) -> Server {
    let limiter = Ctx::default().redis(redis);
    let layer = RateLimitLayer::new(limiter, Quota::per_minute(2).unwrap(), PeerIp::new());
    Server::start(layer).await
}

fn hello() -> HelloRequest {
    HelloRequest {
        name: "test".to_owned(),
    }
}

/// Two gRPC clients on different addresses (127.0.0.1 and 127.0.0.2) each get their own quota:
/// the key is the peer address from tonic's `TcpConnectInfo`, not one shared "unkeyed" bucket.
#[tokio::test]
async fn two_grpc_clients_on_different_addresses_are_keyed_apart() {
    let redis = RedisServer::start();
    let server = two_a_minute_per_peer(&redis).await;
    let mut first = server.client_from("127.0.0.1").await;
    let mut second = server.client_from("127.0.0.2").await;

    for _ in 0..2 {
        first.say_hello(hello()).await.expect("within the quota");
    }
    let denied = first.say_hello(hello()).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");

    // The second client has a bucket of its own, full.
    let reply = second.say_hello(hello()).await.expect("its own quota");
    assert_eq!(reply.get_ref().message, "Hello test! (1 calls left)");
    second.say_hello(hello()).await.expect("its own quota");
    let denied = second.say_hello(hello()).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");

    assert_eq!(
        redis.keys(),
        [
            "redlimit:{ip:127.0.0.1}:default:token-bucket:2/60s",
            "redlimit:{ip:127.0.0.2}:default:token-bucket:2/60s"
        ]
    );
}

/// Over the quota: `RESOURCE_EXHAUSTED`, the message, `retry-after` in seconds and
/// `grpc-retry-pushback-ms` in milliseconds that agree with each other, and the `RateLimit`
/// fields; the handler reads the decision from the request extensions.
#[tokio::test]
async fn over_the_quota_is_resource_exhausted_with_retry_hints() {
    let redis = RedisServer::start();
    let server = two_a_minute_per_peer(&redis).await;
    let mut client = server.client_from("127.0.0.1").await;

    let reply = client.say_hello(hello()).await.unwrap();
    assert_eq!(reply.get_ref().message, "Hello test! (1 calls left)");
    assert_eq!(
        reply.metadata().get("ratelimit-policy").unwrap(),
        "\"default\";q=2;w=60"
    );
    let reply = client.say_hello(hello()).await.unwrap();
    assert_eq!(reply.get_ref().message, "Hello test! (0 calls left)");

    let denied = client.say_hello(hello()).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    assert_eq!(denied.message(), "rate limit exceeded");
    let retry_after: u64 = metadata(&denied, "retry-after").parse().unwrap();
    let pushback_ms: u64 = metadata(&denied, "grpc-retry-pushback-ms").parse().unwrap();
    // 2 a minute: one call comes back within 30 s. Retry-After is the pushback rounded up to
    // whole seconds.
    assert!((1..=30).contains(&retry_after), "{denied:?}");
    assert!(
        (1..=30_000).contains(&pushback_ms) && pushback_ms.div_ceil(1000) == retry_after,
        "retry-after {retry_after} s, pushback {pushback_ms} ms"
    );
    assert_eq!(
        metadata(&denied, "ratelimit"),
        format!("\"default\";r=0;t={retry_after}")
    );
}

/// A call whose cost the quota can never hold: `RESOURCE_EXHAUSTED` with a pushback of `-1`,
/// gRPC's "do not retry".
#[tokio::test]
async fn a_cost_over_capacity_tells_the_client_not_to_retry() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::builder(
        Ctx::default().redis(&redis),
        Quota::per_minute(2).unwrap(),
        PeerIp::new(),
    )
    .cost(|_| 3)
    .build()
    .unwrap();
    let server = Server::start(layer).await;
    let mut client = server.client_from("127.0.0.1").await;

    let denied = client.say_hello(hello()).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    assert_eq!(metadata(&denied, "grpc-retry-pushback-ms"), "-1");
    assert_eq!(metadata(&denied, "retry-after"), "60");
}

/// Fail-closed with Redis gone: `UNAVAILABLE` with its retry hint; OK again once Redis is back.
#[tokio::test]
async fn fail_closed_while_redis_is_down_is_unavailable() {
    let mut redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let limiter = Limiter::builder(store)
        .failure_policy(FailClosed {
            retry_after: Duration::from_millis(1500),
        })
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, Quota::per_minute(100).unwrap(), PeerIp::new());
    let server = Server::start(layer).await;
    let mut client = server.client_from("127.0.0.1").await;
    client.say_hello(hello()).await.expect("Redis is up");

    redis.stop();
    let failed = client.say_hello(hello()).await.unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable, "{failed:?}");
    assert_eq!(failed.message(), "rate limiter unavailable");
    assert_eq!(metadata(&failed, "retry-after"), "2");
    assert_eq!(metadata(&failed, "grpc-retry-pushback-ms"), "1500");

    redis.restart();
    // The store reconnects by itself (the circuit breaker may hold it off for a moment).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match client.say_hello(hello()).await {
            Ok(reply) => {
                assert!(reply.get_ref().message.contains("calls left"), "{reply:?}");
                break;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "Redis never came back"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
