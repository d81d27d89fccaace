//! The worker's connection to the upstream, as the `tower::Service` the outbound layer wraps.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::Service;

/// The upstream as a client `tower::Service`: one kept-alive HTTP/1.1 connection. The outbound
/// layer clones its inner service into each response future (tower's advice for a ready service),
/// so the connection sits behind a lock; a worker makes one call at a time, never waiting on it.
#[derive(Clone)]
pub struct UpstreamClient {
    sender: Arc<tokio::sync::Mutex<http1::SendRequest<Empty<Bytes>>>>,
}

impl UpstreamClient {
    pub async fn connect(addr: SocketAddr) -> Result<UpstreamClient, Box<dyn std::error::Error>> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(UpstreamClient {
            sender: Arc::new(tokio::sync::Mutex::new(sender)),
        })
    }
}

impl Service<Request<Empty<Bytes>>> for UpstreamClient {
    type Response = Response<Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        // The connection's readiness is awaited in `call`, under the lock.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Empty<Bytes>>) -> Self::Future {
        let sender = self.sender.clone();
        Box::pin(async move {
            let mut sender = sender.lock().await;
            sender.ready().await?;
            sender.send_request(request).await
        })
    }
}
