//! Scenario: the TLS overhead.

use super::*;

/// The TLS overhead: token-bucket `Limiter::check` on one hot key through a `redis-server` that
/// listens both in plain text and with TLS, each side in turn over a few rounds, at concurrency
/// 1 and 64. Prints decisions/s of both and the median of the per-round ratios.
pub(crate) async fn tls_overhead(settings: &Settings) {
    let files = tls::TlsFiles::generate("redlimit-bench");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    };
    let (plain_port, tls_port) = (free_port(), free_port());
    let mut server = std::process::Command::new("redis-server")
        .args(["--port", &plain_port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--tls-port",
            &tls_port.to_string(),
            "--tls-auth-clients",
            "no",
        ])
        .arg("--tls-cert-file")
        .arg(files.server_cert())
        .arg("--tls-key-file")
        .arg(files.server_key())
        .arg("--tls-ca-cert-file")
        .arg(files.ca())
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server with TLS");
    let ca = tls::TlsFiles::read(&files.ca());
    let plain = RedisStore::builder(format!("redis://127.0.0.1:{plain_port}/"))
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a plain store");
    let secure = RedisStore::builder(format!("rediss://127.0.0.1:{tls_port}/"))
        .tls_ca_pem(ca)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a TLS store");
    let deadline = Instant::now() + Duration::from_secs(10);
    while plain.verify().await.is_err() || secure.verify().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the TLS redis-server did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
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
                            assert!(decision.expect("a decision").allowed, "admitted");
                            done += 1;
                        }
                        done
                    })
                });
                let started = Instant::now();
                let mut done = 0;
                for task in tasks.collect::<Vec<_>>() {
                    done += task.await.expect("a task");
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
    let _ = server.kill();
    let _ = server.wait();
}
