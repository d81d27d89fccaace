//! `redlimit::store::redacted_url` on hostile and malformed input: it never panics, stays
//! linear on a megabyte, and never shows a password, however the URL spells it (user info,
//! `pass=` / `password=`, percent-encoded, holding `@`, `?`, `#`, `:` or `/`).

use std::time::{Duration, Instant};

use redlimit::store::redacted_url;

/// The secret every URL below carries, in some spelling.
const SECRET: &str = "Zq9SECRETx";

/// Each `(url, secret)` redacted: the url must not show `secret` (nor the [`SECRET`] in it).
fn assert_all_hidden<const N: usize>(cases: [(String, String); N]) {
    for (url, secret) in cases {
        let shown = redacted_url(&url);
        assert!(
            !shown.contains(&secret) && !shown.contains(SECRET),
            "{url:?} shown as {shown:?}, with {secret:?}"
        );
    }
}

#[test]
fn every_url_form_hides_its_password() {
    let s = SECRET;
    assert_all_hidden([
        (format!("redis://u:{s}@h:6379/0"), s.to_owned()),
        (format!("redis://:{s}@h"), s.to_owned()),
        (format!("rediss://u:{s}@h:6380/#insecure"), s.to_owned()),
        (format!("valkey://u:{s}@h/"), s.to_owned()),
        (format!("valkeys://u:{s}@h/"), s.to_owned()),
        (format!("redis://h/?pass={s}"), s.to_owned()),
        (format!("redis://h/?password={s}&db=1"), s.to_owned()),
        (format!("redis://h/?PassWord={s}"), s.to_owned()),
        (format!("redis://h/?%70ass={s}"), s.to_owned()),
        (format!("unix:///run/r.sock?pass={s}"), s.to_owned()),
        (
            format!("redis+unix:///run/r.sock?user=u&pass={s}"),
            s.to_owned(),
        ),
        (format!("valkey+unix:///run/r.sock?pass={s}"), s.to_owned()),
        // Percent-encoded passwords, and escapes that decode to no UTF-8.
        (format!("redis://u:{s}%40%3F%23@h/"), s.to_owned()),
        (format!("redis://u:{s}%FF%FE@h/"), s.to_owned()),
        (format!("redis://u:%E9{s}%C3@h/"), s.to_owned()),
        (format!("redis://u:{s}%@h/"), s.to_owned()),
        (format!("redis://u:{s}%G1@h/"), s.to_owned()),
        (format!("unix:///s?pass={s}%FF"), s.to_owned()),
        // Passwords holding `@`, `?`, `#`, `:`, `/`, written unencoded.
        (format!("redis://u:a@{s}@h:6379/"), format!("a@{s}")),
        (format!("redis://u:a?{s}@h:6379/"), format!("a?{s}")),
        (format!("redis://u:a#{s}@h:6379/"), format!("a#{s}")),
        (format!("redis://u:a:{s}@h:6379/"), format!("a:{s}")),
        (format!("redis://u:a/{s}@h:6379/"), format!("a/{s}")),
        (format!("rediss://u:a#{s}@h:6379/"), format!("a#{s}")),
        (format!("redis://:{s}@@h"), s.to_owned()),
        (format!("redis://u:ä{s}é@h/"), s.to_owned()),
        // Multi-byte text around the separators.
        (format!("redis://ü:{s}€@h/"), s.to_owned()),
        (format!("€€://ü:{s}@h"), s.to_owned()),
        (format!("redis://u:{s}@[::1"), s.to_owned()),
        (format!("redis://u:{s}@"), s.to_owned()),
        (format!("u:{s}@"), s.to_owned()),
        (format!(":{s}@"), s.to_owned()),
        (format!("redis://u:{s}@h:99999/"), s.to_owned()),
        (format!("redis://u:{s}@0.0.0.0/"), s.to_owned()),
        (format!("redis://u:{s}@h/not-a-db"), s.to_owned()),
        (format!(" redis://u:{s}@h/ "), s.to_owned()),
        (format!("redis://u:{s}\n@h/"), s.to_owned()),
        (format!("REDIS://u:{s}@h/"), s.to_owned()),
    ]);
}

