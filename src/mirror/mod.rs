//! The Rust twin of the scripts: everything that reads or writes what the Lua reads and writes.
//!
//! - `driver.rs`: the Rust mirror of the driver (`lua/common.lua`) and of the controls
//!   (`lua/control.lua`), which [`MemoryStore`](crate::store::MemoryStore) runs over the same
//!   bytes.
//! - `refund.rs`, `block.rs`, `slots.rs`: the mirrors of the production modes' scripts
//!   (`lua/refund.lua`, `lua/block.lua`, `lua/slots.lua`).
//!
//! The pure math of each algorithm, and its [`Spec`](crate::algorithm), are in
//! [`algorithm`](crate::algorithm); this module builds on them, never the other way.

mod block;
mod driver;
mod refund;
mod slots;

pub(crate) use self::block::{block_us, offences_key};
pub(crate) use self::driver::{
    control, decide, decide_log, foreign_state, learning, marked_override, LogWrite, RecordWrite,
    Refused, Written,
};
pub(crate) use self::refund::{log_refund, refund, reserved_before_reset};
pub(crate) use self::slots::{slots_step, ACQUIRE, RELEASE, RENEW};

/// The decision script as the crate sends it (`lua/common.lua` with every step spliced in),
/// for tests that run it by hand.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub fn script_source() -> &'static str {
    &crate::store::wire::scripts::SOURCE
}

/// The keys a decision on the storage key `key` names besides it, as the crate builds them:
/// the sliding log's controls (`<key>#m`), then the tenant's (`<prefix>:{<id>}#t`). For tests.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub fn control_keys(key: &str) -> [String; 2] {
    use crate::store::wire::layout::{log_controls_key, tenant_key};
    [log_controls_key(key), tenant_key(key)]
}
