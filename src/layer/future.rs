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
}

/// Asks the limiter about the request stored under `storage_key`, against the quotas of
/// `style` (a resolver's choice) or else the layer's own, and hands back the verdict with what
/// the response headers need. Boxed as a [`Check`]: the store's future borrows the key and the
/// quotas, so it is only ever built inside the future that owns them.
pub(crate) async fn check<K>(
    config: Arc<Config<K>>,
    storage_key: &str,
    style: Option<Arc<HeaderStyle>>,
    cost: u64,
) -> Checked<K> {
    let quotas = style.as_deref().map_or(&config.quotas, HeaderStyle::quotas);
    let verdict = config
        .limiter
        .check_storage_key(storage_key, quotas, cost, &config.metrics_label)
        .await;
    Checked {
        verdict,
        headers: Headers { config, style },
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

    /// A request admitted already (from a lease): the inner service is called at once, with
    /// the decision in the request's extensions, as after a check.
    pub(crate) fn admitted(
        decision: Decision,
        headers: Headers<K>,
        mut request: Request<ReqBody>,
        mut inner: S,
    ) -> Self {
        debug_assert!(decision.allowed);
        request.extensions_mut().insert(decision);
        ResponseFuture {
            state: State::Calling {
                future: inner.call(request),
                headers: Some((decision, headers)),
            },
            wire: Wire::Http,
        }
    }

    pub(crate) fn pass_through(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                headers: None,
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
                StateProj::Checking {
                    check,
                    request,
                    inner,
                } => {
                    let Checked { verdict, headers } = ready!(check.as_mut().poll(cx));
                    let (mut request, mut inner) = match (request.take(), inner.take()) {
                        (Some(request), Some(inner)) => (request, inner),
                        _ => panic!("ResponseFuture polled after completion"),
                    };
                    if !verdict.is_allowed() {
                        *this.wire = Wire::of(request.headers());
                    }
                    match verdict {
                        Verdict::Decided(decision) if decision.allowed => {
                            // Handlers can read what is left.
                            request.extensions_mut().insert(decision);
                            State::Calling {
                                future: inner.call(request),
                                headers: Some((decision, headers)),
                            }
                        }
                        Verdict::Decided(decision) => State::Rejecting {
                            rejection: Some(Rejection::TooManyRequests(decision, headers)),
                        },
                        Verdict::FailedOpen => State::Calling {
                            future: inner.call(request),
                            headers: None,
                        },
                        Verdict::FailedClosed { retry_after } => State::Rejecting {
                            rejection: Some(Rejection::Unavailable(retry_after)),
                        },
                    }
                }
                StateProj::Calling { future, headers } => {
                    let response = ready!(future.poll(cx))?;
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

fn reject<B, K>(rejection: Rejection<K>, wire: Wire) -> Response<ResponseBody<B>> {
    match rejection {
        Rejection::TooManyRequests(decision, headers) => {
            response::too_many_requests(&decision, headers.style(), wire)
        }
        Rejection::Unavailable(retry_after) => response::unavailable(retry_after, wire),
        Rejection::MissingKey(status) => response::missing_key(status, wire),
    }
}
