//! What the command line asks for: the parsed [`Options`], and what it asks for instead of
//! running ([`CliError`]).

use std::fmt;
use std::net::SocketAddr;

use redlimit::{Algorithm, Quota};

/// What differs between the examples that share this command line.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// The example's name, as in `cargo run --example NAME`.
    pub name: &'static str,
    /// `--bind`'s default.
    pub default_bind: &'static str,
    /// What a rejection looks like, for `--on-redis-error`'s help ("503", "UNAVAILABLE").
    pub closed_answer: &'static str,
    /// Whether the example takes `--metrics-bind ADDR`.
    pub serves_metrics: bool,
}

/// The parsed command line.
#[derive(Debug)]
pub struct Options {
    pub bind: SocketAddr,
    pub backend: Backend,
    /// `--redis-ca`: a private CA (PEM) for `rediss://`.
    pub redis_ca: Option<Vec<u8>>,
    /// `--metrics-bind`: where to serve `/metrics` (only examples with `serves_metrics`).
    #[allow(dead_code)] // read by the axum example only
    pub metrics_bind: Option<SocketAddr>,
    pub quota: Quota,
    pub algorithm: Algorithm,
    pub on_redis_error: OnRedisError,
    /// `--key`: who a client is.
    pub key: KeyChoice,
    /// `--shadow`: decide and count, never deny.
    pub shadow: bool,
}

/// `--key`: what the layer counts a client by.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum KeyChoice {
    /// `ip` (the default): the client's IP address, which a client cannot choose.
    #[default]
    Ip,
    /// `api-key`: the `x-api-key` header (hashed), else the IP address. Only for a server
    /// behind a layer that has authenticated the header.
    ApiKey,
}

/// Where decisions are made. A new Redis topology is one more variant here, its flag in
/// `parse_args` (through [`Backend::set`]) and its store in `store::limiter`.
#[derive(Debug, PartialEq)]
pub enum Backend {
    /// No store flag: the Redis at `REDIS_URL` or the default URL if it answers, else memory.
    Auto,
    /// `--redis URL`: this Redis, whatever happens.
    Redis(String),
    /// `--redis-cluster URL,URL,...`: this Redis Cluster, whatever happens.
    Cluster(Vec<String>),
    /// `--redis-sentinel URL,URL,... --sentinel-master NAME`: the primary these sentinels name
    /// `master`, whatever happens.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

impl Backend {
    /// Sets the store flag's backend: only one store flag, given once.
    pub(super) fn set(&mut self, backend: Backend) -> Result<(), CliError> {
        if *self != Backend::Auto {
            return Err(invalid(
                "give one of --redis, --redis-cluster and --redis-sentinel, once",
            ));
        }
        *self = backend;
        Ok(())
    }
}

/// `--on-redis-error`: the limiter's failure policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OnRedisError {
    /// `FailOpen`: admit.
    Open,
    /// `FailClosed`: reject (503, gRPC UNAVAILABLE).
    Closed,
    /// `LocalFallback::new(instances)`: an in-memory limiter with `1/instances` of each quota.
    Local { instances: u64 },
}

impl fmt::Display for OnRedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OnRedisError::Open => f.write_str("open"),
            OnRedisError::Closed => f.write_str("closed"),
            OnRedisError::Local { instances } => write!(f, "local (instances {instances})"),
        }
    }
}

/// What the command line asked for instead of running.
#[derive(Debug)]
pub enum CliError {
    Help,
    Invalid(String),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Help => f.write_str("help requested"),
            CliError::Invalid(message) => f.write_str(message),
        }
    }
}

/// A usage error saying `message`.
pub fn invalid(message: impl Into<String>) -> CliError {
    CliError::Invalid(message.into())
}
