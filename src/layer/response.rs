//! The responses the layer builds, and the rate-limit headers.
//!
//! Headers follow draft-ietf-httpapi-ratelimit-headers-11:
//! `RateLimit-Policy: "name";q=100;w=60` (the quota) and `RateLimit: "name";r=42;t=5` (what is
//! left, and seconds until it resets), on allowed and rejected responses alike. A rejection adds
//! `Retry-After` in delay-seconds (rounded up, at least 1). Optionally the legacy
//! `X-RateLimit-Limit / -Remaining / -Reset` too.
//!
//! A request whose `content-type` starts with `application/grpc` is answered the gRPC way: HTTP
//! 200, trailers-only, `grpc-status: 8` (RESOURCE_EXHAUSTED) or `14` (UNAVAILABLE) and a
//! `grpc-message`, with the same hint headers plus `grpc-retry-pushback-ms` (gRPC's retry hint,
//! proposal A6: milliseconds, rounded up; `-1`, "do not retry", for a cost the quota can never
//! hold).

use std::io::Write;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use super::body::ResponseBody;
use crate::algorithm::Algorithm;
use crate::decision::{secs_rounded_up, Decision};
use crate::quota::Quota;

static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// gRPC status RESOURCE_EXHAUSTED.
const GRPC_RESOURCE_EXHAUSTED: &str = "8";
/// gRPC status UNAVAILABLE.
const GRPC_UNAVAILABLE: &str = "14";

/// How the layer writes its headers; built once per layer.
#[derive(Debug, Clone)]
pub(crate) struct HeaderStyle {
    /// The quoted policy name, e.g. `"default"`.
    quoted_name: String,
    /// `RateLimit-Policy`, constant for a layer.
    policy: HeaderValue,
    /// The quota's period in whole seconds (at least 1): the retry hint for a cost the quota
    /// can never hold, which has no true retry time.
    period_secs: u64,
    /// Also send `X-RateLimit-*`.
    pub legacy: bool,
}

impl HeaderStyle {
    /// `name` must already be validated (`[A-Za-z0-9._-]`).
    pub(crate) fn new(name: &str, quota: &Quota, algorithm: Algorithm, legacy: bool) -> Self {
        let quoted_name = format!("\"{name}\"");
        let (q, w) = policy_window(quota, algorithm);
        let policy = HeaderValue::try_from(format!("{quoted_name};q={q};w={w}"))
            .unwrap_or_else(|_| HeaderValue::from_static("\"default\""));
        HeaderStyle {
            quoted_name,
            policy,
            period_secs: secs_rounded_up(quota.period()).max(1),
            legacy,
        }
    }

    /// `Retry-After` for a denied request, in whole seconds (at least 1).
    pub(crate) fn retry_after_secs(&self, decision: &Decision) -> u64 {
        if decision.never_allowed() {
            self.period_secs
        } else {
            decision.retry_after_secs()
        }
    }

    /// Adds the rate-limit headers describing `decision`.
    pub(crate) fn apply(&self, headers: &mut HeaderMap, decision: &Decision) {
        let t = if decision.allowed {
            decision.reset_after_secs()
        } else {
            self.retry_after_secs(decision)
        };
        // Written on the stack and copied once into the header value: one allocation, where a
        // `format!` took two (the string, then the shrink into `Bytes`). The name is at most 66
        // bytes and each number 20 digits, so 128 bytes always suffice.
        let mut state = [0u8; 128];
        let mut cursor = std::io::Cursor::new(&mut state[..]);
        let written = write!(
            cursor,
            "{};r={};t={}",
            self.quoted_name, decision.remaining, t
        );
        let len = cursor.position() as usize;
        // Appended, not inserted: with stacked layers every policy shows up as its own item.
        headers.append(RATELIMIT_POLICY.clone(), self.policy.clone());
        if written.is_ok() {
            if let Ok(value) = HeaderValue::from_bytes(&state[..len]) {
                headers.append(RATELIMIT.clone(), value);
            }
        }
        if !self.legacy {
            return;
        }
        // The legacy headers hold one policy: the most restrictive one (least remaining) wins.
        let tighter = headers
            .get(&X_REMAINING)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_none_or(|remaining| decision.remaining < remaining);
        if tighter {
            headers.insert(X_LIMIT.clone(), decision.limit.into());
            headers.insert(X_REMAINING.clone(), decision.remaining.into());
            headers.insert(X_RESET.clone(), decision.reset_after_secs().into());
        }
    }
}

