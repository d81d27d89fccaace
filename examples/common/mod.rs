//! Code the examples share: a table-driven command line (`flags`), the axum and tonic servers'
//! flags, store and layer (`server`), and the hand-written `helloworld.Greeter` gRPC service
//! (`greeter`, also used by the tests).
//!
//! Each example includes this folder with `mod common;`; Cargo does not build it as an example of
//! its own (only `examples/*.rs` and `examples/*/main.rs` are).

pub mod flags;
pub mod greeter;
pub mod server;
