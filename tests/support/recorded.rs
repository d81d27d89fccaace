//! What a `metrics-util` debugging recorder recorded, read as plain values. Outside
//! `support/mod.rs`, as not every test binary that loads the harness depends on `metrics-util`:
//! `tests/it` and `tests/metrics.rs` load it with `#[path]`.

use metrics_util::debugging::{DebugValue, Snapshotter};

/// A metric's labels as `(name, value)`.
pub type Labels = Vec<(String, String)>;

/// A snapshot of `snapshotter`: each metric's name, labels and value.
pub fn metrics(snapshotter: &Snapshotter) -> Vec<(String, Labels, DebugValue)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.name().to_owned(), labels, value)
        })
        .collect()
}
