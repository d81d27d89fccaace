//! Faults on the fixture's Redis, and which of them lose data.
//!
//! To add a fault: a variant of [`Fault`], a line in [`draw`], its arm in [`inject`], and
//! whether it loses data ([`Fault::loses_data`]): the oracles widen their bounds after a data
//! loss exactly as the docs allow.

use std::time::Duration;

use crate::generator::{Backend, Config, Family};
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
    /// Bytes that are no state of redlimit's written into each of the schedule's keys: random
    /// bytes, a number, or a value of another type (docs/algorithms.md: such a key "reads as a
    /// fresh key and is overwritten on the next admission", so its state is lost).
    Corrupt { kind: u8, seed: u64 },
    /// `maxmemory` set `bytes` under the memory in use with `allkeys-random`, long enough for
    /// Redis to evict keys of its choice, then lifted: some keys are lost.
    Evict { bytes: u64 },
}

impl Fault {
    /// Whether the fault loses stored state.
    pub fn loses_data(self) -> bool {
        matches!(
            self,
            Fault::FlushAll | Fault::Restart | Fault::Corrupt { .. } | Fault::Evict { .. }
        )
    }
}

/// A fault for `config`'s backend (a `MemoryStore` has none to suffer: it gets none).
pub fn draw(rng: &mut fastrand::Rng, config: &Config) -> Fault {
    if config.backend == Backend::Memory {
        return Fault::DebugSleep { ms: 0 };
    }
    // The keys a corruption writes into are the rate and settlement families' limiter keys.
    let keyed = matches!(config.family, Family::Rate | Family::Settle);
    match rng.u32(0..14) {
        0..=2 => Fault::FlushAll,
        3..=4 => Fault::ClientKill,
        5..=6 => Fault::ScriptFlush,
        7..=8 => Fault::DebugSleep {
            ms: rng.u64(300..900),
        },
        9 => Fault::Restart,
        10..=11 if keyed => Fault::Corrupt {
            kind: rng.u8(0..4),
            seed: rng.u64(..),
        },
        _ => Fault::Evict {
            bytes: rng.u64(1..8_192),
        },
    }
}

/// Writes something that is no state of redlimit's into each of `keys`.
fn corrupt(conn: &mut redis::Connection, keys: &[String], kind: u8, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    for key in keys {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(key).ignore();
        match kind {
            0 => {
                let bytes: Vec<u8> = (0..rng.usize(1..64)).map(|_| rng.u8(..)).collect();
                pipe.cmd("SET").arg(key).arg(bytes).ignore();
            }
            1 => {
                let number = ["0", "-1", "1e308", "nan", "99999999999"][rng.usize(0..5)];
                pipe.cmd("SET").arg(key).arg(number).ignore();
            }
            2 => {
                pipe.cmd("RPUSH").arg(key).arg("x").ignore();
            }
            _ => {
                pipe.cmd("HSET").arg(key).arg("tk").arg("-5").ignore();
            }
        }
        let _: redis::RedisResult<()> = pipe.query(conn);
    }
}

/// `maxmemory` just under the memory in use, with random eviction, for a few commands (Redis
/// evicts before it runs each one), then lifted.
fn evict(redis: &RedisServer, bytes: u64) {
    let mut conn = redis.conn();
    let used = redis.used_memory();
    let config = |conn: &mut redis::Connection, name: &str, value: String| {
        let _: redis::RedisResult<()> = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(conn);
    };
    config(&mut conn, "maxmemory-policy", "allkeys-random".into());
    config(
        &mut conn,
        "maxmemory",
        used.saturating_sub(bytes).max(1).to_string(),
    );
    for _ in 0..3 {
        let _: redis::RedisResult<()> = redis::cmd("PING").query(&mut conn);
        std::thread::sleep(Duration::from_millis(2));
    }
    config(&mut conn, "maxmemory", "0".into());
}

/// Injects `fault` on `redis` (blocking calls, run off the runtime's workers); `keys` are the
/// storage keys a corruption writes into.
pub async fn inject(
    redis: &std::sync::Arc<std::sync::Mutex<RedisServer>>,
    fault: Fault,
    keys: Vec<String>,
) {
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
            Fault::Corrupt { kind, seed } => corrupt(&mut redis.conn(), &keys, kind, seed),
            Fault::Evict { bytes } => evict(&redis, bytes),
        }
    };
    tokio::task::spawn_blocking(run)
        .await
        .expect("fault injected");
}