/// `q` and `w` of `RateLimit-Policy`: whole seconds; a sub-second quota is scaled to one second.
/// `q` is what a window admits: the limit for the rate algorithms, the burst (their capacity per
/// window) for the window algorithms.
fn policy_window(quota: &Quota, algorithm: Algorithm) -> (u64, u64) {
    let per_window = match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => quota.burst(),
        _ => quota.limit(),
    };
    let period = quota.period();
    if period >= Duration::from_secs(1) {
        (per_window, secs_rounded_up(period))
    } else {
        let per_second = per_window as u128 * 1_000_000 / period.as_micros().max(1);
        (per_second.min(u64::MAX as u128) as u64, 1)
    }
}

/// Whether the request speaks gRPC.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The answer to a denied request: 429 (or gRPC RESOURCE_EXHAUSTED) with `Retry-After`.
pub(crate) fn too_many_requests<B>(
    decision: &Decision,
    style: &HeaderStyle,
    grpc: bool,
) -> Response<ResponseBody<B>> {
    let retry_secs = style.retry_after_secs(decision);
    let mut response = if grpc {
        grpc_response(GRPC_RESOURCE_EXHAUSTED, "rate limit exceeded")
    } else {
        text_response(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded\n")
    };
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, retry_secs.into());
    if grpc {
        let pushback = if decision.never_allowed() {
            HeaderValue::from_static("-1")
        } else {
            pushback_ms(decision.retry_after).into()
        };
        headers.insert(GRPC_RETRY_PUSHBACK_MS.clone(), pushback);
    }
    style.apply(headers, decision);
    response
}

/// `grpc-retry-pushback-ms`: whole milliseconds, rounded up, at least 1.
fn pushback_ms(retry_after: Duration) -> u64 {
    let millis = retry_after.as_nanos().div_ceil(1_000_000).max(1);
    u64::try_from(millis).unwrap_or(u64::MAX)
}

/// The answer when the store failed and the policy rejects: 503 (or gRPC UNAVAILABLE).
pub(crate) fn unavailable<B>(retry_after: Duration, grpc: bool) -> Response<ResponseBody<B>> {
    let mut response = if grpc {
        grpc_response(GRPC_UNAVAILABLE, "rate limiter unavailable")
    } else {
        text_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "rate limiter unavailable\n",
        )
    };
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, secs_rounded_up(retry_after).max(1).into());
    if grpc {
        headers.insert(
            GRPC_RETRY_PUSHBACK_MS.clone(),
            pushback_ms(retry_after).into(),
        );
    }
    response
}

/// The answer when a request has no key and the rule says reject.
pub(crate) fn missing_key<B>(status: StatusCode, grpc: bool) -> Response<ResponseBody<B>> {
    if grpc {
        // The gRPC status closest to the configured HTTP one.
        let code = match status {
            StatusCode::UNAUTHORIZED => "16",        // UNAUTHENTICATED
            StatusCode::FORBIDDEN => "7",            // PERMISSION_DENIED
            StatusCode::TOO_MANY_REQUESTS => "8",    // RESOURCE_EXHAUSTED
            StatusCode::SERVICE_UNAVAILABLE => "14", // UNAVAILABLE
            _ => "3",                                // INVALID_ARGUMENT
        };
        grpc_response(code, "no rate limit key in request")
    } else {
        text_response(status, "no rate limit key in request\n")
    }
}

