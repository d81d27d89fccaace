//! The URLs of the command line and `REDIS_URL`: a list split without cutting a password, each
//! URL shown with its password hidden, and every form of that password, which no message may
//! show.
//!
//! What is secret is what the client reads as a password: the `redis` crate's
//! `IntoConnectionInfo` takes a TCP URL's (`redis://`, `rediss://`, `valkey://`, `valkeys://`)
//! from its user info, percent-decoded, and a Unix socket URL's (`unix://`, `redis+unix://`,
//! `valkey+unix://`) from its `pass` query parameter, form-decoded (`+` is a space, `%2B` a
//! `+`). `password` in a query (which the client ignores) is hidden too: whoever wrote it meant
//! a password.

use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};
use redis::IntoConnectionInfo;
use url::form_urlencoded;

/// The query parameters that hold a password.
const SECRET_PARAMETERS: [&str; 2] = ["pass", "password"];

/// The most commas a list is searched over for a split into URLs the client accepts (an
/// operator lists a few nodes; the search takes a parse per pair of commas).
const MAX_SEARCHED_COMMAS: usize = 64;

/// The URLs of a comma-separated list, blanks around each trimmed, empty ones dropped.
///
/// A comma may be part of a URL (a password, a query, a socket's path), so the list is cut at
/// the commas that leave every piece a URL the client accepts, keeping as few commas inside a
/// URL as it can from the left; a list that has no such cut (some piece is not a URL) is cut
/// at each comma followed by a scheme and `://`, which no password holds (a `/` would end the
/// URL's host), so that the piece an error shows never holds part of a password.
pub fn split_list(value: &str) -> Vec<String> {
    let commas: Vec<usize> = value.match_indices(',').map(|(at, _)| at).collect();
    let cut = (commas.len() <= MAX_SEARCHED_COMMAS)
        .then(|| valid_cut(value, &commas))
        .flatten();
    let pieces = match cut {
        Some(pieces) => pieces,
        None => scheme_cut(value),
    };
    pieces
        .into_iter()
        .map(str::trim)
        .filter(|piece| !piece.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The cut of `value` at some of its `commas` into pieces that are each empty or a URL the
/// client accepts, the shortest first piece first; `None` when there is none.
fn valid_cut<'a>(value: &'a str, commas: &[usize]) -> Option<Vec<&'a str>> {
    // Piece boundaries: the start, after each comma; ends: each comma, the end.
    let starts: Vec<usize> = std::iter::once(0)
        .chain(commas.iter().map(|at| at + 1))
        .collect();
    let ends: Vec<usize> = commas
        .iter()
        .copied()
        .chain(std::iter::once(value.len()))
        .collect();
    // `rest[i]`: the cut of everything from `starts[i]`, as the indexes of its pieces' ends.
    let mut rest: Vec<Option<Vec<usize>>> = vec![None; starts.len() + 1];
    rest[starts.len()] = Some(Vec::new());
    for i in (0..starts.len()).rev() {
        rest[i] = (i..ends.len()).find_map(|j| {
            let piece = value[starts[i]..ends[j]].trim();
            let accepted = piece.is_empty() || piece.into_connection_info().is_ok();
            let after = rest[j + 1].as_ref()?;
            accepted.then(|| std::iter::once(j).chain(after.iter().copied()).collect())
        });
    }
    let ends_used = rest[0].take()?;
    let mut start = 0;
    let pieces = ends_used
        .into_iter()
        .map(|j| {
            let piece = &value[start..ends[j]];
            start = ends[j] + 1;
            piece
        })
        .collect();
    Some(pieces)
}

/// `value` cut at each comma followed (after blanks) by a scheme and `://`.
fn scheme_cut(value: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (at, _) in value.match_indices(',') {
        if starts_with_scheme(value[at + 1..].trim_start()) {
            pieces.push(&value[start..at]);
            start = at + 1;
        }
    }
    pieces.push(&value[start..]);
    pieces
}

/// Whether `text` starts with a URL scheme (a letter, then letters, digits, `+`, `.`, `-`) and
/// `://`.
fn starts_with_scheme(text: &str) -> bool {
    let Some((scheme, _)) = text.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
}

