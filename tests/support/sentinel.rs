//! A private Redis Sentinel setup: a primary, a replica of it and three sentinels
//! (`redis-server sentinel.conf --sentinel`), each on a free port in its own temporary
//! directory.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::server::{spawn_logged, wait_until_ready};
use super::{free_port, info_field, RedisServer, REDIS_MISSING};

/// The name the sentinels monitor the primary under.
pub const MASTER_NAME: &str = "mymaster";
/// How many sentinels run; the quorum is 2.
const SENTINELS: usize = 3;
/// How long a sentinel takes to call an unanswering primary down (`down-after-milliseconds`).
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// `failover-timeout`: a failover that stalls is retried after twice this.
const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);
/// How long the setup may take to settle (replication up, sentinels aware of each other).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// A primary, its replica and three sentinels that monitor it as [`MASTER_NAME`] with quorum 2.
///
/// Dropping it kills every process (SIGKILL; a frozen replica is thawed first) and removes
/// their directories.
pub struct RedisSentinel {
    /// The primary the sentinels were started on.
    pub master: RedisServer,
    /// Its replica (`REPLICAOF` the primary), the one a failover promotes.
    pub replica: RedisServer,
    sentinels: Vec<SentinelProcess>,
    /// The replica's pid while it is frozen (a frozen server cannot tell its pid).
    frozen: Option<u32>,
}

