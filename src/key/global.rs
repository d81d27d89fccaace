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
    fn extract(&self, _parts: &Parts) -> Option<String> {
        Some(self.key.clone())
    }
}
