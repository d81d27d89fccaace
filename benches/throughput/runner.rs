//! The runner: tasks in flight for a warm-up and a measured run.

use super::*;

/// One task's operation: what it does for its `n`-th call. `true` when it went as expected.
pub(crate) trait Op: Send + 'static {
    fn run(&mut self, n: u64) -> impl Future<Output = bool> + Send + '_;
}

/// What one measured run saw.
#[derive(Clone)]
pub(crate) struct Run {
    pub(crate) ops: u64,
    pub(crate) failures: u64,
    pub(crate) elapsed: Duration,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) allocations: u64,
    /// Calls of `EVALSHA` in Redis during the run, and their time.
    pub(crate) redis: Option<ScriptStat>,
    /// CPU time of Redis's main thread during the run, when it is this bench's own server.
    pub(crate) redis_cpu: Option<Duration>,
    /// CPU time of this process (all its threads) during the run.
    pub(crate) own_cpu: Option<Duration>,
}

impl Run {
    pub(crate) fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    pub(crate) fn allocations_per_op(&self) -> f64 {
        self.allocations as f64 / self.ops as f64
    }

    /// Redis CPU microseconds per operation (all of Redis's work: network, parsing, script).
    pub(crate) fn redis_cpu_us(&self) -> f64 {
        self.redis_cpu
            .map_or(f64::NAN, |cpu| cpu.as_secs_f64() * 1e6 / self.ops as f64)
    }

    /// This process's CPU microseconds per operation: the client side (and, for HTTP, the
    /// server and the load generator too).
    pub(crate) fn own_cpu_us(&self) -> f64 {
        self.own_cpu
            .map_or(f64::NAN, |cpu| cpu.as_secs_f64() * 1e6 / self.ops as f64)
    }

    /// Redis's `EVALSHA` microseconds per operation: the `usec` total of `INFO commandstats`
    /// over the decisions made. A store that batches carries many decisions in one call, so
    /// `usec_per_call` would be per call; for a call per decision the two are the same.
    pub(crate) fn usec_per_decision(&self) -> f64 {
        self.redis.map_or(f64::NAN, |s| s.usec / self.ops as f64)
    }
}

/// `EVALSHA` in `INFO commandstats` since the last `CONFIG RESETSTAT`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScriptStat {
    pub(crate) calls: u64,
    /// Microseconds Redis spent in them, in all.
    pub(crate) usec: f64,
}

impl ScriptStat {
    pub(crate) fn usec_per_call(&self) -> f64 {
        self.usec / self.calls as f64
    }
}

/// Runs `ops` (one task each) for a warm-up, then for a measured run, and gives the ops back.
pub(crate) async fn measure<O: Op>(
    settings: &Settings,
    redis: &Admin,
    ops: Vec<O>,
) -> Checked<(Run, Vec<O>)> {
    let (_, ops) = run_tasks(ops, settings.warm_up, settings.max_ops).await?;
    redis.reset_stats().await;
    let (cpu_before, own_before) = (redis.cpu(), own_cpu());
    let (mut run, ops) = run_tasks(ops, settings.run, settings.max_ops).await?;
    run.redis_cpu = redis
        .cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    run.own_cpu = own_cpu()
        .zip(own_before)
        .map(|(after, before)| after.saturating_sub(before));
    run.redis = redis.script_stat().await;
    Ok((run, ops))
}

/// CPU time of this process so far: the time on a CPU of each of its threads
/// (`/proc/self/task/*/schedstat`, in nanoseconds).
pub(crate) fn own_cpu() -> Option<Duration> {
    let mut nanos = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        if let Ok(schedstat) = std::fs::read_to_string(path) {
            nanos += schedstat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(Duration::from_nanos(nanos))
}

/// Runs `ops` (one task each) for `duration` (or `max_ops` in all). Each task makes at least one
/// operation, so that a run has a figure even when a busy machine left a task no time before
/// the end.
pub(crate) async fn run_tasks<O: Op>(
    ops: Vec<O>,
    duration: Duration,
    max_ops: u64,
) -> Checked<(Run, Vec<O>)> {
    let per_task = (max_ops / ops.len() as u64).max(1);
    let go = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(ops.len());
    for mut op in ops {
        let (go, stop) = (go.clone(), stop.clone());
        let mut histogram = Histogram::new();
        tasks.push(tokio::spawn(async move {
            while !go.load(Ordering::Acquire) {
                tokio::task::yield_now().await;
            }
            let (mut n, mut failures) = (0, 0);
            loop {
                let start = Instant::now();
                if !op.run(n).await {
                    failures += 1;
                }
                histogram.record(start.elapsed().as_nanos() as u64);
                n += 1;
                if n >= per_task || stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            (op, n, failures, histogram)
        }));
    }
    // Let every task reach its start line.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let allocations_before = allocations();
    let start = Instant::now();
    go.store(true, Ordering::Release);
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(
            task.await
                .map_err(|e| failure!("a bench task failed: {e}"))?,
        );
    }
    let elapsed = start.elapsed();
    let allocations = allocations() - allocations_before;

    let mut histogram = Histogram::new();
    let (mut ops, mut total, mut failures) = (Vec::new(), 0, 0);
    for (op, n, f, h) in results {
        ops.push(op);
        total += n;
        failures += f;
        histogram.merge(&h);
    }
    let run = Run {
        ops: total,
        failures,
        elapsed,
        p50_us: histogram.quantile_us(0.50),
        p99_us: histogram.quantile_us(0.99),
        allocations,
        redis: None,
        redis_cpu: None,
        own_cpu: None,
    };
    Ok((run, ops))
}