/// A password that starts with digits and holds `#`, `?` or `/`, written unencoded: the URL
/// parser reads the digits as a port and the rest as a fragment, query or path (with the `@`
/// and the host in it), so the client reads no password; but the text is the user's
/// password all the same, and a log line must not show it.
#[test]
fn a_password_of_digits_then_a_url_delimiter_is_hidden() {
    let s = SECRET;
    assert_all_hidden([
        (format!("redis://u:123#{s}@h:6379/"), format!("123#{s}")),
        (format!("redis://u:123?{s}@h:6379/"), format!("123?{s}")),
        (format!("redis://u:123/{s}@h:6379/"), format!("123/{s}")),
        (format!("valkey://u:4#{s}@h/"), format!("4#{s}")),
        (format!("redis://:99?x={s}@h"), format!("99?x={s}")),
    ]);
}

/// A `pass=` value holding `#` unencoded: the parser reads what follows as the fragment.
#[test]
fn a_pass_parameter_holding_a_hash_is_hidden_whole() {
    let s = SECRET;
    assert_all_hidden([
        (format!("unix:///run/r.sock?pass=a#{s}"), format!("a#{s}")),
        (
            format!("redis+unix:///r.sock?user=u&pass=a#{s}"),
            format!("a#{s}"),
        ),
        (format!("redis://h/?password=a#{s}"), format!("a#{s}")),
    ]);
    // The fragment the client reads (TLS without verification) is still shown.
    assert_eq!(
        redacted_url("rediss://h:6380/?password=x#insecure"),
        "rediss://h:6380/?password=***#insecure"
    );
}

/// URLs the loose reading meets: never a panic, whatever the bytes.
#[test]
fn malformed_urls_never_panic() {
    let odd = [
        "",
        ":",
        "@",
        "://",
        "://@",
        "?",
        "#",
        "%",
        "%%",
        "%ZZ",
        "@@@",
        ":::",
        "redis://",
        "redis://@",
        "redis://:@",
        "redis://?",
        "redis://#",
        "redis://[",
        "redis://]",
        "redis://[::1]:",
        "redis://h:/",
        "unix://",
        "unix://?",
        "unix://?pass",
        "unix://?=",
        "redis://h?&&&=&",
        "redis://h?pass=&pass",
        "redis://h/?%",
        "redis://h/?pass%=x",
        "é://é:é@é?é=é#é",
        "\u{0}://\u{0}:\u{0}@\u{0}",
        "redis://\u{7f}:x@h",
    ];
    for url in odd {
        let _ = redacted_url(url);
    }
}

/// A megabyte of each hostile shape, redacted in well under a second each (no quadratic
/// scans), and its password still hidden.
#[test]
fn a_megabyte_url_is_redacted_quickly_without_its_password() {
    const MB: usize = 1 << 20;
    let s = SECRET;
    let cases = [
        format!("redis://u:{s}{}@h/", "a".repeat(MB)),
        format!("redis://u:{s}{}@h/", "@".repeat(MB)),
        format!("redis://u:{s}{}@h/", ":".repeat(MB)),
        format!("redis://u:{s}{}@h/", "%".repeat(MB)),
        format!("redis://u:{s}{}@h/", "%FF".repeat(MB / 3)),
        format!("redis://u:{s}{}@h/", "é".repeat(MB / 2)),
        format!("redis://h/?{}pass={s}", "a=b&".repeat(MB / 4)),
        format!("redis://h/?{}pass={s}", "&".repeat(MB)),
        format!("unix:///s?{}&pass={s}", "%".repeat(MB)),
        format!("{}u:{s}@h", "?".repeat(MB)),
        format!("redis://u:{s}@h{}", "#".repeat(MB)),
        format!("redis://u:{s}@{}", "[".repeat(MB)),
    ];
    for url in &cases {
        let started = Instant::now();
        let shown = redacted_url(url);
        let took = started.elapsed();
        let head: String = shown.chars().take(80).collect();
        assert!(!shown.contains(s), "{head}…");
        let head: String = url.chars().take(40).collect();
        assert!(took < Duration::from_secs(1), "{took:?} for {head}…");
    }
}
