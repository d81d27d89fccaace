//! [`ResponseFuture`]: waits for the limiter, then calls the inner service or answers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use super::config::Config;
use super::headers::HeaderStyle;
use super::response::{self, Wire};
use super::settle::Settlement;
use super::shadow::{self, ShadowLimited};
use crate::block::BlockFor;
use crate::core::{Ask, Later, Origin, StorageKey, StoreCall};
use crate::decision::Decision;
use crate::decision::Verdict;

pin_project! {
    /// The response future of [`RateLimit`](crate::layer::RateLimit): it waits for the limiter's
    /// verdict, then calls the inner service or answers by itself.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response, StatusCode};
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota};
    /// use redlimit::{layer::ResponseFuture, RateLimitLayer};
    /// use tower::{Service, ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut svc = ServiceBuilder::new()
    ///     .layer(RateLimitLayer::new(
    ///         Limiter::new(MemoryStore::new()),
    ///         Quota::per_second(10)?,
    ///         GlobalKey::new("all"),
    ///     ))
    ///     .service_fn(|_: Request<String>| async {
    ///         Ok::<_, Infallible>(Response::new(String::new()))
    ///     });
    ///
    /// let future: ResponseFuture<_, String, GlobalKey> =
    ///     svc.ready().await?.call(Request::new(String::new()));
    /// assert_eq!(future.await?.status(), StatusCode::OK);
    /// # Ok(())
    /// # }
    /// ```
    pub struct ResponseFuture<S, ReqBody, K>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, K>,
        // How the request speaks (HTTP, gRPC, gRPC-Web): read from its headers only when the
        // layer answers it itself (most requests are admitted and never need it).
        wire: Wire,
    }
}

/// The limiter's verdict, with what the response headers need.
pub(crate) type Check<K> = BoxFuture<'static, Checked<K>>;

/// What a check hands back.
pub(crate) struct Checked<K> {
    pub verdict: Verdict,
    pub headers: Headers<K>,
    /// The shadow tiers' denial, if they would have denied (`shadow.rs`).
    pub shadow: Option<Decision>,
    /// The settlement due after the response (`settle.rs`); boxed, as the future is moved
    /// whole on every request and only the settling layers have one.
    pub settlement: Option<Box<Settlement>>,
}

/// Asks the limiter about the request stored under `storage_key`, against the quotas of
/// `style` (a resolver's choice) or else the layer's own, and hands back the verdict with what
/// the response headers need. Boxed as a [`Check`]: the store's future borrows the key and the
/// quotas, so it is only ever built inside the future that owns them. `later`: what the layer's
/// call left of the check after answering what it could at once (the layer's own quotas, no
/// mode on), so that nothing runs twice.
pub(crate) async fn check<K>(
    config: Arc<Config<K>>,
    storage_key: &str,
    style: Option<Arc<HeaderStyle>>,
    cost: u64,
    later: Option<Later>,
) -> Checked<K> {
    let quotas = style.as_deref().map_or(&config.quotas, HeaderStyle::quotas);
    let modes = &config.modes;
    let limiter = &config.limiter;
    let settles = modes.settle.is_some();
    let label = &config.metrics_label;
    // A shadow layer has no effects: its would-be denials block nobody.
    let block = modes.block.as_ref().filter(|_| !modes.shadow);
    let ask = Ask::new(storage_key, quotas, cost, label)
        .blocking(block.map(BlockFor::store_block))
        .reserving(settles);
    // When and where the units are reserved: a settlement gives them back there, or nowhere.
    let reserved = settles.then(|| limiter.mark_reservation());
    let answer = match later {
        Some(later) => limiter.answer_later(ask, later).await,
        None => limiter.answer(ask).await,
    };
    let (verdict, origin) = (answer.verdict, answer.origin);
    let admitted = matches!(verdict, Verdict::Decided(decision) if decision.allowed);
    let (mut shadow, mut shadow_admitted) = (None, None);
    if let (true, Some(tiers)) = (admitted, &modes.shadow_tiers) {
        let key = [storage_key, shadow::SHADOW_SCOPE_SUFFIX].concat();
        let label = config.shadow_label();
        let shadow_reserved = settles.then(|| limiter.mark_reservation());
        let shadow_answer = limiter
            .answer(Ask::new(&key, tiers, cost, &label).reserving(settles))
            .await;
        if let Verdict::Decided(decision) = shadow_answer.verdict {
            if decision.allowed {
                // Settled like the enforced tiers, when the layer settles (if the store, not
                // the failure policy, reserved the units).
                shadow_admitted = shadow_reserved
                    .filter(|_| shadow_answer.origin == Origin::Store)
                    .map(|reserved| (key, *tiers, reserved.taking(shadow_answer.taken)));
            } else {
                shadow = Some(decision);
            }
        }
    }
    // A request the failure policy admitted is settled nowhere: the store never reserved it.
    let settlement = match (&modes.settle, reserved) {
        (Some(settle), Some(reserved)) if admitted && origin == Origin::Store => {
            Some(Box::new(Settlement {
                limiter: config.limiter.clone(),
                storage_key: storage_key.to_owned(),
                quotas: *quotas,
                reserved: cost,
                reserved_at: reserved.taking(answer.taken),
                settle: Arc::clone(settle),
                label: config.metrics_label.clone(),
                shadow: shadow_admitted,
            }))
        }
        _ => None,
    };
    Checked {
        verdict,
        headers: Headers { config, style },
        shadow,
        settlement,
    }
}

