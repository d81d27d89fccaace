//! The integration tests, one binary: one module per concern, every test on real Redis
//! processes of its own (`tests/support`), never a mock and never the machine's Redis.
//!
//! Three kinds of test live in binaries of their own: the example-driving tests
//! (`tests/examples/`: they build and run the examples as a user runs them), the hostile-input
//! tests (`tests/hostile/`: their million-key flood runs alone), and the metrics test
//! (`tests/metrics.rs`: its recorder is process-global).
//!
//! Run one module with a filter, e.g. `./scripts/test.sh --test it algorithms::`.

#[path = "../support/mod.rs"]
mod support;

// The hand-written gRPC service of the examples, for `layer_quotas` and `tonic` (loaded once).
#[path = "../../examples/common/greeter.rs"]
mod greeter;
// The algorithms' written-out sequences, data shared with their unit tests (`algorithms`).
#[path = "../../src/algorithm/sequences.rs"]
#[allow(dead_code)] // The unit tests run every sequence; `algorithms` those it names.
mod sequences;
// What the gRPC tests read from a status (outside `support`: the CLI's tests load that too).
#[path = "../support/grpc.rs"]
mod grpc;
// A metrics recorder's snapshot, read (outside `support` for the same reason), for `acl`.
#[path = "../support/recorded.rs"]
mod recorded;

mod acl;
mod algorithms;
mod batching;
mod cluster;
mod concurrency;
mod connection;
mod controls_after_answers;
mod custom_store;
mod deny_cache;
mod differential;
mod dropped_controls;
mod eviction;
mod expiry;
mod extremes;
mod failure_episodes;
mod failure_policy;
mod fleet;
mod harness;
mod layer;
mod layer_quotas;
mod learning_records;
mod lease;
mod logs;
mod misconfiguration;
mod modes;
mod outbound;
mod redacted_url;
mod route_limits;
mod sentinel;
mod store_faults;
mod store_seam;
mod tls;
mod token_bucket;
mod tonic;
