//! The responses the layer builds itself (rejections), with the rate-limit headers that
//! [`headers`](super::headers) writes (its module docs give their format).
//!
//! # gRPC and gRPC-Web
//!
//! A request is gRPC by its media type, the `content-type` without its parameters and the
//! whitespace around it, in any case: `application/grpc` or `application/grpc+<codec>` (`+proto`,
//! `+json`, ...). `application/grpc-web[+<codec>]` and `application/grpc-web-text[+<codec>]` are
//! gRPC-Web; anything else, `application/grpcfoo` included, is plain HTTP. `RateLimitLayer` and
//! `ConcurrencyLimitLayer` read it with the same function (`Wire::of`).
//!
//! A gRPC request is answered the gRPC way: HTTP 200, trailers-only, `grpc-status: 8`
//! (RESOURCE_EXHAUSTED) or `14` (UNAVAILABLE) and a `grpc-message`, with the same hint headers
//! plus `grpc-retry-pushback-ms` (gRPC's retry hint, proposal A6: milliseconds, rounded up; `-1`,
//! "do not retry", for a cost the quota can never hold). A gRPC-Web request gets the same
//! trailers-only answer in its own protocol: `content-type: application/grpc-web` (or `application/grpc-web-text` for
//! the text encoding), the status in the headers and an empty body, which gRPC-Web clients read
//! as a trailers-only response; a browser's gRPC-Web client cannot read `application/grpc`.

use std::time::Duration;

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use super::body::ResponseBody;
use super::headers::HeaderStyle;
use crate::decision::{secs_rounded_up, Decision};

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// gRPC status RESOURCE_EXHAUSTED.
const GRPC_RESOURCE_EXHAUSTED: &str = "8";
/// gRPC status UNAVAILABLE.
const GRPC_UNAVAILABLE: &str = "14";

/// The body (and `grpc-message`) of a request denied by the quota.
const EXCEEDED: &str = "rate limit exceeded";
/// The body (and `grpc-message`) of a request denied because its key is suspended.
const SUSPENDED: &str = "rate limit: suspended, retry later";
/// The `grpc-message` when every concurrency slot is taken.
const TOO_MANY_CONCURRENT: &str = "too many concurrent requests";

/// How a request speaks, which decides how the layer answers it itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    /// Plain HTTP: 429 / 503 with a text body.
    Http,
    /// `application/grpc…`: a trailers-only gRPC response.
    Grpc,
    /// `application/grpc-web…` (binary): the same, as `application/grpc-web`.
    GrpcWeb,
    /// `application/grpc-web-text…` (base64): the same, as `application/grpc-web-text`.
    GrpcWebText,
}

impl Wire {
    /// The wire of a request, from its `content-type`.
    pub(crate) fn of(headers: &HeaderMap) -> Wire {
        headers
            .get(CONTENT_TYPE)
            .map_or(Wire::Http, |value| Wire::of_media_type(value.as_bytes()))
    }

    /// The wire of a `content-type` value. Only the media type counts, compared without regard
    /// to case (RFC 9110, 8.3.1), with its parameters (`; charset=utf-8`) and the whitespace
    /// around it ignored: `application/grpc` or `application/grpc+<codec>` is gRPC,
    /// `application/grpc-web[+<codec>]` and `application/grpc-web-text[+<codec>]` are
    /// gRPC-Web, anything else (`application/grpcfoo`) is plain HTTP.
    pub(crate) fn of_media_type(value: &[u8]) -> Wire {
        let essence = value.split(|&b| b == b';').next().unwrap_or_default();
        let essence = essence.trim_ascii();
        let Some(subtype) = strip_prefix_ignore_case(essence, b"application/") else {
            return Wire::Http;
        };
        // Longest name first: `grpc-web-text` also starts with `grpc-web` and `grpc`.
        for (name, wire) in [
            (&b"grpc-web-text"[..], Wire::GrpcWebText),
            (b"grpc-web", Wire::GrpcWeb),
            (b"grpc", Wire::Grpc),
        ] {
            if let Some(rest) = strip_prefix_ignore_case(subtype, name) {
                return match rest {
                    [] => wire,
                    [b'+', codec @ ..] if is_token(codec) => wire,
                    _ => Wire::Http,
                };
            }
        }
        Wire::Http
    }

