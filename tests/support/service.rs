//! The inner service the layer tests wrap: counts its calls and echoes the decision it finds in
//! the request's extensions (header [`SEEN`]: its `remaining`, or `none`).

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use redlimit::Decision;
use tower::Service;

/// The header in which the inner service reports the `remaining` it read from the request's
/// extensions (`none` when there was no `Decision`).
pub const SEEN: &str = "x-seen-remaining";

/// A service answering `200 ok` that adds one to `calls` per call and reports the decision it
/// saw in [`SEEN`].
pub fn counting(
    calls: Arc<AtomicUsize>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send,
> + Clone
       + Send
       + Sync
       + 'static {
    tower::service_fn(move |request: Request<Full<Bytes>>| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(Response::builder()
                .header(SEEN, seen_remaining(request.extensions()))
                .body(Full::new(Bytes::from_static(b"ok")))
                .unwrap())
        }
    })
}

/// The `remaining` of the `Decision` in `extensions`, or `none`.
pub fn seen_remaining(extensions: &http::Extensions) -> String {
    extensions
        .get::<Decision>()
        .map_or_else(|| "none".to_owned(), |d| d.remaining.to_string())
}

type Req = Request<Full<Bytes>>;
type Resp = Response<Full<Bytes>>;

/// What the tests' inner services are: full-body requests in, full-body responses out, never an
/// error, a `Send` future, cloneable. A name for the bound, so each service need not spell it.
pub trait TestService:
    Service<Req, Response = Resp, Error = Infallible, Future: Send> + Clone + Send + 'static
{
}

impl<S> TestService for S where
    S: Service<Req, Response = Resp, Error = Infallible, Future: Send> + Clone + Send + 'static
{
}

/// The status `svc` (a clone of it, so the caller keeps its own) answers `request` with.
pub async fn status_of<S, B>(svc: &S, request: Request<Full<Bytes>>) -> http::StatusCode
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    use tower::ServiceExt;
    svc.clone().oneshot(request).await.unwrap().status()
}

/// The statuses (as numbers) `svc` answers `n` requests made by `request` with, sent one after
/// another.
pub async fn statuses_of<S, B>(
    svc: &S,
    n: usize,
    request: impl Fn() -> Request<Full<Bytes>>,
) -> Vec<u16>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        statuses.push(status_of(svc, request()).await.as_u16());
    }
    statuses
}

/// An empty response carrying `value` in the header `name`.
pub fn with_header(name: &'static str, value: http::HeaderValue) -> Response<Full<Bytes>> {
    Response::builder()
        .header(name, value)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// The whole seconds of `response`'s `Retry-After` header (which must be there).
pub fn retry_after_secs<B>(response: &Response<B>) -> u64 {
    let value = response.headers()["retry-after"].to_str().unwrap();
    value
        .parse()
        .unwrap_or_else(|e| panic!("Retry-After {value:?}: {e}"))
}

/// `GET /` to the server at `addr` over a fresh connection (`Connection: close`): the whole
/// response as it came, status line, headers and body.
pub async fn raw_get(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n";
    stream.write_all(request).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw
}
