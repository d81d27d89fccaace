//! The Redis under test, and an admin connection for its stats.

use super::*;

/// The Redis under test and an admin connection for stats.
pub(crate) struct Admin {
    pub(crate) url: String,
    pub(crate) connection: MultiplexedConnection,
    /// Whether `CONFIG RESETSTAT` works (a managed Redis may refuse it).
    pub(crate) stats: bool,
    pub(crate) _server: Option<PrivateRedis>,
}

impl Admin {
    pub(crate) async fn connect() -> Checked<Admin> {
        let (url, server) = match std::env::var("REDIS_URL") {
            Ok(url) => (url, None),
            Err(_) => {
                let server = PrivateRedis::start().map_err(|e| {
                    failure!("{e}: install redis-server or set REDIS_URL to a Redis of your own")
                })?;
                (server.url(), Some(server))
            }
        };
        let connection = connect(&url).await?;
        let mut admin = Admin {
            url,
            connection,
            stats: true,
            _server: server,
        };
        admin.stats = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut admin.connection)
            .await
            .is_ok();
        Ok(admin)
    }

    pub(crate) async fn info(&self, section: &str) -> String {
        redis::cmd("INFO")
            .arg(section)
            .query_async::<String>(&mut self.connection.clone())
            .await
            .unwrap_or_default()
    }

    /// Script calls (`EVALSHA` + `EVAL`) since the last `CONFIG RESETSTAT`.
    pub(crate) async fn script_calls(&self) -> u64 {
        let info = self.info("commandstats").await;
        let calls = |name| {
            info_field(&info, name)
                .and_then(|line| {
                    line.split(',')
                        .find_map(|kv| kv.strip_prefix("calls=")?.parse::<u64>().ok())
                })
                .unwrap_or(0)
        };
        calls("cmdstat_evalsha") + calls("cmdstat_eval")
    }

    pub(crate) async fn version(&self) -> String {
        let info = self.info("server").await;
        info_field(&info, "redis_version").unwrap_or("?").to_owned()
    }

    /// CPU time of the private server's main thread so far (`/proc/<pid>/schedstat`: time on
    /// a CPU in nanoseconds, which waiting for a CPU does not inflate).
    pub(crate) fn cpu(&self) -> Option<Duration> {
        let pid = self._server.as_ref()?.pid();
        let schedstat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
        let nanos = schedstat.split_whitespace().next()?.parse().ok()?;
        Some(Duration::from_nanos(nanos))
    }

    pub(crate) async fn reset_stats(&self) {
        if self.stats {
            let _: redis::RedisResult<()> = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut self.connection.clone())
                .await;
        }
    }

    /// `EVALSHA` calls and their total `usec` since the last reset.
    pub(crate) async fn script_stat(&self) -> Option<ScriptStat> {
        if !self.stats {
            return None;
        }
        let info = self.info("commandstats").await;
        let line = info_field(&info, "cmdstat_evalsha")?;
        let field = |name: &str| {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok())
        };
        let (calls, usec) = (field("calls")?, field("usec")?);
        Some(ScriptStat {
            calls: calls as u64,
            usec,
        })
    }

    /// A limiter on a store of its own (one connection), checked once so that a dead Redis
    /// fails here.
    pub(crate) async fn limiter(
        &self,
        algorithm: Algorithm,
        prefix: &str,
        deny_cache: bool,
    ) -> Checked<Limiter> {
        let store = RedisStore::builder(self.url.as_str())
            .timeout(TIMEOUT)
            .build()
            .expect("a valid Redis URL");
        let builder = Limiter::builder(store).algorithm(algorithm).prefix(prefix);
        let builder = if deny_cache {
            with_deny_cache(builder).expect("deny-cache runs only when this build has one")
        } else {
            builder
        };
        let limiter = builder.build().expect("a valid limiter");
        limiter
            .try_check_quotas("warm-up", &admitting(algorithm).into(), 1)
            .await
            .map_err(|e| {
                failure!(
                    "Redis at {} does not answer the first check of the limiter under {prefix}: \
                     {e}",
                    self.url
                )
            })?;
        Ok(limiter)
    }
}

impl Admin {
    /// A token-bucket limiter on [`RoundRobin`] over `connections` connections, checked once.
    pub(crate) async fn round_robin_limiter(
        &self,
        connections: usize,
        prefix: &str,
    ) -> Checked<Limiter> {
        let stores = (0..connections)
            .map(|_| {
                RedisStore::builder(self.url.as_str())
                    .timeout(TIMEOUT)
                    .build()
                    .expect("a valid Redis URL")
            })
            .collect();
        let store = RoundRobin {
            stores,
            next: AtomicUsize::new(0),
        };
        let algorithm = Algorithm::TokenBucket;
        let limiter = Limiter::builder(store)
            .algorithm(algorithm)
            .prefix(prefix)
            .build()
            .expect("a valid limiter");
        // One check per connection, so that each is open before the runs.
        for _ in 0..connections {
            limiter
                .try_check_quotas("warm-up", &admitting(algorithm).into(), 1)
                .await
                .map_err(|e| failure!("Redis at {} does not answer: {e}", self.url))?;
        }
        Ok(limiter)
    }
}

/// A redis-rs connection of the bench's own (the raw runs, stats), bound by [`TIMEOUT`] like
/// the stores: redis-rs's default of 500 ms for a reply would fail a raw run that a busy
/// machine slows, where the stores it is compared with wait 2 s.
pub(crate) async fn connect(url: &str) -> Checked<MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT));
    redis::Client::open(url)
        .map_err(|e| failure!("{url} is not a Redis URL: {e}"))?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| failure!("cannot connect to Redis at {url}: {e}"))
}

pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// A quota the bench spends with its first check of a key: every later check is denied.
pub(crate) fn spent() -> Quota {
    Quota::per_hour(1).expect("a valid quota")
}

/// The builder with the local deny cache on.
pub(crate) fn with_deny_cache(builder: LimiterBuilder) -> Option<LimiterBuilder> {
    Some(builder.deny_cache(DENY_CACHE_KEYS))
}

pub(crate) fn has_deny_cache() -> bool {
    with_deny_cache(Limiter::builder(redlimit::store::MemoryStore::new())).is_some()
}
