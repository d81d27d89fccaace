//! Hashed names: a tenant or route whose id the limiter stores hashed (`#` and 64 lower-case hex
//! digits) is listed by that stored form, and every command given it reaches exactly the keys
//! stored under it, on a single node and on Cluster, and none outside the prefix.

mod commands;
mod listing;
