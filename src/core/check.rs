//! One check, from the request to its answer, by one path: what can be answered at once
//! ([`Limiter::answer_now`]: a quota the algorithm cannot serve, a lease that holds enough, the
//! deny cache, a store that decides in this process) is answered there, once; the rest
//! ([`Limiter::answer_later`]) waits for the store, or for a lease's renewal. Every check of
//! the crate goes through here, and hands back what it decided as a value ([`Answer`]).

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;

use super::stats::{PolicyLabel, StoreTimer};
use super::Limiter;
use crate::decision::{Decision, Verdict};
use crate::deny_cache::Started;
use crate::failure_policy::FailureContext;
use crate::quota::{Quota, QuotaError, Quotas};
use crate::store::ops::StoreExt;
use crate::store::{Block, CheckRequest, QueuedDecision, StoreError};

/// One check to run: which storage key, under which quotas, at what cost, and what its caller
/// needs beyond the verdict.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'a> {
    pub(crate) storage_key: &'a str,
    pub(crate) quotas: &'a Quotas,
    pub(crate) cost: u64,
    /// The layer's policy, in metrics.
    pub(crate) label: &'a PolicyLabel,
    /// Suspend the key's tenant on a denial, in the same store call (`block.rs`).
    pub(crate) block: Option<Block>,
    /// The caller will refund what it reserves: on the store's clock, the store is asked when
    /// it admits ([`Taken::Decided`]).
    pub(crate) reserving: bool,
}

impl<'a> Ask<'a> {
    /// A plain check: no block, no reservation.
    pub(crate) fn new(
        storage_key: &'a str,
        quotas: &'a Quotas,
        cost: u64,
        label: &'a PolicyLabel,
    ) -> Self {
        Ask {
            storage_key,
            quotas,
            cost,
            label,
            block: None,
            reserving: false,
        }
    }

    /// The same check, suspending the key's tenant for `block` on a denial.
    pub(crate) fn blocking(self, block: Option<Block>) -> Self {
        Ask { block, ..self }
    }

    /// The same check, whose caller refunds what it reserves when `reserving`.
    pub(crate) fn reserving(self, reserving: bool) -> Self {
        Ask { reserving, ..self }
    }
}

/// What a check decided, and how: who answered, and when its units were reserved.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer {
    pub(crate) verdict: Verdict,
    /// The store, or the failure policy (whose units no settlement gives back).
    pub(crate) origin: Origin,
    /// What a refund of the units needs to date them.
    pub(crate) taken: Taken,
}

impl Answer {
    /// The store's (or this process's own) answer.
    pub(crate) fn decided(decision: Decision) -> Self {
        Answer {
            verdict: Verdict::Decided(decision),
            origin: Origin::Store,
            taken: Taken::Marked,
        }
    }

    /// The same answer, its units reserved as `taken` says.
    pub(crate) fn taken(self, taken: Taken) -> Self {
        Answer { taken, ..self }
    }
}

/// What a check learns of when the units it reserved were reserved, handed back with its
/// verdict ([`Answer`](super::check::Answer)).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum Taken {
    /// Nothing more than the reservation's mark.
    #[default]
    Marked,
    /// The store's time of its admission.
    Decided(u64),
    /// A lease's renewal reserved them, earlier than the check (told only to a check that
    /// reserves).
    Renewal(Renewal),
}

/// The lease renewal that reserved the units a request spent (the oldest of them): a settlement
/// of that request is dated by it, as a give-back of the lease's units is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal {
    /// Taken before the renewal's store call was sent.
    pub(crate) sent: Instant,
    /// The client clock's time then, when the limiter has a client clock.
    pub(crate) client_micros: Option<u64>,
    /// The store's clock's µs at which it admitted the renewal, when it told.
    pub(crate) store_micros: Option<u64>,
}

/// Which store made a reservation: the limiter's own, or its failure policy's (a
/// [`LocalFallback`](crate::failure_policy::LocalFallback)'s memory). A settlement goes to the first,
/// or nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Store,
    Policy,
}

/// What the part of a check done at once leaves to [`Limiter::answer_later`]. Large when the
/// store queued the decision (its timer inside): moved, never boxed, since a box per request is
/// what queueing saves.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Later {
    /// Through the limiter's delegate (a lease that holds too little, or none yet).
    Delegate,
    /// One store call.
    Store(StoreCall),
}

/// What [`Limiter::ask_now`] found at once.
enum Asked {
    /// The deny cache's denial (counted as such).
    Cached(Decision),
    /// The store's decision or error, not counted yet.
    Stored(Result<Decision, StoreError>),
}

