//! The parent's side of the workers: starting them, hearing what they learn, waiting for them.

use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::Child;
use tokio::time::Instant;

use crate::upstream::Tally;
use crate::WORKER_MODE;

/// What a worker learned, and how many responses the upstream had sent when the parent heard.
#[derive(Debug, Clone, Copy)]
pub struct Learned {
    pub limit: u64,
    pub period: Duration,
    pub after: u64,
}

/// Reads a worker's stdout: its line `learned LIMIT PERIOD_US` (see `worker`) is recorded with
/// the upstream's count of responses at that moment, the first one only.
pub fn watch_learning(
    child: &mut tokio::process::Child,
    tally: &Arc<Mutex<Tally>>,
    learned: &Arc<Mutex<Option<Learned>>>,
) {
    let Some(stdout) = child.stdout.take() else {
        return;
    };
    let (tally, learned) = (tally.clone(), learned.clone());
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut words = line.split(' ');
            let (Some("learned"), Some(limit), Some(period)) =
                (words.next(), words.next(), words.next())
            else {
                continue;
            };
            let (Ok(limit), Ok(period)) = (limit.parse(), period.parse()) else {
                continue;
            };
            let after = tally.lock().expect("the tally lock").total;
            learned
                .lock()
                .expect("the learned lock")
                .get_or_insert(Learned {
                    limit,
                    period: Duration::from_micros(period),
                    after,
                });
        }
    });
}

/// Starts `workers` worker processes (this program again, in [`WORKER_MODE`]) with `args` after
/// their ids, and watches what they learn; on failure, what to exit with.
pub fn spawn_workers(
    workers: u64,
    args: &[String],
    tally: &Arc<Mutex<Tally>>,
    learned: &Arc<Mutex<Option<Learned>>>,
) -> Result<Vec<(u64, Child)>, ExitCode> {
    let exe = std::env::current_exe().map_err(|error| {
        eprintln!("error: cannot find this program to start the workers: {error}");
        ExitCode::FAILURE
    })?;
    let mut children = Vec::new();
    for id in 1..=workers {
        let spawned = spawn_worker(&exe, id, args);
        match spawned {
            Ok(mut child) => {
                watch_learning(&mut child, tally, learned);
                children.push((id, child))
            }
            Err(error) => {
                eprintln!("error: cannot start worker {id}: {error}");
                return Err(ExitCode::FAILURE);
            }
        }
    }
    Ok(children)
}

fn spawn_worker(exe: &Path, id: u64, args: &[String]) -> std::io::Result<Child> {
    tokio::process::Command::new(exe)
        .arg(WORKER_MODE)
        .arg(id.to_string())
        .args(args)
        .stdin(Stdio::null())
        // A worker that learns a quota says so on its stdout (see `watch_learning`).
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
}

/// Waits for every worker until `give_up`, then kills the rest; how many failed.
pub async fn wait_all(children: Vec<(u64, Child)>, give_up: Instant) -> u64 {
    let mut failed = 0;
    for (id, mut child) in children {
        match tokio::time::timeout_at(give_up, child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => {
                eprintln!("error: worker {id} exited with {status}");
                failed += 1;
            }
            Ok(Err(error)) => {
                eprintln!("error: cannot wait for worker {id}: {error}");
                failed += 1;
            }
            Err(_) => {
                eprintln!("error: worker {id} did not finish in time; killed");
                let _ = child.kill().await;
                failed += 1;
            }
        }
    }
    failed
}
