//! [`ConcurrencyFuture`], the response future: takes a slot, then calls the inner service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ConcurrencyBody;
use super::config::Shared;
use super::{Slot, SlotOutcome};
use crate::layer::response::{self, Wire};
use crate::layer::ResponseBody;

pin_project! {
    /// The response future of [`ConcurrencyLimit`]: takes a slot, then calls the inner service
    /// or answers 429 (503 when the store failed closed). Dropped while it takes the slot, it
    /// gives back the slot its call may take ([`ConcurrencyLimiter::acquire`]).
    pub struct ConcurrencyFuture<S, ReqBody, K>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        pub(super) state: State<S, ReqBody>,
        // Only until the slot is taken: a held slot must not keep its limiter alive (a slot
        // whose limiter is gone is not given back, as after a crash).
        pub(super) shared: Option<Arc<Shared<K>>>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(super) enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Acquiring {
            acquire: BoxFuture<'static, SlotOutcome>,
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
        // The slot is held while the service answers (dropped with this future), then by the body.
        Calling {
            #[pin]
            future: S::Future,
            slot: Option<Slot>,
            // RateLimit-Policy and RateLimit for the response.
            headers: Option<(HeaderValue, HeaderValue)>,
        },
    }
}

impl<S, ReqBody, ResBody, K> Future for ConcurrencyFuture<S, ReqBody, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ConcurrencyBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    request,
                    inner,
                } => {
                    let outcome = ready!(acquire.as_mut().poll(cx));
                    let (request, mut inner) = match (request.take(), inner.take()) {
                        (Some(request), Some(inner)) => (request, inner),
                        _ => panic!("ConcurrencyFuture polled after completion"),
                    };
                    let shared = this
                        .shared
                        .take()
                        .expect("ConcurrencyFuture polled after completion");
                    match outcome {
                        SlotOutcome::Acquired(slot) => {
                            let remaining = format!("\"{}\";r={}", shared.name, slot.remaining());
                            let headers = HeaderValue::from_str(&remaining)
                                .ok()
                                .map(|r| (shared.policy.clone(), r));
                            State::Calling {
                                future: inner.call(request),
                                slot: Some(slot),
                                headers,
                            }
                        }
                        SlotOutcome::FailedOpen => State::Calling {
                            future: inner.call(request),
                            slot: None,
                            headers: None,
                        },
                        SlotOutcome::Full { .. } => {
                            let wire = Wire::of(request.headers());
                            return Poll::Ready(Ok(full(&shared, wire)));
                        }
                        SlotOutcome::FailedClosed { retry_after } => {
                            let wire = Wire::of(request.headers());
                            return Poll::Ready(Ok(unavailable(retry_after, wire)));
                        }
                    }
                }
                StateProj::Calling {
                    future,
                    slot,
                    headers,
                } => {
                    let response = ready!(future.poll(cx))?;
                    let slot = slot.take();
                    let mut response =
                        response.map(|body| ConcurrencyBody::new(ResponseBody::inner(body), slot));
                    if let Some((policy, remaining)) = headers.take() {
                        let headers = response.headers_mut();
                        headers.insert("ratelimit-policy", policy);
                        headers.insert("ratelimit", remaining);
                    }
                    return Poll::Ready(Ok(response));
                }
            };
            this.state.set(next);
        }
    }
}

/// 429 (gRPC: RESOURCE_EXHAUSTED): every slot taken.
fn full<B, K>(shared: &Shared<K>, wire: Wire) -> Response<ConcurrencyBody<B>> {
    let mut response =
        response::too_many_concurrent(wire).map(|inner| ConcurrencyBody::new(inner, None));
    let headers = response.headers_mut();
    headers.insert("ratelimit-policy", shared.policy.clone());
    if let Ok(value) = HeaderValue::from_str(&format!("\"{}\";r=0;t=1", shared.name)) {
        headers.insert("ratelimit", value);
    }
    response
}

/// 503 (gRPC: UNAVAILABLE): the store failed and the policy refused.
fn unavailable<B>(retry_after: Duration, wire: Wire) -> Response<ConcurrencyBody<B>> {
    response::unavailable(retry_after, wire).map(|inner| ConcurrencyBody::new(inner, None))
}
