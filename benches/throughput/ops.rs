//! The operations the tasks repeat: raw `EVALSHA`, `Limiter::check`, the layer, HTTP.

use super::*;

/// (a) The reference script: only `TIME`, one `GET` and one `SET key value PX ttl` on its key.
pub(crate) const REFERENCE_SCRIPT: &str = r"
redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, 0, 0, 0, 0}
";

/// (a) raw redis-rs `EVALSHA` of [`REFERENCE_SCRIPT`] on one multiplexed connection (shared by
/// every task: each holds a clone of the handle).
pub(crate) struct RawOp {
    pub(crate) connection: MultiplexedConnection,
    pub(crate) sha: Arc<str>,
    pub(crate) keys: Arc<KeySet>,
    pub(crate) shape: Shape,
    pub(crate) task: usize,
}

impl Op for RawOp {
    async fn run(&mut self, n: u64) -> bool {
        let key = &self.keys.raw[self.shape.key(self.task, n)];
        let reply: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
            .arg(&*self.sha)
            .arg(1)
            .arg(key)
            .arg("1764500000000000:7")
            .arg(1000)
            .query_async(&mut self.connection)
            .await;
        reply.is_ok()
    }
}

/// (b) `Limiter::check`; `true` when the decision is the expected one.
pub(crate) struct CheckOp {
    pub(crate) limiter: Limiter,
    /// The quota of every key (of the spread keys in a [`Keys::HotDenied`] run).
    pub(crate) quota: Quota,
    /// The spent quota of the hot key in a [`Keys::HotDenied`] run.
    pub(crate) spent: Quota,
    pub(crate) expect_allowed: bool,
    pub(crate) keys: Arc<KeySet>,
    pub(crate) shape: Shape,
    pub(crate) task: usize,
}

impl Op for CheckOp {
    async fn run(&mut self, n: u64) -> bool {
        let index = self.shape.key(self.task, n);
        let key = &self.keys.plain[index];
        if self.shape.keys == Keys::HotDenied {
            let (quota, allowed) = if index == 0 {
                (&self.spent, false)
            } else {
                (&self.quota, true)
            };
            return self.limiter.check(key, quota).await.is_allowed() == allowed;
        }
        self.limiter.check(key, &self.quota).await.is_allowed() == self.expect_allowed
    }
}

/// A fleet feature the bench measures (see [`Bench::fleet`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fleet {
    /// The key's quota overridden with `Limiter::set_quota` (admitting).
    Override,
    /// Two tiers in one call: `Limiter::check_quotas` with a per-second and a per-minute quota.
    TwoTiers,
    /// The key suspended with `Limiter::suspend`: every decision is a denial.
    Suspended,
    /// The crate's decision script sent by hand on the route's key alone, without the tenant's
    /// key every limiter sends: what the tenant's controls cost a limiter that uses none
    /// (`plain` over this is the price of reading them).
    Untenanted,
}

impl Fleet {
    pub(crate) const ALL: [Fleet; 4] = [
        Fleet::Override,
        Fleet::TwoTiers,
        Fleet::Suspended,
        Fleet::Untenanted,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Fleet::Override => "override",
            Fleet::TwoTiers => "two tiers",
            Fleet::Suspended => "suspended",
            Fleet::Untenanted => "no tenant key",
        }
    }
}

/// `Limiter::check_quotas` on the hot key; `true` when the decision is the expected one
/// (admitted, or denied because suspended).
pub(crate) struct FleetOp {
    pub(crate) limiter: Limiter,
    pub(crate) quotas: Quotas,
    pub(crate) suspended: bool,
    pub(crate) keys: Arc<KeySet>,
}

impl Op for FleetOp {
    async fn run(&mut self, _n: u64) -> bool {
        let verdict = self
            .limiter
            .check_quotas(&self.keys.plain[0], &self.quotas, 1)
            .await;
        match verdict {
            Verdict::Decided(decision) => {
                decision.allowed != self.suspended && decision.suspended == self.suspended
            }
            _ => false,
        }
    }
}

/// The crate's decision script by hand on a route's storage key alone (no tenant key), with
/// the packed arguments a token-bucket `check` sends; `true` on an admission (one integer).
pub(crate) struct UntenantedOp {
    pub(crate) connection: MultiplexedConnection,
    pub(crate) sha: Arc<str>,
    /// The storage keys of `KeySet::plain`, in its order.
    pub(crate) keys: Arc<Vec<String>>,
    pub(crate) args: Arc<[u8]>,
    pub(crate) shape: Shape,
    pub(crate) task: usize,
}

impl Op for UntenantedOp {
    async fn run(&mut self, n: u64) -> bool {
        let key = &self.keys[self.shape.key(self.task, n)];
        evalsha_is_an_integer(&mut self.connection, &self.sha, key, &*self.args).await
    }
}

/// `EVALSHA sha 1 key arg` on `connection`: whether Redis replied an integer.
pub(crate) async fn evalsha_is_an_integer(
    connection: &mut MultiplexedConnection,
    sha: &str,
    key: &str,
    arg: impl redis::ToRedisArgs,
) -> bool {
    let reply: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg(arg)
        .query_async(connection)
        .await;
    matches!(reply, Ok(redis::Value::Int(_)))
}

/// (c) `ready` + `call` on a service (the layer over a trivial service, or the trivial service
/// alone), with requests carrying `x-api-key`; `true` on `200 OK`.
pub(crate) struct ServiceOp<S> {
    pub(crate) service: S,
    pub(crate) keys: Arc<KeySet>,
    pub(crate) shape: Shape,
    pub(crate) task: usize,
}

impl<S, B> Op for ServiceOp<S>
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    async fn run(&mut self, n: u64) -> bool {
        let mut request = Request::new(());
        request.headers_mut().insert(
            API_KEY,
            self.keys.header[self.shape.key(self.task, n)].clone(),
        );
        let Ok(service) = self.service.ready().await;
        let Ok(response) = service.call(request).await;
        response.status() == StatusCode::OK
    }
}

/// The trivial inner service of (c).
pub(crate) fn trivial_service(
) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(|_request: Request<()>| async { Ok(Response::new(())) })
}

/// (d) one keep-alive HTTP/1.1 connection of the load generator; `true` on `200 OK`.
pub(crate) struct HttpOp {
    pub(crate) sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    pub(crate) keys: Arc<KeySet>,
    pub(crate) shape: Shape,
    pub(crate) task: usize,
}

impl HttpOp {
    pub(crate) async fn connect(
        address: SocketAddr,
        keys: Arc<KeySet>,
        shape: Shape,
        task: usize,
    ) -> Checked<HttpOp> {
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| failure!("the bench's HTTP server at {address} refused: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| failure!("TCP_NODELAY: {e}"))?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| failure!("an HTTP/1.1 handshake with {address}: {e}"))?;
        tokio::spawn(connection);
        Ok(HttpOp {
            sender,
            keys,
            shape,
            task,
        })
    }
}

impl Op for HttpOp {
    async fn run(&mut self, n: u64) -> bool {
        let request = Request::get("/")
            .header(http::header::HOST, "127.0.0.1")
            .header(API_KEY, &self.keys.header[self.shape.key(self.task, n)])
            .body(Empty::new())
            .expect("a valid request");
        if self.sender.ready().await.is_err() {
            return false;
        }
        let Ok(response) = self.sender.send_request(request).await else {
            return false;
        };
        let ok = response.status() == StatusCode::OK;
        ok && response.into_body().collect().await.is_ok()
    }
}
