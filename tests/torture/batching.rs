//! The batching family's fleet: each instance's `RedisStore` (batching on, as by default) shared
//! by one limiter per algorithm, so that a batch mixes algorithms, and used the ways no caller
//! may be able to stall: from runtimes other than the one that built it (one that then goes
//! idle without being driven, one shut down), by tasks that work without yielding right after
//! their decision (the runtime's driver handed to its other worker meanwhile:
//! [`DriverHandoff`]), through futures polled once and parked or dropped at an await, with
//! `max_batch` at its largest allowed value, and while Redis is out of memory. Every decision is
//! recorded with its wall time ([`Timed`]) for the oracles, with what a health monitor saw of
//! Redis meanwhile ([`Monitor`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use redlimit::store::RedisStore;
use redlimit::{Algorithm, Limiter, Quota, Quotas};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout};

use crate::faults::{self, Fault};
use crate::fleet::{marked_why, with_policy, Fixture, Run, Timed, BOUND, STORE_TIMEOUT};
use crate::generator::{Op, Schedule};
use crate::health::Monitor;

/// The `max_batch` a full batch is tried at: this, or the largest value
/// `RedisStoreBuilder::build` accepts when the crate bounds `max_batch` below it (found by
/// bisection, so no constant of the crate's is named here). 9 000 tenant keys are more than a
/// batch script can unpack at once on Lua's stack (under 8 000).
pub const FULL_BATCH: usize = 9_000;

/// The timeout of the full batch's store: time for Redis to run a full batch (a few hundred ms
/// on a loaded machine), so that what its decisions meet is the batch's answer, not a timeout.
pub const FULL_TIMEOUT: Duration = Duration::from_secs(3);

/// How many decisions queue at once on the full batch's store of `max_batch`: what the first
/// calls may take (a call alone, then a quarter of `max_batch` behind it) and a full
/// `max_batch` more (11 251 at 9 000).
pub fn full_queue(max_batch: usize) -> usize {
    1 + max_batch.div_ceil(4) + max_batch
}

/// How long Redis pauses (`DEBUG SLEEP`) while a full batch's decisions queue.
const FULL_PAUSE: Duration = Duration::from_millis(500);

/// Polls each of `checks` once, in one go, and returns those still pending.
async fn queue_all<F: Future<Output = ()> + Unpin>(checks: Vec<F>) -> Vec<F> {
    let mut checks = checks;
    let mut pending = Vec::with_capacity(checks.len());
    std::future::poll_fn(|cx| {
        for mut check in checks.drain(..) {
            if std::pin::Pin::new(&mut check).poll(cx).is_pending() {
                pending.push(check);
            }
        }
        Poll::Ready(())
    })
    .await;
    pending
}

/// How often [`DriverHandoff`] wakes the fleet's runtime.
const HANDOFF_EVERY: Duration = Duration::from_millis(5);

/// A thread that wakes the current runtime (the fleet's) every [`HANDOFF_EVERY`] until
/// stopped, so that a worker parked without the I/O and time driver takes it up.
///
/// A multi-thread runtime's I/O and time driver is polled by a worker about to park; the other
/// parked workers wait on a condition variable. A worker woken by the driver (a reply, a timer)
/// leaves it to run the task woken, and no other worker is told to take it up (tokio does so
/// only with its unstable `Builder::enable_eager_driver_handoff`). When that task then works
/// without yielding, no reply is read and no timer fires anywhere on the runtime until the work
/// ends, unless a wake from outside rouses another worker: every decision of the runtime's tasks
/// waits for the work, with batching or without (`max_batch(1)`), and so does a plain
/// `tokio::time::sleep`. That stall is the runtime's, not the store's (whose connection, as any
/// redis-rs connection, is read on the runtime it was built on). Woken from outside, an idle
/// worker runs the empty task, parks again holding the driver, and reads the replies; what the
/// busy task still holds up is then only what it holds itself (the task in its worker's LIFO
/// slot, its own poll), which is the store's to avoid.
struct DriverHandoff {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl DriverHandoff {
    fn start() -> DriverHandoff {
        let runtime = tokio::runtime::Handle::current();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                drop(runtime.spawn(async {}));
                std::thread::sleep(HANDOFF_EVERY);
            }
        });
        DriverHandoff { stop, thread }
    }

    /// Stops the thread (it ends within [`HANDOFF_EVERY`]).
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the driver hand-off thread");
    }
}

