//! The reader over generated fields: valid Structured Fields of every item type (RFC 9651) are
//! read exactly as they say, one invalid piece anywhere makes the whole field ignored, and no
//! input, however hostile (huge numbers, 16 digits and more, repeated parameters, Unicode),
//! panics or is read when it is not ASCII.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;

use super::{read, Policy, MAX_FIELD_BYTES};

/// What the reader makes of a bare item as a parameter's value.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// An Integer: its value, `None` when negative.
    Integer(Option<u64>),
    /// A String: the text between its quotes, as written.
    String(String),
    /// A Token (usable as a member's item).
    Token,
    /// Any other type (Decimal, Byte Sequence, Boolean, Date, Display String).
    Other,
}

/// A bare item as written, and its kind.
type Item = (String, Kind);

fn integer() -> impl Strategy<Value = Item> {
    (any::<bool>(), "[0-9]{1,15}").prop_map(|(negative, digits)| {
        let value: u64 = digits.parse().unwrap();
        let sign = if negative { "-" } else { "" };
        let kind = Kind::Integer((!negative || value == 0).then_some(value));
        (format!("{sign}{digits}"), kind)
    })
}

fn bare_item() -> impl Strategy<Value = Item> {
    let string = "([ !#-\\[\\]-~]|\\\\\"|\\\\\\\\){0,12}"
        .prop_map(|text| (format!("\"{text}\""), Kind::String(text)));
    let token = "[A-Za-z*][A-Za-z0-9:/!#$%&'*+.^_`|~-]{0,10}".prop_map(|t| (t, Kind::Token));
    let decimal = "-?[0-9]{1,12}\\.[0-9]{1,3}".prop_map(|d| (d, Kind::Other));
    let bytes = "[A-Za-z0-9+/=]{0,16}".prop_map(|b| (format!(":{b}:"), Kind::Other));
    let boolean = "[01]".prop_map(|b| (format!("?{b}"), Kind::Other));
    let date = integer().prop_map(|(n, _)| (format!("@{n}"), Kind::Other));
    let display = any::<String>().prop_map(|text| (display_string(&text), Kind::Other));
    prop_oneof![
        integer(),
        Just((
            String::from("\"requests\""),
            Kind::String("requests".into())
        )),
        string,
        token,
        decimal,
        bytes,
        boolean,
        date,
        display,
    ]
}

/// `text` as a Display String: printable ASCII but `%` and `"` as is, every other byte of its
/// UTF-8 as `%xx` in lowercase.
fn display_string(text: &str) -> String {
    let mut out = String::from("%\"");
    for byte in text.bytes() {
        match byte {
            b'%' | b'"' => out.push_str(&format!("%{byte:02x}")),
            0x20..=0x7e => out.push(char::from(byte)),
            _ => out.push_str(&format!("%{byte:02x}")),
        }
    }
    out.push('"');
    out
}

/// A parameter: its key, its value, and the value's kind (a Boolean when written bare).
fn parameter() -> impl Strategy<Value = (String, Item)> {
    let key = prop_oneof![
        3 => proptest::sample::select(vec!["q", "w", "r", "a", "t", "qu"]).prop_map(String::from),
        1 => "[a-z*][a-z0-9_.*-]{0,6}",
    ];
    let bare = Just((String::new(), Kind::Other));
    (key, prop_oneof![4 => bare_item(), 1 => bare])
}

/// One list member as written (item and parameters), and its item's and parameters' kinds.
#[derive(Debug, Clone)]
struct Member {
    item: Item,
    params: Vec<(String, Item)>,
}

impl Member {
    fn text(&self) -> String {
        let mut text = self.item.0.clone();
        for (key, (value, _)) in &self.params {
            text.push(';');
            text.push_str(key);
            if !value.is_empty() {
                text.push('=');
                text.push_str(value);
            }
        }
        text
    }

