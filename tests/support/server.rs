//! One private `redis-server` process.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{free_port, info_field, TlsSetup, REDIS_MISSING};

/// How long a fresh process gets to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How many ports `start` tries before giving up.
const START_ATTEMPTS: usize = 10;
/// How long `restart` keeps retrying its (fixed) port.
const RESTART_TIMEOUT: Duration = Duration::from_secs(10);
/// Name of the server's stdout/stderr log inside its directory.
const LOG_FILE: &str = "redis.log";

/// A private `redis-server` on 127.0.0.1, in its own temporary directory.
///
/// Dropping it kills the process (SIGKILL) and removes the directory.
pub struct RedisServer {
    port: u16,
    cluster_node: bool,
    /// TLS on a second port (the plain port stays, for the harness's own connections).
    tls: Option<(TlsSetup, u16)>,
    child: Option<Child>,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a standalone server on a free port and waits until it answers
    /// PING. Panics (never skips) if `redis-server` is not installed.
    pub fn start() -> RedisServer {
        Self::start_inner(false, None)
    }

    /// Starts a standalone server that also serves TLS on [`tls_port`](Self::tls_port) with
    /// `tls`'s certificates (the plain port stays open for the harness).
    pub fn start_tls(tls: &TlsSetup) -> RedisServer {
        Self::start_inner(false, Some(tls.clone()))
    }

    /// A cluster node that serves TLS, with TLS on the cluster bus too (`tls-cluster yes`).
    pub fn start_tls_cluster_node(tls: &TlsSetup) -> RedisServer {
        Self::start_inner(true, Some(tls.clone()))
    }

    /// Starts a server with cluster mode enabled and no slots assigned; used by
    /// [`super::RedisCluster`].
    pub fn start_cluster_node() -> RedisServer {
        Self::start_inner(true, None)
    }