/// `url` with every password hidden (`***`): the user info's, and each `pass` or `password`
/// query parameter's. A URL the client's parser reads (`redis::parse_redis_url`) is redacted
/// from the parts it finds; any other text (an error shows it), and a URL the client then
/// refuses, also by the same rules read loosely: the user info up to the last `@` after
/// `://`, the query after the first `?` that follows. A URL without a password is shown as
/// written.
pub fn redacted(url: &str) -> String {
    redlimit::store::redacted_url(url)
}

/// Whether a query parameter's name, as written, names a password (in any case: the client
/// reads only `pass`, but a writer of `PASS` meant one too).
fn is_secret_parameter(name: &str) -> bool {
    let decoded: String = form_urlencoded::parse(name.as_bytes())
        .map(|(name, _)| name.into_owned())
        .collect();
    is_secret_name(&decoded)
}

/// Whether a query parameter's decoded name names a password.
fn is_secret_name(name: &str) -> bool {
    SECRET_PARAMETERS
        .iter()
        .any(|secret| secret.eq_ignore_ascii_case(name))
}

/// Where `url`'s user info starts and the user info (up to the host's `@`, the last one: a
/// password may hold one), also in text that does not parse (no `//`, no scheme).
fn user_info(url: &str) -> Option<(usize, &str)> {
    let start = url.find("://").map_or(0, |at| at + 3);
    let (user_info, _) = url[start..].rsplit_once('@')?;
    Some((start, user_info))
}

/// The URLs shown, redacted, as a list.
pub fn shown_list(urls: &[String]) -> String {
    let shown: Vec<String> = urls.iter().map(|url| redacted(url)).collect();
    shown.join(",")
}

/// The passwords `url` carries, in every form a message could show: as written, decoded as
/// the client decodes them, decoded the other way (`+` kept, or made a space), and encoded
/// again (every byte but letters and digits as `%XX`, and as a form encodes it).
pub fn secrets(url: &str) -> Vec<String> {
    // As written: the user info's password (up to the last `@`), each password parameter of
    // the query that follows it; and as the client's parser reads them.
    let mut written = Vec::new();
    let mut rest = url;
    if let Some((start, info)) = user_info(url) {
        written.extend(
            info.split_once(':')
                .map(|(_, password)| password.to_owned()),
        );
        rest = &url[start + info.len()..];
    }
    let query = rest
        .split_once('?')
        .map(|(_, query)| query.split('#').next().unwrap_or(""));
    for piece in query.into_iter().flat_map(|query| query.split('&')) {
        if let Some((name, value)) = piece.split_once('=') {
            if is_secret_parameter(name) {
                written.push(value.to_owned());
            }
        }
    }
    if let Some(parsed) = redis::parse_redis_url(url) {
        written.extend(parsed.password().map(str::to_owned));
        for (name, value) in parsed.query_pairs() {
            if is_secret_name(&name) {
                written.push(value.into_owned());
            }
        }
    }
    let mut secrets = Vec::new();
    for form in &written {
        secrets.push(form.clone());
        secrets.push(percent_decode_str(form).decode_utf8_lossy().into_owned());
        let as_form: String = form_urlencoded::parse(format!("x={form}").as_bytes())
            .map(|(_, value)| value.into_owned())
            .collect();
        secrets.push(as_form);
    }
    if let Ok(info) = url.into_connection_info() {
        secrets.extend(info.redis_settings().password().map(str::to_owned));
    }
    let decoded: Vec<String> = secrets.clone();
    secrets.extend(decoded.iter().flat_map(|secret| encoded(secret)));
    secrets.retain(|secret| !secret.is_empty());
    secrets.sort();
    secrets.dedup();
    secrets
}

