//! The wire both stores share: what the scripts read and write, as bytes.
//!
//! - `layout.rs`: the controls at the start of a key's string, the keys a call names, the
//!   reply, the numbers every script keeps.
//! - `scripts.rs`: the scripts as Redis runs them, assembled from `lua/` and the algorithms'
//!   specs, and the constants every script shares (written into them at assembly).
//! - `decide.rs`: the decision's operation, which both stores run natively (`Store::check`),
//!   and its packed argument, which every decision sends.
//!
//! Which other call sends what (keys, arguments, the reply read) is each operation's own, in
//! `ops/`; the pure math of each algorithm, and its [`Spec`](crate::algorithm), are in
//! [`algorithm`](crate::algorithm), which this module builds on, never the other way.

pub(crate) mod decide;
pub(crate) mod layout;
pub(crate) mod scripts;

/// Hooks for the crate's own tests, which run the scripts by hand.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod test_hooks {
    use super::layout::{log_controls_key, tenant_key};

    /// The decision script as the crate sends it (`lua/common.lua` with every step spliced
    /// in).
    pub fn script_source() -> &'static str {
        &super::scripts::SOURCE
    }

    /// The keys a decision on the storage key `key` names besides it, as the crate builds
    /// them: the sliding log's controls (`<key>#m`), then the tenant's (`<prefix>:{<id>}#t`).
    pub fn control_keys(key: &str) -> [String; 2] {
        [log_controls_key(key), tenant_key(key)]
    }
}
