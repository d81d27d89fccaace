//! The learning scenario (`OutboundLayer::learn_quota`): what learning costs Redis when the
//! upstream contradicts itself. 3 instances (each a limiter on a store of its own) call an
//! in-process upstream that announces `q=2000;w=1` and `q=3000;w=1` on alternate answers, under a
//! ceiling of 5 000 a second, with the default learning period; after every instance's rounds
//! are settled, the Redis script calls (`EVALSHA` + `EVAL` from `INFO commandstats`: the checks
//! and learning's reads and writes) are divided by the upstream calls:
//! `learning redis calls per upstream call`. Without learning it is 1 (one check per call).
//!
//! `cargo bench --bench throughput -- --quick learning` runs only this scenario.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use redlimit::outbound::OutboundLayer;
use redlimit::store::RedisStore;
use redlimit::{Algorithm, Limiter, Quota};
use tower::{Layer, ServiceExt};

use crate::failure::{failure, Checked};
use crate::server::Admin;
use crate::settings::{Settings, TIMEOUT};

/// Instances, each calling the upstream in sequence.
const INSTANCES: usize = 3;

/// One instance's layer: a limiter on a store of its own, learning under `ceiling`.
fn instance(url: &str, ceiling: Quota) -> OutboundLayer {
    let store = RedisStore::builder(url)
        .timeout(TIMEOUT)
        .build()
        .expect("a valid Redis URL");
    let limiter = Limiter::builder(store)
        .algorithm(Algorithm::TokenBucket)
        .prefix("redlimit-bench-learning")
        .build()
        .expect("a valid limiter");
    OutboundLayer::builder(limiter, ceiling, "flapping-api")
        .learn_quota(ceiling)
        .max_wait(Duration::from_secs(10))
        .build()
        .expect("a valid layer")
}

/// Runs the scenario and prints its line.
pub(super) async fn learning_bench(settings: &Settings, admin: &Admin) -> Checked {
    if !admin.stats {
        println!(
            "learning redis calls per upstream call: n/a (CONFIG RESETSTAT refused by this Redis)"
        );
        return Ok(());
    }
    let per_instance: u64 = if settings.quick { 500 } else { 2000 };
    let ceiling = Quota::per_second(5000).expect("a valid quota");
    let layers: Vec<_> = (0..INSTANCES)
        .map(|_| instance(&admin.url, ceiling))
        .collect();
    // The upstream: alternate answers contradict each other.
    let answers = Arc::new(AtomicU64::new(0));
    let upstream = {
        let answers = answers.clone();
        tower::service_fn(move |_: Request<()>| {
            let n = answers.fetch_add(1, Ordering::Relaxed);
            async move {
                let policy = if n.is_multiple_of(2) {
                    "p;q=2000;w=1"
                } else {
                    "p;q=3000;w=1"
                };
                let mut response = Response::new(());
                response
                    .headers_mut()
                    .insert("ratelimit-policy", HeaderValue::from_static(policy));
                Ok::<_, Infallible>(response)
            }
        })
    };
    admin.reset_stats().await;
    let tasks: Vec<_> = layers
        .iter()
        .map(|layer| {
            let (layer, upstream) = (layer.clone(), upstream.clone());
            tokio::spawn(async move {
                for _ in 0..per_instance {
                    layer
                        .layer(upstream.clone())
                        .oneshot(Request::new(()))
                        .await
                        .map_err(|e| format!("an upstream call through the layer: {e}"))?;
                }
                layer.settled().await;
                Ok::<_, String>(())
            })
        })
        .collect();
    for task in tasks {
        task.await
            .map_err(|e| e.to_string())
            .and_then(|result| result)
            .map_err(|e| failure!("learning scenario: {e}"))?;
    }
    let calls = admin.script_calls().await;
    let upstream_calls = answers.load(Ordering::Relaxed);
    println!(
        "learning redis calls per upstream call: {:.2}",
        calls as f64 / upstream_calls.max(1) as f64
    );
    Ok(())
}

/// `cargo bench --bench throughput -- learning`: only this scenario.
pub(super) async fn only(settings: Settings) -> Checked {
    let admin = Admin::connect().await?;
    learning_bench(&settings, &admin).await
}