    /// The policy the reader must make of this member, as the draft and RFC 8941 define it:
    /// a String or Token item whose known parameters, each at its later value, have their
    /// types; a `q`; a `w` other than 0; a unit, if any, of requests.
    fn policy(&self) -> Option<Policy> {
        if !matches!(self.item.1, Kind::String(_) | Kind::Token) {
            return None;
        }
        let last = |name: &str| {
            self.params
                .iter()
                .rev()
                .find(|(key, _)| key == name)
                .map(|(_, (_, kind))| kind.clone())
        };
        let mut integers = Vec::new();
        for name in ["q", "w", "r", "a", "t"] {
            match last(name) {
                None => integers.push(None),
                Some(Kind::Integer(Some(n))) => integers.push(Some(n)),
                Some(_) => return None,
            }
        }
        match last("qu") {
            None => {}
            Some(Kind::String(unit)) if unit == "requests" => {}
            Some(Kind::String(_)) => return None,
            Some(_) => return None,
        }
        let window = match integers[1] {
            Some(0) => return None,
            w => w.map(Duration::from_secs),
        };
        Some(Policy {
            limit: integers[0]?,
            window,
        })
    }
}

fn member() -> impl Strategy<Value = Member> {
    (bare_item(), proptest::collection::vec(parameter(), 0..=8))
        .prop_map(|(item, params)| Member { item, params })
}

/// Members joined with commas and optional whitespace, after optional spaces.
fn field(members: &[Member], spacing: &[(&str, &str)]) -> String {
    let mut text = String::from(spacing[0].0);
    for (i, member) in members.iter().enumerate() {
        if i > 0 {
            let (before, after) = spacing[i % spacing.len()];
            text.push_str(before);
            text.push(',');
            text.push_str(after);
        }
        text.push_str(&member.text());
    }
    text
}

fn spacing() -> impl Strategy<Value = Vec<(&'static str, &'static str)>> {
    let ows = proptest::sample::select(vec!["", " ", "\t", "  ", " \t"]);
    proptest::collection::vec((ows.clone(), ows), 1..=4).prop_map(|mut s| {
        // Only spaces may lead a field.
        s[0].0 = if s[0].0.is_empty() { "" } else { " " };
        s
    })
}

/// The headers with `value` as both IETF fields.
fn both_fields(value: &[u8]) -> Option<HeaderMap> {
    let value = HeaderValue::from_bytes(value).ok()?;
    let mut headers = HeaderMap::new();
    headers.append("ratelimit-policy", value.clone());
    headers.append("ratelimit", value);
    Some(headers)
}

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_750_000_000)
}

