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
