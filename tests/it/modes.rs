//! The production modes, each on real Redis (single node, and Cluster where it
//! matters) and on the memory store: refunds, shadow rollout, cost settled after the response,
//! block on abuse, and fleet-wide concurrency limits.

mod block;
mod concurrency;
mod refund;
pub(crate) mod settle;
mod shadow;
