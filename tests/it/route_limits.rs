//! Per-route limits: two layers from one `Limiter`, same key extractor, default
//! policy name, different quotas, on two routes of one axum server. One client uses both routes
//! over real TCP; Redis is a private `redis-server` on its own clock (server time).

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use redlimit::key::PeerIp;
use redlimit::{Quota, RateLimitLayer};
use support::{Ctx, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `/login` at 5 a minute and `/api` at 1000 a minute, both keyed by the client's address, served
/// with connect info so `PeerIp` sees it.
async fn serve(redis: &RedisServer) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let limiter = Ctx::default().redis(redis);
    let login = RateLimitLayer::new(
        limiter.clone(),
        Quota::per_minute(5).unwrap(),
        PeerIp::new(),
    );
    let api = RateLimitLayer::new(limiter, Quota::per_minute(1000).unwrap(), PeerIp::new());
    let app = Router::new()
        .route("/login", get(|| async { "welcome" }).layer(login))
        .route("/api", get(|| async { "data" }).layer(api));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).await.unwrap();
    });
    (addr, server)
}

/// One request from the client; its status code.
async fn status(addr: SocketAddr, path: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw.split(' ').nth(1).unwrap().parse().unwrap()
}

async fn admitted(addr: SocketAddr, path: &str, requests: usize) -> usize {
    let mut ok = 0;
    for _ in 0..requests {
        if status(addr, path).await == 200 {
            ok += 1;
        }
    }
    ok
}

/// Before the fix both layers counted in one bucket: after 5 logins `/api` admitted 9 of 100.
#[tokio::test]
async fn login_traffic_does_not_spend_the_api_quota() {
    let redis = RedisServer::start();
    let (addr, server) = serve(&redis).await;
    assert_eq!(admitted(addr, "/login", 5).await, 5);
    assert_eq!(admitted(addr, "/api", 100).await, 100);
    assert_eq!(status(addr, "/login").await, 429);
    server.abort();
}

/// Before the fix `/api` traffic refilled the shared bucket at its own rate (1000 a minute), and
/// `/login` read the refill: a spent login limit was open again a second later.
#[tokio::test]
async fn api_traffic_does_not_refill_the_login_limit() {
    let redis = RedisServer::start();
    let (addr, server) = serve(&redis).await;
    assert_eq!(admitted(addr, "/login", 6).await, 5);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(admitted(addr, "/api", 10).await, 10);
    // 1.1 s at 5 a minute refills no whole login attempt.
    assert_eq!(admitted(addr, "/login", 5).await, 0);
    server.abort();
}
