//! [`Limiter`]: a store, an algorithm, a key prefix, a clock and a failure policy — usable
//! without tower; and what its features add to it: the fleet controls ([`Limiter::set_quota`],
//! [`Limiter::suspend`], [`Limiter::inspect`] and siblings), blocks on abuse
//! ([`Limiter::check_blocking`]), leases ([`Leases`]) and settlement
//! ([`Limiter::check_reserving`]).

pub use crate::block::BlockFor;
pub use crate::control::{KeyStatus, OverrideSource, TierState, OVERRIDE_IDLE_TTL};
pub use crate::core::{
    AcquireError, ConfigError, ControlError, LeaseError, LeaseStats, Leases, Limiter,
    LimiterBuilder, LimiterStats, StoredKey, Target, DEFAULT_MAX_LEASE_KEYS,
    DEFAULT_MAX_LEASE_UNITS, DEFAULT_PREFIX, DIRECT_POLICY_LABEL, MAX_LEASE_INTERVAL,
    MAX_SUSPENSION,
};
pub use crate::settle::Reserved;