fn text_response<B>(status: StatusCode, text: &'static str) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::rejection(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn grpc_response<B>(status: &'static str, message: &'static str) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::rejection(""));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from_static(status));
    headers.insert(GRPC_MESSAGE.clone(), HeaderValue::from_static(message));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_window_in_whole_seconds() {
        assert_eq!(
            policy_window(&Quota::per_minute(100).unwrap(), Algorithm::TokenBucket),
            (100, 60)
        );
        let half_second = Quota::new(5, Duration::from_millis(500)).unwrap();
        assert_eq!(policy_window(&half_second, Algorithm::TokenBucket), (10, 1));
        let odd = Quota::new(3, Duration::from_millis(1500)).unwrap();
        assert_eq!(policy_window(&odd, Algorithm::TokenBucket), (3, 2));
    }

    #[test]
    fn window_algorithms_advertise_their_capacity_per_window() {
        let quota = Quota::per_minute(10).unwrap().with_burst(50).unwrap();
        assert_eq!(policy_window(&quota, Algorithm::TokenBucket), (10, 60));
        assert_eq!(policy_window(&quota, Algorithm::Gcra), (10, 60));
        for window in [
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
        ] {
            assert_eq!(policy_window(&quota, window), (50, 60), "{window}");
        }
    }

    #[test]
    fn stacked_policies_are_all_listed_and_legacy_keeps_the_tightest() {
        let quota = Quota::per_minute(100).unwrap();
        let outer = HeaderStyle::new("minute", &quota, Algorithm::TokenBucket, true);
        let inner = HeaderStyle::new("second", &quota, Algorithm::TokenBucket, true);
        let decision = |remaining| Decision {
            allowed: true,
            limit: 100,
            remaining,
            retry_after: Duration::ZERO,
            reset_after: Duration::from_secs(1),
            suspended: false,
            quota,
        };
        let mut headers = HeaderMap::new();
        inner.apply(&mut headers, &decision(1));
        outer.apply(&mut headers, &decision(98));
        let states: Vec<_> = headers.get_all("ratelimit").iter().collect();
        assert_eq!(states, ["\"second\";r=1;t=1", "\"minute\";r=98;t=1"]);
        assert_eq!(headers.get_all("ratelimit-policy").iter().count(), 2);
        assert_eq!(headers["x-ratelimit-remaining"], "1");
    }

    #[test]
    fn grpc_rejections_carry_the_retry_pushback() {
        let quota = Quota::per_minute(10).unwrap();
        let style = HeaderStyle::new("api", &quota, Algorithm::TokenBucket, false);
        let denied = Decision {
            allowed: false,
            limit: 10,
            remaining: 0,
            retry_after: Duration::from_micros(5_999_001),
            reset_after: Duration::from_secs(60),
            suspended: false,
            quota,
        };
        let grpc = too_many_requests::<()>(&denied, &style, true);
        assert_eq!(grpc.headers()["grpc-status"], "8");
        assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "6000");
        assert_eq!(grpc.headers()["retry-after"], "6");
        let never = Decision {
            retry_after: Decision::NEVER,
            ..denied
        };
        let grpc = too_many_requests::<()>(&never, &style, true);
        assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "-1");
        let http = too_many_requests::<()>(&denied, &style, false);
        assert!(http.headers().get("grpc-retry-pushback-ms").is_none());

        let closed = unavailable::<()>(Duration::from_millis(1500), true);
        assert_eq!(closed.headers()["grpc-status"], "14");
        assert_eq!(closed.headers()["grpc-retry-pushback-ms"], "1500");
        assert_eq!(closed.headers()["retry-after"], "2");
    }

    #[test]
    fn headers_describe_the_decision() {
        let quota = Quota::per_minute(10).unwrap();
        let style = HeaderStyle::new("api", &quota, Algorithm::TokenBucket, true);
        let decision = Decision {
            allowed: true,
            limit: 10,
            remaining: 7,
            retry_after: Duration::ZERO,
            reset_after: Duration::from_millis(17_001),
            suspended: false,
            quota,
        };
        let mut headers = HeaderMap::new();
        style.apply(&mut headers, &decision);
        assert_eq!(headers["ratelimit-policy"], "\"api\";q=10;w=60");
        assert_eq!(headers["ratelimit"], "\"api\";r=7;t=18");
        assert_eq!(headers["x-ratelimit-remaining"], "7");
    }
}
