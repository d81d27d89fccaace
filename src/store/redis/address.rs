//! A store's address as its log lines show it: the URLs as written, every password hidden.
//!
//! What is secret is what the client reads as a password: the `redis` crate takes a TCP URL's
//! (`redis://`, `rediss://`, `valkey://`, `valkeys://`) from its user info, percent-decoded,
//! and a Unix socket URL's (`unix://`, `redis+unix://`, `valkey+unix://`) from its `pass` query
//! parameter. `password` in a query (which the client ignores) is hidden too: whoever wrote it
//! meant a password. The same rules as the `redlimit` command's (`cli/src/urls.rs`).

use redis::IntoConnectionInfo;

/// The query parameters that hold a password (in any case).
const SECRET_PARAMETERS: [&str; 2] = ["pass", "password"];

/// How a hidden password is shown.
const HIDDEN: &str = "***";

/// `url` with every password hidden (`***`): the user info's, and each `pass` or `password`
/// query parameter's. A URL the client's parser reads is redacted from the parts it finds; any
/// other text, and a URL the client then refuses, by the same rules read loosely: the user info
/// up to the last `@` after `://`, the query after the first `?` that follows. A URL without a
/// password is shown as written.
///
/// What a `RedisStore`'s failures log as its address; public so that a service logs the URLs
/// it was given the same way (the `redlimit` command does).
///
/// ```
/// use redlimit::store::redacted_url;
///
/// assert_eq!(redacted_url("redis://app:s3cret@10.0.0.5:6379/0"), "redis://app:***@10.0.0.5:6379/0");
/// assert_eq!(redacted_url("unix:///run/redis.sock?pass=s3cret"), "unix:///run/redis.sock?pass=***");
/// assert_eq!(redacted_url("redis://10.0.0.5:6379"), "redis://10.0.0.5:6379");
/// ```
pub fn redacted_url(url: &str) -> String {
    let Some(parsed) = redis::parse_redis_url(url) else {
        return redacted_loosely(url);
    };
    if has_user_info_past_authority(url, parsed.scheme()) {
        // `redis://u:123#pw@h`: the parser reads `123` as a port and `#pw@h` as a fragment (or
        // a query, or a path), so it finds no password; but the text before the last `@` is
        // the user's password all the same.
        return redacted_loosely(url);
    }
    let accepted = parsed.clone().into_connection_info().is_ok();
    let mut parsed = parsed;
    let query = parsed.query().map(redacted_query);
    let password = parsed.password().is_some();
    if !password && query.as_ref().is_none_or(|(_, hidden)| !hidden) {
        // Nothing the parser reads as a password; a URL it reads but the client refuses
        // (`redis:/u:pw@h` has no host, so no user info) is read loosely too.
        return if accepted {
            url.to_owned()
        } else {
            redacted_loosely(url)
        };
    }
    if password && parsed.set_password(Some(HIDDEN)).is_err() {
        return redacted_loosely(url);
    }
    if let Some((query, true)) = query {
        parsed.set_query(Some(&query));
        // A password holding `#` unencoded runs on into the fragment: hidden too, unless it
        // is the one the client reads (`#insecure`).
        if last_parameter_is_secret(&query)
            && parsed
                .fragment()
                .is_some_and(|fragment| fragment != "insecure")
        {
            parsed.set_fragment(Some(HIDDEN));
        }
    }
    let shown = parsed.to_string();
    if accepted {
        shown
    } else {
        redacted_loosely(&shown)
    }
}

/// Whether `url`, whose scheme the parser read as `scheme`, is a TCP URL with an `@` after the
/// authority the parser found (in its path, query or fragment): user info whose password holds
/// a `/`, `?` or `#` unencoded after a part the parser took for a port.
fn has_user_info_past_authority(url: &str, scheme: &str) -> bool {
    let tcp = matches!(scheme, "redis" | "rediss" | "valkey" | "valkeys");
    let Some(start) = url.find("://").map(|at| at + 3) else {
        return false;
    };
    let rest = &url[start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    tcp && rest[authority_end..].contains('@')
}

/// Whether the last parameter of `query` (redacted) is a secret one.
fn last_parameter_is_secret(query: &str) -> bool {
    let last = query.rsplit('&').next().unwrap_or_default();
    last.split_once('=')
        .is_some_and(|(name, _)| is_secret_parameter(name))
}

/// The URLs of a list (a Cluster's nodes, a Sentinel's sentinels), each [`redacted_url`], joined
/// with commas.
pub(crate) fn redacted_list<'a>(urls: impl IntoIterator<Item = &'a str>) -> String {
    let shown: Vec<String> = urls.into_iter().map(redacted_url).collect();
    shown.join(",")
}

/// `query` (without its `?`) with the value of every `pass` or `password` parameter replaced
/// by `***`, the rest as written; and whether any was.
fn redacted_query(query: &str) -> (String, bool) {
    let mut hidden = false;
    let pieces: Vec<String> = query
        .split('&')
        .map(|piece| match piece.split_once('=') {
            Some((name, _)) if is_secret_parameter(name) => {
                hidden = true;
                format!("{name}={HIDDEN}")
            }
            _ => piece.to_owned(),
        })
        .collect();
    (pieces.join("&"), hidden)
}

