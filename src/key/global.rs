use std::borrow::Cow;

use http::request::Parts;

use super::KeyExtractor;

/// Every request counts against one key: a fleet-wide quota (e.g. a third-party API's limit).
///
/// ```
/// use redlimit::key::{GlobalKey, KeyExtractor};
///
/// let (parts, _) = http::Request::new(()).into_parts();
/// assert_eq!(GlobalKey::new("payments-api").extract(&parts).as_deref(), Some("payments-api"));
/// ```
#[derive(Debug, Clone)]
pub struct GlobalKey {
    key: String,
}

impl GlobalKey {
    /// All requests count against `key`.
    pub fn new(key: impl Into<String>) -> Self {
        GlobalKey { key: key.into() }
    }
}

impl KeyExtractor for GlobalKey {
    fn extract<'a>(&'a self, _parts: &'a Parts) -> Option<Cow<'a, str>> {
        Some(Cow::Borrowed(&self.key))
    }

    fn missing_key_hint(&self) -> &'static str {
        "GlobalKey always has a key"
    }
}
