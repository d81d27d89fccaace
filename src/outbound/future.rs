//! [`ResponseFuture`]: waits for the limiter (per-request keys), calls the inner service, and
//! suspends the key fleet-wide when the upstream asks to back off.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::config::{Acquire, Limits};
use super::error::OutboundError;
use super::react;
use super::retry_after::upstream_backoff;
use crate::control::WriteKind;

/// What a response future needs to suspend its key (or learn its quota): the limits and the key.
pub(crate) type Backoff = (Arc<Limits>, Arc<str>);

pin_project! {
    /// The response future of [`Outbound`](super::Outbound): for a per-request key it waits for
    /// the limiter first, then for its clone of the inner service to be ready; then it calls
    /// the inner service and hands its answer back; when it is `429` or `503` with
    /// `Retry-After` (or announces nothing left), the key's suspension is written in a task of
    /// its own that the key's next acquisition waits for (see the
    /// [module docs](super#auto-suspend)).
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use redlimit::outbound::{OutboundLayer, ResponseFuture};
    /// use redlimit::{store::MemoryStore, Limiter, Quota};
    /// use tower::{Service, ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = OutboundLayer::new(Limiter::new(MemoryStore::new()), Quota::per_second(5)?, "api");
    /// let mut client = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
    /// let future: ResponseFuture<_, String> = client.ready().await?.call(Request::new(String::new()));
    /// assert!(future.await?.status().is_success());
    /// # Ok(())
    /// # }
    /// ```
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
        // `None` when auto-suspend and learning are off.
        backoff: Option<Backoff>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // Waiting for the limiter (per-request keys); holds the request and a clone of the
        // inner service, not yet ready: a ready one may hold capacity the other keys need.
        Acquiring {
            acquire: Acquire,
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
        // Admitted: waiting for the clone of the inner service to be ready.
        Readying {
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
        // The inner service is answering.
        Calling {
            #[pin]
            future: S::Future,
        },
        // The upstream asked to back off: suspending the key before handing its answer back.
        Suspending {
            suspend: BoxFuture<'static, ()>,
            response: Option<S::Response>,
        },
        // The request was not sent.
        Failed {
            error: Option<OutboundError<S::Error>>,
        },
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn acquiring(
        acquire: Acquire,
        request: Request<ReqBody>,
        inner: S,
        backoff: Option<Backoff>,
    ) -> Self {
        let state = State::Acquiring {
            acquire,
            request: Some(request),
            inner: Some(inner),
        };
        ResponseFuture { state, backoff }
    }

    pub(crate) fn calling(future: S::Future, backoff: Option<Backoff>) -> Self {
        let state = State::Calling { future };
        ResponseFuture { state, backoff }
    }

    pub(crate) fn failed(error: OutboundError<S::Error>) -> Self {
        let state = State::Failed { error: Some(error) };
        ResponseFuture {
            state,
            backoff: None,
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResBody>, OutboundError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    request,
                    inner,
                } => match ready!(acquire.as_mut().poll(cx)) {
                    Ok(_) => State::Readying {
                        request: request.take(),
                        inner: inner.take(),
                    },
                    Err(error) => State::Failed {
                        error: Some(OutboundError::Acquire(error)),
                    },
                },
                StateProj::Readying { request, inner } => {
                    let service = inner
                        .as_mut()
                        .expect("ResponseFuture polled after completion");
                    if let Err(error) = ready!(service.poll_ready(cx)) {
                        return Poll::Ready(Err(OutboundError::Inner(error)));
                    }
                    match (request.take(), inner.take()) {
                        (Some(request), Some(mut inner)) => State::Calling {
                            future: inner.call(request),
                        },
                        _ => panic!("ResponseFuture polled after completion"),
                    }
                }
                StateProj::Calling { future } => {
                    let response = ready!(future.poll(cx)).map_err(OutboundError::Inner)?;
                    let status = response.status();
                    let wait = this
                        .backoff
                        .as_ref()
                        .filter(|(limits, _)| limits.auto_suspend)
                        .and_then(|_| {
                            upstream_backoff(status, response.headers(), SystemTime::now())
                        });
                    // The quota and what is left, as the upstream announces them (`react.rs`).
                    let announced = this.backoff.as_ref().and_then(|(limits, key)| {
                        react::on_response(limits, key, response.headers(), wait.is_some())
                    });
                    let pacing = match (wait, this.backoff.take()) {
                        (Some(wait), Some((limits, key))) => {
                            let write = react::then(
                                Box::pin(suspend(limits.clone(), key.clone(), status, wait)),
                                announced,
                            );
                            react::spawn_pacing(&limits, &key, write)
                        }
                        (_, Some((limits, key))) => {
                            announced.and_then(|write| react::spawn_pacing(&limits, &key, write))
                        }
                        _ => announced,
                    };
                    // The pacing runs in a task of its own (the key's next acquisition waits
                    // for it); only without a runtime does the response wait for it here.
                    match pacing {
                        Some(pacing) => State::Suspending {
                            suspend: pacing,
                            response: Some(response),
                        },
                        None => return Poll::Ready(Ok(response)),
                    }
                }
                StateProj::Suspending { suspend, response } => {
                    ready!(suspend.as_mut().poll(cx));
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(response));
                }
                StateProj::Failed { error } => {
                    let error = error
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Err(error));
                }
            };
            this.state.set(next);
        }
    }
}

/// Suspends `key` fleet-wide for at least `wait`, capped at the layer's `max_auto_suspension`
/// (a suspension that ends later stays: a late answer never cuts an operator's), and says so in
/// the logs (never with the key: it may be a secret). The write is registered with the limiter
/// here, before the answer is handed back: a `suspend` or `resume` made through the limiter
/// after that wins over it (see the [module docs](super#after-the-response)).
fn suspend(
    limits: Arc<Limits>,
    key: Arc<str>,
    status: StatusCode,
    wait: Duration,
) -> impl Future<Output = ()> + Send + 'static {
    let ticket = limits
        .limiter
        .start_write(limits.target(&key), WriteKind::Suspension);
    async move {
        let wait = wait
            .min(limits.max_auto_suspension)
            .min(crate::core::MAX_SUSPENSION)
            .max(Duration::from_micros(1));
        let scope = limits.scope.as_deref().unwrap_or("");
        let target = limits.target(&key);
        match limits
            .limiter
            .extend_suspension_by(&ticket, target, wait)
            .await
        {
            Ok(Some(_)) => tracing::warn!(
                status = status.as_u16(),
                suspended_ms = wait.as_millis() as u64,
                scope,
                "upstream asked to back off (Retry-After): key suspended for the whole fleet"
            ),
            Ok(None) => tracing::debug!(
                status = status.as_u16(),
                scope,
                "upstream asked to back off (Retry-After), but a suspend or resume made since \
                 through this limiter wins: not suspended"
            ),
            Err(error) => tracing::warn!(
                %error,
                status = status.as_u16(),
                retry_after_ms = wait.as_millis() as u64,
                scope,
                "upstream asked to back off (Retry-After), but the key could not be suspended: \
                 the other workers keep calling"
            ),
        }
    }
}
