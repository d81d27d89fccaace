//! Code the examples share: a table-driven command line (`flags`), the axum and tonic servers'
//! flags and layer (`server`, its help in `server_usage.txt`) and the store their flags name
//! (`store`), and the hand-written `helloworld.Greeter` gRPC service
//! (`greeter`, also used by the tests).
//!
//! The fleet example includes what it needs by path instead: `flags`, its command line
//! (`fleet_flags.rs`) and its mock upstream (`upstream.rs`).
//!
//! Each example includes this folder with `mod common;`; Cargo does not build it as an example of
//! its own (only `examples/*.rs` and `examples/*/main.rs` are).

pub mod flags;
pub mod greeter;
pub mod server;
pub mod store;
