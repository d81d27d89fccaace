use std::borrow::Cow;
use std::fmt;

use http::request::Parts;

use super::KeyExtractor;

/// A closure over the request head, e.g. a tenant id from the path or a claim a previous layer
/// put in the extensions.
///
/// Keys it returns that look like secrets should be hashed by the closure; every key is bounded
/// anyway (see the [module docs](crate::key)).
///
/// ```
/// use redlimit::key::{FnKey, KeyExtractor};
///
/// let by_tenant = FnKey::new(|parts: &http::request::Parts| {
///     parts.uri.path().strip_prefix("/tenants/")?.split('/').next().map(str::to_owned)
/// });
/// let (parts, _) = http::Request::get("/tenants/42/orders").body(()).unwrap().into_parts();
/// assert_eq!(by_tenant.extract(&parts).as_deref(), Some("42"));
/// ```
#[derive(Clone)]
pub struct FnKey<F> {
    f: F,
}

impl<F> FnKey<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    /// Wraps the closure.
    pub fn new(f: F) -> Self {
        FnKey { f }
    }
}

impl<F> fmt::Debug for FnKey<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnKey").finish_non_exhaustive()
    }
}

impl<F> KeyExtractor for FnKey<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        (self.f)(parts).map(Cow::Owned)
    }

    fn missing_key_hint(&self) -> &'static str {
        "the FnKey closure returned None"
    }
}
