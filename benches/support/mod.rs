//! What the benches share: a private `redis-server` on a free port, and a quota that admits
//! everything.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redlimit::{Algorithm, Quota};

/// A quota that admits every check of a bench (the sliding log refuses bursts above
/// [`MAX_SLIDING_LOG_BURST`](redlimit::algorithm::MAX_SLIDING_LOG_BURST)).
#[allow(dead_code)] // not every bench checks
pub fn admitting(algorithm: Algorithm) -> Quota {
    match algorithm {
        Algorithm::SlidingLog => Quota::new(
            redlimit::algorithm::MAX_SLIDING_LOG_BURST,
            Duration::from_millis(100),
        ),
        _ => Quota::per_second(1_000_000_000),
    }
    .expect("a valid quota")
}

/// How many ports [`PrivateRedis`] tries before it gives up.
const START_ATTEMPTS: usize = 10;

/// A `redis-server` of a bench, on a free loopback port in a temporary directory, killed on drop.
pub struct PrivateRedis {
    /// The port it listens on (127.0.0.1 only).
    pub port: u16,
    /// The port it serves TLS on, when started with [`start_tls`](Self::start_tls).
    #[allow(dead_code)] // not every bench serves TLS
    pub tls_port: Option<u16>,
    child: Child,
    _dir: tempfile::TempDir,
}

/// The certificate, key and CA files of a server that serves TLS too.
#[allow(dead_code)] // not every bench serves TLS
pub struct ServerTls<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub ca: &'a Path,
}

impl PrivateRedis {
    /// Starts one and waits until it answers `PING`.
    #[allow(dead_code)] // not every bench starts one without a wrapper
    pub fn start() -> Result<PrivateRedis, String> {
        Self::start_inner(&[], Duration::from_secs(5), None)
    }

    /// Starts one that also serves TLS (clients unauthenticated) on
    /// [`tls_port`](Self::tls_port), and waits until it answers `PING` in plain text.
    #[allow(dead_code)] // not every bench serves TLS
    pub fn start_tls(tls: &ServerTls<'_>) -> Result<PrivateRedis, String> {
        Self::start_inner(&[], Duration::from_secs(5), Some(tls))
    }

    /// Starts one run by `wrapper` (a command and its arguments, e.g. `valgrind
    /// --tool=callgrind`; empty: none), in the server's temporary directory, and waits up to
    /// `ready_within` until it answers `PING`.
    #[allow(dead_code)] // not every bench wraps it
    pub fn start_under(wrapper: &[String], ready_within: Duration) -> Result<PrivateRedis, String> {
        Self::start_inner(wrapper, ready_within, None)
    }

    /// A port free a moment ago can be taken before `redis-server` binds it (by another
    /// process's server, or as the local port of any outgoing connection: it comes from the
    /// ephemeral range), so each attempt takes new ports, and an attempt counts only when the
    /// server that answers is this one.
    fn start_inner(
        wrapper: &[String],
        ready_within: Duration,
        tls: Option<&ServerTls<'_>>,
    ) -> Result<PrivateRedis, String> {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let ports = free_ports(if tls.is_some() { 2 } else { 1 })?;
            let (port, tls_port) = (ports[0], ports.get(1).copied());
            let mut command = match wrapper {
                [program, args @ ..] => {
                    let mut command = Command::new(program);
                    command.args(args).arg("redis-server");
                    command
                }
                [] => Command::new("redis-server"),
            };
            command
                .current_dir(dir.path())
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path());
            if let (Some(tls), Some(tls_port)) = (tls, tls_port) {
                command
                    .args(["--tls-port", &tls_port.to_string()])
                    .args(["--tls-auth-clients", "no"])
                    .arg("--tls-cert-file")
                    .arg(tls.cert)
                    .arg("--tls-key-file")
                    .arg(tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(tls.ca);
            }
            let child = command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run redis-server: {e}"))?;
            let mut server = PrivateRedis {
                port,
                tls_port,
                child,
                _dir: dir,
            };
            match server.wait_until_ready(ready_within) {
                Ok(()) => return Ok(server),
                // Dropping it kills it.
                Err(e) => failures.push(format!("port {port}: {e}")),
            }
        }
        Err(format!(
            "redis-server did not start in {START_ATTEMPTS} attempts ({})",
            failures.join("; ")
        ))
    }

    /// The process id of the server.
    #[allow(dead_code)] // not every bench reads it
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's temporary directory (its working directory).
    #[allow(dead_code)] // not every bench reads it
    pub fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// Waits until the server on `port` answers `PING` and is this child (`process_id` of
    /// `INFO server`: a wrapper such as valgrind runs the server in the child's process).
    fn wait_until_ready(&mut self, within: Duration) -> Result<(), String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("redis-server exited at start ({status})"));
            }
            let answer = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut c| {
                    c.set_read_timeout(Some(Duration::from_secs(1)))?;
                    redis::cmd("INFO").arg("server").query::<String>(&mut c)
                });
            match answer {
                Ok(info) => {
                    let pid = info
                        .lines()
                        .find_map(|line| line.strip_prefix("process_id:"))
                        .and_then(|pid| pid.trim().parse::<u32>().ok());
                    return match pid {
                        Some(pid) if pid == self.child.id() => Ok(()),
                        _ => Err(format!(
                            "the port is served by another process ({})",
                            pid.map_or("no process_id".to_owned(), |p| format!("pid {p}"))
                        )),
                    };
                }
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("redis-server did not answer PING: {e}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// `n` distinct loopback ports free at this moment (held together while they are picked, so
/// that none is picked twice).
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("no free loopback port: {e}"))?;
    listeners
        .iter()
        .map(|listener| listener.local_addr().map(|address| address.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("no free loopback port: {e}"))
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
