//! Scenarios: the rows of the table (check, deny, layer, HTTP, deny cache).

use super::*;

/// A row of the table: a scenario at one shape, with its runs (several for the compared shape).
pub(crate) struct Row {
    pub(crate) scenario: String,
    pub(crate) shape: Shape,
    pub(crate) runs: Vec<Run>,
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| !v.is_nan());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

impl Row {
    pub(crate) fn median_of(&self, f: impl Fn(&Run) -> f64) -> f64 {
        median(self.runs.iter().map(f).collect())
    }
}

pub(crate) struct Bench {
    pub(crate) settings: Settings,
    pub(crate) admin: Admin,
    pub(crate) keys: Arc<KeySet>,
    pub(crate) sha: Arc<str>,
    pub(crate) raw_connection: MultiplexedConnection,
    pub(crate) rows: Vec<Row>,
}

impl Bench {
    /// The bench on the Redis under test (a private server, or `REDIS_URL`), with the
    /// reference script loaded and the raw runs' connection open.
    pub(crate) async fn start(settings: Settings) -> Checked<Bench> {
        let admin = Admin::connect().await?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(REFERENCE_SCRIPT)
            .query_async(&mut admin.connection.clone())
            .await
            .map_err(|e| failure!("SCRIPT LOAD of the reference script: {e}"))?;
        let raw_connection = connect(&admin.url).await?;
        Ok(Bench {
            settings,
            admin,
            keys: KeySet::new(),
            sha: sha.into(),
            raw_connection,
            rows: Vec::new(),
        })
    }

    pub(crate) fn record(&mut self, scenario: &str, shape: Shape, run: Run) -> Checked {
        ensure!(
            run.failures == 0,
            "{scenario} at {}: {} of {} operations failed or had an unexpected decision: the \
             figures would not be valid",
            shape.label(),
            run.failures,
            run.ops
        );
        match self
            .rows
            .iter_mut()
            .find(|row| row.scenario == scenario && row.shape == shape)
        {
            Some(row) => row.runs.push(run),
            None => self.rows.push(Row {
                scenario: scenario.to_owned(),
                shape,
                runs: vec![run],
            }),
        }
        Ok(())
    }

    pub(crate) async fn raw(&mut self, shape: Shape) -> Checked<Run> {
        let ops = (0..shape.concurrency)
            .map(|task| RawOp {
                connection: self.raw_connection.clone(),
                sha: self.sha.clone(),
                keys: self.keys.clone(),
                shape,
                task,
            })
            .collect();
        let (run, _) = measure(&self.settings, &self.admin, ops).await?;
        self.record("raw EVALSHA (reference)", shape, run.clone())?;
        Ok(run)
    }

    pub(crate) fn check_ops(
        &self,
        limiter: &Limiter,
        quota: Quota,
        allowed: bool,
        shape: Shape,
    ) -> Vec<CheckOp> {
        (0..shape.concurrency)
            .map(|task| CheckOp {
                limiter: limiter.clone(),
                quota,
                spent: spent(),
                expect_allowed: allowed,
                keys: self.keys.clone(),
                shape,
                task,
            })
            .collect()
    }

    /// One [`ServiceOp`] per task of `shape`, each on its clone of `service`.
    fn service_ops<S: Clone>(&self, service: &S, shape: Shape) -> Vec<ServiceOp<S>> {
        (0..shape.concurrency)
            .map(|task| ServiceOp {
                service: service.clone(),
                keys: self.keys.clone(),
                shape,
                task,
            })
            .collect()
    }

    /// (b) on the allowed path.
    pub(crate) async fn check(&mut self, algorithm: Algorithm, shape: Shape) -> Checked<Run> {
        let prefix = format!("{PREFIX}-{algorithm}");
        let limiter = self.admin.limiter(algorithm, &prefix, false).await?;
        let ops = self.check_ops(&limiter, admitting(algorithm), true, shape);
        let (run, _) = measure(&self.settings, &self.admin, ops).await?;
        let scenario = format!("check {algorithm} at {}", shape.label());
        assert_only(&limiter, &scenario, "allowed", |s| {
            s.denied == 0 && s.store_errors == 0
        })?;
        self.record(&format!("check {algorithm}"), shape, run.clone())?;
        Ok(run)
    }

    /// (b) on the denied path: every key's quota is spent before the run.
    pub(crate) async fn denied(&mut self, algorithm: Algorithm, shape: Shape) -> Checked {
        let prefix = format!("{PREFIX}-denied-{algorithm}");
        let limiter = self.admin.limiter(algorithm, &prefix, false).await?;
        let quota = spent();
        let keys = if shape.keys == Keys::Hot { 1 } else { KEYS };
        for chunk in self.keys.plain[..keys].chunks(256) {
            spend(&limiter, chunk, &quota).await?;
        }
        let before = limiter.stats();
        let ops = self.check_ops(&limiter, quota, false, shape);
        let (run, _) = measure(&self.settings, &self.admin, ops).await?;
        let after = limiter.stats();
        ensure!(
            after.allowed == before.allowed && after.store_errors == 0,
            "{algorithm}: the denied run admitted or failed ({before:?} -> {after:?})"
        );
        self.record(&format!("denied {algorithm}"), shape, run)
    }

