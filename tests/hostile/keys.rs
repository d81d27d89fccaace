//! Huge keys, non-UTF-8 and control bytes, braces, forwarded headers: every Redis key stays
//! short and printable with exactly one hash tag.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use http::{HeaderValue, Request, StatusCode};
use redis::aio::MultiplexedConnection;
use redlimit::key::{Cidr, FnKey, HeaderKey, KeyExtractor, PeerIp};
use redlimit::{limiter::DEFAULT_PREFIX, Algorithm, Quota, RateLimitLayer};

use crate::support::RedisServer;
use crate::{
    aconn, check_redis_key, check_storage_key, flushall, is_hash_id, manual_limiter, memory_usage,
    send, shared, used_memory, RawKey,
};

/// Every key in the private server (`KEYS *` is fine on a test server), binary-safe.
async fn all_keys(conn: &mut MultiplexedConnection) -> Vec<Vec<u8>> {
    redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("KEYS *")
}

/// A deterministic pseudo-random printable-ASCII string (no braces needed: hashed anyway).
fn pseudo_random_printable(len: usize, seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
            (b'!' + (r >> 58) as u8 % 94) as char
        })
        .collect()
}

fn with_header(name: &str, value: HeaderValue) -> Request<String> {
    let mut request = Request::new(String::new());
    request
        .headers_mut()
        .insert(http::HeaderName::try_from(name).unwrap(), value);
    request
}

// ---------------------------------------------------------------------------------------------
// 1. Huge keys
// ---------------------------------------------------------------------------------------------