    fn start_inner(cluster_node: bool, tls: Option<TlsSetup>) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("redlimit-redis-")
            .tempdir()
            .expect("create temp dir");
        let mut server = RedisServer {
            port: 0,
            cluster_node,
            tls: tls.map(|tls| (tls, 0)),
            child: None,
            dir,
        };
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            // Another process may take the port between our check and redis
            // binding it: then redis exits and we try the next port.
            server.port = free_port();
            if let Some((_, tls_port)) = &mut server.tls {
                *tls_port = free_port();
            }
            match server.spawn_and_wait() {
                Ok(child) => {
                    server.child = Some(child);
                    return server;
                }
                Err(e) => failures.push(format!("port {}: {e}", server.port)),
            }
        }
        panic!(
            "redis-server did not start after {START_ATTEMPTS} attempts:\n{}\n--- log tail ---\n{}",
            failures.join("\n"),
            server.log_tail(30)
        );
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TLS port; panics if the server was not started with TLS.
    pub fn tls_port(&self) -> u16 {
        self.tls.as_ref().expect("a TLS server").1
    }

    /// The port the server announces to clients: the TLS port when it serves TLS.
    pub fn client_port(&self) -> u16 {
        self.tls.as_ref().map_or(self.port, |(_, port)| *port)
    }

    /// `rediss://127.0.0.1:<tls port>/`
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port())
    }

    /// The server's temporary directory (holds the log and, for cluster
    /// nodes, the nodes config file).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// A client for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid redis url")
    }

    /// A new synchronous connection; panics if the server cannot be reached.
    pub fn conn(&self) -> redis::Connection {
        self.client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to redis on port {}: {e}", self.port))
    }

    /// Kills the process with SIGKILL (like `kill -9`) and waits for it to
    /// exit. Does nothing if it is not running.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory (a cluster node
    /// so rejoins its cluster) and waits until it answers PING. Kills it first
    /// if it is still running. Retries for a while if the port is not free
    /// yet.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + RESTART_TIMEOUT;
        loop {
            match self.spawn_and_wait() {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) if Instant::now() >= deadline => panic!(
                    "redis-server did not restart on port {}: {e}\n--- log tail ---\n{}",
                    self.port,
                    self.log_tail(30)
                ),
                Err(_) => thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Whether the process is alive.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Blocks the whole server for `duration` with `DEBUG SLEEP`. The command
    /// is written on a connection of its own before this returns; a background
    /// thread then waits for the reply. Join the handle to wait until the
    /// server is responsive again.
    pub fn debug_sleep(&self, duration: Duration) -> JoinHandle<()> {
        debug_sleep_via(&self.client(), duration)
    }

    /// [`debug_sleep`](Self::debug_sleep), then 20 ms for the command to reach the server, so
    /// that what the caller sends next waits behind it.
    pub async fn asleep(&self, duration: Duration) -> JoinHandle<()> {
        let sleeping = self.debug_sleep(duration);
        tokio::time::sleep(Duration::from_millis(20)).await;
        sleeping
    }

    /// Puts `maxmemory` below what the server uses, with nothing to evict (`noeviction`):
    /// every write is refused with `OOM`.
    pub fn out_of_memory(&self) {
        let mut conn = self.conn();
        for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query(&mut conn)
                .unwrap();
        }
    }

    /// The server's clock (`TIME`), since the Unix epoch.
    pub fn time(&self) -> Duration {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut self.conn()).unwrap();
        Duration::from_secs(secs) + Duration::from_micros(micros)
    }

    /// Waits for a [`debug_sleep`](Self::debug_sleep) to end (Redis answers again) on a
    /// blocking thread, so that the runtime goes on meanwhile.
    pub async fn awake(sleeping: JoinHandle<()>) {
        tokio::task::spawn_blocking(move || sleeping.join().unwrap())
            .await
            .unwrap();
    }

    /// Every key, sorted, with what it holds: a string's bytes, a sorted set as `zset` reads it
    /// (on a connection, by key), any other type by its name.
    pub fn contents(
        &self,
        zset: impl Fn(&mut redis::Connection, &str) -> String,
    ) -> Vec<(String, String)> {
        let mut conn = self.conn();
        let mut keys = self.keys();
        keys.sort();
        keys.into_iter()
            .map(|key| {
                let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
                let value = match kind.as_str() {
                    "string" => {
                        let bytes: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
                        format!("{bytes:?}")
                    }
                    "zset" => zset(&mut conn, &key),
                    other => other.to_owned(),
                };
                (key, value)
            })
            .collect()
    }

    /// `SCRIPT FLUSH`: forgets every loaded Lua script (EVALSHA then fails
    /// with NOSCRIPT).
    pub fn script_flush(&self) {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut self.conn())
            .expect("SCRIPT FLUSH");
    }

    /// `FLUSHALL`: deletes every key.
    pub fn flushall(&self) {
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut self.conn())
            .expect("FLUSHALL");
    }

    /// `CLIENT KILL TYPE normal`: drops every normal client connection (the
    /// harness uses a throwaway connection, and any error is ignored).
    pub fn client_kill_normal(&self) {
        let mut conn = self.conn();
        let _: redis::RedisResult<redis::Value> = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut conn);
    }

    /// The raw text of `INFO <section>`.
    pub fn info(&self, section: &str) -> String {
        redis::cmd("INFO")
            .arg(section)
            .query(&mut self.conn())
            .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
    }

    /// How many times `name` (e.g. `"evalsha"`, `"script|load"`) has been
    /// called since start or the last [`reset_stats`](Self::reset_stats),
    /// from `INFO commandstats`; 0 if never.
    pub fn command_calls(&self, name: &str) -> u64 {
        let field = format!("cmdstat_{}", name.to_ascii_lowercase());
        let stats = self.info("commandstats");
        // cmdstat_evalsha:calls=12,usec=80,usec_per_call=6.67,...
        info_field(&stats, &field)
            .and_then(|value| value.split(',').find_map(|kv| kv.strip_prefix("calls=")))
            .map(|calls| calls.parse().expect("numeric calls in INFO commandstats"))
            .unwrap_or(0)
    }

    /// `CONFIG RESETSTAT`: zeroes the command statistics.
    pub fn reset_stats(&self) {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut self.conn())
            .expect("CONFIG RESETSTAT");
    }

    /// `used_memory` from `INFO memory`, in bytes.
    pub fn used_memory(&self) -> u64 {
        let memory = self.info("memory");
        info_field(&memory, "used_memory")
            .and_then(|value| value.parse().ok())
            .expect("used_memory in INFO memory")
    }

    /// `MEMORY USAGE <key>` in bytes, `None` if the key does not exist.
    pub fn memory_usage(&self, key: &str) -> Option<u64> {
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query(&mut self.conn())
            .expect("MEMORY USAGE")
    }

    /// Every key (`KEYS *`), sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query(&mut self.conn())
            .expect("KEYS");
        keys.sort();
        keys
    }

    /// `DBSIZE`: the number of keys.
    pub fn dbsize(&self) -> u64 {
        redis::cmd("DBSIZE")
            .query(&mut self.conn())
            .expect("DBSIZE")
    }

    /// The last `lines` lines of the server's stdout/stderr log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join(LOG_FILE)).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The command-line arguments for `redis-server` on the current port.
    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            self.dir.path().display().to_string(),
            "--enable-debug-command".into(),
            "local".into(),
            "--protected-mode".into(),
            "no".into(),
        ];
        if let Some((tls, tls_port)) = &self.tls {
            args.extend([
                "--tls-port".into(),
                tls_port.to_string(),
                "--tls-cert-file".into(),
                tls.cert.display().to_string(),
                "--tls-key-file".into(),
                tls.key.display().to_string(),
                "--tls-ca-cert-file".into(),
                tls.ca.display().to_string(),
                "--tls-auth-clients".into(),
                if tls.auth_clients { "yes" } else { "no" }.into(),
            ]);
            if self.cluster_node {
                // The cluster bus and the addresses nodes announce use TLS.
                args.extend(["--tls-cluster".into(), "yes".into()]);
            }
        }
        if self.cluster_node {
            args.extend([
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                format!("nodes-{}.conf", self.port),
                "--cluster-node-timeout".into(),
                "2000".into(),
            ]);
        }
        args
    }

    /// Spawns `redis-server` on the current port and waits until it is the
    /// one answering PING there. On failure the process is killed.
    fn spawn_and_wait(&self) -> Result<Child, String> {
        let mut child = self.spawn();
        match wait_until_ready(&mut child, self.port, "redis-server") {
            Ok(()) => Ok(child),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// Spawns the process with stdout and stderr appended to the log file.
    fn spawn(&self) -> Child {
        spawn_logged(self.args(), self.open_log(), "redis-server")
    }

    fn open_log(&self) -> File {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(LOG_FILE))
            .expect("open redis log file")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the server binary with `args`, its stdout and stderr appended to `log`; `what` names
/// it in the panic when it cannot start.
pub(super) fn spawn_logged<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
    log: File,
    what: &str,
) -> Child {
    let log_err = log.try_clone().expect("clone log file handle");
    Command::new(super::server_binary())
        .args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .unwrap_or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                panic!("{REDIS_MISSING}");
            }
            panic!("could not run {what}: {e}");
        })
}

