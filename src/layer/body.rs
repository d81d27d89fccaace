//! [`ResponseBody`]: the inner service's body, or the small body of a rejection.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a response from [`RateLimit`](crate::layer::RateLimit): the inner service's body, or
    /// the short text of a 429 / 503 (empty for gRPC, whose status travels in headers).
    ///
    /// **The bound:** the inner body must be `http_body::Body<Data = bytes::Bytes>`. That is what
    /// axum (`axum::body::Body`), tonic (`tonic::body::Body`) and hyper (`Full<Bytes>`,
    /// `Incoming`, `BoxBody<Bytes, _>`) all use, so the layer stacks under each of them; the
    /// error type is the inner body's own.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::BodyExt;
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
    /// use tower::{Service, ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut svc = ServiceBuilder::new()
    ///     .layer(RateLimitLayer::new(
    ///         Limiter::new(MemoryStore::new()),
    ///         Quota::per_minute(1)?,
    ///         GlobalKey::new("all"),
    ///     ))
    ///     .service_fn(|_: Request<String>| async {
    ///         Ok::<_, Infallible>(Response::new(String::from("hello")))
    ///     });
    ///
    /// let allowed = svc.ready().await?.call(Request::new(String::new())).await?;
    /// assert_eq!(allowed.into_body().collect().await?.to_bytes(), "hello");
    /// let denied = svc.ready().await?.call(Request::new(String::new())).await?;
    /// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(denied.into_body().collect().await?.to_bytes(), "rate limit exceeded\n");
    /// # Ok(())
    /// # }
    /// ```
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Rejection { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn rejection(text: &'static str) -> Self {
        ResponseBody {
            kind: Kind::Rejection {
                data: (!text.is_empty()).then(|| Bytes::from_static(text.as_bytes())),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Rejection { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Rejection { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Rejection { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
