//! The examples run as a user runs them (built once by `cargo build --example`, then started as
//! processes): their flags, their store choice and what their clients see. One module per
//! example; a binary of its own, so that building and running the examples does not share the
//! machine with the timing-sensitive tests of `tests/it`.

#[path = "../support/mod.rs"]
mod support;

mod cli;
mod fleet;
mod tonic;