    /// Whether the answer is a gRPC status (gRPC or gRPC-Web).
    fn is_grpc(self) -> bool {
        self != Wire::Http
    }

    /// The `content-type` of a gRPC answer on this wire.
    fn grpc_content_type(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Wire::GrpcWeb => "application/grpc-web",
            Wire::GrpcWebText => "application/grpc-web-text",
            _ => "application/grpc",
        })
    }
}

/// `value` without `prefix`, compared without regard to ASCII case.
fn strip_prefix_ignore_case<'a>(value: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let (head, rest) = value.split_at_checked(prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then_some(rest)
}

/// Whether `name` is a non-empty HTTP token (RFC 9110, 5.6.2), as a codec's name must be.
fn is_token(name: &[u8]) -> bool {
    !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The answer to a denied request: 429 (or gRPC RESOURCE_EXHAUSTED) with `Retry-After`; the
/// body (or `grpc-message`) says whether the key is over its quota or suspended.
pub(crate) fn too_many_requests<B>(
    decision: &Decision,
    style: &HeaderStyle,
    wire: Wire,
) -> Response<ResponseBody<B>> {
    let grpc = wire.is_grpc();
    let mut response = match (grpc, decision.suspended) {
        (true, false) => grpc_response(wire, GRPC_RESOURCE_EXHAUSTED, EXCEEDED),
        (true, true) => grpc_response(wire, GRPC_RESOURCE_EXHAUSTED, SUSPENDED),
        (false, false) => text_response(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded\n"),
        (false, true) => text_response(
            StatusCode::TOO_MANY_REQUESTS,
            "rate limit: suspended, retry later\n",
        ),
    };
    let hint = style.retry_hint(decision);
    let headers = response.headers_mut();
    let retry_secs = match hint {
        Some(wait) => secs_rounded_up(wait).max(1),
        None => style.never_allowed_secs(decision),
    };
    headers.insert(RETRY_AFTER, retry_secs.into());
    if grpc {
        let pushback = match hint {
            Some(wait) => pushback_ms(wait).into(),
            None => HeaderValue::from_static("-1"),
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

/// The answer when every concurrency slot is taken: 429 (or gRPC RESOURCE_EXHAUSTED) with
/// `Retry-After: 1` (a slot frees when a request ends, which no one can foretell).
pub(crate) fn too_many_concurrent<B>(wire: Wire) -> Response<ResponseBody<B>> {
    let mut response = if wire.is_grpc() {
        grpc_response(wire, GRPC_RESOURCE_EXHAUSTED, TOO_MANY_CONCURRENT)
    } else {
        text_response(
            StatusCode::TOO_MANY_REQUESTS,
            "too many concurrent requests\n",
        )
    };
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    if wire.is_grpc() {
        headers.insert(
            GRPC_RETRY_PUSHBACK_MS.clone(),
            HeaderValue::from_static("1000"),
        );
    }
    response
}

/// The answer when the store failed and the policy rejects: 503 (or gRPC UNAVAILABLE).
pub(crate) fn unavailable<B>(retry_after: Duration, wire: Wire) -> Response<ResponseBody<B>> {
    let grpc = wire.is_grpc();
    let mut response = if grpc {
        grpc_response(wire, GRPC_UNAVAILABLE, "rate limiter unavailable")
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
pub(crate) fn missing_key<B>(status: StatusCode, wire: Wire) -> Response<ResponseBody<B>> {
    if wire.is_grpc() {
        // The gRPC status closest to the configured HTTP one.
        let code = match status {
            StatusCode::UNAUTHORIZED => "16",        // UNAUTHENTICATED
            StatusCode::FORBIDDEN => "7",            // PERMISSION_DENIED
            StatusCode::TOO_MANY_REQUESTS => "8",    // RESOURCE_EXHAUSTED
            StatusCode::SERVICE_UNAVAILABLE => "14", // UNAVAILABLE
            _ => "3",                                // INVALID_ARGUMENT
        };
        grpc_response(wire, code, "no rate limit key in request")
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

fn grpc_response<B>(
    wire: Wire,
    status: &'static str,
    message: &'static str,
) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::rejection(""));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, wire.grpc_content_type());
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from_static(status));
    headers.insert(GRPC_MESSAGE.clone(), HeaderValue::from_static(message));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::layer::headers::tests::{denied, style};
    use crate::quota::Quota;

    #[test]
    fn grpc_web_is_answered_in_grpc_web() {
        let quota = Quota::per_minute(10).unwrap();
        let style = style("api", &[quota], false);
        let denied = denied(quota, Duration::from_secs(6));
        for (content_type, wire, answered) in [
            ("application/grpc", Wire::Grpc, "application/grpc"),
            ("application/grpc+proto", Wire::Grpc, "application/grpc"),
            (
                "application/grpc-web",
                Wire::GrpcWeb,
                "application/grpc-web",
            ),
            (
                "application/grpc-web+proto",
                Wire::GrpcWeb,
                "application/grpc-web",
            ),
            (
                "application/grpc-web-text",
                Wire::GrpcWebText,
                "application/grpc-web-text",
            ),
            (
                "application/grpc-web-text+proto",
                Wire::GrpcWebText,
                "application/grpc-web-text",
            ),
        ] {
            let mut request = HeaderMap::new();
            request.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            assert_eq!(Wire::of(&request), wire, "{content_type}");
            let response = too_many_requests::<()>(&denied, &style, wire);
            assert_eq!(response.status(), StatusCode::OK, "{content_type}");
            assert_eq!(response.headers()[CONTENT_TYPE], answered, "{content_type}");
            assert_eq!(response.headers()["grpc-status"], "8", "{content_type}");
            let closed = unavailable::<()>(Duration::from_secs(1), wire);
            assert_eq!(closed.headers()[CONTENT_TYPE], answered, "{content_type}");
            let keyless = missing_key::<()>(StatusCode::UNAUTHORIZED, wire);
            assert_eq!(keyless.headers()[CONTENT_TYPE], answered, "{content_type}");
        }
        assert_eq!(Wire::of(&HeaderMap::new()), Wire::Http);
    }

    #[test]
    fn the_wire_is_read_from_the_media_type() {
        use Wire::{Grpc, GrpcWeb, GrpcWebText, Http};
        for (content_type, wire) in [
            ("application/grpc", Grpc),
            ("application/grpc+proto", Grpc),
            ("application/grpc+json", Grpc),
            ("Application/GRPC", Grpc),
            ("APPLICATION/Grpc+Proto", Grpc),
            ("application/grpc; charset=utf-8", Grpc),
            ("application/grpc+proto ;charset=utf-8", Grpc),
            ("  application/grpc\t", Grpc),
            ("application/grpc-web", GrpcWeb),
            ("application/grpc-web+proto", GrpcWeb),
            ("Application/gRPC-Web+Thrift; x=y", GrpcWeb),
            ("application/grpc-web-text", GrpcWebText),
            ("application/grpc-web-text+proto", GrpcWebText),
            ("APPLICATION/GRPC-WEB-TEXT", GrpcWebText),
            ("application/grpcfoo", Http),
            ("application/grpc-webfoo", Http),
            ("application/grpc-web-textfoo", Http),
            ("application/grpc-web-", Http),
            ("application/grpc+", Http),
            ("application/grpc+pro to", Http),
            ("application/grpc+proto+", Grpc),
            ("application/grpc/x", Http),
            ("application/ grpc", Http),
            ("application/json", Http),
            ("text/grpc", Http),
            ("grpc", Http),
            ("application/", Http),
            ("", Http),
            ("; application/grpc", Http),
            ("text/plain; a=application/grpc", Http),
        ] {
            assert_eq!(
                Wire::of_media_type(content_type.as_bytes()),
                wire,
                "{content_type:?}"
            );
        }
        // Not UTF-8: plain HTTP, never a panic.
        assert_eq!(Wire::of_media_type(b"application/grpc+\xff"), Http);
        assert_eq!(Wire::of_media_type(b"\xffapplication/grpc"), Http);
    }

    #[test]
    fn suspended_denials_say_so_with_the_time_left() {
        let quota = Quota::per_minute(10).unwrap();
        let style = style("api", &[quota], false);
        let suspended = Decision {
            suspended: true,
            remaining: 4,
            ..denied(quota, Duration::from_millis(299_500))
        };
        let http = too_many_requests::<()>(&suspended, &style, Wire::Http);
        assert_eq!(http.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(http.headers()["retry-after"], "300");
        assert_eq!(http.headers()["ratelimit"], "\"api\";r=0;t=300");
        let grpc = too_many_requests::<()>(&suspended, &style, Wire::Grpc);
        assert_eq!(grpc.headers()["grpc-status"], "8");
        assert_eq!(grpc.headers()["grpc-message"], SUSPENDED);
        assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "299500");
        let exceeded =
            too_many_requests::<()>(&denied(quota, Duration::from_secs(6)), &style, Wire::Grpc);
        assert_eq!(exceeded.headers()["grpc-message"], EXCEEDED);
    }

    #[test]
    fn jitter_only_lengthens_retry_after_within_its_bound() {
        let quota = Quota::per_minute(10).unwrap();
        let jittered = HeaderStyle::new(
            "api",
            &quota.into(),
            Algorithm::TokenBucket,
            false,
            Duration::from_secs(10),
        );
        let decision = denied(quota, Duration::from_secs(6));
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let response = too_many_requests::<()>(&decision, &jittered, Wire::Http);
            let retry: u64 = response.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((6..=16).contains(&retry), "{retry}");
            // The state header tells the exact wait.
            assert_eq!(response.headers()["ratelimit"], "\"api\";r=0;t=6");
            seen.insert(retry);
        }
        assert!(seen.len() > 1, "200 draws over 11 values all gave {seen:?}");
        // No jitter on a cost that never fits: it waits a whole period, without pushback.
        let never = denied(quota, Decision::NEVER);
        let response = too_many_requests::<()>(&never, &jittered, Wire::Grpc);
        assert_eq!(response.headers()["retry-after"], "60");
        assert_eq!(response.headers()["grpc-retry-pushback-ms"], "-1");
    }

    #[test]
    fn grpc_rejections_carry_the_retry_pushback() {
        let quota = Quota::per_minute(10).unwrap();
        let style = style("api", &[quota], false);
        let denied = denied(quota, Duration::from_micros(5_999_001));
        let grpc = too_many_requests::<()>(&denied, &style, Wire::Grpc);
        assert_eq!(grpc.headers()["grpc-status"], "8");
        assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "6000");
        assert_eq!(grpc.headers()["retry-after"], "6");
        let never = Decision {
            retry_after: Decision::NEVER,
            ..denied
        };
        let grpc = too_many_requests::<()>(&never, &style, Wire::Grpc);
        assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "-1");
        let http = too_many_requests::<()>(&denied, &style, Wire::Http);
        assert!(http.headers().get("grpc-retry-pushback-ms").is_none());

        let closed = unavailable::<()>(Duration::from_millis(1500), Wire::Grpc);
        assert_eq!(closed.headers()["grpc-status"], "14");
        assert_eq!(closed.headers()["grpc-retry-pushback-ms"], "1500");
        assert_eq!(closed.headers()["retry-after"], "2");
    }
}
