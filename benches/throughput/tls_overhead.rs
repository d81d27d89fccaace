//! Scenario: the TLS overhead.

use super::*;

/// The TLS overhead: token-bucket `Limiter::check` on one hot key through a `redis-server` that
/// listens both in plain text and with TLS, each side in turn over a few rounds, at concurrency
/// 1 and 64. Prints decisions/s of both and the median of the per-round ratios.
pub(crate) async fn tls_overhead(settings: &Settings) -> Checked {
    let files = tls::TlsFiles::generate("redlimit-bench");
    let (cert, key, ca) = (files.server_cert(), files.server_key(), files.ca());
    let server = PrivateRedis::start_tls(&ServerTls {
        cert: &cert,
        key: &key,
        ca: &ca,
    })
    .map_err(|e| failure!("the TLS redis-server: {e}"))?;
    let tls_port = server.tls_port.expect("started with TLS");
    let plain = RedisStore::builder(server.url())
        .timeout(TIMEOUT)
        .build()
        .expect("a plain store");
    let secure = RedisStore::builder(format!("rediss://127.0.0.1:{tls_port}/"))
        .tls_ca_pem(tls::TlsFiles::read(&ca))
        .timeout(TIMEOUT)
        .build()
        .expect("a TLS store");
    // The plain port answered already; the TLS one listens from the same start.
    for (store, side) in [(&plain, "plain"), (&secure, "TLS")] {
        store
            .verify()
            .await
            .map_err(|e| failure!("the TLS redis-server's {side} port does not answer: {e}"))?;
    }
    let quota = admitting(Algorithm::TokenBucket);
    let limiters = [Limiter::new(plain), Limiter::new(secure)];
    let window = settings.run;
    let rounds = settings.rounds.clamp(1, 5);
    for concurrency in [1usize, 64] {
        let mut rates = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            for side in [round % 2, 1 - round % 2] {
                let limiter = &limiters[side];
                let stop = Instant::now() + window;
                let tasks = (0..concurrency).map(|_| {
                    let (limiter, quota) = (limiter.clone(), quota);
                    tokio::spawn(async move {
                        let mut done = 0u64;
                        while Instant::now() < stop {
                            let decision =
                                limiter.try_check_quotas("tls-hot", &quota.into(), 1).await;
                            match decision {
                                Ok(decision) if decision.allowed => done += 1,
                                Ok(decision) => return Err(format!("denied: {decision:?}")),
                                Err(e) => return Err(e.to_string()),
                            }
                        }
                        Ok(done)
                    })
                });
                let started = Instant::now();
                let mut done = 0;
                for task in tasks.collect::<Vec<_>>() {
                    let side = if side == 0 { "plain" } else { "TLS" };
                    done += task
                        .await
                        .map_err(|e| e.to_string())
                        .and_then(|done| done)
                        .map_err(|e| {
                            failure!("tls/plain c{concurrency}, a {side} check failed: {e}")
                        })?;
                }
                rates[side].push(done as f64 / started.elapsed().as_secs_f64());
            }
        }
        let ratios: Vec<f64> = rates[1].iter().zip(&rates[0]).map(|(t, p)| t / p).collect();
        println!(
            "tls/plain token-bucket check c{concurrency} hot key: plain {:.0}/s, tls {:.0}/s, \
             ratio median {:.2} over {rounds} rounds",
            median(rates[0].clone()),
            median(rates[1].clone()),
            median(ratios)
        );
    }
    Ok(())
}
