//! What the gRPC tests read from a `tonic::Status`. Outside `support/mod.rs`, as not every test
//! binary that loads the harness depends on tonic: `tests/it` and `tests/examples` load it with
//! `#[path]`.

/// A metadata value of `status` as text (panics with the whole status when it is missing).
pub fn metadata<'a>(status: &'a tonic::Status, name: &str) -> &'a str {
    let value = status.metadata().get(name);
    let value = value.unwrap_or_else(|| panic!("no {name} metadata in {status:?}"));
    value.to_str().unwrap()
}