/// How to write the headers of one request's response: the layer's own style, or the one of
/// the quotas a resolver chose.
pub(crate) struct Headers<K> {
    pub config: Arc<Config<K>>,
    pub style: Option<Arc<HeaderStyle>>,
}

impl<K> Headers<K> {
    fn style(&self) -> &HeaderStyle {
        self.style.as_deref().unwrap_or(&self.config.headers)
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, K>
    where
        S: Service<Request<ReqBody>>,
    {
        // A plain check waiting for its store decision, queued when the layer was called: no
        // future of its own, so nothing boxed.
        Queued {
            #[pin]
            call: StoreCall,
            storage_key: StorageKey,
            cost: u64,
            config: Option<Arc<Config<K>>>,
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
        // Waiting for the limiter; holds the request and the ready inner service.
        Checking {
            check: Check<K>,
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
        // The inner service is answering; its response gets the headers for `decision`.
        Calling {
            #[pin]
            future: S::Future,
            headers: Option<(Decision, Headers<K>)>,
            settlement: Option<Box<Settlement>>,
        },
        // Answering without the inner service.
        Rejecting { rejection: Option<Rejection<K>> },
    }
}

/// Why the layer answers itself.
enum Rejection<K> {
    TooManyRequests(Decision, Headers<K>),
    Unavailable(Duration),
    MissingKey(StatusCode),
}

impl<S, ReqBody, K> ResponseFuture<S, ReqBody, K>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn checking(check: Check<K>, request: Request<ReqBody>, inner: S) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                request: Some(request),
                inner: Some(inner),
            },
            wire: Wire::Http,
        }
    }

    /// A plain request whose store decision was queued at once (see [`StoreCall::is_queued`]).
    pub(crate) fn queued(
        call: StoreCall,
        storage_key: StorageKey,
        cost: u64,
        config: Arc<Config<K>>,
        request: Request<ReqBody>,
        inner: S,
    ) -> Self {
        ResponseFuture {
            state: State::Queued {
                call,
                storage_key,
                cost,
                config: Some(config),
                request: Some(request),
                inner: Some(inner),
            },
            wire: Wire::Http,
        }
    }

    /// A request whose verdict came at once (from a lease, or from a store that decides in this
    /// process): the next state as after a check, without a future to box.
    pub(crate) fn decided(
        verdict: Verdict,
        headers: Headers<K>,
        request: Request<ReqBody>,
        inner: S,
    ) -> Self {
        let checked = Checked {
            verdict,
            headers,
            shadow: None,
            settlement: None,
        };
        let mut wire = Wire::Http;
        let state = after_check(checked, request, inner, &mut wire);
        ResponseFuture { state, wire }
    }

    pub(crate) fn pass_through(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                headers: None,
                settlement: None,
            },
            wire: Wire::Http,
        }
    }

    pub(crate) fn missing_key(status: StatusCode, wire: Wire) -> Self {
        ResponseFuture {
            state: State::Rejecting {
                rejection: Some(Rejection::MissingKey(status)),
            },
            wire,
        }
    }
}