pin_project! {
    /// A store call still to make, or already queued: at the time read at once, with the deny
    /// cache's mark taken before it.
    #[derive(Debug)]
    pub(crate) struct StoreCall {
        now_micros: Option<u64>,
        started: Option<Started>,
        // The store's decision, started at once when the store queues it
        // ([`Store::queue`](crate::store::Store::queue)), its wait timed from then.
        #[pin]
        queued: Option<QueuedDecision>,
        timer: Option<StoreTimer>,
    }
}

impl StoreCall {
    /// Whether the store queued the decision: [`Limiter::poll_queued`] waits for it.
    pub(crate) fn is_queued(&self) -> bool {
        self.queued.is_some()
    }
}

impl Limiter {
    /// Whether the algorithm serves every quota; else the first it cannot.
    pub(crate) fn supports(
        &self,
        quotas: &Quotas,
    ) -> Result<(), (Quota, crate::quota::QuotaError)> {
        for quota in quotas {
            self.inner
                .algorithm
                .supports(quota)
                .map_err(|error| (*quota, error))?;
        }
        Ok(())
    }

    /// The store's request for a check of `cost` on `storage_key` under `quotas`, at the
    /// clock's time (`None`: the store's), read once per check.
    pub(crate) fn request<'a>(
        &self,
        storage_key: &'a str,
        quotas: &'a Quotas,
        cost: u64,
    ) -> CheckRequest<'a> {
        CheckRequest {
            key: storage_key,
            algorithm: self.inner.algorithm,
            quotas,
            cost,
            now_micros: self.inner.clock.now_micros(),
        }
    }

    /// Runs `ask` to its answer.
    pub(crate) async fn answer(&self, ask: Ask<'_>) -> Answer {
        match self.answer_now(ask) {
            Ok(answer) => answer,
            Err(later) => self.answer_later(ask, later).await,
        }
    }

    /// The answer to `ask` when it needs no waiting; else what is left to await.
    #[allow(clippy::result_large_err)] // see `Later`
    pub(crate) fn answer_now(&self, ask: Ask<'_>) -> Result<Answer, Later> {
        if let Err((quota, error)) = self.supports(ask.quotas) {
            return Ok(self.refused(quota, error, ask.label));
        }
        if let Some(delegate) = self.inner.delegate.as_deref() {
            if delegate.takes(&ask) {
                return delegate.answer_now(self, ask).ok_or(Later::Delegate);
            }
        }
        let request = self.request(ask.storage_key, ask.quotas, ask.cost);
        match self.ask_now(request, ask) {
            Ok(Asked::Cached(decision)) => Ok(Answer::decided(decision)),
            Ok(Asked::Stored(result)) => Ok(self.answered(result, request, ask.label)),
            Err(call) => Err(Later::Store(call)),
        }
    }

    /// The rest of a check that [`answer_now`](Self::answer_now) could not answer.
    pub(crate) async fn answer_later(&self, ask: Ask<'_>, later: Later) -> Answer {
        match (later, self.inner.delegate.as_deref()) {
            (Later::Store(call), _) => {
                let request = self.request_of(ask, &call);
                let (result, taken) = self.ask_later(request, ask, call).await;
                self.answered(result, request, ask.label).taken(taken)
            }
            (Later::Delegate, Some(delegate)) => delegate.answer_later(self, ask).await,
            (Later::Delegate, None) => self.answer_direct(ask).await,
        }
    }

    /// A check by one store call (no lease), its failure to the policy.
    pub(crate) async fn answer_direct(&self, ask: Ask<'_>) -> Answer {
        let request = self.request(ask.storage_key, ask.quotas, ask.cost);
        let (result, taken) = match self.ask_now(request, ask) {
            Ok(Asked::Cached(decision)) => return Answer::decided(decision),
            Ok(Asked::Stored(result)) => (result, Taken::Marked),
            Err(call) => self.ask_later(request, ask, call).await,
        };
        self.answered(result, request, ask.label).taken(taken)
    }

    /// The store's decision for `request` when it needs no waiting (the deny cache's, or a
    /// store's in this process: [`Store::decide_now`]); else the store call to await.
    ///
    /// [`Store::decide_now`]: crate::store::Store::decide_now
    #[allow(clippy::result_large_err)] // see `Later`
    fn ask_now(&self, request: CheckRequest<'_>, ask: Ask<'_>) -> Result<Asked, StoreCall> {
        let cache = self.inner.deny_cache.as_ref();
        let CheckRequest {
            key, quotas, cost, ..
        } = request;
        if let Some(cache) = cache {
            let now = cache.now(request.now_micros);
            if let Some(decision) = cache.lookup(key, quotas, cost, now) {
                self.inner.stats.count_cached_denial(ask.label);
                return Ok(Asked::Cached(decision));
            }
        }
        // Taken before the store call: a control that returns while it is in flight keeps its
        // denial out of the cache.
        let started = cache.map(|cache| cache.start(key, cache.now(request.now_micros)));
        // A blocking check always waits for the store; so does a reservation on the store's
        // clock, which asks the store when it admits.
        let timed = ask.reserving && request.now_micros.is_none();
        let mut queued = None;
        if ask.block.is_none() && !timed {
            // No latency recorded: a decision made in this process has no round trip to watch
            // (docs/using.md, the metrics' table).
            if let Some(result) = self.inner.store.decide_now(request) {
                return Ok(Asked::Stored(self.remembered(result, request, started)));
            }
            queued = self.inner.store.queue(request);
        }
        Err(StoreCall {
            now_micros: request.now_micros,
            started,
            timer: queued.as_ref().map(|_| StoreTimer::start()),
            queued,
        })
    }

    /// Polls a check whose store decision was queued ([`StoreCall::is_queued`]) to its answer:
    /// the layer's plain check waits so, with no future of its own to box.
    pub(crate) fn poll_queued(
        &self,
        cx: &mut Context<'_>,
        ask: Ask<'_>,
        call: Pin<&mut StoreCall>,
    ) -> Poll<Answer> {
        let request = self.request_of(ask, &call);
        let result = ready!(self.poll_queued_result(cx, request, ask.label, call));
        Poll::Ready(self.answered(result, request, ask.label))
    }

    /// The store's request for `ask` at the time read when the check began, which `call`
    /// keeps: the clock is read once per check.
    fn request_of<'a>(&self, ask: Ask<'a>, call: &StoreCall) -> CheckRequest<'a> {
        CheckRequest {
            key: ask.storage_key,
            algorithm: self.inner.algorithm,
            quotas: ask.quotas,
            cost: ask.cost,
            now_micros: call.now_micros,
        }
    }

    /// The store's result for a queued `call` of `request`, timed and remembered.
    fn poll_queued_result(
        &self,
        cx: &mut Context<'_>,
        request: CheckRequest<'_>,
        label: &PolicyLabel,
        call: Pin<&mut StoreCall>,
    ) -> Poll<Result<Decision, StoreError>> {
        let call = call.project();
        let queued = call.queued.as_pin_mut().expect("a queued store call");
        let (result, late) = ready!(queued.poll_decided(cx, request));
        let result = result.map(|(decision, _)| decision);
        if let Some(timer) = call.timer.take() {
            timer.stop(label);
        }
        Poll::Ready(self.remembered_late(result, request, *call.started, late))
    }

    /// The store call of a check, and what it told of its admission's time.
    async fn ask_later(
        &self,
        request: CheckRequest<'_>,
        ask: Ask<'_>,
        call: StoreCall,
    ) -> (Result<Decision, StoreError>, Taken) {
        if call.is_queued() {
            let mut call = std::pin::pin!(call);
            let result = std::future::poll_fn(|cx| {
                self.poll_queued_result(cx, request, ask.label, call.as_mut())
            });
            return (result.await, Taken::Marked);
        }
        let store = &self.inner.store;
        let timer = StoreTimer::start();
        let (result, taken) = if ask.reserving && request.now_micros.is_none() {
            match store.check_timed(request, ask.block).await {
                Ok((decision, at)) => (Ok(decision), at.map_or(Taken::Marked, Taken::Decided)),
                Err(error) => (Err(error), Taken::Marked),
            }
        } else {
            let result = match ask.block {
                Some(block) => store.check_blocking(request, block).await,
                None => store.check(request).await,
            };
            (result, Taken::Marked)
        };
        timer.stop(ask.label);
        (self.remembered(result, request, call.started), taken)
    }

    /// The store's `result` for `request`, as the deny cache learns it: a denial that will
    /// end is remembered, an admission that consumed drops a cached wait it made too short.
    fn remembered(
        &self,
        result: Result<Decision, StoreError>,
        request: CheckRequest<'_>,
        started: Option<Started>,
    ) -> Result<Decision, StoreError> {
        self.remembered_late(result, request, started, Duration::ZERO)
    }

    /// [`remembered`](Self::remembered), for a store's answer that came `late` before it was
    /// read (a queued decision polled after its answer came).
    fn remembered_late(
        &self,
        result: Result<Decision, StoreError>,
        request: CheckRequest<'_>,
        started: Option<Started>,
        late: Duration,
    ) -> Result<Decision, StoreError> {
        if let (Ok(decision), Some(cache), Some(started)) =
            (&result, &self.inner.deny_cache, started)
        {
            let CheckRequest {
                key, quotas, cost, ..
            } = request;
            if !decision.allowed {
                // The store decided at `now_micros` (client clock), or before its reply came
                // (its clock): not when it was read, which may be long after.
                let now = match request.now_micros {
                    Some(_) => cache.now(request.now_micros),
                    None => cache.now(None).saturating_sub(late.as_micros() as u64),
                };
                cache.remember(key, quotas, cost, decision, now, started);
            } else if cost > 0 {
                // An admission consumed: a cached wait for another cost may now be too short.
                cache.admitted(key, quotas, cost);
            }
        }
        result
    }

    /// The answer to a check whose decision (or error) is `result`: counted, an error to the
    /// failure policy.
    fn answered(
        &self,
        result: Result<Decision, StoreError>,
        request: CheckRequest<'_>,
        label: &PolicyLabel,
    ) -> Answer {
        match result {
            Ok(decision) => {
                self.inner.stats.count_decision(&decision, label);
                Answer::decided(decision)
            }
            Err(error) => {
                self.inner.stats.count_store_error();
                self.fail(error, request, label)
            }
        }
    }

    /// A quota the algorithm cannot serve: a programming error, logged, and the request denied
    /// as never allowed.
    fn refused(&self, quota: Quota, error: QuotaError, label: &PolicyLabel) -> Answer {
        tracing::error!(%error, algorithm = %self.inner.algorithm, "quota refused; request denied");
        let decision = Decision {
            allowed: false,
            limit: quota.limit(),
            remaining: 0,
            retry_after: Decision::NEVER,
            reset_after: Duration::ZERO,
            suspended: false,
            quota,
            overridden: false,
        };
        self.inner.stats.count_decision(&decision, label);
        Answer::decided(decision)
    }

    /// The failure policy's answer for `request`, whose store call failed with `error`
    /// (counted already), counted and logged.
    pub(crate) fn fail(
        &self,
        error: StoreError,
        request: CheckRequest<'_>,
        label: &PolicyLabel,
    ) -> Answer {
        let stats = &self.inner.stats;
        let verdict = self.inner.policy.on_store_error(&FailureContext {
            error: &error,
            request,
        });
        stats.count_failure(&verdict, label);
        // The key is never logged: it may be a secret. The store's description is (a
        // `RedisStore` shows its address, passwords hidden). One line at the first failure of
        // an episode, then one a minute while it lasts (`StoreFailureLog`): an outage or a
        // poisoned key hammered must not flood, and the circuit breaker logs its own changes.
        let logs = self.feature_state::<crate::store::StoreFailureLog>();
        let (description, log) = logs.of(&self.inner.store);
        match log.failed() {
            Some(line) => {
                let message = match line.first {
                    true => "rate limit store failed; the failure policy decides until it answers",
                    false => "rate limit store still failing; the failure policy decides until it answers",
                };
                tracing::warn!(
                    store = %description,
                    %error,
                    transport = error.is_transport(),
                    algorithm = %self.inner.algorithm,
                    policy = ?self.inner.policy,
                    allowed = verdict.is_allowed(),
                    left_out = line.left_out,
                    "{message}"
                )
            }
            None => tracing::debug!(
                %error,
                allowed = verdict.is_allowed(),
                "rate limit store failed; the failure policy decided"
            ),
        }
        Answer {
            verdict,
            origin: Origin::Policy,
            taken: Taken::Marked,
        }
    }

    /// [`check_quotas`](Self::check_quotas)'s decision without the failure policy: the store's
    /// (or the deny cache's), or the store's error.
    pub(crate) async fn decide_without_policy(
        &self,
        request: CheckRequest<'_>,
        label: &PolicyLabel,
    ) -> Result<Decision, StoreError> {
        let ask = Ask::new(request.key, request.quotas, request.cost, label);
        let result = match self.ask_now(request, ask) {
            Ok(Asked::Cached(decision)) => return Ok(decision),
            Ok(Asked::Stored(result)) => result,
            Err(call) => self.ask_later(request, ask, call).await.0,
        };
        if let Ok(decision) = &result {
            self.inner.stats.count_decision(decision, label);
        }
        result
    }
}