/// Polls until the server on `port` (a `redis-server` or a sentinel, `what` says) answers PING
/// and reports `child`'s pid (so a Redis of another process that holds the port does not count).
pub(super) fn wait_until_ready(child: &mut Child, port: u16, what: &str) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last_error = String::from("no attempt made");
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{what} exited early ({status})"));
        }
        match server_pid(port) {
            Ok(pid) if pid == child.id() => return Ok(()),
            Ok(pid) => {
                return Err(format!(
                    "port {port} is served by another process (pid {pid})"
                ))
            }
            Err(e) => last_error = e.to_string(),
        }
        thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "no PING answer within {READY_TIMEOUT:?} (last error: {last_error})"
    ))
}

/// PINGs 127.0.0.1:`port` and returns the answering server's `process_id`.
fn server_pid(port: u16) -> redis::RedisResult<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
    conn.set_read_timeout(Some(Duration::from_secs(1)))?;
    let _: String = redis::cmd("PING").query(&mut conn)?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn)?;
    let pid = info_field(&info, "process_id").and_then(|pid| pid.parse().ok());
    Ok(pid.unwrap_or(0))
}

/// [`RedisServer::debug_sleep`] through `client`, for code that holds a client rather than the
/// server (a hook moved into an upstream's thread).
pub fn debug_sleep_via(client: &redis::Client, duration: Duration) -> JoinHandle<()> {
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("connect to send DEBUG SLEEP");
    let seconds = format!("{:.3}", duration.as_secs_f64());
    let command = redis::cmd("DEBUG")
        .arg("SLEEP")
        .arg(seconds)
        .get_packed_command();
    conn.send_packed_command(&command)
        .expect("send DEBUG SLEEP");
    thread::spawn(move || {
        // The server may be killed while asleep: the reply does not matter.
        let _ = conn.recv_response();
    })
}