impl RedisSentinel {
    /// Starts the primary and the replica, waits for replication, starts the sentinels and waits
    /// until each knows the replica and the two other sentinels (so a failover can be agreed).
    pub fn start() -> RedisSentinel {
        let master = RedisServer::start();
        let replica = RedisServer::start();
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.port())
            .query(&mut replica.conn())
            .expect("REPLICAOF");
        wait_for("the replica to sync", SETTLE_TIMEOUT, || {
            info_field(&replica.info("replication"), "master_link_status") == Some("up")
        });
        let sentinels = (0..SENTINELS)
            .map(|_| SentinelProcess::start(master.port()))
            .collect();
        let setup = RedisSentinel {
            master,
            replica,
            sentinels,
            frozen: None,
        };
        wait_for(
            "the sentinels to know the replica and each other",
            SETTLE_TIMEOUT,
            || {
                setup.sentinels.iter().all(|sentinel| {
                    let Ok(state) = sentinel.master_state() else {
                        return false;
                    };
                    state.get("num-slaves").map(String::as_str) == Some("1")
                        && state.get("num-other-sentinels").map(String::as_str)
                            == Some(&*(SENTINELS - 1).to_string())
                        && state.get("flags").map(String::as_str) == Some("master")
                })
            },
        );
        setup
    }

    /// `redis://127.0.0.1:<port>/` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|sentinel| format!("redis://127.0.0.1:{}/", sentinel.port))
            .collect()
    }

    /// A store with the defaults through these sentinels, connected on `runtime`.
    pub fn verified_store(&self, runtime: &tokio::runtime::Runtime) -> redlimit::store::RedisStore {
        let urls = self.sentinel_urls();
        let store =
            redlimit::store::RedisStore::sentinel(urls.iter().map(String::as_str), MASTER_NAME)
                .unwrap();
        runtime
            .block_on(store.verify())
            .expect("verify via Sentinel");
        store
    }

    /// Asks the first sentinel for a failover (`SENTINEL FAILOVER`): the old primary stays up
    /// until Sentinel demotes it.
    pub fn ask_failover(&self) {
        let mut sentinel = redis::Client::open(self.sentinel_urls()[0].as_str())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(1))
            .unwrap();
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER_NAME)
            .query(&mut sentinel)
            .expect("SENTINEL FAILOVER");
    }

    /// The primary's port as each sentinel that answers names it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn named_master_ports(&self) -> Vec<u16> {
        self.sentinels
            .iter()
            .filter_map(|sentinel| sentinel.master_port().ok())
            .collect()
    }

    /// Whether a majority of the sentinels name the replica as the primary and the replica
    /// says it is one (`ROLE`): the failover is over.
    pub fn replica_promoted(&self) -> bool {
        let port = self.replica.port();
        let naming = self
            .named_master_ports()
            .into_iter()
            .filter(|named| *named == port)
            .count();
        naming > SENTINELS / 2 && role(&self.replica).as_deref() == Some("master")
    }

    /// Stops the replica's process (SIGSTOP): it reads nothing more from the primary, so what
    /// the primary writes now waits in its output buffer. [`thaw_replica`](Self::thaw_replica)
    /// resumes it.
    pub fn freeze_replica(&mut self) {
        let pid = pid(&self.replica);
        signal(pid, "-STOP");
        self.frozen = Some(pid);
    }

    /// Resumes the replica's process (SIGCONT).
    pub fn thaw_replica(&mut self) {
        if let Some(pid) = self.frozen.take() {
            signal(pid, "-CONT");
        }
    }

    /// The bytes the primary holds for the replica and has not been able to send it (`omem` of
    /// the replica's connection in `CLIENT LIST TYPE replica`).
    pub fn replica_backlog_bytes(&self) -> u64 {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("replica")
            .query(&mut self.master.conn())
            .expect("CLIENT LIST TYPE replica");
        clients
            .split_whitespace()
            .find_map(|field| field.strip_prefix("omem="))
            .and_then(|omem| omem.parse().ok())
            .unwrap_or(0)
    }

    /// The sentinels' logs (their last lines), for a failure message.
    pub fn sentinel_logs(&self) -> String {
        self.sentinels
            .iter()
            .map(|sentinel| {
                format!(
                    "--- sentinel :{} ---\n{}",
                    sentinel.port,
                    sentinel.log_tail(20)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL too; thawing it first leaves no surprise. Never
        // panics (it may run while a test panics).
        if let Some(pid) = self.frozen.take() {
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(pid.to_string())
                .status();
        }
    }
}

/// `ROLE`'s first element (`master`, `slave`), `None` if the server does not answer.
fn role(server: &RedisServer) -> Option<String> {
    let client = server.client();
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    let role: redis::Value = redis::cmd("ROLE").query(&mut conn).ok()?;
    match role {
        redis::Value::Array(items) => items
            .into_iter()
            .next()
            .and_then(|first| redis::from_redis_value::<String>(first).ok()),
        _ => None,
    }
}

fn pid(server: &RedisServer) -> u32 {
    info_field(&server.info("server"), "process_id")
        .and_then(|pid| pid.parse().ok())
        .expect("process_id in INFO server")
}

/// Sends `signal` (`-STOP`, `-CONT`) to `pid` with `kill`.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid} failed: {status}");
}

/// Polls `ready` every 50 ms; panics after `timeout`.
fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// One `redis-server sentinel.conf --sentinel` process; killed (SIGKILL) on drop.
struct SentinelProcess {
    port: u16,
    child: Child,
    dir: TempDir,
}

impl SentinelProcess {
    /// Starts a sentinel on a free port monitoring the primary on `master_port`.
    fn start(master_port: u16) -> SentinelProcess {
        let dir = tempfile::Builder::new()
            .prefix("redlimit-sentinel-")
            .tempdir()
            .expect("create temp dir");
        let mut failures = Vec::new();
        for _ in 0..10 {
            let port = free_port();
            // Sentinels rewrite their config file: each gets its own.
            let config = dir.path().join("sentinel.conf");
            std::fs::write(&config, sentinel_config(port, master_port, dir.path()))
                .expect("write sentinel.conf");
            let mut child = spawn(&config, dir.path());
            match wait_until_ready(&mut child, port, "redis sentinel") {
                Ok(()) => return SentinelProcess { port, child, dir },
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    failures.push(format!("port {port}: {e}"));
                }
            }
        }
        panic!("redis sentinel did not start:\n{}", failures.join("\n"));
    }

    fn conn(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        let conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
        conn.set_read_timeout(Some(Duration::from_secs(1)))?;
        Ok(conn)
    }

    /// `SENTINEL MASTER mymaster` as a map (`flags`, `num-slaves`, `num-other-sentinels`...).
    fn master_state(&self) -> redis::RedisResult<HashMap<String, String>> {
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(MASTER_NAME)
            .query(&mut self.conn()?)
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME mymaster`'s port.
    fn master_port(&self) -> redis::RedisResult<u16> {
        let (_host, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME)
            .query(&mut self.conn()?)?;
        Ok(port)
    }

    fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sentinel_config(port: u16, master_port: u16, dir: &Path) -> String {
    format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         dir {dir}\n\
         sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
         sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
         sentinel failover-timeout {MASTER_NAME} {failover}\n\
         sentinel parallel-syncs {MASTER_NAME} 1\n",
        dir = dir.display(),
        down = DOWN_AFTER.as_millis(),
        failover = FAILOVER_TIMEOUT.as_millis(),
    )
}

fn spawn(config: &Path, dir: &Path) -> Child {
    let args = [config.as_os_str(), "--sentinel".as_ref()];
    spawn_logged(args, log_file(dir), "redis-server --sentinel")
}

fn log_file(dir: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("sentinel.log"))
        .expect("open sentinel log file")
}
