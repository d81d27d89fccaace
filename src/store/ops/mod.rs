//! The crate's script operations, one file each (see [`ScriptOp`](super::op::ScriptOp)); the
//! batch's is the batcher's own, in `redis/batch.rs`.

pub(crate) mod block;
pub(crate) mod control;
pub(crate) mod decide;
pub(crate) mod refund;
pub(crate) mod slots;
