//! Faults on the fixture's Redis, and which of them lose data.
//!
//! To add a fault: a variant of [`Fault`], a line in [`draw`], its arm in [`inject`], and
//! whether it loses data ([`Fault::loses_data`]): the oracles widen their bounds after a data
//! loss exactly as the docs allow.

use std::time::Duration;

use crate::generator::Backend;
use crate::support::RedisServer;

/// A fault on the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `FLUSHALL`: every key is lost.
    FlushAll,
    /// `CLIENT KILL TYPE normal`: every connection is cut.
    ClientKill,
    /// `SCRIPT FLUSH`: the next calls meet `NOSCRIPT`.
    ScriptFlush,
    /// `DEBUG SLEEP` for longer than the store timeout.
    DebugSleep { ms: u64 },
    /// `kill -9` and a restart without persistence: every key is lost.
    Restart,
}

impl Fault {
    /// Whether the fault loses stored state.
    pub fn loses_data(self) -> bool {
        matches!(self, Fault::FlushAll | Fault::Restart)
    }
}

/// A fault for `backend` (a `MemoryStore` has none to suffer: it gets none).
pub fn draw(rng: &mut fastrand::Rng, backend: Backend) -> Fault {
    if backend == Backend::Memory {
        return Fault::DebugSleep { ms: 0 };
    }
    match rng.u32(0..10) {
        0..=2 => Fault::FlushAll,
        3..=4 => Fault::ClientKill,
        5..=6 => Fault::ScriptFlush,
        7..=8 => Fault::DebugSleep {
            ms: rng.u64(300..900),
        },
        _ => Fault::Restart,
    }
}

/// Injects `fault` on `redis` (blocking calls, run off the runtime's workers).
pub async fn inject(redis: &std::sync::Arc<std::sync::Mutex<RedisServer>>, fault: Fault) {
    let redis = redis.clone();
    let run = move || {
        let mut redis = redis.lock().unwrap();
        match fault {
            Fault::FlushAll => redis.flushall(),
            Fault::ClientKill => redis.client_kill_normal(),
            Fault::ScriptFlush => redis.script_flush(),
            Fault::DebugSleep { ms: 0 } => {}
            // The sleep runs on a thread of its own while the fleet keeps calling.
            Fault::DebugSleep { ms } => drop(redis.debug_sleep(Duration::from_millis(ms))),
            Fault::Restart => redis.restart(),
        }
    };
    tokio::task::spawn_blocking(run)
        .await
        .expect("fault injected");
}
