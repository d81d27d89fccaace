//! A property test over every key extraction path (`HeaderKey`, `FnKey`, `PeerIp`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::{HeaderValue, Request, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use redlimit::key::{Cidr, FnKey, HeaderKey, KeyExtractor, PeerIp};
use redlimit::{Limiter, Quota, RateLimitLayer, Target};

use crate::support::{self, RedisServer};
use crate::{
    check_redis_key, check_storage_key, is_hash_id, redis_store, send, shared_blocking, RawKey,
};

/// Maps any byte to one a `HeaderValue` accepts: tab, visible ASCII and space, obs-text
/// (0x80..=0xff).
fn header_byte(b: u8) -> u8 {
    match b {
        b'\t' | 0x20..=0x7e | 0x80..=0xff => b,
        0x7f => b'~',
        _ => b + 0x20,
    }
}

/// Short header values, shrinkable byte by byte.
fn header_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>().prop_map(header_byte), 0..max)
}

/// Long header values (up to `max` bytes), expanded from a seed: cheap to generate.
fn long_header_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    (any::<u64>(), 0..max).prop_map(|(seed, len)| {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                header_byte(x as u8)
            })
            .collect()
    })
}

/// One `X-Forwarded-For` hop: addresses (v4, v6, with ports, padded) or garbage.
fn hop() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<Ipv4Addr>().prop_map(|ip| ip.to_string().into_bytes()),
        any::<Ipv6Addr>().prop_map(|ip| ip.to_string().into_bytes()),
        (any::<Ipv4Addr>(), any::<u16>()).prop_map(|(ip, p)| format!("{ip}:{p}").into_bytes()),
        (any::<Ipv6Addr>(), any::<u16>()).prop_map(|(ip, p)| format!("[{ip}]:{p}").into_bytes()),
        any::<Ipv4Addr>().prop_map(|ip| format!(" \t{ip} ").into_bytes()),
        any::<Ipv4Addr>().prop_map(|ip| ip.to_ipv6_mapped().to_string().into_bytes()),
        header_bytes(24),
    ]
}

#[derive(Debug, Clone)]
struct KeyCase {
    header: Vec<u8>,
    secret: Option<Vec<u8>>,
    fn_key: String,
    forwarded: Vec<Vec<Vec<u8>>>,
    peer: SocketAddr,
    trusted: Vec<(IpAddr, u8)>,
    trust_peer: bool,
    trust_all: bool,
    ipv6_prefix: u8,
}

fn key_case() -> impl Strategy<Value = KeyCase> {
    let fn_key = prop_oneof![
        any::<String>(),
        "[ -~]{0,220}",
        "[a-z0-9{}#:-]{0,12}",
        Just("x".repeat(200)),
        Just("x".repeat(201)),
        proptest::collection::vec(any::<char>(), 150..400)
            .prop_map(|chars| chars.into_iter().collect()),
    ];
    // Grouped by what they feed: the header key, the forwarded chain, the trust settings.
    (
        (
            prop_oneof![header_bytes(64), long_header_bytes(3000)],
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..32)),
            fn_key,
        ),
        (
            proptest::collection::vec(proptest::collection::vec(hop(), 0..6), 0..3),
            any::<SocketAddr>(),
            proptest::collection::vec((any::<IpAddr>(), any::<u8>()), 0..4),
        ),
        (any::<bool>(), any::<bool>(), any::<u8>()),
    )
        .prop_map(
            |(
                (header, secret, fn_key),
                (forwarded, peer, trusted),
                (trust_peer, trust_all, ipv6_prefix),
            )| {
                KeyCase {
                    header,
                    secret,
                    fn_key,
                    forwarded,
                    peer,
                    trusted,
                    trust_peer,
                    trust_all,
                    ipv6_prefix,
                }
            },
        )
}

