//! Code the examples share: the servers' command line and store selection (`cli`), a small
//! argument reader for the fleet example (`flags`), and the hand-written
//! `helloworld.Greeter` gRPC service (`greeter`, also used by the tests).
//!
//! Each example includes this folder with `mod common;`; Cargo does not build it as an example of
//! its own (only `examples/*.rs` and `examples/*/main.rs` are).

pub mod cli;
pub mod flags;
pub mod greeter;
