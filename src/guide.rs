//! The long-form documentation: one page per topic, from the repository's `docs/` folder.
//!
//! The README gives the short version; these pages hold the rest. Their Rust examples are
//! doctests, so they keep compiling. This module holds no code.
//!
//! | page | what it covers |
//! |---|---|
//! | [`using`] | dependencies, crate features, metrics and logs, axum 0.7, tonic, the decision in a handler |
//! | [`examples`] | every example, its command line and output; the fleet example; the `redlimit` command; the example's flags |
//! | [`algorithms`] | the five algorithms: guarantees, memory, Redis work, the sliding window counter exactly |
//! | [`failure`] | when Redis fails: timeouts, the circuit breaker, failure policies, resends, the startup check |
//! | [`production`] | production Redis: version, TLS, credentials and the ACL user, Cluster, Sentinel, failover |
//! | [`keys`] | storage keys, scopes, hashing, client IPs, requests without a key, per-route limits |
//! | [`fleet`] | several quotas at once, limits changed at run time, suspension, reset and inspect |
//! | [`outbound`] | wait mode: `Limiter::acquire`, `OutboundLayer`, auto-suspend |
//! | [`headers`] | `RateLimit-Policy` / `RateLimit`, `Retry-After`, tiers, overrides, jitter, gRPC |
//! | [`leases`] | token leases for hot keys: exactness, stranding, the controls' delay, headers |
//! | [`modes`] | production modes: shadow rollout, cost settled after the response and refunds, block on abuse, concurrency limits |
//!
//! How the crate is built inside (the data flow, the script format, where each concept lives)
//! is in `ARCHITECTURE.md`, and the benchmarks in `benches/README.md`, in the repository.

#[doc = include_str!("../docs/using.md")]
pub mod using {}

#[doc = include_str!("../docs/examples.md")]
pub mod examples {}

#[doc = include_str!("../docs/algorithms.md")]
pub mod algorithms {}

#[doc = include_str!("../docs/failure.md")]
pub mod failure {}

#[doc = include_str!("../docs/production.md")]
pub mod production {}

#[doc = include_str!("../docs/keys.md")]
pub mod keys {}

#[doc = include_str!("../docs/fleet.md")]
pub mod fleet {}

#[doc = include_str!("../docs/outbound.md")]
pub mod outbound {}

#[doc = include_str!("../docs/headers.md")]
pub mod headers {}

#[doc = include_str!("../docs/leases.md")]
pub mod leases {}

#[doc = include_str!("../docs/modes.md")]
pub mod modes {}

// The README's Rust examples are compiled with the doctests too (never documented).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