/// Arbitrary header bytes (`HeaderKey`, with and without a secret), arbitrary strings
/// (`FnKey`), arbitrary forwarded lists, peers (v4/v6) and trusted proxies (`PeerIp`): no panic;
/// every storage key is printable ASCII with exactly one `{` and one `}`, the id is the key when
/// plain and its SHA-256 otherwise, at most prefix + 70 bytes for hashed, header and IP keys
/// (and prefix + 203 for a plain key of the maximal 200 bytes); and the same requests through
/// the layer on real Redis store exactly that key, without a store error.
#[test]
fn prop_key_extraction_paths_stay_bounded() {
    let _machine = shared_blocking();
    let redis = RedisServer::start();
    let runtime = support::current_thread_runtime();
    let prefix = "rl-prop";
    let limiter = Limiter::builder(redis_store(&redis))
        .prefix(prefix)
        .build()
        .unwrap();
    // Room for every case, and each request keeps its key for a while (TTL 3.6 s) so that the
    // test can see it in Redis.
    let quota = Quota::new(1_000_000, Duration::from_secs(3_600_000)).unwrap();
    let conn = std::cell::RefCell::new(redis.conn());
    let cases = AtomicU64::new(0);
    let hashed_fn_keys = AtomicU64::new(0);
    let longest = AtomicUsize::new(0);

    let mut runner = TestRunner::new(ProptestConfig {
        cases: 1000,
        failure_persistence: None, // this test may only create tests/hostile/
        ..ProptestConfig::default()
    });
    let started = Instant::now();
    runner
        .run(&key_case(), |case| {
            cases.fetch_add(1, Ordering::Relaxed);
            let header = HeaderValue::from_bytes(&case.header)
                .map_err(|e| TestCaseError::fail(format!("valid header bytes refused: {e}")))?;
            let mut request = http::Request::builder().header("x-api-key", header);
            for line in &case.forwarded {
                let joined = line.join(&b","[..]);
                let value = HeaderValue::from_bytes(&joined).map_err(|e| {
                    TestCaseError::fail(format!("valid forwarded bytes refused: {e}"))
                })?;
                request = request.header("x-forwarded-for", value);
            }
            let mut request = request.body(String::new()).unwrap();
            request.extensions_mut().insert(case.peer);
            request.extensions_mut().insert(RawKey(case.fn_key.clone()));

            let mut header_key = HeaderKey::named("x-api-key").unwrap();
            if let Some(secret) = &case.secret {
                header_key = header_key.with_secret(secret.clone());
            }
            let mut trusted: Vec<Cidr> = case
                .trusted
                .iter()
                .filter_map(|(ip, bits)| format!("{ip}/{}", bits % 129).parse().ok())
                .collect();
            if case.trust_peer {
                trusted.push(case.peer.ip().to_string().parse().unwrap());
            }
            if case.trust_all {
                trusted.push("0.0.0.0/0".parse().unwrap());
                trusted.push("::/0".parse().unwrap());
            }
            let peer_ip = PeerIp::new()
                .trust_proxies(trusted)
                .ipv6_prefix(case.ipv6_prefix);
            let fn_key = FnKey::new(|parts: &http::request::Parts| {
                parts.extensions.get::<RawKey>().map(|k| k.0.clone())
            });

            let (parts, _) = {
                let mut copy = Request::new(());
                *copy.headers_mut() = request.headers().clone();
                copy.extensions_mut().insert(case.peer);
                copy.extensions_mut().insert(RawKey(case.fn_key.clone()));
                copy.into_parts()
            };
            let owned = |key: Option<std::borrow::Cow<'_, str>>| key.map(|k| k.into_owned());
            let keys = [
                ("HeaderKey", owned(header_key.extract(&parts)), true),
                ("FnKey", owned(fn_key.extract(&parts)), false),
                ("PeerIp", owned(peer_ip.extract(&parts)), true),
            ];
            for (path, key, short) in &keys {
                let key = key
                    .as_ref()
                    .ok_or_else(|| TestCaseError::fail(format!("{path}: no key")))?;
                let storage = limiter.storage_key(key);
                check_storage_key(&storage, prefix, key)
                    .map_err(|e| TestCaseError::fail(format!("{path}: {e}")))?;
                let hashed = is_hash_id(&storage[prefix.len() + 2..storage.len() - 1]);
                if *short || hashed {
                    prop_assert!(
                        storage.len() <= prefix.len() + 70,
                        "{}: {} bytes: {}",
                        path,
                        storage.len(),
                        storage
                    );
                }
                if *path == "FnKey" && hashed {
                    hashed_fn_keys.fetch_add(1, Ordering::Relaxed);
                }
                longest.fetch_max(storage.len(), Ordering::Relaxed);
            }

            // Through the layer on real Redis: the key stored is exactly the layer's scoped
            // storage key (its scope after the hash tag).
            let by_header = RateLimitLayer::new(limiter.clone(), quota, header_key);
            let by_fn = RateLimitLayer::new(limiter.clone(), quota, fn_key);
            let by_ip = RateLimitLayer::new(limiter.clone(), quota, peer_ip);
            let scope = by_ip.scope().to_owned();
            let statuses = runtime.block_on(async {
                let copy = |request: &Request<String>| {
                    let mut new = Request::new(String::new());
                    *new.headers_mut() = request.headers().clone();
                    new.extensions_mut().insert(case.peer);
                    new.extensions_mut().insert(RawKey(case.fn_key.clone()));
                    new
                };
                [
                    send(&by_header, copy(&request)).await,
                    send(&by_fn, copy(&request)).await,
                    send(&by_ip, request).await,
                ]
            });
            prop_assert_eq!(statuses, [StatusCode::OK; 3]);
            for (path, key, _) in &keys {
                let storage = limiter.storage_key(Target::scoped(&scope, key.as_deref().unwrap()));
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&storage)
                    .query(&mut *conn.borrow_mut())
                    .unwrap();
                prop_assert!(exists, "{}: {} not in Redis", path, storage);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(limiter.stats().store_errors, 0, "no store error");

    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut *conn.borrow_mut())
        .unwrap();
    for key in &keys {
        check_redis_key(key, prefix).unwrap_or_else(|e| panic!("{e}"));
    }
    println!(
        "proptest: {} cases x 3 extraction paths in {:.2?}: {} FnKey keys hashed, longest \
         storage key {} B, {} Redis keys, all bounded with one hash tag",
        cases.load(Ordering::Relaxed),
        started.elapsed(),
        hashed_fn_keys.load(Ordering::Relaxed),
        longest.load(Ordering::Relaxed),
        keys.len()
    );
}