impl<S, ReqBody, ResBody, K> Future for ResponseFuture<S, ReqBody, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Queued {
                    call,
                    storage_key,
                    cost,
                    config,
                    request,
                    inner,
                } => {
                    let layer = config
                        .as_deref()
                        .expect("ResponseFuture polled after completion");
                    let ask = Ask::new(
                        storage_key.as_str(),
                        &layer.quotas,
                        *cost,
                        &layer.metrics_label,
                    );
                    let answer = ready!(layer.limiter.poll_queued(cx, ask, call));
                    let (request, inner, config) =
                        match (request.take(), inner.take(), config.take()) {
                            (Some(request), Some(inner), Some(config)) => (request, inner, config),
                            _ => panic!("ResponseFuture polled after completion"),
                        };
                    let checked = Checked {
                        verdict: answer.verdict,
                        headers: Headers {
                            config,
                            style: None,
                        },
                        shadow: None,
                        settlement: None,
                    };
                    after_check(checked, request, inner, this.wire)
                }
                StateProj::Checking {
                    check,
                    request,
                    inner,
                } => {
                    let checked = ready!(check.as_mut().poll(cx));
                    let (request, inner) = match (request.take(), inner.take()) {
                        (Some(request), Some(inner)) => (request, inner),
                        _ => panic!("ResponseFuture polled after completion"),
                    };
                    after_check(checked, request, inner, this.wire)
                }
                StateProj::Calling {
                    future,
                    headers,
                    settlement,
                } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(settlement) = settlement.take() {
                        response = settlement.settle(response);
                    }
                    let mut response = response.map(ResponseBody::inner);
                    if let Some((decision, headers)) = headers.take() {
                        headers.style().apply(response.headers_mut(), &decision);
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Rejecting { rejection } => {
                    let rejection = rejection
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(self::reject(rejection, *this.wire)));
                }
            };
            this.state.set(next);
        }
    }
}

/// The state after the limiter's verdict: the inner service called (with the headers to write
/// on its response), or the layer answering; `wire` is read for the answer.
fn after_check<S, ReqBody, K>(
    checked: Checked<K>,
    mut request: Request<ReqBody>,
    mut inner: S,
    wire: &mut Wire,
) -> State<S, ReqBody, K>
where
    S: Service<Request<ReqBody>>,
{
    let Checked {
        verdict,
        headers,
        shadow,
        settlement,
    } = checked;
    let modes = &headers.config.modes;
    if !verdict.is_allowed() {
        *wire = Wire::of(request.headers());
    }
    match verdict {
        Verdict::Decided(decision) if decision.allowed => {
            // Handlers can read what is left.
            request.extensions_mut().insert(decision);
            if let Some(denial) = shadow {
                shadow::note_shadow_denial(&headers.config.policy_name, &denial, true);
                request.extensions_mut().insert(ShadowLimited(denial));
            }
            let headers = (!modes.shadow || modes.shadow_headers).then_some((decision, headers));
            State::Calling {
                future: inner.call(request),
                headers,
                settlement,
            }
        }
        // Shadow: recorded as a denial, forwarded all the same.
        Verdict::Decided(decision) if modes.shadow => {
            shadow::note_shadow_denial(&headers.config.policy_name, &decision, false);
            request.extensions_mut().insert(decision);
            request.extensions_mut().insert(ShadowLimited(decision));
            let headers = modes.shadow_headers.then_some((decision, headers));
            State::Calling {
                future: inner.call(request),
                headers,
                settlement: None,
            }
        }
        Verdict::Decided(decision) => State::Rejecting {
            rejection: Some(Rejection::TooManyRequests(decision, headers)),
        },
        Verdict::FailedOpen => State::Calling {
            future: inner.call(request),
            headers: None,
            settlement: None,
        },
        Verdict::FailedClosed { .. } if modes.shadow => State::Calling {
            future: inner.call(request),
            headers: None,
            settlement: None,
        },
        Verdict::FailedClosed { retry_after } => State::Rejecting {
            rejection: Some(Rejection::Unavailable(retry_after)),
        },
    }
}

fn reject<B, K>(rejection: Rejection<K>, wire: Wire) -> Response<ResponseBody<B>> {
    match rejection {
        Rejection::TooManyRequests(decision, headers) => {
            response::too_many_requests(&decision, headers.style(), wire)
        }
        Rejection::Unavailable(retry_after) => response::unavailable(retry_after, wire),
        Rejection::MissingKey(status) => response::missing_key(status, wire),
    }
}