    /// (c) the layer over a trivial service, token bucket.
    pub(crate) async fn layer(&mut self, shape: Shape) -> Checked<Run> {
        let limiter = self
            .admin
            .limiter(Algorithm::TokenBucket, &format!("{PREFIX}-layer"), false)
            .await?;
        self.layer_on(limiter, "layer (ready+call)", shape).await
    }

    /// The layer of (c) on `limiter`, recorded as `scenario`.
    pub(crate) async fn layer_on(
        &mut self,
        limiter: Limiter,
        scenario: &str,
        shape: Shape,
    ) -> Checked<Run> {
        let layer = RateLimitLayer::new(
            limiter.clone(),
            admitting(Algorithm::TokenBucket),
            HeaderKey::named("x-api-key").expect("a valid header name"),
        );
        let service = layer.layer(trivial_service());
        let ops = self.service_ops(&service, shape);
        let (run, _) = measure(&self.settings, &self.admin, ops).await?;
        let at = format!("{scenario} at {}", shape.label());
        assert_only(&limiter, &at, "allowed", |s| {
            s.denied == 0 && s.store_errors == 0
        })?;
        self.record(scenario, shape, run.clone())?;
        Ok(run)
    }

    /// What (c) costs without the layer: the request the bench builds and the trivial service.
    pub(crate) async fn service_alone(&mut self, shape: Shape) -> Checked {
        let service = trivial_service();
        let ops = self.service_ops(&service, shape);
        let (run, _) = measure(&self.settings, &self.admin, ops).await?;
        self.record("service alone (no layer)", shape, run)
    }

    /// (d) HTTP through the example's router, with or without the layer.
    pub(crate) async fn http(&mut self, shape: Shape, with_layer: bool) -> Checked<Run> {
        let limiter = self
            .admin
            .limiter(Algorithm::TokenBucket, &format!("{PREFIX}-http"), false)
            .await?;
        // The router and handler of examples/axum.rs.
        let app = Router::new().route("/", get(|| async { "ok" }));
        let app = if with_layer {
            app.layer(RateLimitLayer::new(
                limiter.clone(),
                admitting(Algorithm::TokenBucket),
                HeaderKey::named("x-api-key").expect("a valid header name"),
            ))
        } else {
            app
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| failure!("no loopback port for the HTTP server: {e}"))?;
        let address = listener
            .local_addr()
            .map_err(|e| failure!("the HTTP server's address: {e}"))?;
        let (shutdown, on_shutdown) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async {
                let _ = on_shutdown.await;
            })
            .await
        });
        let mut ops = Vec::with_capacity(shape.concurrency);
        for task in 0..shape.concurrency {
            ops.push(HttpOp::connect(address, self.keys.clone(), shape, task).await?);
        }
        let (run, ops) = measure(&self.settings, &self.admin, ops).await?;
        drop(ops);
        let _ = shutdown.send(());
        let _ = server.await;
        if with_layer {
            let scenario = format!("http + layer at {}", shape.label());
            assert_only(&limiter, &scenario, "allowed", |s| {
                s.denied == 0 && s.store_errors == 0
            })?;
        }
        let scenario = if with_layer {
            "http + layer"
        } else {
            "http (no layer)"
        };
        self.record(scenario, shape, run.clone())?;
        Ok(run)
    }

    /// (b) with the deny cache or without, 90 % of the traffic on a hot key over its quota.
    pub(crate) async fn deny_mix(
        &mut self,
        algorithm: Algorithm,
        deny_cache: bool,
    ) -> Checked<Run> {
        let shape = Shape::new(RATIO_CONCURRENCY, Keys::HotDenied);
        let prefix = format!("{PREFIX}-mix-{algorithm}-{deny_cache}");
        let limiter = self.admin.limiter(algorithm, &prefix, deny_cache).await?;
        spend(&limiter, &self.keys.plain[..1], &spent()).await?;
        let ops = self.check_ops(&limiter, admitting(algorithm), true, shape);
        let (run, _) = measure(&self.settings, &self.admin, ops).await?;
        let cache = if deny_cache { "with" } else { "without" };
        self.record(
            &format!("deny-cache {cache} {algorithm}"),
            shape,
            run.clone(),
        )?;
        Ok(run)
    }
}

/// Spends `quota` on each of `keys` with one decision from Redis each (no failure policy: a
/// check that failed open would leave its key unspent, and the denied run that follows would
/// then see an admission).
async fn spend(limiter: &Limiter, keys: &[String], quota: &Quota) -> Checked {
    let quotas = Quotas::from(*quota);
    let checks = keys
        .iter()
        .map(|key| limiter.try_check_quotas(key.as_str(), &quotas, 1));
    for (key, result) in keys.iter().zip(futures::future::join_all(checks).await) {
        result.map_err(|e| failure!("spending the quota of {key} before a denied run: {e}"))?;
    }
    Ok(())
}
