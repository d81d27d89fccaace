//! The help text (`--help`), and what the process does with the command line: the options, or
//! the help or an error and an exit status.

use std::env;
use std::io::IsTerminal;
use std::process::ExitCode;

use redlimit::Algorithm;

use super::{parse_args, CliError, Options, Program};

const USAGE: &str = "\
usage: cargo run --example NAME -- [OPTIONS]

options:
  --bind ADDR                   address to listen on [default: BIND]
  --redis URL                   use this Redis, never the in-memory store
                                [default: $REDIS_URL or redis://127.0.0.1:6379 if it answers,
                                otherwise the in-memory store]
  --redis-cluster URL,URL,...   use this Redis Cluster (any of its nodes), never the
                                in-memory store
  --redis-sentinel URL,URL,...  use the primary these Redis Sentinels name (with
                                --sentinel-master), never the in-memory store
  --sentinel-master NAME        the name the sentinels monitor the primary under
                                (`sentinel monitor NAME ...`); needs --redis-sentinel
  --redis-ca FILE               trust this CA (PEM) for rediss:// URLs instead of the
                                system's roots
  --limit N                     requests per period and client [default: 10]
  --period DURATION             e.g. 500ms, 1s, 60s, 1m, 1h [default: 60s]
  --burst N                     requests allowed at once [default: the limit]
  --algorithm NAME              one of: ALGORITHMS [default: token-bucket]
  --on-redis-error POLICY       when Redis fails: open (admit), closed (answer CLOSED) or
                                local (an in-memory limiter with 1/N of each quota)
                                [default: open]
  --instances N                 with --on-redis-error local: how many instances share the
                                quota [default: 1]
  --key ip|api-key              who a client is: ip, its IP address; api-key, its x-api-key
                                header (gRPC: metadata), else its IP address. Use api-key only
                                behind a layer that has authenticated the key: unchecked, a
                                client sending a fresh key per request gets a fresh quota
                                [default: ip]
  --shadow                      shadow mode: decide and count every request, deny none (a
                                would-be denial is counted as shadow_limited; no RateLimit
                                headers)
METRICS  -h, --help                    print this help

A client is its IP address (--key ip), or its authenticated x-api-key (--key api-key).
Each flag is given at most once.";

/// The `--metrics-bind` line of the usage, for the examples that serve metrics.
const METRICS_USAGE: &str = concat!(
    "  --metrics-bind ADDR           serve Prometheus metrics at http://ADDR/metrics\n",
    "                                [default: no metrics]\n",
);

/// The usage text, with this build's algorithms.
pub fn usage(program: &Program) -> String {
    let names: Vec<&str> = Algorithm::ALL.iter().map(Algorithm::name).collect();
    USAGE
        .replace("--example NAME", &format!("--example {}", program.name))
        .replace("BIND", program.default_bind)
        .replace("CLOSED", program.closed_answer)
        .replace(
            "METRICS",
            if program.serves_metrics {
                METRICS_USAGE
            } else {
                ""
            },
        )
        .replace("ALGORITHMS", &names.join(", "))
}

/// The options from the process's arguments; on `--help` or a bad flag, what to exit with
/// (after printing the usage, or the error on stderr).
pub fn options_or_exit(program: &Program) -> Result<Options, ExitCode> {
    match parse_args(program, env::args().skip(1)) {
        Ok(options) => Ok(options),
        Err(CliError::Help) => {
            println!("{}", usage(program));
            Err(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("error: {error}");
            Err(ExitCode::from(2))
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), without colour codes unless stderr
/// is a terminal.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
