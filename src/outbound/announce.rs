//! Reading what an upstream announces about its limits in its response headers, with bounded
//! work: the IETF fields and the common `X-RateLimit-*` trio.
//!
//! - **IETF** (draft-ietf-httpapi-ratelimit-headers-11): `RateLimit-Policy: "name";q=100;w=60`
//!   (a Structured Field List of policies: quota `q`, window `w` in seconds, quota unit `qu`,
//!   partition key `pk`) and `RateLimit: "name";r=50;t=30` (what is left, `r`, and the seconds
//!   until the window ends, `t`). The working group's text after -11 (-12) names a policy with a
//!   Token or a String and calls the service limit's parameters `a` (available) and `w`
//!   (effective window): both spellings are read.
//! - **`X-RateLimit-*`**: `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`,
//!   each a plain number. The reset is delta seconds or, GitHub's style, Unix epoch seconds: told
//!   apart by magnitude, as the clients of those APIs do (a value of at least
//!   [`EPOCH_THRESHOLD`], 2001-09-09, is a date; nobody announces a 31-year window). The limit
//!   carries no window: the caller supplies it.
//!
//! The IETF fields are Structured Fields (RFC 8941, and RFC 9651, which adds Dates `@…` and
//! Display Strings `%"…"`), read as those RFCs define them: a parameter given twice takes its
//! later value, and parameters this module does not know (`pk`, vendor parameters of any type,
//! Dates and Display Strings included) are parsed and skipped.
//!
//! Bounds, so a hostile upstream (or anything between it and us) costs a little CPU and nothing
//! else: a field of more than [`MAX_FIELD_LINES`] lines or [`MAX_FIELD_BYTES`] bytes, more than
//! [`MAX_MEMBERS`] list members or [`MAX_PARAMS`] parameters on one, numbers of more than 15
//! digits, anything that is not the Structured Field syntax (non-ASCII bytes included, an empty
//! line among several): the whole field is ignored, never a panic, never an allocation that
//! grows with the input. A repeated `X-RateLimit-*` header is ignored too (which one would be
//! true?).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

/// A field of more lines than this is ignored.
pub(crate) const MAX_FIELD_LINES: usize = 8;
/// A field (all its lines together) longer than this is ignored.
pub(crate) const MAX_FIELD_BYTES: usize = 2048;
/// A list of more members than this is ignored.
pub(crate) const MAX_MEMBERS: usize = 8;
/// A member with more parameters than this makes its list ignored.
pub(crate) const MAX_PARAMS: usize = 8;
/// An `X-RateLimit-Reset` of at least this is Unix epoch seconds, below it delta seconds.
pub(crate) const EPOCH_THRESHOLD: u64 = 1_000_000_000;
/// Structured-field Integers have at most 15 digits (RFC 8941 §3.3.1).
const MAX_DIGITS: usize = 15;

/// A quota the upstream announced: `limit` requests per `window` (`None`: not announced, as with
/// `X-RateLimit-Limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub limit: u64,
    pub window: Option<Duration>,
}

/// What is left under the tightest announced limit, and when it resets (`None`: not said).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Left {
    pub remaining: u64,
    pub reset: Option<Duration>,
}

/// What one response announced. Empty when it announced nothing readable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Announcement {
    /// The quota policies, at most [`MAX_MEMBERS`].
    pub policies: Vec<Policy>,
    /// The service limit with the least left.
    pub left: Option<Left>,
}

impl Announcement {
    /// Whether nothing readable was announced.
    pub(crate) fn is_empty(&self) -> bool {
        self.policies.is_empty() && self.left.is_none()
    }
}

/// What `headers` announce: the IETF fields when the response has either, else `X-RateLimit-*`.
pub(crate) fn read(headers: &HeaderMap, now: SystemTime) -> Announcement {
    if headers.contains_key("ratelimit-policy") || headers.contains_key("ratelimit") {
        return Announcement {
            policies: ietf_policies(headers),
            left: ietf_left(headers),
        };
    }
    x_ratelimit(headers, now)
}

/// `RateLimit-Policy`: every well-formed policy counted in requests.
fn ietf_policies(headers: &HeaderMap) -> Vec<Policy> {
    let mut policies = Vec::new();
    let _ = for_each_member(headers, "ratelimit-policy", |params| {
        // A quota counted in anything but requests (content bytes, concurrency) is not ours.
        if params.qu.is_some_and(|unit| unit != b"requests") {
            return;
        }
        let Some(limit) = params.q else { return };
        let window = match params.w {
            Some(0) => return,
            Some(seconds) => Some(Duration::from_secs(seconds)),
            None => None,
        };
        policies.push(Policy { limit, window });
    });
    policies
}