/// A 1 MB header value as the key, through the layer with `HeaderKey` and with an `FnKey`
/// returning the raw value, and a 1 MB key given to `Limiter::check`: Redis holds only short
/// keys (< 140 bytes: a hex digest as hash tag, then the layer's scope), never the value, and the same huge value still
/// counts against one key (2 admitted, the 3rd gets 429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn megabyte_keys_become_short_redis_keys() {
    let _machine = shared().await;
    const MB: usize = 1 << 20;
    let redis = RedisServer::start();
    let mut conn = aconn(&redis).await;
    let quota = Quota::per_minute(2).unwrap();
    let header_raw = pseudo_random_printable(MB, 1);
    let fn_raw = pseudo_random_printable(MB, 2);
    let direct_raw = pseudo_random_printable(MB, 3);

    for &algorithm in Algorithm::ALL {
        // A frozen client clock: a request pair that straddled a window's end would be judged
        // by the sliding window counter's weighting, not by the key (the third request of
        // three at 2/min was admitted once, across a minute's end).
        let (limiter, _clock) = manual_limiter(&redis, algorithm);
        // Script loaded and connection open before the baseline.
        assert!(limiter.check("warm-up", &quota).await.is_allowed());
        flushall(&mut conn).await;
        let memory_before = used_memory(&mut conn).await;

        let by_header = RateLimitLayer::new(
            limiter.clone(),
            quota,
            HeaderKey::named("x-api-key").unwrap(),
        );
        let by_fn = RateLimitLayer::new(
            limiter.clone(),
            quota,
            FnKey::new(|parts: &http::request::Parts| {
                parts.headers.get("x-raw")?.to_str().ok().map(str::to_owned)
            }),
        );
        let header_value = HeaderValue::from_str(&header_raw).unwrap();
        let fn_value = HeaderValue::from_str(&fn_raw).unwrap();
        let mut header_statuses = Vec::new();
        let mut fn_statuses = Vec::new();
        let mut direct = Vec::new();
        for _ in 0..3 {
            header_statuses
                .push(send(&by_header, with_header("x-api-key", header_value.clone())).await);
            fn_statuses.push(send(&by_fn, with_header("x-raw", fn_value.clone())).await);
            direct.push(limiter.check(&direct_raw, &quota).await.is_allowed());
        }
        let expected = [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ];
        assert_eq!(
            header_statuses, expected,
            "{algorithm}: HeaderKey, 1 MB value"
        );
        assert_eq!(fn_statuses, expected, "{algorithm}: FnKey, 1 MB value");
        assert_eq!(direct, [true, true, false], "{algorithm}: check(1 MB key)");
        assert_eq!(
            limiter.stats().store_errors,
            0,
            "{algorithm}: no store error"
        );

        let keys = all_keys(&mut conn).await;
        let mut tags = BTreeSet::new();
        for key in &keys {
            let tag =
                check_redis_key(key, DEFAULT_PREFIX).unwrap_or_else(|e| panic!("{algorithm}: {e}"));
            // A 65-byte hash tag and the layer's scope (configuration, not client input).
            assert!(key.len() < 140, "{algorithm}: key of {} bytes", key.len());
            for raw in [&header_raw, &fn_raw, &direct_raw] {
                assert!(
                    !String::from_utf8_lossy(key).contains(&raw[..16]),
                    "{algorithm}: a Redis key contains the raw value"
                );
            }
            let header_tag = tag.starts_with("x-api-key:")
                && tag.len() == "x-api-key:".len() + 32
                && tag["x-api-key:".len()..]
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit());
            assert!(
                header_tag || is_hash_id(&tag),
                "{algorithm}: unexpected hash tag {tag:?}"
            );
            tags.insert(tag);
        }
        assert_eq!(tags.len(), 3, "{algorithm}: three limiter keys: {tags:?}");
        for raw in [&fn_raw, &direct_raw] {
            let storage = limiter.storage_key(raw);
            assert!(
                keys.iter().any(|k| k.starts_with(storage.as_bytes())),
                "{algorithm}: storage_key() is what Redis holds"
            );
        }
        let memory_after = used_memory(&mut conn).await;
        let mut per_key = Vec::new();
        for key in &keys {
            per_key.push(format!(
                "{} ({} B key, MEMORY USAGE {} B)",
                String::from_utf8_lossy(key),
                key.len(),
                memory_usage(&mut conn, key).await
            ));
        }
        let grew = memory_after.saturating_sub(memory_before);
        println!(
            "{algorithm}: 3 x 1 MB keys -> {} Redis keys, used_memory +{grew} B:\n  {}",
            keys.len(),
            per_key.join("\n  ")
        );
        assert!(
            grew < 64 * 1024,
            "{algorithm}: used_memory grew {grew} B for 3 x 1 MB keys"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Non-UTF-8, control bytes, braces, forwarded headers
// ---------------------------------------------------------------------------------------------
fn hostile_header_values() -> Vec<Vec<u8>> {
    let mut values: Vec<Vec<u8>> = vec![
        (0x80..=0xff).collect(),
        b"\t".to_vec(),
        b"a\tb".to_vec(),
        b"\xff\xfe{}".to_vec(),
        b"{tenant}".to_vec(),
        b"\x80{a}\xff".to_vec(),
        b"}{".to_vec(),
        b"#abc".to_vec(),
        b"  spaced  ".to_vec(),
        "é🦀".as_bytes().to_vec(),
        b"\xc3\x28".to_vec(), // invalid UTF-8 sequence
    ];
    values.push(vec![0xff; 300]);
    values
}

fn hostile_strings() -> Vec<String> {
    vec![
        "\0".into(),
        "\n".into(),
        "\r\n".into(),
        "\x1b[31mred".into(),
        "\x7f".into(),
        "a\0b".into(),
        "{".into(),
        "}".into(),
        "{}".into(),
        "{a}".into(),
        "a".into(),
        "a{b}c".into(),
        "}{".into(),
        "{{x}}".into(),
        "#".into(),
        "#abc".into(),
        "".into(),
        " ".into(),
        "é".into(),
        "🦀".into(),
        "\u{202e}rtl".into(),
        "\u{feff}bom".into(),
        "x".repeat(200),
        "x".repeat(201),
        "{".repeat(300),
        "tenant-42".into(),
        "redlimit:{evil}".into(),
    ]
}

/// Non-UTF-8 and control bytes in headers (`HeaderKey`, `FnKey`, forwarded headers through
/// `PeerIp::trust_proxies`), keys with braces: no panic, no store error, every Redis key bounded
/// and printable with exactly one `{...}` section, and distinct hostile keys stay distinct
/// (quota 1/min: first request 200, repeat 429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_control_bytes_and_braces_are_safe() {
    let _machine = shared().await;
    let redis = RedisServer::start();
    let mut conn = aconn(&redis).await;
    let one = Quota::per_minute(1).unwrap();
    let many = Quota::per_minute(1_000).unwrap();

    for &algorithm in Algorithm::ALL {
        flushall(&mut conn).await;
        // A frozen client clock: a request pair that straddled a window's end would be judged
        // by the sliding window counter's weighting, not by the key (the third request of
        // three at 2/min was admitted once, across a minute's end).
        let (limiter, _clock) = manual_limiter(&redis, algorithm);

        // HeaderKey: non-UTF-8 values hash fine; each distinct value is its own key.
        let by_header =
            RateLimitLayer::new(limiter.clone(), one, HeaderKey::named("x-api-key").unwrap());
        for value in hostile_header_values() {
            let header = HeaderValue::from_bytes(&value).expect("valid header bytes");
            let first = send(&by_header, with_header("x-api-key", header.clone())).await;
            let again = send(&by_header, with_header("x-api-key", header)).await;
            assert_eq!(
                (first, again),
                (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS),
                "{algorithm}: HeaderKey {value:?}"
            );
        }

        // FnKey over the raw bytes (lossy UTF-8: different bytes may share a key, so only
        // "no panic, no error, 200 or 429" is asserted here).
        let lossy = RateLimitLayer::new(
            limiter.clone(),
            one,
            FnKey::new(|parts: &http::request::Parts| {
                let value = parts.headers.get("x-raw")?;
                Some(format!(
                    "lossy:{}",
                    String::from_utf8_lossy(value.as_bytes())
                ))
            }),
        );
        for value in hostile_header_values() {
            let header = HeaderValue::from_bytes(&value).unwrap();
            let status = send(&lossy, with_header("x-raw", header)).await;
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{algorithm}: lossy FnKey {value:?} -> {status}"
            );
        }

        // FnKey returning arbitrary strings: control bytes, braces, '#', empty, 200/201 bytes.
        let by_string = RateLimitLayer::new(
            limiter.clone(),
            one,
            FnKey::new(|parts: &http::request::Parts| {
                parts.extensions.get::<RawKey>().map(|k| k.0.clone())
            }),
        );
        let strings = hostile_strings();
        for key in &strings {
            let request = || {
                let mut request = Request::new(String::new());
                request.extensions_mut().insert(RawKey(key.clone()));
                request
            };
            let first = send(&by_string, request()).await;
            let again = send(&by_string, request()).await;
            assert_eq!(
                (first, again),
                (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS),
                "{algorithm}: FnKey {key:?} must be its own key"
            );
            check_storage_key(&limiter.storage_key(key), DEFAULT_PREFIX, key)
                .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
        }
        let distinct: BTreeSet<String> = strings.iter().map(|k| limiter.storage_key(k)).collect();
        assert_eq!(
            distinct.len(),
            strings.len(),
            "{algorithm}: no two keys collide"
        );

        // PeerIp behind trusted proxies with hostile forwarded headers.
        let peer_ip = PeerIp::new().trust_proxies([
            "10.0.0.0/8".parse::<Cidr>().unwrap(),
            "::1".parse::<Cidr>().unwrap(),
        ]);
        let by_ip = RateLimitLayer::new(limiter.clone(), many, peer_ip.clone());
        let long_chain = format!("198.51.100.1{}", ", 10.0.0.2".repeat(20_000));
        let forwarded: Vec<(&str, Vec<u8>)> = vec![
            ("10.0.0.1:1234", (0x80..=0xff).collect()),
            ("10.0.0.1:1234", b"\t203.0.113.9\t".to_vec()),
            ("10.0.0.1:1234", b"203.0.113.7, \xff\xfe".to_vec()),
            ("10.0.0.1:1234", b"\xff, 203.0.113.8".to_vec()),
            ("10.0.0.1:1234", b"1.2.3.4, 10.1.1.1".to_vec()),
            ("10.0.0.1:1234", b"[2001:db8::1]:443".to_vec()),
            ("10.0.0.1:1234", b"999.1.1.1, {x}".to_vec()),
            ("10.0.0.1:1234", b",,, ,".to_vec()),
            ("10.0.0.1:1234", long_chain.into_bytes()),
            ("[::1]:80", b"2001:db8:aaaa:bbbb:cccc::1".to_vec()),
            ("[::1]:80", b"::ffff:192.0.2.1".to_vec()),
            ("198.51.100.200:1", b"203.0.113.66".to_vec()),
        ];
        for (peer, value) in &forwarded {
            let header = HeaderValue::from_bytes(value).expect("valid header bytes");
            let mut request = with_header("x-forwarded-for", header);
            request
                .extensions_mut()
                .insert(peer.parse::<SocketAddr>().unwrap());
            let (parts, _) = {
                let mut clone = Request::new(());
                *clone.headers_mut() = request.headers().clone();
                clone
                    .extensions_mut()
                    .insert(peer.parse::<SocketAddr>().unwrap());
                clone.into_parts()
            };
            let key = peer_ip.extract(&parts).expect("a peer address gives a key");
            assert!(key.starts_with("ip:") && key.len() <= 50, "{key}");
            let status = send(&by_ip, request).await;
            assert_eq!(status, StatusCode::OK, "{algorithm}: XFF from {peer}");
        }

        assert_eq!(
            limiter.stats().store_errors,
            0,
            "{algorithm}: no store error"
        );
        let keys = all_keys(&mut conn).await;
        let mut longest = 0;
        for key in &keys {
            check_redis_key(key, DEFAULT_PREFIX).unwrap_or_else(|e| panic!("{algorithm}: {e}"));
            longest = longest.max(key.len());
        }
        println!(
            "{algorithm}: {} header values, {} hostile strings, {} forwarded headers -> {} Redis \
             keys, all printable with one hash tag, longest {longest} B (the 200-byte plain key)",
            hostile_header_values().len(),
            strings.len(),
            forwarded.len(),
            keys.len()
        );
        // The prefix, the braces, a 200-byte plain key and a scope (configuration).
        assert!(longest <= DEFAULT_PREFIX.len() + 3 + 200 + 64);
    }
}