/// The largest `max_batch` at most [`FULL_BATCH`] that a store builder accepts.
fn largest_max_batch(url: &str) -> usize {
    let accepts = |n: usize| RedisStore::builder(url).max_batch(n).build().is_ok();
    if accepts(FULL_BATCH) {
        return FULL_BATCH;
    }
    let (mut lo, mut hi) = (1, FULL_BATCH);
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if accepts(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The schedule's instances and what they recorded; shared by the tasks and threads that
/// decide.
struct Fleet {
    seed: u64,
    keys: usize,
    quotas: Quotas,
    /// Per instance, one limiter per algorithm of [`Algorithm::ALL`], all on the instance's
    /// store.
    limiters: Vec<Vec<Limiter>>,
    /// The instances' stores.
    stores: Vec<RedisStore>,
    /// The full batch's limiters, one per algorithm on one store, and its `max_batch`.
    full: Mutex<Option<(Vec<Limiter>, usize)>>,
    url: String,
    policy: crate::generator::Policy,
    timed: Mutex<Vec<Timed>>,
    hangs: Mutex<Vec<(usize, String)>>,
    /// When a task of the fleet's runtime worked without yielding.
    busy: Mutex<Vec<(Instant, Instant)>>,
}

/// One limiter per algorithm on `store`.
fn limiters_on(store: &RedisStore, seed: u64, policy: crate::generator::Policy) -> Vec<Limiter> {
    Algorithm::ALL
        .iter()
        .map(|algorithm| {
            let builder = Limiter::builder(store.clone())
                .algorithm(*algorithm)
                .prefix(format!("t{seed}"));
            with_policy(builder, policy).build().expect("valid limiter")
        })
        .collect()
}

impl Fleet {
    /// The schedule's stores are built here, on the fleet's runtime.
    fn new(schedule: &Schedule, fixture: &Fixture) -> Arc<Fleet> {
        let config = &schedule.config;
        let quota =
            Quota::new(config.limit, Duration::from_millis(config.period_ms)).expect("quota");
        let mut stores = Vec::new();
        let limiters = (0..config.instances)
            .map(|_| {
                let store = fixture.store(config.backend);
                stores.push(store.clone());
                limiters_on(&store, schedule.seed, config.policy)
            })
            .collect();
        Arc::new(Fleet {
            seed: schedule.seed,
            keys: config.keys,
            quotas: Quotas::from(quota),
            limiters,
            stores,
            full: Mutex::default(),
            url: fixture.redis.lock().unwrap().url(),
            policy: config.policy,
            timed: Mutex::default(),
            hangs: Mutex::default(),
            busy: Mutex::default(),
        })
    }

    /// `n` (algorithm, key) pairs drawn from `seed`.
    fn draw(&self, seed: u64, n: usize) -> Vec<(usize, usize)> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..n)
            .map(|_| (rng.usize(0..Algorithm::ALL.len()), rng.usize(0..self.keys)))
            .collect()
    }

    fn name(&self, algorithm: usize, key: usize) -> String {
        format!("k{key}-a{algorithm}-{}", self.seed)
    }

    /// The full batch's limiters (built the first time, on the fleet's runtime), and its
    /// `max_batch`.
    fn full(&self) -> (Vec<Limiter>, usize) {
        let mut full = self.full.lock().unwrap();
        full.get_or_insert_with(|| {
            let max_batch = largest_max_batch(&self.url);
            let store = RedisStore::builder(&self.url)
                .max_batch(max_batch)
                .timeout(FULL_TIMEOUT)
                .build()
                .expect("valid store");
            (limiters_on(&store, self.seed, self.policy), max_batch)
        })
        .clone()
    }

    fn record(&self, timed: Timed) {
        self.timed.lock().unwrap().push(timed);
    }

    fn hang(&self, op: usize, what: String) {
        self.hangs.lock().unwrap().push((op, what));
    }

    /// A check of 1 by `limiter` (algorithm `alg`, on a store of `timeout`) on key `key`,
    /// polled to its end and recorded as `caller`'s; a hang past [`BOUND`].
    fn decide(
        self: &Arc<Self>,
        limiter: Limiter,
        store_timeout: Duration,
        (op, inst, alg, key): (usize, usize, usize, usize),
        caller: &'static str,
    ) -> impl Future<Output = ()> + Send + 'static {
        let fleet = self.clone();
        async move {
            let name = fleet.name(alg, key);
            let started = Instant::now();
            let check = marked_why(limiter.check_quotas(name.as_str(), &fleet.quotas, 1));
            match timeout(BOUND, check).await {
                Ok(checked) => {
                    let what = (op, inst, Algorithm::ALL[alg], caller);
                    fleet.record(Timed::new(what, started, &checked, Some(store_timeout)));
                }
                Err(_) => fleet.hang(op, format!("{caller} check still pending after {BOUND:?}")),
            }
        }
    }

    /// [`decide`](Self::decide) on instance `inst`'s store.
    fn decide_on(
        self: &Arc<Self>,
        (op, inst, alg, key): (usize, usize, usize, usize),
        caller: &'static str,
    ) -> impl Future<Output = ()> + Send + 'static {
        let limiter = self.limiters[inst][alg].clone();
        self.decide(limiter, STORE_TIMEOUT, (op, inst, alg, key), caller)
    }

    /// Once a first check's first poll is over (`first`), decisions on instance `inst` for the
    /// op `op`: `queued` ones (`(alg, key)`) at once, behind that check, then `lone` ones a
    /// quarter of `gap` apart, each recorded as its caller's (`callers`: the queued ones', the
    /// lone ones'). Returns once all are done.
    async fn behind_a_first_check(
        self: &Arc<Self>,
        (op, inst): (usize, usize),
        first: oneshot::Receiver<()>,
        (queued, lone): (&[Draw], &[Draw]),
        gap: Duration,
        callers: (&'static str, &'static str),
    ) {
        first_poll(first).await;
        let mut decisions = JoinSet::new();
        for &(alg, key) in queued {
            decisions.spawn(self.decide_on((op, inst, alg, key), callers.0));
        }
        for &(alg, key) in lone {
            sleep(gap / 4).await;
            decisions.spawn(self.decide_on((op, inst, alg, key), callers.1));
        }
        while decisions.join_next().await.is_some() {}
    }

    /// A check on instance `inst`'s store polled once, `polled` told (its call is then in
    /// flight, unless it returned at once); then, if `parked` gives a time, kept that long
    /// neither polled nor dropped, then dropped (`then_drop`) or polled on. Polled to its end,
    /// it is recorded as `caller`'s, its wait judged unless it was parked.
    async fn polled_once(
        self: Arc<Self>,
        (op, inst, alg, key): (usize, usize, usize, usize),
        caller: &'static str,
        polled: oneshot::Sender<()>,
        parked: Option<(Duration, bool)>,
    ) {
        let limiter = self.limiters[inst][alg].clone();
        let name = self.name(alg, key);
        let started = Instant::now();
        let mut check = Box::pin(marked_why(limiter.check_quotas(
            name.as_str(),
            &self.quotas,
            1,
        )));
        let first = poll_once(&mut check).await;
        let _ = polled.send(());
        let what = (op, inst, Algorithm::ALL[alg], caller);
        if let Poll::Ready(checked) = first {
            return self.record(Timed::new(what, started, &checked, Some(STORE_TIMEOUT)));
        }
        let mut judged = Some(STORE_TIMEOUT);
        if let Some((park, then_drop)) = parked {
            sleep(park).await;
            if then_drop {
                drop(check);
                return;
            }
            judged = None;
        }
        match timeout(BOUND, check).await {
            Ok(checked) => self.record(Timed::new(what, started, &checked, judged)),
            Err(_) => self.hang(op, format!("{caller} check still pending after {BOUND:?}")),
        }
    }
}