/// `RateLimit`: the service limit with the least left (on a tie, the latest reset).
fn ietf_left(headers: &HeaderMap) -> Option<Left> {
    let mut least: Option<Left> = None;
    let _ = for_each_member(headers, "ratelimit", |params| {
        let Some(remaining) = params.r.or(params.a) else {
            return;
        };
        let reset = params.t.or(params.w).map(Duration::from_secs);
        let this = Left { remaining, reset };
        least = Some(match least {
            Some(old) if old.remaining < remaining => old,
            Some(old) if old.remaining == remaining && old.reset >= reset => old,
            _ => this,
        });
    });
    least
}

/// `X-RateLimit-Limit`, `-Remaining`, `-Reset`; each ignored when missing, repeated or not a
/// plain number.
fn x_ratelimit(headers: &HeaderMap, now: SystemTime) -> Announcement {
    let limit = single(headers, "x-ratelimit-limit").and_then(integer);
    let remaining = single(headers, "x-ratelimit-remaining").and_then(integer);
    let reset = single(headers, "x-ratelimit-reset").and_then(|value| reset_in(value, now));
    Announcement {
        policies: limit
            .filter(|&limit| limit > 0)
            .map(|limit| Policy {
                limit,
                window: None,
            })
            .into_iter()
            .collect(),
        left: remaining.map(|remaining| Left { remaining, reset }),
    }
}

/// The one value of `name`; `None` when missing or repeated.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values.next().is_none().then(|| value.as_bytes())
}

/// A plain non-negative number of at most 15 digits, spaces around allowed.
fn integer(value: &[u8]) -> Option<u64> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > MAX_DIGITS || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(value.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// An `X-RateLimit-Reset` as the time from `now`: delta seconds, or Unix epoch seconds (zero
/// when passed), told apart by [`EPOCH_THRESHOLD`]; up to 3 decimals (Discord's style).
/// Values of 10^12 and up (milliseconds since the epoch, or noise) are not read.
fn reset_in(value: &[u8], now: SystemTime) -> Option<Duration> {
    let value = value.trim_ascii();
    let (whole, millis) = match value.iter().position(|&b| b == b'.') {
        Some(dot) => {
            let fraction = &value[dot + 1..];
            if fraction.is_empty() || fraction.len() > 3 {
                return None;
            }
            let digits = integer(fraction)?;
            (&value[..dot], digits * 10u64.pow(3 - fraction.len() as u32))
        }
        None => (value, 0),
    };
    let seconds = integer(whole)?;
    if seconds >= 1_000_000_000_000 {
        return None;
    }
    let at = Duration::from_secs(seconds) + Duration::from_millis(millis);
    if seconds < EPOCH_THRESHOLD {
        return Some(at);
    }
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    Some(at.saturating_sub(now))
}

/// The parameters of one list member this module reads, all Integers but `qu` (a String).
#[derive(Debug, Default, Clone, Copy)]
struct Params<'a> {
    q: Option<u64>,
    qu: Option<&'a [u8]>,
    w: Option<u64>,
    r: Option<u64>,
    a: Option<u64>,
    t: Option<u64>,
}

/// Parses the List `name` (all its lines, RFC 8941 §4.2) and calls `member` with each member's
/// parameters, but only once the whole field has parsed: a field that fails anywhere is
/// ignored whole. A member whose item is not a String or Token, or whose known parameters have
/// the wrong type, is skipped. `Err` when the field is ignored.
fn for_each_member<'a>(
    headers: &'a HeaderMap,
    name: &str,
    mut member: impl FnMut(Params<'a>),
) -> Result<(), ()> {
    let mut parsed = [(false, Params::default()); MAX_MEMBERS];
    let mut count = 0;
    let (mut lines, mut bytes, mut empty_line) = (0, 0, false);
    for value in headers.get_all(name) {
        lines += 1;
        bytes += value.len();
        if lines > MAX_FIELD_LINES || bytes > MAX_FIELD_BYTES {
            return Err(());
        }
        // Lines of one field are one list (RFC 8941 §4.2: joined with commas).
        let mut parser = Parser {
            input: value.as_bytes(),
            at: 0,
        };
        parser.skip_spaces();
        empty_line |= parser.done();
        while !parser.done() {
            if count == MAX_MEMBERS {
                return Err(());
            }
            parsed[count] = parser.member()?;
            count += 1;
            parser.skip_ows();
            if parser.done() {
                break;
            }
            parser.expect(b',')?;
            parser.skip_ows();
            if parser.done() {
                return Err(()); // a trailing comma
            }
        }
    }
    if empty_line && lines > 1 {
        // Lines joined with commas: an empty one leaves an empty member (RFC 8941 §4.2).
        return Err(());
    }
    for (usable, params) in &parsed[..count] {
        if *usable {
            member(*params);
        }
    }
    Ok(())
}

