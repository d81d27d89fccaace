//! Strings kept for the life of the process, each distinct one stored once: values the request
//! path clones per request (a metrics label, a constant header value) then cost no allocation
//! and no shared reference count, which both cores of a busy server would otherwise keep
//! bumping.
//!
//! Only configuration goes here (one string per layer configuration, not per request or key):
//! the set grows with the distinct configurations a process builds, never with traffic.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

/// `value` for the life of the process, stored once however often it is asked for.
pub(crate) fn interned(value: &str) -> &'static str {
    static VALUES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut values = VALUES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = values.get(value) {
        return known;
    }
    let leaked: &'static str = Box::leak(value.into());
    values.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_stored_once() {
        let owned = String::from("interned-once");
        let first = interned(&owned);
        let again = interned(&String::from("interned-once"));
        assert_eq!(first, "interned-once");
        assert!(std::ptr::eq(first, again), "one copy per distinct value");
        assert!(!std::ptr::eq(first, interned("interned-other")));
    }
}
