//! Faults on the fixture's Redis, and which of them lose data.
//!
//! To add a fault: a variant of [`Fault`], a line in [`draw`], its arm in [`inject`], and
//! whether it loses data ([`Fault::loses_data`]): the oracles widen their bounds after a data
//! loss exactly as the docs allow.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::fleet::Fixture;
use crate::generator::{Backend, Config, Family};
use crate::support::{RedisCluster, RedisServer};

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
    /// Cluster: the slot of the schedule's key `key` moves to the next master, key by key, in
    /// the background while the schedule goes on (docs/failure.md: "a slot migration fails no
    /// decision open"; `MIGRATE` keeps each key's state: no data is lost).
    Migrate { key: usize },
    /// `maxmemory` set `over` bytes above the memory in use with `noeviction`, then a write
    /// takes Redis past it, for `ms` while the schedule goes on; then lifted
    /// ([`out_of_memory`]). Nothing is lost: writes are refused.
    OutOfMemory { ms: u64, over: u64 },
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
    if config.family == Family::Batching {
        return Fault::OutOfMemory {
            ms: rng.u64(200..1_500),
            over: rng.u64(0..65_536),
        };
    }
    if config.backend == Backend::Memory {
        return Fault::DebugSleep { ms: 0 };
    }
    if config.backend == Backend::Cluster {
        // `FLUSHALL` is on every master, `kill -9` and the restart on the hot key's master.
        return match rng.u32(0..12) {
            0..=2 => Fault::FlushAll,
            3 => Fault::ClientKill,
            4 => Fault::ScriptFlush,
            5 => Fault::DebugSleep {
                ms: rng.u64(300..900),
            },
            6..=7 => Fault::Restart,
            _ => Fault::Migrate {
                key: rng.usize(0..config.keys),
            },
        };
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

/// The value that takes Redis past `maxmemory` ([`Fault::OutOfMemory`]): far more than the memory
/// other clients may give back meanwhile (a full batch's query buffer is about 1 MB), so that
/// Redis stays out of memory until the fault is lifted.
const FILLER: usize = 8 << 20;
const FILLER_KEY: &str = "out-of-memory-filler";

/// Redis out of memory ([`Fault::OutOfMemory`]): a value of [`FILLER`] bytes is written, then
/// `maxmemory-policy noeviction` and `maxmemory` `over` bytes above what Redis used without it,
/// so Redis is past `maxmemory` by about the filler; after `ms`, the value is deleted and
/// `maxmemory` lifted. Returns once Redis is out of memory, with the moment it was, and the
/// thread that lifts it, which returns the moment the lift began.
pub async fn out_of_memory(
    fixture: &Fixture,
    ms: u64,
    over: u64,
) -> (Instant, std::thread::JoinHandle<Instant>) {
    let redis = fixture.redis.clone();
    let (out, is_out) = tokio::sync::oneshot::channel();
    let config = |conn: &mut redis::Connection, name: &str, value: String| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(conn)
            .expect("CONFIG SET");
    };
    let lift = std::thread::spawn(move || {
        let redis = redis.lock().unwrap();
        let mut conn = redis.conn();
        // Made by a script, not sent: an 8 MB argument would leave a query buffer that Redis
        // trims later, taking its memory back under `maxmemory`.
        let _: () = redis::cmd("EVAL")
            .arg("redis.call('SET', KEYS[1], string.rep('x', ARGV[1]))")
            .arg(1)
            .arg(FILLER_KEY)
            .arg(FILLER)
            .query(&mut conn)
            .expect("the filler is written");
        let used = redis.used_memory();
        drop(redis);
        config(&mut conn, "maxmemory-policy", "noeviction".into());
        let maxmemory = used.saturating_sub(FILLER as u64) + over;
        config(&mut conn, "maxmemory", maxmemory.max(1).to_string());
        let _ = out.send(Instant::now());
        std::thread::sleep(Duration::from_millis(ms));
        let lifted = Instant::now();
        let _: () = redis::cmd("DEL")
            .arg(FILLER_KEY)
            .query(&mut conn)
            .expect("DEL");
        config(&mut conn, "maxmemory", "0".into());
        lifted
    });
    let since = is_out.await.expect("Redis is out of memory");
    (since, lift)
}