/// A bare item of RFC 8941 §3.3, as far as this module needs to tell them apart.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bare<'a> {
    Integer(Option<u64>), // `None`: negative
    Decimal,
    String(&'a [u8]),
    Token(&'a [u8]),
    Bytes,
    Boolean,
    /// RFC 9651 §3.3.7: `@` and an Integer, seconds since the Unix epoch.
    Date,
    /// RFC 9651 §3.3.8: `%"…"`, Unicode percent-encoded as UTF-8.
    DisplayString,
}

/// A cursor over one field line.
struct Parser<'a> {
    input: &'a [u8],
    at: usize,
}

impl<'a> Parser<'a> {
    fn done(&self) -> bool {
        self.at >= self.input.len()
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Result<(), ()> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(())
        }
    }

    fn skip_spaces(&mut self) {
        while self.peek() == Some(b' ') {
            self.at += 1;
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }

    /// One list member: an Item with its parameters (an Inner List is refused: no field read
    /// here has one). Returns whether it is usable (a String or Token item) and its parameters.
    fn member(&mut self) -> Result<(bool, Params<'a>), ()> {
        let item = self.bare()?;
        let usable = matches!(item, Bare::String(_) | Bare::Token(_));
        let mut params = Params::default();
        // Per known parameter (q, w, r, a, t, qu): its latest value has the wrong type.
        let mut wrong_type = [false; 6];
        let mut count = 0;
        while self.peek() == Some(b';') {
            self.at += 1;
            count += 1;
            if count > MAX_PARAMS {
                return Err(());
            }
            self.skip_spaces();
            let key = self.key()?;
            let value = if self.peek() == Some(b'=') {
                self.at += 1;
                self.bare()?
            } else {
                Bare::Boolean
            };
            // A later parameter of the same name wins (RFC 8941 §4.2.3.2), its type too.
            let int = |value| match value {
                Bare::Integer(Some(n)) => Some(n),
                _ => None,
            };
            let (slot, known) = match key {
                b"q" => (&mut params.q, 0),
                b"w" => (&mut params.w, 1),
                b"r" => (&mut params.r, 2),
                b"a" => (&mut params.a, 3),
                b"t" => (&mut params.t, 4),
                b"qu" => {
                    params.qu = match value {
                        Bare::String(unit) => Some(unit),
                        _ => None,
                    };
                    wrong_type[5] = params.qu.is_none();
                    continue;
                }
                _ => continue, // pk, vendor parameters: comments to us
            };
            *slot = int(value);
            wrong_type[known] = slot.is_none();
        }
        Ok((usable && !wrong_type.contains(&true), params))
    }

    /// A parameter key: lcalpha or `*`, then lcalpha, digits, `_-.*`.
    fn key(&mut self) -> Result<&'a [u8], ()> {
        let start = self.at;
        match self.peek() {
            Some(b'a'..=b'z' | b'*') => self.at += 1,
            _ => return Err(()),
        }
        while matches!(
            self.peek(),
            Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
        ) {
            self.at += 1;
        }
        Ok(&self.input[start..self.at])
    }

    fn bare(&mut self) -> Result<Bare<'a>, ()> {
        match self.peek().ok_or(())? {
            b'-' | b'0'..=b'9' => self.number(),
            b'"' => self.string(),
            b':' => self.byte_sequence(),
            b'?' => {
                self.at += 1;
                match self.peek() {
                    Some(b'0' | b'1') => {
                        self.at += 1;
                        Ok(Bare::Boolean)
                    }
                    _ => Err(()),
                }
            }
            b'A'..=b'Z' | b'a'..=b'z' | b'*' => Ok(self.token()),
            b'@' => {
                self.at += 1;
                match self.number()? {
                    Bare::Integer(_) => Ok(Bare::Date),
                    _ => Err(()),
                }
            }
            b'%' => self.display_string(),
            _ => Err(()),
        }
    }

    /// An Integer (at most 15 digits) or a Decimal (12 digits, a dot, 1 to 3 digits).
    fn number(&mut self) -> Result<Bare<'a>, ()> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        let digits = self.at - start;
        if digits == 0 || digits > MAX_DIGITS {
            return Err(());
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            let fraction = self.at;
            while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.at += 1;
            }
            let decimals = self.at - fraction;
            if digits > 12 || decimals == 0 || decimals > 3 {
                return Err(());
            }
            return Ok(Bare::Decimal);
        }
        let value = integer(&self.input[start..self.at]).ok_or(())?;
        // `-0` is zero, a valid Integer.
        Ok(Bare::Integer((!negative || value == 0).then_some(value)))
    }

    /// A String: printable ASCII between quotes, `\"` and `\\` escaped. Returns the raw bytes
    /// between the quotes (the values this module compares contain no escapes).
    fn string(&mut self) -> Result<Bare<'a>, ()> {
        self.at += 1;
        let start = self.at;
        loop {
            match self.peek().ok_or(())? {
                b'\\' => {
                    self.at += 1;
                    match self.peek() {
                        Some(b'"' | b'\\') => self.at += 1,
                        _ => return Err(()),
                    }
                }
                b'"' => {
                    let value = &self.input[start..self.at];
                    self.at += 1;
                    return Ok(Bare::String(value));
                }
                0x20..=0x7e => self.at += 1,
                _ => return Err(()),
            }
        }
    }

    /// A Display String `%"…"` (RFC 9651 §4.2.10): printable ASCII but `"` and `%`, or `%` and
    /// two lowercase hex digits; the bytes it stands for must be UTF-8. Checked, not kept: a
    /// vendor parameter is a comment to us.
    fn display_string(&mut self) -> Result<Bare<'a>, ()> {
        self.at += 1;
        self.expect(b'"')?;
        // A line is at most `MAX_FIELD_BYTES` long, and its decoded text no longer.
        let mut decoded = [0u8; MAX_FIELD_BYTES];
        let mut len = 0;
        loop {
            let byte = match self.peek().ok_or(())? {
                b'"' => {
                    self.at += 1;
                    std::str::from_utf8(&decoded[..len]).map_err(|_| ())?;
                    return Ok(Bare::DisplayString);
                }
                b'%' => {
                    let hex = self.input.get(self.at + 1..self.at + 3).ok_or(())?;
                    self.at += 3;
                    lowercase_hex(hex[0])? << 4 | lowercase_hex(hex[1])?
                }
                byte @ 0x20..=0x7e => {
                    self.at += 1;
                    byte
                }
                _ => return Err(()),
            };
            *decoded.get_mut(len).ok_or(())? = byte;
            len += 1;
        }
    }

    /// A Byte Sequence `:base64:` (checked, not decoded: a partition key is a comment to us).
    fn byte_sequence(&mut self) -> Result<Bare<'a>, ()> {
        self.at += 1;
        loop {
            match self.peek().ok_or(())? {
                b':' => {
                    self.at += 1;
                    return Ok(Bare::Bytes);
                }
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' | b'=' => self.at += 1,
                _ => return Err(()),
            }
        }
    }

    /// A Token: ALPHA or `*`, then tchar, `:` or `/`.
    fn token(&mut self) -> Bare<'a> {
        let start = self.at;
        self.at += 1;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b":/!#$%&'*+-.^_`|~".contains(&b))
        {
            self.at += 1;
        }
        Bare::Token(&self.input[start..self.at])
    }
}

