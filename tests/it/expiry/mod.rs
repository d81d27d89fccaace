//! The key's expiry on Redis's clock: the expiry the decision script remembers beside a key's
//! state, and that a key never expires before its state is fresh again, whoever writes it.

mod basics;
mod edges;
