//! [`Limiter`]: a store, an algorithm, a key prefix, a clock and a failure policy — usable
//! without tower; and what its features add to it: the fleet controls ([`Limiter::set_quota`],
//! [`Limiter::suspend`], [`Limiter::inspect`] and siblings), blocks on abuse
//! ([`Limiter::check_blocking`]), leases ([`Leases`]) and settlement
//! ([`Limiter::check_reserving`]).

pub use crate::block::BlockFor;
pub use crate::control::{KeyStatus, OverrideSource, TierState, OVERRIDE_IDLE_TTL};
pub use crate::core::{
    AcquireError, ConfigError, ControlError, LeaseError, Limiter, LimiterBuilder, LimiterStats,
    StoredKey, Target, DEFAULT_PREFIX, DIRECT_POLICY_LABEL, MAX_SUSPENSION,
};
pub use crate::lease::{
    LeaseStats, Leases, DEFAULT_MAX_LEASE_KEYS, DEFAULT_MAX_LEASE_UNITS, MAX_LEASE_INTERVAL,
};
pub use crate::settle::Reserved;