/// Injects `fault` on the schedule's store (blocking calls, run off the runtime's workers);
/// `keys` are the schedule's storage keys, in pairs per key (its tenant's, then its own): what
/// a corruption writes into, and on Cluster which slot and master a fault aims at.
pub async fn inject(fixture: &Fixture, fault: Fault, keys: Vec<String>, backend: Backend) {
    if backend == Backend::Cluster {
        let cluster = fixture.cluster.clone();
        let run = move || on_cluster(cluster, fault, &keys);
        return tokio::task::spawn_blocking(run)
            .await
            .expect("fault injected");
    }
    let redis = fixture.redis.clone();
    let run = move || {
        let mut redis = redis.lock().unwrap();
        match fault {
            Fault::FlushAll => redis.flushall(),
            Fault::ClientKill => redis.client_kill_normal(),
            Fault::ScriptFlush => redis.script_flush(),
            // An out-of-memory is [`out_of_memory`]'s: the fleet keeps its lifting thread.
            Fault::DebugSleep { ms: 0 } | Fault::Migrate { .. } | Fault::OutOfMemory { .. } => {}
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

/// The hot key's storage key (key 0's own, after its tenant's).
fn hot(keys: &[String]) -> &str {
    keys.get(1).map_or("k", String::as_str)
}

/// `fault` on the cluster. A migration returns once the slot is open for migration (`ASK`s
/// begin) and goes on in a thread of its own that holds the cluster until it is over, so the
/// next fault and the cleaning between schedules wait for it.
fn on_cluster(cluster: Arc<Mutex<Option<RedisCluster>>>, fault: Fault, keys: &[String]) {
    if let Fault::Migrate { key } = fault {
        let route = keys.get(2 * key + 1).map_or("k", String::as_str).to_owned();
        let (begun, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let guard = cluster.lock().unwrap();
            let cluster = guard.as_ref().expect("the cluster runs");
            let slot = cluster.slot_of(&route);
            let from = cluster.node_for_key(&route);
            let to = (from + 1) % cluster.nodes().len();
            cluster.begin_slot_migration(slot, from, to);
            let _ = begun.send(());
            // Key by key, with the fleet's calls in between: some keys of the slot are on
            // each side for a while (`ASK`, `TRYAGAIN`).
            std::thread::sleep(Duration::from_millis(50));
            while cluster.migrate_keys(slot, from, to, 1) > 0 {
                std::thread::sleep(Duration::from_millis(40));
            }
            cluster.finish_slot_migration(slot, from, to);
        });
        let _ = wait.recv();
        return;
    }
    let mut guard = cluster.lock().unwrap();
    let cluster = guard.as_mut().expect("the cluster runs");
    match fault {
        Fault::FlushAll => cluster.flushall(),
        Fault::ClientKill => cluster
            .nodes()
            .iter()
            .for_each(RedisServer::client_kill_normal),
        Fault::ScriptFlush => cluster.script_flush_all(),
        Fault::DebugSleep { ms: 0 } => {}
        Fault::DebugSleep { ms } => {
            let node = cluster.node_for_key(hot(keys));
            drop(cluster.nodes()[node].debug_sleep(Duration::from_millis(ms)));
        }
        Fault::Restart => {
            let node = cluster.node_for_key(hot(keys));
            cluster.restart_node(node);
        }
        // Not drawn on Cluster.
        Fault::Corrupt { .. }
        | Fault::Evict { .. }
        | Fault::Migrate { .. }
        | Fault::OutOfMemory { .. } => {}
    }
}
