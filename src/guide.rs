//! The long-form documentation: one page per topic, from the repository's `docs/` folder.
//!
//! The README gives the short version; these pages hold the rest. Their Rust examples are
//! doctests, so they keep compiling, and a unit test holds the metrics table of [`using`] to
//! the metrics the code records. This module holds no other code.
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    /// The metric names in the metrics table of `docs/using.md`, each row's first cell.
    fn table_names() -> BTreeSet<String> {
        include_str!("../docs/using.md")
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .filter(|name| name.starts_with("redlimit_"))
            .map(str::to_owned)
            .collect()
    }

    /// Every string literal `"redlimit_…"` (lowercase letters and `_`) in the `.rs` files under
    /// `dir`: a metric's name is written once, as such a literal, where it is recorded or in a
    /// `names` module.
    fn emitted_names(dir: &Path, names: &mut BTreeSet<String>) {
        let quote_prefix = concat!("\"", "redlimit_");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                emitted_names(&path, names);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let source = std::fs::read_to_string(&path).unwrap();
                for (at, _) in source.match_indices(quote_prefix) {
                    let rest = &source[at + 1..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    // A whole literal, longer than the prefix alone.
                    if rest[name.len()..].starts_with('"') && name.len() > quote_prefix.len() - 1 {
                        names.insert(name);
                    }
                }
            }
        }
    }

    /// The guide's one metrics table lists exactly the metrics the code records: a metric
    /// added, renamed or removed in `src/` without its row fails here.
    #[test]
    fn the_metrics_table_lists_every_metric_the_code_emits() {
        let mut emitted = BTreeSet::new();
        emitted_names(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut emitted,
        );
        assert!(
            emitted.contains("redlimit_decisions_total"),
            "the scan finds the names: {emitted:?}"
        );
        assert_eq!(table_names(), emitted, "docs/using.md's table against src/");
    }
}
