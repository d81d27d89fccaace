//! The example servers' command line and store selection, shared by the axum and tonic examples.
//!
//! Flags take their value as the next argument or after `=` (`--limit 5`, `--limit=5`), once
//! each: a flag given twice is refused, never "the last one wins". Without
//! `--redis` / `--redis-cluster` / `--redis-sentinel` the server uses the Redis at `REDIS_URL` (or
//! `redis://127.0.0.1:6379`) when one answers, otherwise an in-memory store, and says which.
//!
//! A client is its IP address. `--key api-key` keys on the `x-api-key` header (gRPC: metadata)
//! instead, for a server behind a layer that has authenticated that header: unchecked, any
//! client could send a fresh key with each request and get a fresh quota with it.
//!
//! One concern a module: the options (`options`), reading them (`args`, `values`), the help
//! (`usage`), the client key (`key`), and the store and layer they build (`store`).

mod args;
mod key;
mod options;
mod store;
mod usage;
mod values;

// Each example uses a part of the command line: the fleet and hyper examples only its values.
#[allow(unused_imports)]
pub use {
    args::parse_args,
    key::{ApiKeyOrIp, ExampleKey},
    options::{Backend, CliError, KeyChoice, OnRedisError, Options, Program},
    store::{default_redis_url, layer, redis_answers, DEFAULT_REDIS_URL},
    usage::{init_tracing, options_or_exit, usage},
    values::{parse_count, parse_duration_of, redacted},
};