/// Whether a query parameter's name, as written (form-encoded: `+` a space, `%XX` a byte),
/// names a password.
fn is_secret_parameter(name: &str) -> bool {
    let decoded = form_decoded(name);
    SECRET_PARAMETERS
        .iter()
        .any(|secret| secret.as_bytes().eq_ignore_ascii_case(&decoded))
}

/// `text` decoded as a form decodes a name: `+` a space, `%XX` the byte XX, the rest as is.
fn form_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = |i: usize| bytes.get(i).and_then(|b| (*b as char).to_digit(16));
        match (bytes[at], hex(at + 1), hex(at + 2)) {
            (b'%', Some(high), Some(low)) => {
                decoded.push((high * 16 + low) as u8);
                at += 3;
            }
            (b'+', _, _) => {
                decoded.push(b' ');
                at += 1;
            }
            (byte, _, _) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    decoded
}

/// [`redacted_url`] of text the client's parser does not read: the user info up to the last `@`
/// (a password may hold `?` or `@`), then the query after the first `?` that follows.
fn redacted_loosely(url: &str) -> String {
    let start = url.find("://").map_or(0, |at| at + 3);
    let (mut shown, rest) = match url[start..].rsplit_once('@') {
        Some((info, _)) if info.contains(':') => {
            let user = info.split(':').next().unwrap_or_default();
            let shown = format!("{}{user}:{HIDDEN}", &url[..start]);
            (shown, &url[start + info.len()..])
        }
        _ => (String::new(), url),
    };
    let Some((before, query)) = rest.split_once('?') else {
        shown.push_str(rest);
        return shown;
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    shown.push_str(before);
    shown.push('?');
    shown.push_str(&redacted_query(query).0);
    if let Some(fragment) = fragment {
        shown.push('#');
        shown.push_str(fragment);
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_url_form_is_shown_without_its_password() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            (
                "redis://operator:s3%3Acret@h:6379/",
                "redis://operator:***@h:6379/",
            ),
            ("redis://:s3cret@h:6379/2", "redis://:***@h:6379/2"),
            (
                "rediss://limiter:s3cret@h:6380/#insecure",
                "rediss://limiter:***@h:6380/#insecure",
            ),
            ("valkey://u:s3cret@h/", "valkey://u:***@h/"),
            ("valkeys://u:s3cret@h/", "valkeys://u:***@h/"),
            (
                "redis://h/?password=s3cret&db=1",
                "redis://h/?password=***&db=1",
            ),
            (
                "redis://h/?PASS=p%2Cw&pa%73s=p%2Cw",
                "redis://h/?PASS=***&pa%73s=***",
            ),
            (
                "redis+unix:///run/r.sock?user=op&pass=s3%2Bc+ret",
                "redis+unix:///run/r.sock?user=op&pass=***",
            ),
            (
                "unix:///run/r.sock?db=x&pass=a%2Cb",
                "unix:///run/r.sock?db=x&pass=***",
            ),
            (
                "redis+unix:///run/r.sock?db=1&password=pw%25",
                "redis+unix:///run/r.sock?db=1&password=***",
            ),
            (
                "valkey+unix:///run/r.sock?pass=s3cret",
                "valkey+unix:///run/r.sock?pass=***",
            ),
            ("unix:///run/r.sock", "unix:///run/r.sock"),
            // Not URLs the client takes: read loosely.
            ("redis//u:pw@h:1/", "redis//u:***@h:1/"),
            ("redis:/u:pw@h", "redis:***@h"),
            ("u:p@w@h", "u:***@h"),
            ("redis://u:pw@[::1", "redis://u:***@[::1"),
            ("redis+unix://[?pass=a+b#x", "redis+unix://[?pass=***#x"),
        ] {
            assert_eq!(redacted_url(url), shown, "{url}");
        }
    }

    #[test]
    fn a_node_list_shows_each_node_without_its_password() {
        let nodes = [
            "redis://u:s3cret,xyz@a:1/",
            "rediss://:s3cret@b:2/",
            "redis://c:3/",
        ];
        assert_eq!(
            redacted_list(nodes),
            "redis://u:***@a:1/,rediss://:***@b:2/,redis://c:3/"
        );
    }

    #[test]
    fn a_store_is_described_by_its_address_without_passwords() {
        use crate::store::RedisStore;
        let single = RedisStore::new("redis://limiter:pw-single@h:6379/2").unwrap();
        let cluster =
            RedisStore::cluster(["redis://:pw-node@a:1/", "redis://:pw-node@b:2/"]).unwrap();
        let sentinel = RedisStore::sentinel(["redis://:pw-sentinel@s:26379"], "mymaster").unwrap();
        for (store, address) in [
            (single, "redis://limiter:***@h:6379/2"),
            (cluster, "cluster redis://:***@a:1/,redis://:***@b:2/"),
            (sentinel, "sentinel mymaster at redis://:***@s:26379"),
        ] {
            let described = format!("{store:?}");
            assert!(
                described.contains(&format!("address: \"{address}\"")),
                "{described}"
            );
            assert!(!described.contains("pw-"), "{described}");
        }
    }
}