/// A piece that no Structured Field holds, appended to a member as a parameter, or written as
/// one (an uppercase or empty key); and whether it must end the field (an unterminated String
/// would take what follows, up to another quote, as its text).
fn invalid_parameter() -> impl Strategy<Value = (String, bool)> {
    let unterminated = prop_oneof![
        "[a-z]{0,5}".prop_map(|t| format!(";x=%\"{t}")),
        "[a-z]{0,5}".prop_map(|t| format!(";x=\"{t}")),
    ];
    let anywhere = prop_oneof![
        "[1-9][0-9]{15,24}".prop_map(|n| format!(";x={n}")),
        "[1-9][0-9]{15,24}".prop_map(|n| format!(";q={n}")),
        "-[1-9][0-9]{15,24}".prop_map(|n| format!(";x={n}")),
        "[0-9]{13,16}\\.[0-9]".prop_map(|d| format!(";x={d}")),
        "[0-9]{1,3}\\.[0-9]{4,6}".prop_map(|d| format!(";x={d}")),
        "[0-9]{1,5}\\.".prop_map(|d| format!(";x={d}")),
        "[0-9]{1,5}\\.[0-9]{1,3}".prop_map(|d| format!(";x=@{d}")),
        Just(String::from(";x=@")),
        "[A-F][0-9A-F]".prop_map(|h| format!(";x=%\"%{h}\"")),
        "[89a-f][0-9a-f]".prop_map(|h| format!(";x=%\"%{h}\"")),
        "[a-z]{0,3}[!.,]".prop_map(|b| format!(";x=:{b}:")),
        "[2-9]".prop_map(|b| format!(";x=?{b}")),
        "[A-Z][a-z]{0,3}".prop_map(|k| format!(";{k}=1")),
        Just(String::from(";=1")),
        Just(String::from(";")),
    ];
    prop_oneof![
        4 => anywhere.prop_map(|piece| (piece, false)),
        1 => unterminated.prop_map(|piece| (piece, true)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A valid field of any items and parameters, repeated ones included, is read exactly:
    /// the policies its members state, in order, and the same when it comes on two lines.
    #[test]
    fn a_valid_field_is_read_as_it_says(
        members in proptest::collection::vec(member(), 1..=8),
        spacing in spacing(),
        split in any::<prop::sample::Index>(),
    ) {
        let text = field(&members, &spacing);
        prop_assume!(text.len() <= MAX_FIELD_BYTES);
        let expected: Vec<Policy> = members.iter().filter_map(Member::policy).collect();
        let headers = both_fields(text.as_bytes()).unwrap();
        prop_assert_eq!(&read(&headers, now()).policies, &expected, "{}", text);
        // The same list over two lines.
        let at = split.index(members.len());
        let (first, second) = members.split_at(at);
        if !first.is_empty() && !second.is_empty() {
            let mut headers = HeaderMap::new();
            for part in [first, second] {
                let line = field(part, &spacing);
                headers.append("ratelimit-policy", HeaderValue::from_str(&line).unwrap());
            }
            prop_assert_eq!(&read(&headers, now()).policies, &expected, "{}", text);
        }
    }

    /// One invalid piece anywhere (a parameter no field holds, a character outside ASCII, an
    /// empty member) makes the whole field ignored, however readable its other members.
    #[test]
    fn an_invalid_field_is_ignored_whole(
        members in proptest::collection::vec(member(), 0..=6),
        spacing in spacing(),
        at in any::<prop::sample::Index>(),
        invalid in invalid_parameter(),
        foreign in any::<char>().prop_filter("not ASCII", |c| !c.is_ascii()),
        how in 0..4u8,
    ) {
        let mut members = members;
        members.push(Member {
            item: ("ok".into(), Kind::Token),
            params: vec![
                ("q".into(), ("7".into(), Kind::Integer(Some(7)))),
                ("r".into(), ("1".into(), Kind::Integer(Some(1)))),
            ],
        });
        let mut texts: Vec<String> = members.iter().map(Member::text).collect();
        let i = at.index(texts.len());
        let text = match how {
            0 => {
                let (piece, last) = &invalid;
                let i = if *last { texts.len() - 1 } else { i };
                texts[i].push_str(piece);
                texts.join(", ")
            }
            1 => {
                let mut text = field(&members, &spacing);
                let chars = text.chars().count();
                let (offset, _) = text.char_indices().nth(at.index(chars)).unwrap();
                text.insert(offset, foreign);
                text
            }
            2 => {
                texts.insert(i, String::new());
                texts.join(", ")
            }
            _ => format!("{},", texts.join(", ")),
        };
        let headers = both_fields(text.as_bytes()).unwrap();
        let announced = read(&headers, now());
        prop_assert!(announced.is_empty(), "{:?} read from {:?}", announced, text);
    }

    /// Any bytes at all, or text over the fields' own alphabet with Unicode in it: the reader
    /// never panics, reads nothing from a field that is not ASCII, and never a number of more
    /// than 15 digits.
    #[test]
    fn hostile_input_never_panics_nor_reads_what_no_field_holds(
        bytes in proptest::collection::vec(any::<u8>(), 0..=300),
        text in "([a-z0-9;=,\" %@:?*.()\\\\-]|[0-9]{14,20}|é|\u{1F600}|\u{0}){0,80}",
    ) {
        for input in [&bytes[..], text.as_bytes()] {
            let Some(headers) = both_fields(input) else { continue };
            let announced = read(&headers, now());
            if !input.is_ascii() {
                prop_assert!(announced.is_empty(), "{:?} from {:?}", announced, input);
            }
            for policy in &announced.policies {
                prop_assert!(policy.limit <= 999_999_999_999_999);
            }
            if let Some(left) = announced.left {
                prop_assert!(left.remaining <= 999_999_999_999_999);
            }
        }
    }
}