/// A draw of [`Fleet::draw`]: an algorithm's index and a key's.
type Draw = (usize, usize);

/// Polls `future` once, with this task's waker.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx))).await
}

/// Waits (at most [`BOUND`]) until a check's first poll is over.
async fn first_poll(polled: oneshot::Receiver<()>) {
    let _ = timeout(BOUND, polled).await;
}

/// Runs `ops` of a batching `schedule`.
pub async fn run<'a>(
    schedule: &Schedule,
    ops: impl Iterator<Item = &'a Op>,
    fixture: &Fixture,
) -> Run {
    let fleet = Fleet::new(schedule, fixture);
    if schedule.config.warm {
        // As a service's startup check would: each store connects from the fleet's runtime.
        for store in &fleet.stores {
            let _ = timeout(BOUND, store.verify()).await;
        }
    }
    let monitor = Monitor::start(fleet.url.clone());
    let mut run = Run::default();
    // Threads with a runtime of their own, going idle or shut down while the schedule goes on.
    let mut runtimes: Vec<std::thread::JoinHandle<()>> = Vec::new();
    // Parked check futures.
    let mut parked = JoinSet::new();
    // The lifting thread of the out-of-memory in force, and since when it is.
    let mut out_of_memory: Option<Lifting> = None;
    for (i, op) in ops.enumerate() {
        run.operations += 1;
        match *op {
            Op::Mixed {
                inst,
                n,
                seed,
                cancel_us,
            } => {
                let checks = fleet.draw(seed, n).into_iter().map(|(alg, key)| {
                    let check = fleet.decide_on((i, inst, alg, key), "burst");
                    async move {
                        match cancel_us {
                            // Dropped at whatever await it reached.
                            Some(us) => timeout(Duration::from_micros(us), check).await.is_err(),
                            None => {
                                check.await;
                                false
                            }
                        }
                    }
                });
                let cancelled = futures::future::join_all(checks).await;
                run.cancellations += cancelled.iter().filter(|c| **c).count() as u64;
            }
            Op::Runtime {
                inst,
                n,
                seed,
                idle_ms,
                shutdown,
                multi,
            } => {
                let draws = fleet.draw(seed, n + 2);
                let (polled, first) = oneshot::channel();
                let own = fleet.clone();
                let (alg, key) = draws[0];
                runtimes.push(std::thread::spawn(move || {
                    let runtime = if multi {
                        tokio::runtime::Builder::new_multi_thread()
                            .worker_threads(1)
                            .enable_all()
                            .build()
                    } else {
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                    }
                    .expect("runtime");
                    let caller = "other runtime's own";
                    let check = own.polled_once((i, inst, alg, key), caller, polled, None);
                    runtime.block_on(check);
                    if shutdown {
                        drop(runtime);
                        return;
                    }
                    // Idle: nothing drives the runtime (a current-thread one runs its tasks
                    // only inside `block_on`).
                    std::thread::sleep(Duration::from_millis(idle_ms));
                    runtime.block_on(async { sleep(Duration::from_millis(20)).await });
                }));
                first_poll(first).await;
                let mut queued = JoinSet::new();
                for &(alg, key) in &draws[1..=n] {
                    queued.spawn(
                        fleet.decide_on((i, inst, alg, key), "queued behind another runtime's"),
                    );
                }
                while queued.join_next().await.is_some() {}
                // A lone decision after them, with the other runtime idle or gone.
                sleep(Duration::from_millis(50)).await;
                let (alg, key) = draws[n + 1];
                fleet
                    .decide_on((i, inst, alg, key), "lone after another runtime's")
                    .await;
            }
            Op::Busy {
                inst,
                n,
                seed,
                work_ms,
                cpu,
            } => {
                let draws = fleet.draw(seed, n + 4);
                let (polled, first) = oneshot::channel();
                let work = Duration::from_millis(work_ms);
                // The other worker takes the I/O and time driver while the busy one works, as
                // with tokio's eager driver hand-off ([`DriverHandoff`]).
                let handoff = DriverHandoff::start();
                let busy = tokio::spawn(fleet.clone().busy((i, inst), draws[0], work, cpu, polled));
                let draws = (&draws[1..=n], &draws[n + 1..]);
                let callers = (
                    "queued behind a busy task's",
                    "lone during a busy task's work",
                );
                fleet
                    .behind_a_first_check((i, inst), first, draws, work, callers)
                    .await;
                busy.await.expect("the busy task");
                handoff.stop();
            }
            Op::Park {
                inst,
                n,
                seed,
                park_ms,
                then_drop,
            } => {
                let draws = fleet.draw(seed, n + 4);
                let (polled, first) = oneshot::channel();
                let park = Duration::from_millis(park_ms);
                run.cancellations += u64::from(then_drop);
                let (alg, key) = draws[0];
                let what = (i, inst, alg, key);
                let parking = Some((park, then_drop));
                parked.spawn(fleet.clone().polled_once(what, "parked", polled, parking));
                let draws = (&draws[1..=n], &draws[n + 1..]);
                let callers = ("queued behind a parked one", "lone beside a parked one");
                fleet
                    .behind_a_first_check((i, inst), first, draws, park, callers)
                    .await;
            }
            Op::Full { seed } => {
                let (limiters, max_batch) = fleet.full();
                let draws = fleet.draw(seed, full_queue(max_batch));
                let checks: Vec<_> = draws
                    .into_iter()
                    .map(|(alg, key)| {
                        let limiter = limiters[alg].clone();
                        // Its instance number is one past the fleet's.
                        let inst = fleet.limiters.len();
                        Box::pin(fleet.decide(
                            limiter,
                            FULL_TIMEOUT,
                            (i, inst, alg, key),
                            "full batch",
                        ))
                    })
                    .collect();
                // Redis pauses while every decision is queued (each polled once, in one go):
                // the calls that carry them are all sent before the first answer comes back,
                // so one carries a full `max_batch`.
                let pause = fixture.redis.lock().unwrap().debug_sleep(FULL_PAUSE);
                sleep(Duration::from_millis(20)).await;
                let pending = queue_all(checks).await;
                futures::future::join_all(pending).await;
                tokio::task::spawn_blocking(move || pause.join())
                    .await
                    .expect("joined")
                    .expect("the pause");
            }
            Op::Sleep { ms } => sleep(Duration::from_millis(ms)).await,
            Op::Fault(fault @ Fault::OutOfMemory { ms, over }) => {
                // One at a time: the one in force is lifted first.
                if let Some(lifting) = out_of_memory.take() {
                    run.out_of_memory.push(lifted(lifting).await);
                }
                let began = Instant::now();
                let (since, lift) = faults::out_of_memory(fixture, ms, over).await;
                run.faults.push((since, fault));
                run.fault_starts.push(began);
                out_of_memory = Some((began, since, lift));
            }
            _ => {}
        }
    }
    if let Some(lifting) = out_of_memory.take() {
        run.out_of_memory.push(lifted(lifting).await);
    }
    while parked.join_next().await.is_some() {}
    let joined = tokio::task::spawn_blocking(move || {
        for thread in runtimes {
            thread.join().expect("a runtime's thread");
        }
        monitor.stop()
    });
    run.health = joined.await.expect("joined");
    run.timed = std::mem::take(&mut *fleet.timed.lock().unwrap());
    run.hangs = std::mem::take(&mut *fleet.hangs.lock().unwrap());
    run.busy = std::mem::take(&mut *fleet.busy.lock().unwrap());
    run
}

/// An out-of-memory in force: when it began, since when Redis is out of memory, and the thread
/// that lifts it.
type Lifting = (Instant, Instant, std::thread::JoinHandle<Instant>);

/// The window of an out-of-memory once its lift began: (began, since, lifted).
async fn lifted((began, since, lift): Lifting) -> (Instant, Instant, Instant) {
    let lifted = tokio::task::spawn_blocking(move || lift.join().expect("the lift"));
    (began, since, lifted.await.expect("joined"))
}

impl Fleet {
    /// A check polled once (`polled` told), whose task, once it returned, works `work` without
    /// yielding: spinning on the CPU when `cpu`, else in `std::thread::sleep`.
    async fn busy(
        self: Arc<Self>,
        (op, inst): (usize, usize),
        (alg, key): (usize, usize),
        work: Duration,
        cpu: bool,
        polled: oneshot::Sender<()>,
    ) {
        self.clone()
            .polled_once((op, inst, alg, key), "busy task's own", polled, None)
            .await;
        let began = Instant::now();
        if cpu {
            let until = Instant::now() + work;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(work);
        }
        self.busy.lock().unwrap().push((began, Instant::now()));
    }
}
