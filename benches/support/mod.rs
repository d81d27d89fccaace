//! What the benches share: a private `redis-server` on a free port, and a quota that admits
//! everything.

use std::net::TcpListener;
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

/// A `redis-server` of a bench, on a free loopback port in a temporary directory, killed on drop.
pub struct PrivateRedis {
    /// The port it listens on (127.0.0.1 only).
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    /// Starts one and waits until it answers `PING`.
    #[allow(dead_code)] // not every bench starts one without a wrapper
    pub fn start() -> Result<PrivateRedis, String> {
        Self::start_under(&[], Duration::from_secs(5))
    }

    /// Starts one run by `wrapper` (a command and its arguments, e.g. `valgrind
    /// --tool=callgrind`; empty: none), in the server's temporary directory, and waits up to
    /// `ready_within` until it answers `PING`.
    pub fn start_under(wrapper: &[String], ready_within: Duration) -> Result<PrivateRedis, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let mut command = match wrapper {
            [program, args @ ..] => {
                let mut command = Command::new(program);
                command.args(args).arg("redis-server");
                command
            }
            [] => Command::new("redis-server"),
        };
        let child = command
            .current_dir(dir.path())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        let mut server = PrivateRedis {
            port,
            child,
            _dir: dir,
        };
        server.wait_until_ready(ready_within)?;
        Ok(server)
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

    fn wait_until_ready(&mut self, within: Duration) -> Result<(), String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("redis-server exited at start ({status})"));
            }
            let pong = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            match pong {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("redis-server did not answer PING: {e}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