/// The value of a lowercase hex digit (a Display String's escapes allow no other).
fn lowercase_hex(digit: u8) -> Result<u8, ()> {
    match digit {
        b'0'..=b'9' => Ok(digit - b'0'),
        b'a'..=b'f' => Ok(digit - b'a' + 10),
        _ => Err(()),
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(fields: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    const NOW: u64 = 1_750_000_000;

    fn policy(limit: u64, window: u64) -> Policy {
        Policy {
            limit,
            window: Some(Duration::from_secs(window)),
        }
    }

    fn left(remaining: u64, reset: u64) -> Option<Left> {
        Some(Left {
            remaining,
            reset: Some(Duration::from_secs(reset)),
        })
    }

    #[test]
    fn the_drafts_examples_read() {
        let read = |fields: &[(&'static str, &str)]| read(&headers(fields), at(NOW));
        // draft -11 §3.2 and §4.2.
        let a = read(&[
            (
                "ratelimit-policy",
                r#""permin";q=50;w=60,"perhr";q=1000;w=3600"#,
            ),
            ("ratelimit", r#""default";r=50;t=30"#),
        ]);
        assert_eq!(a.policies, [policy(50, 60), policy(1000, 3600)]);
        assert_eq!(a.left, left(50, 30));
        let a = read(&[(
            "ratelimit-policy",
            r#""peruser";q=100;w=60;pk=:cHsdsRa894==:"#,
        )]);
        assert_eq!(a.policies, [policy(100, 60)]);
        assert_eq!(a.left, None);
        // A quota in content bytes is not a request quota.
        let a = read(&[(
            "ratelimit-policy",
            r#""peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:"#,
        )]);
        assert!(a.is_empty(), "{a:?}");
        let a = read(&[("ratelimit", r#""default";r=999;pk=:dHJpYWwxMjEzMjM=:"#)]);
        assert_eq!(
            a.left,
            Some(Left {
                remaining: 999,
                reset: None
            })
        );
        // -12: Token names, `a` and `w` in the service limit; lists split over lines.
        let a = read(&[
            ("ratelimit-policy", r#"burst;q=100;w=60"#),
            (
                "ratelimit-policy",
                r#""daily";q=1000;w=86400;qu="requests""#,
            ),
            ("ratelimit", "default;a=0;w=7;c=1"),
        ]);
        assert_eq!(a.policies, [policy(100, 60), policy(1000, 86400)]);
        assert_eq!(a.left, left(0, 7));
        // No window: the caller's.
        let a = read(&[("ratelimit-policy", "p;q=5")]);
        assert_eq!(
            a.policies,
            [Policy {
                limit: 5,
                window: None
            }]
        );
    }

    #[test]
    fn the_tightest_service_limit_counts() {
        let a = read(
            &headers(&[("ratelimit", "a;r=5;t=1, b;r=0;t=30, c;r=0;t=10")]),
            at(NOW),
        );
        assert_eq!(a.left, left(0, 30));
    }

    #[test]
    fn x_ratelimit_reset_is_delta_or_epoch_seconds() {
        let read = |reset: &str| {
            read(
                &headers(&[
                    ("x-ratelimit-limit", "60"),
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", reset),
                ]),
                at(NOW),
            )
        };
        let a = read("30");
        assert_eq!(
            a.policies,
            [Policy {
                limit: 60,
                window: None
            }]
        );
        assert_eq!(a.left, left(0, 30));
        assert_eq!(read(&(NOW + 45).to_string()).left, left(0, 45));
        // A date that has passed: reset now.
        assert_eq!(read(&(NOW - 5).to_string()).left, left(0, 0));
        assert_eq!(
            read("1.25").left.unwrap().reset,
            Some(Duration::from_millis(1250))
        );
        // Milliseconds since the epoch (or noise) are not read; the rest still is.
        for garbage in ["1750000000000", "-5", "5s", "1.2345", "", "0x10", "1e3"] {
            let a = read(garbage);
            assert_eq!(a.left.unwrap().reset, None, "{garbage:?}");
        }
    }

    #[test]
    fn repeated_or_garbage_x_ratelimit_headers_are_ignored() {
        let a = read(
            &headers(&[
                ("x-ratelimit-limit", "60"),
                ("x-ratelimit-limit", "6"),
                ("x-ratelimit-remaining", "99999999999999999999"),
            ]),
            at(NOW),
        );
        assert!(a.is_empty(), "{a:?}");
        let a = read(
            &headers(&[("x-ratelimit-limit", "0"), ("x-ratelimit-remaining", "-1")]),
            at(NOW),
        );
        assert!(a.is_empty(), "{a:?}");
    }

    #[test]
    fn malformed_ietf_fields_are_ignored_whole() {
        let huge = format!("p;q=1;w=1,{}", "x".repeat(MAX_FIELD_BYTES));
        let many = ["p;q=1;w=1"; MAX_MEMBERS + 1].join(",");
        let params = format!("p;q=1{}", ";x=1".repeat(MAX_PARAMS));
        for bad in [
            "",
            " ",
            "p;q=1;w=1,",
            "p;q=1;w=1,,p;q=2",
            "(a b);q=1;w=1",
            r#""unterminated;q=1"#,
            r#""bad\escape";q=1"#,
            "p;q=1;W=1",
            "p;q=1234567890123456",
            "p;q=1.2345",
            "p;q=:not base64!:",
            "p;q=?2",
            "p q=1",
            "p;q=1;w=1 junk",
            "@date;q=1",
            huge.as_str(),
            many.as_str(),
            params.as_str(),
        ] {
            let a = read(&headers(&[("ratelimit-policy", bad)]), at(NOW));
            assert!(a.policies.is_empty(), "{bad:?}: {a:?}");
            let a = read(&headers(&[("ratelimit", bad)]), at(NOW));
            assert!(a.left.is_none(), "{bad:?}: {a:?}");
        }
        // Too many lines, each fine.
        let mut map = HeaderMap::new();
        for _ in 0..=MAX_FIELD_LINES {
            map.append("ratelimit-policy", HeaderValue::from_static("p;q=1;w=1"));
        }
        assert!(read(&map, at(NOW)).policies.is_empty());
        // Non-ASCII bytes.
        let mut map = HeaderMap::new();
        map.append(
            "ratelimit-policy",
            HeaderValue::from_bytes(b"p\xff;q=1;w=1").unwrap(),
        );
        assert!(read(&map, at(NOW)).policies.is_empty());
    }

    /// The policies a `RateLimit-Policy` of `value` announces.
    fn policies(value: &str) -> Vec<Policy> {
        read(&headers(&[("ratelimit-policy", value)]), at(NOW)).policies
    }

    #[test]
    fn a_repeated_parameter_takes_its_later_value() {
        assert_eq!(policies(r#""p";q=x;q=10;w=1"#), [policy(10, 1)]);
        assert_eq!(policies(r#""p";q=10;w=1;w=60;q=5"#), [policy(5, 60)]);
        assert_eq!(policies(r#""p";q=10;q=x;w=1"#), []);
        assert_eq!(
            policies(r#""p";q=9;qu=requests;qu="requests";w=1"#),
            [policy(9, 1)]
        );
    }

    #[test]
    fn dates_and_display_strings_are_parsed_and_skipped_as_vendor_parameters() {
        assert_eq!(
            policies(r#""p";q=10;w=1;x-at=@1750000000"#),
            [policy(10, 1)]
        );
        assert_eq!(policies(r#""p";q=10;w=1;x-at=@-1"#), [policy(10, 1)]);
        assert_eq!(
            policies(r#""p";q=10;w=1;x-name=%"caf%c3%a9""#),
            [policy(10, 1)]
        );
        assert_eq!(policies(r#""p";q=10;w=1;x-name=%"""#), [policy(10, 1)]);
        // A Date or a Display String as the item: a member of the wrong shape, skipped.
        assert_eq!(
            policies(r#"@1;q=1;w=1, %"p";q=2;w=1, p;q=3;w=1"#),
            [policy(3, 1)]
        );
        // Not one: the field is ignored.
        for bad in [
            "@1.5",
            "@",
            "@x",
            r#"%"caf%C3%A9""#,
            r#"%"%ff""#,
            r#"%"%c3""#,
            r#"%"%g0""#,
            r#"%"50%""#,
            r#"%"unterminated"#,
            r#"%"no \"escapes\" here""#,
            r#"%p"#,
        ] {
            let field = format!(r#""p";q=10;w=1;x={bad}"#);
            assert_eq!(policies(&field), [], "{field}");
        }
    }

    #[test]
    fn minus_zero_is_the_integer_zero() {
        assert_eq!(policies("p;q=-0;w=1"), [policy(0, 1)]);
    }

    #[test]
    fn an_empty_line_among_several_leaves_an_empty_member_and_the_field_is_ignored() {
        let lines = [("ratelimit-policy", "p;q=1;w=1"), ("ratelimit-policy", " ")];
        assert_eq!(read(&headers(&lines), at(NOW)).policies, []);
    }

    #[test]
    fn members_of_the_wrong_shape_are_skipped_not_the_field() {
        let a = read(
            &headers(&[(
                "ratelimit-policy",
                r#"1;q=9;w=1, p;q="9";w=1, p;q=-9;w=1, p;q=9;w=0, p;q=9;w=1.5, p;q=0;w=1, ok;q=7;w=2"#,
            )]),
            at(NOW),
        );
        // `q=0` is well-formed (nothing allowed): it is the caller's to refuse.
        assert_eq!(a.policies, [policy(0, 1), policy(7, 2)]);
    }
}