/// `secret` encoded as a URL could carry it: every byte but letters and digits as `%XX`, and
/// as a form encodes it (a space as `+`).
pub fn encoded(secret: &str) -> [String; 2] {
    [
        utf8_percent_encode(secret, NON_ALPHANUMERIC).to_string(),
        form_urlencoded::byte_serialize(secret.as_bytes()).collect(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_and_known_as_secrets() {
        let url = "redis://operator:s3%3Acret@127.0.0.1:6379/";
        assert_eq!(redacted(url), "redis://operator:***@127.0.0.1:6379/");
        let secrets = secrets(url);
        assert!(secrets.contains(&"s3%3Acret".to_owned()), "{secrets:?}");
        assert!(secrets.contains(&"s3:cret".to_owned()), "{secrets:?}");
        assert_eq!(redacted("redis://127.0.0.1/"), "redis://127.0.0.1/");
        // URLs that do not parse, shown in the message that says so.
        assert_eq!(redacted("redis//u:pw@h:1/"), "redis//u:***@h:1/");
        assert_eq!(redacted("redis:/u:pw@h"), "redis:***@h");
        assert_eq!(redacted("u:p@w@h"), "u:***@h");
        assert_eq!(redacted("redis://u:pw@[::1"), "redis://u:***@[::1");
        assert!(super::secrets("redis:/u:pw@h").contains(&"/u:pw".to_owned()));
    }

    #[test]
    fn a_unix_sockets_password_is_redacted_in_every_form() {
        for (url, shown, password) in [
            (
                "redis+unix:///run/r.sock?user=op&pass=s3%2Bc+ret",
                "redis+unix:///run/r.sock?user=op&pass=***",
                "s3+c ret",
            ),
            (
                "unix:///run/r.sock?db=x&pass=a%2Cb",
                "unix:///run/r.sock?db=x&pass=***",
                "a,b",
            ),
            (
                "redis+unix:///run/r.sock?db=1&password=pw%25",
                "redis+unix:///run/r.sock?db=1&password=***",
                "pw%",
            ),
            (
                "redis://h/?PASS=p%2Cw&pa%73s=p%2Cw",
                "redis://h/?PASS=***&pa%73s=***",
                "p,w",
            ),
            // Not a URL the parser reads: the query read loosely.
            (
                "redis+unix://[?pass=a+b#x",
                "redis+unix://[?pass=***#x",
                "a b",
            ),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
            let secrets = secrets(url);
            assert!(secrets.contains(&password.to_owned()), "{url}: {secrets:?}");
            // As written: the value after the last `=`, up to a `&` or `#`.
            let (_, written) = url.rsplit_once('=').unwrap();
            let written = written.split(['&', '#']).next().unwrap();
            assert!(secrets.contains(&written.to_owned()), "{url}: {secrets:?}");
        }
    }

    #[test]
    fn a_list_is_cut_between_urls_never_in_a_password() {
        let cases: [(&str, &[&str]); 7] = [
            (
                "redis://a:1/,redis://b:2/",
                &["redis://a:1/", "redis://b:2/"],
            ),
            (
                "redis://u:s3cret,xyz@a:1/, redis://u:s3cret,xyz@b:2/",
                &["redis://u:s3cret,xyz@a:1/", "redis://u:s3cret,xyz@b:2/"],
            ),
            // `redis://u:12` alone is a URL (host u, port 12); what follows is not.
            (
                "redis://u:12,34@a:1/,redis://u:12,34@b:2/",
                &["redis://u:12,34@a:1/", "redis://u:12,34@b:2/"],
            ),
            (
                "redis+unix:///a.sock?pass=x,y,unix:///b.sock",
                &["redis+unix:///a.sock?pass=x,y", "unix:///b.sock"],
            ),
            (",redis://a/,,", &["redis://a/"]),
            (",", &[]),
            // No cut into URLs: cut only before a scheme.
            (
                "redis://u:pw,d@a:99999/,not a url",
                &["redis://u:pw,d@a:99999/,not a url"],
            ),
        ];
        for (list, want) in cases {
            assert_eq!(split_list(list), want, "{list}");
        }
        assert_eq!(
            split_list("redis://u:p,w@a:99999/,redis://b/"),
            ["redis://u:p,w@a:99999/", "redis://b/"]
        );
    }
}
