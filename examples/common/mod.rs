//! Code the example servers share: the command line and store selection (`cli`), and the
//! hand-written `helloworld.Greeter` gRPC service (`greeter`, also used by the tests).
//!
//! Each example includes this folder with `mod common;`; Cargo does not build it as an example of
//! its own (only `examples/*.rs` and `examples/*/main.rs` are).

pub mod cli;
pub mod greeter;
