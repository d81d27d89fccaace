//! An operator's tool for the fleet controls: look at a key, change its quotas, suspend it,
//! resume it, reset it, on every instance at once, while they run.
//!
//! ```text
//! cargo run --example admin -- (--redis URL | --redis-cluster URL,URL,...) (inspect KEY | set-quota KEY N/DURATION [N/DURATION…]
//!     | clear-quota KEY | suspend KEY DURATION | resume KEY | reset KEY | limited)
//!     [--prefix PREFIX] [--scope SCOPE] [--all-routes] [--json] [--algorithm NAME]
//!     [--header NAME] [--header-secret SECRET]
//! ```
//!
//! Each command prints what it did, then what the key now looks like ([`Limiter::inspect`]):
//!
//! ```text
//! $ cargo run --example admin -- --redis redis://127.0.0.1:6379 suspend ip:203.0.113.7 10m
//! suspend: "ip:203.0.113.7" is denied on every instance for 600s
//! key "ip:203.0.113.7" (redlimit:{ip:203.0.113.7})
//!   override: none
//!   suspended: 600.000s left
//!   expires in: 600.000s
//!   state: none stored
//! ```
//!
//! # Which key
//!
//! `KEY` is the key as the layer's extractor hands it to the limiter (the tenant):
//! `ip:203.0.113.7` for [`PeerIp`](redlimit::key::PeerIp), what your closure returns for a
//! `KeyFn`. `suspend`, `resume` and `reset` reach the tenant on every route. A layer keeps its
//! keys in a route of its own, [`RateLimitLayer::scope`](redlimit::RateLimitLayer::scope) (a
//! named layer's policy name; the axum example prints its scope at start): `--scope` names one
//! route for `set-quota`, `clear-quota`, `inspect` (and a suspension or reset of that route
//! only), `--all-routes` every route for `set-quota` and `clear-quota`; without either, the key
//! is the one [`Limiter::check`] uses. `inspect` also lists every route where the key has state
//! (a bounded `SCAN` of its keys); an unknown key or route exits 2. `limited` lists the keys
//! denied now or with under 10 % left, from a bounded `SCAN` of the prefix (routes whose quota
//! the scope or an override names): tenant by tenant, the most constrained tenant first (a
//! suspension, the longest first, then the least share left on any of its routes), and within
//! a tenant its own row (`(every route)`, its suspension) first, then its routes by name. The
//! rows of one tenant never move with the times left, which are read at different moments.
//! `inspect` and `limited` print JSON with `--json`.
//!
//! # A Redis Cluster
//!
//! `--redis-cluster URL,URL,...` (any of its nodes) instead of `--redis URL`: the tool then
//! builds its limiter on [`RedisStore::cluster`], and `inspect` and `limited` find the masters
//! with `CLUSTER NODES` (asked of the first node that answers) and `SCAN` each of them, with
//! `MATCH` and a bounded `COUNT`, over a plain connection to that node: a `SCAN` sent to one node
//! sees only that node's keys, and a tenant's keys may live on any master.
//!
//! An API key is never stored in clear: [`HeaderKey`] hashes it. With `--header NAME`, `KEY` is
//! the header's value as the client sends it (`k-123`), hashed exactly as `HeaderKey::named(NAME)`
//! hashes it in the layer. A layer built with [`HeaderKey::with_secret`] needs the same secret,
//! byte for byte: `--header-secret SECRET`, or better the `REDLIMIT_HEADER_SECRET` environment
//! variable (a flag shows in `ps` and in the shell's history). The example servers use no secret.
//! `--prefix` and `--algorithm` must match the limiters' (`LimiterBuilder::prefix`, `algorithm`).
//!
//! Durations are a whole number and a unit: `500ms`, `30s`, `10m`, `1h`. A suspension lasts at
//! most 30 days ([`MAX_SUSPENSION`]). `set-quota` takes one to eight `N/DURATION` tiers, all
//! checked together (`10/1s 500/1m`); the override lives until `clear-quota`, or until the key
//! has admitted nothing for 30 days ([`OVERRIDE_IDLE_TTL`](redlimit::limiter::OVERRIDE_IDLE_TTL)).
//!
//! A bad command line exits with status 2 and says why; a Redis that fails exits with 1.
//!
//! # Its Redis user
//!
//! The README's operator line (`ACL SETUSER operator ...`): the service's least-privilege line
//! plus `+scan` for `inspect` and `limited`, and on Cluster `+cluster|nodes` besides the
//! service's `+cluster|slots +asking`. The service's own user has no `SCAN`: as that user,
//! `inspect` and `limited` exit 1 with `NOPERM`.

#[allow(dead_code)] // the admin tool uses the parsing helpers, not the servers' layer
mod common;

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use common::cli::{self, CliError};
use common::flags::{set_once, Arg, Args};
use redlimit::key::{HeaderKey, KeyExtractor};
use redlimit::store::{BuildError, RedisStore};
use redlimit::{
    limiter::{ControlError, KeyStatus, StoredKey, MAX_SUSPENSION},
    quota::{QuotaError, MAX_TIERS},
    Algorithm, Limiter, Quota, Quotas, Target,
};

const USAGE: &str = "\
usage: cargo run --example admin -- (--redis URL | --redis-cluster URL,URL,...) [OPTIONS]
       COMMAND

commands:
  inspect KEY                   what the key looks like (override, suspension, state), and
                                every route where it has state
  set-quota KEY N/DURATION...   replace the key's quotas on every instance, e.g. 10/1s 500/1m
                                (1 to 8 tiers, checked together)
  clear-quota KEY               back to the callers' own quotas
  suspend KEY DURATION          deny every request on the key for DURATION (at most 30 days),
                                on every route (with --scope: on that route only)
  resume KEY                    end a suspension
  limited                       the keys denied now or with under 10 % left, the most
                                constrained tenant first, each tenant's own row first, then
                                its routes by name (a bounded SCAN of the prefix)
  reset KEY                     forget the key's usage on every route (with --scope: on that
                                route only; an override and a suspension stay)

KEY is the key as the layer's extractor returns it, e.g. ip:203.0.113.7.
DURATION is a whole number and a unit: 500ms, 30s, 10m, 1h.

options:
  --redis URL               the limiters' Redis (required: no default)
  --redis-cluster URL,URL,...
                            the limiters' Redis Cluster, any of its nodes (instead of
                            --redis); inspect and limited scan every master
  --prefix PREFIX           the limiters' key prefix [default: redlimit]
  --scope SCOPE             the route: the layer's scope (its policy name when it has one;
                            RateLimitLayer::scope(), e.g. default:token-bucket:10/60s)
                            [default: unscoped, as Limiter::check]
  --json                    inspect and limited: print JSON
  --all-routes              set-quota and clear-quota: the override of every route of the key
                            (a route's own override stays first)
  --algorithm NAME          the limiters' algorithm, one of: ALGORITHMS [default: token-bucket]
  --header NAME             KEY is the value of request header NAME (an API key), hashed as
                            HeaderKey::named(NAME) hashes it
  --header-secret SECRET    the secret of HeaderKey::with_secret [default:
                            $REDLIMIT_HEADER_SECRET, else none]
  -h, --help                print this help";

/// Where `--header-secret` is read from when the flag is not given.
const SECRET_VAR: &str = "REDLIMIT_HEADER_SECRET";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let secret_from_env = std::env::var_os(SECRET_VAR).map(|s| s.into_encoded_bytes());
    let request = match parse_args(std::env::args().skip(1), secret_from_env) {
        Ok(request) => request,
        Err(CliError::Help) => {
            println!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(CliError::Invalid(message)) => {
            let hint = if message.ends_with("(see --help)") {
                ""
            } else {
                " (see --help)"
            };
            eprintln!("error: {message}{hint}");
            return ExitCode::from(2);
        }
    };
    match run(&request).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Store(message)) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> String {
    let names: Vec<&str> = Algorithm::ALL.iter().map(Algorithm::name).collect();
    USAGE.replace("ALGORITHMS", &names.join(", "))
}

/// What the command line asks for.
#[derive(Debug)]
struct Request {
    redis: Redis,
    prefix: Option<String>,
    scope: Option<String>,
    all_routes: bool,
    /// Print JSON instead of text (`inspect`, `limited`).
    json: bool,
    algorithm: Algorithm,
    /// The key as the limiter sees it (hashed when `--header` was given).
    key: String,
    /// The key as given on the command line (before any hashing), for `--json`.
    given: String,
    /// How the key was given, for printing: `x-api-key header "k-123"` or the key itself.
    shown: String,
    command: Command,
}

/// The limiters' Redis: `--redis` or `--redis-cluster`.
#[derive(Debug)]
enum Redis {
    Single(String),
    /// The nodes given (any of the cluster's), not necessarily its masters.
    Cluster(Vec<String>),
}

impl Redis {
    /// The URL(s) without passwords, for messages.
    fn shown(&self) -> String {
        match self {
            Redis::Single(url) => cli::redacted(url),
            Redis::Cluster(urls) => {
                let shown: Vec<String> = urls.iter().map(|url| cli::redacted(url)).collect();
                shown.join(",")
            }
        }
    }

    /// The store the limiters use on this Redis.
    fn store(&self) -> Result<RedisStore, BuildError> {
        match self {
            Redis::Single(url) => RedisStore::new(url.as_str()),
            Redis::Cluster(urls) => RedisStore::cluster(urls.iter().map(String::as_str)),
        }
    }

    /// The keys matching `pattern` on every master, by a bounded `SCAN` of each (each call
    /// looks at 1000 keys, so Redis is never blocked).
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, String> {
        let mut keys = Vec::new();
        for client in self.masters().await? {
            let mut connection = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?;
            let mut cursor = 0u64;
            loop {
                let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut connection)
                    .await
                    .map_err(|e| e.to_string())?;
                keys.extend(found);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(keys)
    }

    /// A plain (non-cluster) client for every node that holds keys: the single node, or each
    /// master of the cluster from `CLUSTER NODES`, asked of the first given node that answers.
    async fn masters(&self) -> Result<Vec<redis::Client>, String> {
        let urls = match self {
            Redis::Single(url) => {
                return Ok(vec![
                    redis::Client::open(url.as_str()).map_err(|e| e.to_string())?
                ])
            }
            Redis::Cluster(urls) => urls,
        };
        let mut last_error = String::from("no node given");
        for url in urls {
            let seed = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
            let nodes: String = match seed.get_multiplexed_async_connection().await {
                Ok(mut connection) => match redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut connection)
                    .await
                {
                    Ok(nodes) => nodes,
                    Err(e) => {
                        last_error = format!("CLUSTER NODES at {}: {e}", cli::redacted(url));
                        continue;
                    }
                },
                Err(e) => {
                    last_error = format!("{}: {e}", cli::redacted(url));
                    continue;
                }
            };
            let info = seed.get_connection_info();
            return cluster_masters(&nodes)
                .into_iter()
                .map(|(host, port)| {
                    // The given node's credentials and TLS settings, the master's address.
                    let host = if host.is_empty() {
                        match info.addr() {
                            redis::ConnectionAddr::Tcp(host, _)
                            | redis::ConnectionAddr::TcpTls { host, .. } => host.clone(),
                            _ => host,
                        }
                    } else {
                        host
                    };
                    let addr = match info.addr() {
                        redis::ConnectionAddr::TcpTls {
                            insecure,
                            tls_params,
                            ..
                        } => redis::ConnectionAddr::TcpTls {
                            host,
                            port,
                            insecure: *insecure,
                            tls_params: tls_params.clone(),
                        },
                        _ => redis::ConnectionAddr::Tcp(host, port),
                    };
                    redis::Client::open(info.clone().set_addr(addr)).map_err(|e| e.to_string())
                })
                .collect();
        }
        Err(format!("no node of the cluster answers: {last_error}"))
    }
}

/// The `(host, port)` of every master serving slots in a `CLUSTER NODES` reply (lines of `id
/// host:port@bus[,hostname] flags master ping pong epoch link slot...`); a master marked
/// failed is skipped (its replica takes over its slots and shows as a master).
fn cluster_masters(nodes: &str) -> Vec<(String, u16)> {
    let mut masters = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, address, flags, ..] = fields.as_slice() else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
            continue;
        }
        if fields.len() < 9 {
            continue; // no slots: nothing to scan
        }
        let address = address.split(['@', ',']).next().unwrap_or_default();
        let Some((host, port)) = address.rsplit_once(':') else {
            continue;
        };
        if let Ok(port) = port.parse() {
            masters.push((host.to_owned(), port));
        }
    }
    masters
}

#[derive(Debug)]
enum Command {
    Inspect,
    /// The tenants denied now or with under 10 % left, most constrained first.
    Limited,
    /// Boxed: a `Quotas` holds its tiers inline.
    SetQuota(Box<Quotas>),
    ClearQuota,
    Suspend(Duration),
    Resume,
    Reset,
}

fn invalid(message: impl Into<String>) -> CliError {
    CliError::Invalid(message.into())
}

fn parse_args(
    args: impl IntoIterator<Item = String>,
    secret_from_env: Option<Vec<u8>>,
) -> Result<Request, CliError> {
    let (mut url, mut prefix, mut scope, mut algorithm, mut header, mut secret) =
        (None, None, None, None, None, None);
    let mut cluster: Option<Vec<String>> = None;
    let mut plain = Vec::new();
    let (mut all_routes, mut json) = (false, false);
    let mut args = Args::new(args.into_iter().collect::<Vec<_>>());
    while let Some(arg) = args.next_arg() {
        let (name, inline) = match arg {
            Arg::Plain(value) => {
                plain.push(value);
                continue;
            }
            Arg::Flag { name, .. } if name == "-h" || name == "--help" => {
                return Err(CliError::Help)
            }
            Arg::Flag { name, inline } => (name, inline),
        };
        match name.as_str() {
            "--redis" => set_once(&mut url, &name, args.value(&name, inline)?)?,
            "--redis-cluster" => set_once(
                &mut cluster,
                &name,
                parse_cluster_urls(&args.value(&name, inline)?)?,
            )?,
            "--prefix" => set_once(&mut prefix, &name, args.value(&name, inline)?)?,
            "--scope" => set_once(&mut scope, &name, args.value(&name, inline)?)?,
            "--all-routes" if inline.is_none() => all_routes = true,
            "--json" if inline.is_none() => json = true,
            "--header" => set_once(&mut header, &name, args.value(&name, inline)?)?,
            "--header-secret" => {
                set_once(&mut secret, &name, args.value(&name, inline)?.into_bytes())?
            }
            "--algorithm" => {
                let value: Algorithm = args
                    .value(&name, inline)?
                    .parse()
                    .map_err(|e| invalid(format!("--algorithm: {e}")))?;
                set_once(&mut algorithm, &name, value)?
            }
            other => return Err(invalid(format!("unknown option {other:?}"))),
        }
    }

    // Never a default: an operator names the Redis a change goes to, and only one.
    let redis = match (url, cluster) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "give one of --redis URL and --redis-cluster URL,URL,..., not both",
            ))
        }
        (None, None) => {
            return Err(invalid(
                "give the limiters' Redis: --redis URL (or --redis-cluster URL,URL,...)",
            ))
        }
        (Some(url), None) => {
            redis::Client::open(url.as_str()).map_err(|e| {
                invalid(format!("--redis: invalid URL {}: {e}", cli::redacted(&url)))
            })?;
            Redis::Single(url)
        }
        (None, Some(urls)) => Redis::Cluster(urls),
    };
    if prefix.as_deref() == Some("") {
        return Err(invalid("--prefix must not be empty"));
    }
    if scope.as_deref() == Some("") {
        return Err(invalid("--scope must not be empty"));
    }

    let mut plain = plain.into_iter();
    let Some(verb) = plain.next() else {
        return Err(invalid(
            "give a command: inspect, set-quota, clear-quota, suspend, resume or reset",
        ));
    };
    if verb == "limited" {
        if let Some(extra) = plain.next() {
            return Err(invalid(format!(
                "limited takes no KEY; unexpected {extra:?}"
            )));
        }
        if header.is_some() || scope.is_some() || all_routes {
            return Err(invalid(
                "limited takes no --header, --scope or --all-routes",
            ));
        }
        return Ok(Request {
            redis,
            prefix,
            scope,
            all_routes,
            json,
            algorithm: algorithm.unwrap_or_default(),
            key: String::new(),
            given: String::new(),
            shown: String::new(),
            command: Command::Limited,
        });
    }
    let Some(raw_key) = plain.next().filter(|key| !key.is_empty()) else {
        return Err(invalid(format!("{verb} needs a KEY")));
    };
    let rest: Vec<String> = plain.collect();
    let command = match verb.as_str() {
        "set-quota" => Command::SetQuota(Box::new(parse_quotas(&rest)?)),
        "suspend" => match rest.as_slice() {
            [duration] => Command::Suspend(parse_suspension(duration)?),
            [] => return Err(invalid("suspend needs a DURATION after the KEY, e.g. 10m")),
            _ => return Err(invalid("suspend takes a KEY and one DURATION")),
        },
        "inspect" | "clear-quota" | "resume" | "reset" => {
            if let Some(extra) = rest.first() {
                return Err(invalid(format!(
                    "{verb} takes only a KEY; unexpected {extra:?}"
                )));
            }
            match verb.as_str() {
                "inspect" => Command::Inspect,
                "clear-quota" => Command::ClearQuota,
                "resume" => Command::Resume,
                _ => Command::Reset,
            }
        }
        other => {
            return Err(invalid(format!(
                "unknown command {other:?}: expected inspect, set-quota, clear-quota, suspend, \
                 resume or reset"
            )))
        }
    };

    // A secret in the environment is for the commands that hash; one on the command line
    // without `--header` is a mistake.
    let (key, shown) = match header {
        Some(name) => (
            hashed_header_key(&name, &raw_key, secret.or(secret_from_env))?,
            format!("{name} header {raw_key:?}"),
        ),
        None if secret.is_some() => return Err(invalid("--header-secret needs --header NAME")),
        None => (raw_key.clone(), format!("{raw_key:?}")),
    };
    if all_routes && scope.is_some() {
        return Err(invalid(
            "--all-routes names every route: give it without --scope",
        ));
    }
    if all_routes && !matches!(command, Command::SetQuota(_) | Command::ClearQuota) {
        return Err(invalid(format!(
            "--all-routes is for set-quota and clear-quota, not {verb}"
        )));
    }
    Ok(Request {
        redis,
        prefix,
        scope,
        all_routes,
        json,
        algorithm: algorithm.unwrap_or_default(),
        key,
        given: raw_key,
        shown,
        command,
    })
}

/// `--redis-cluster`'s comma-separated node URLs, checked as the store checks them (the same
/// rules as the servers' `--redis-cluster`).
fn parse_cluster_urls(value: &str) -> Result<Vec<String>, CliError> {
    let urls: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(invalid("--redis-cluster needs at least one URL"));
    }
    RedisStore::cluster(urls.iter().map(String::as_str)).map_err(|e| {
        let shown: Vec<String> = urls.iter().map(|url| cli::redacted(url)).collect();
        invalid(format!(
            "--redis-cluster: invalid URLs {}: {e}",
            shown.join(",")
        ))
    })?;
    for url in &urls {
        redis::Client::open(url.as_str()).map_err(|e| {
            invalid(format!(
                "--redis-cluster: invalid URL {}: {e}",
                cli::redacted(url)
            ))
        })?;
    }
    Ok(urls)
}

/// The key [`HeaderKey`] makes of header `name` carrying `value`, in the layer.
fn hashed_header_key(name: &str, value: &str, secret: Option<Vec<u8>>) -> Result<String, CliError> {
    let extractor = HeaderKey::named(name)
        .map_err(|_| invalid(format!("--header: {name:?} is not a header name")))?;
    let extractor = match secret {
        Some(secret) => extractor.with_secret(secret),
        None => extractor,
    };
    let (parts, ()) = http::Request::builder()
        .header(name, value)
        .body(())
        .map_err(|_| invalid(format!("KEY {value:?} is not a valid {name} header value")))?
        .into_parts();
    extractor
        .extract(&parts)
        .map(|key| key.into_owned())
        .ok_or_else(|| invalid(format!("KEY {value:?} gives no {name} key")))
}

/// `set-quota`'s `N/DURATION` tiers.
fn parse_quotas(args: &[String]) -> Result<Quotas, CliError> {
    if args.is_empty() {
        return Err(invalid(
            "set-quota needs at least one N/DURATION after the KEY, e.g. 10/1s",
        ));
    }
    if args.len() > MAX_TIERS {
        return Err(invalid(format!(
            "set-quota takes at most {MAX_TIERS} N/DURATION tiers, got {}",
            args.len()
        )));
    }
    let quotas = args
        .iter()
        .map(|arg| parse_quota(arg))
        .collect::<Result<Vec<_>, _>>()?;
    Quotas::new(quotas).map_err(|e| invalid(format!("set-quota: {e}")))
}

/// `10/1s`: `N` requests per `DURATION`.
fn parse_quota(arg: &str) -> Result<Quota, CliError> {
    let Some((count, period)) = arg.split_once('/') else {
        return Err(invalid(format!(
            "{arg:?} is not N/DURATION, e.g. 10/1s or 500/1m"
        )));
    };
    let what = format!("{arg:?}");
    let limit = cli::parse_count(&format!("{what}: N"), count)?;
    let period = cli::parse_duration_of(&what, period)?;
    Quota::new(limit, period).map_err(|e| match e {
        QuotaError::ZeroPeriod => invalid(format!("{what}: the period must be more than 0")),
        other => invalid(format!("{what}: {other}")),
    })
}

/// `suspend`'s duration: more than zero, at most [`MAX_SUSPENSION`].
fn parse_suspension(arg: &str) -> Result<Duration, CliError> {
    let duration = cli::parse_duration_of("suspend", arg)?;
    if duration.is_zero() {
        return Err(invalid("suspend: the duration must be more than 0"));
    }
    if duration > MAX_SUSPENSION {
        return Err(invalid(format!(
            "suspend: {arg:?} is longer than the longest suspension, 30 days (720h)"
        )));
    }
    Ok(duration)
}

/// Why a command failed: the input (exit 2) or the store (exit 1).
enum Failure {
    Input(String),
    Store(String),
}

async fn run(request: &Request) -> Result<(), Failure> {
    let shown_url = request.redis.shown();
    let store = request
        .redis
        .store()
        .map_err(|e| Failure::Input(format!("invalid Redis URL {shown_url}: {e}")))?;
    store
        .verify()
        .await
        .map_err(|e| Failure::Store(format!("cannot use the Redis at {shown_url}: {e}")))?;
    let mut builder = Limiter::builder(store.clone()).algorithm(request.algorithm);
    if let Some(prefix) = &request.prefix {
        builder = builder.prefix(prefix.as_str());
    }
    let limiter = builder.build().map_err(|e| Failure::Input(e.to_string()))?;
    if matches!(request.command, Command::Limited) {
        return limited(request, &limiter, &store)
            .await
            .map_err(|e| Failure::Store(format!("Redis at {shown_url}: {e}")));
    }
    let target = match &request.scope {
        Some(scope) => Target::scoped(scope, &request.key),
        None if request.all_routes => Target::all_routes(&request.key),
        None => Target::key(&request.key),
    };
    // Where the key has state: every route, its tenant's controls. An inspect of a key with
    // none at all, or of a route it has no state on, is an input error (nothing to show).
    let mut routes = Vec::new();
    if matches!(request.command, Command::Inspect) {
        let controls;
        (routes, controls) = tenant_routes(request, &limiter)
            .await
            .map_err(|e| Failure::Store(format!("Redis at {shown_url}: {e}")))?;
        if routes.is_empty() && !controls {
            return Err(Failure::Input(format!(
                "unknown tenant {}: no state under this --prefix (check --prefix, --header and \
                 --header-secret)",
                request.shown
            )));
        }
        if let Some(scope) = &request.scope {
            if !routes
                .iter()
                .any(|route| route.as_deref() == Some(scope.as_str()))
            {
                return Err(Failure::Input(format!(
                    "unknown route {scope:?} for {}: it has state on {}",
                    request.shown,
                    routes_text(&routes)
                )));
            }
        }
    }

    let shown = &request.shown;
    let (did, result) = match &request.command {
        Command::Inspect => (String::new(), limiter.inspect(target).await),
        Command::Limited => unreachable!("handled above"),
        Command::SetQuota(quotas) => (
            format!(
                "set-quota: {shown} now uses {} on every instance",
                quotas_text(quotas)
            ),
            limiter.set_quota(target, quotas).await,
        ),
        Command::ClearQuota => (
            format!("clear-quota: {shown} uses its callers' own quotas again"),
            limiter.clear_quota(target).await,
        ),
        Command::Suspend(duration) => (
            format!(
                "suspend: {shown} is denied on every instance for {}",
                duration_text(*duration)
            ),
            limiter.suspend(target, *duration).await,
        ),
        Command::Resume => (
            format!("resume: {shown} is no longer suspended"),
            limiter.resume(target).await,
        ),
        Command::Reset => (
            format!("reset: {shown}'s usage is forgotten (an override and a suspension stay)"),
            limiter.reset(target).await,
        ),
    };
    let status = result.map_err(|error| match error {
        ControlError::Quota(e) => {
            Failure::Input(format!("{e} (for --algorithm {})", request.algorithm))
        }
        ControlError::InvalidDuration => Failure::Input(error.to_string()),
        other => Failure::Store(format!("Redis at {shown_url}: {other}")),
    })?;
    if request.json && matches!(request.command, Command::Inspect) {
        let mut scoped = Vec::new();
        if request.scope.is_none() {
            for scope in routes.iter().flatten() {
                let status = limiter
                    .inspect(Target::scoped(scope, &request.key))
                    .await
                    .map_err(|e| Failure::Store(format!("Redis at {shown_url}: {e}")))?;
                scoped.push((scope.as_str(), status));
            }
        }
        println!(
            "{}",
            inspect_json(request, &limiter.storage_key(target), &status, &scoped)
        );
        return Ok(());
    }
    if !did.is_empty() {
        println!("{did}");
    }
    print!(
        "{}",
        status_text(shown, &limiter.storage_key(target), &status)
    );
    if matches!(request.command, Command::Inspect) && request.scope.is_none() {
        println!("routes: {}", routes_text(&routes));
        for scope in routes.iter().flatten() {
            let status = limiter
                .inspect(Target::scoped(scope, &request.key))
                .await
                .map_err(|e| Failure::Store(format!("Redis at {shown_url}: {e}")))?;
            print!("{}", route_text(scope, &status));
        }
    }
    Ok(())
}

/// The routes where the key has state, by a bounded `SCAN` of its keys (`<prefix>:{<id>}…`):
/// `None` for the unscoped key, `Some(scope)` for each scope; and whether its tenant's controls
/// exist. Never blocks Redis: each `SCAN` call looks at a bounded number of keys (on a
/// Cluster, of every master).
async fn tenant_routes(
    request: &Request,
    limiter: &Limiter,
) -> Result<(Vec<Option<String>>, bool), String> {
    let base = limiter.storage_key(&request.key);
    let tenant_id = match limiter.stored_key(&base) {
        Some(StoredKey::Route { id, .. }) => id,
        _ => unreachable!("a limiter reads its own storage keys"),
    };
    let mut pattern = String::new();
    for c in base.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    let (mut routes, mut controls) = (Vec::new(), false);
    for key in request.redis.scan(&pattern).await? {
        // The pattern also matches the keys of tenants whose id starts with this one's.
        let route = match limiter.stored_key(&key) {
            Some(StoredKey::Tenant { id }) if id == tenant_id => {
                controls = true;
                continue;
            }
            Some(StoredKey::Route { id, scope } | StoredKey::LogControls { id, scope })
                if id == tenant_id =>
            {
                scope.map(str::to_owned)
            }
            _ => continue,
        };
        if !routes.contains(&route) {
            routes.push(route);
        }
    }
    routes.sort();
    Ok((routes, controls))
}

/// `inspect --json`: the key's own status (the route `--scope` names, else the unscoped key)
/// and, without `--scope`, every route where the tenant has state.
fn inspect_json(
    request: &Request,
    storage_key: &str,
    status: &KeyStatus,
    routes: &[(&str, KeyStatus)],
) -> String {
    let routes: Vec<String> = routes
        .iter()
        .map(|(scope, status)| {
            format!(
                "{{\"route\":{},{}}}",
                json_string(scope),
                status_json(status)
            )
        })
        .collect();
    format!(
        "{{\"tenant\":{},\"key\":{},\"storage_key\":{},\"route\":{},{},\"routes\":[{}]}}",
        json_string(&request.given),
        json_string(&request.key),
        json_string(storage_key),
        request
            .scope
            .as_deref()
            .map_or("null".to_owned(), json_string),
        status_json(status),
        routes.join(",")
    )
}

/// A status's fields as JSON members: override, suspension, time to reset, state.
fn status_json(status: &KeyStatus) -> String {
    let millis = |d: Option<Duration>| d.map_or("null".to_owned(), |d| d.as_millis().to_string());
    let tiers: Vec<String> = status
        .tiers
        .iter()
        .map(|tier| json_string(&tier.to_string()))
        .collect();
    format!(
        "\"override\":{},\"suspended_ms\":{},\"reset_after_ms\":{},\"tiers\":[{}],\"log_entries\":{}",
        status
            .quota_override
            .as_ref()
            .map_or("null".to_owned(), |q| json_string(&quotas_text(q))),
        millis(status.suspended_for),
        millis(status.expires_in),
        tiers.join(","),
        status
            .log_entries
            .map_or("null".to_owned(), |n| n.to_string()),
    )
}

/// `the unscoped key, api, login`.
fn routes_text(routes: &[Option<String>]) -> String {
    let names: Vec<String> = routes
        .iter()
        .map(|route| match route {
            None => "(unscoped)".to_owned(),
            Some(scope) => scope.clone(),
        })
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// One route of `inspect`: its override, suspension, expiry and state on one line each.
fn route_text(scope: &str, status: &KeyStatus) -> String {
    let mut text = format!("route {scope}\n");
    let override_text = status
        .quota_override
        .as_ref()
        .map_or("none".to_owned(), quotas_text);
    let _ = writeln!(text, "  override: {override_text}");
    let suspended = status.suspended_for.map_or("no".to_owned(), |left| {
        format!("{} left", seconds_text(left))
    });
    let _ = writeln!(text, "  suspended: {suspended}");
    let reset = status.expires_in.map_or("fresh".to_owned(), |left| {
        format!("in {}", seconds_text(left))
    });
    let _ = writeln!(text, "  back to full: {reset}");
    if status.tiers.is_empty() {
        let _ = writeln!(text, "  remaining: full (none stored)");
    }
    for (i, tier) in status.tiers.iter().enumerate() {
        let _ = writeln!(text, "  state of tier {}: {tier}", i + 1);
    }
    if let Some(entries) = status.log_entries {
        let _ = writeln!(text, "  sliding log entries: {entries}");
    }
    text
}

/// What a key looks like, one fact a line.
fn status_text(shown: &str, storage_key: &str, status: &KeyStatus) -> String {
    let mut text = format!("key {shown} ({storage_key})\n");
    let _ = writeln!(
        text,
        "  override: {}",
        status
            .quota_override
            .as_ref()
            .map_or("none".to_owned(), quotas_text)
    );
    let _ = writeln!(
        text,
        "  suspended: {}",
        status.suspended_for.map_or("no".to_owned(), |left| format!(
            "{} left",
            seconds_text(left)
        ))
    );
    let _ = writeln!(
        text,
        "  expires in: {}",
        status
            .expires_in
            .map_or("nothing stored".to_owned(), seconds_text)
    );
    if status.tiers.is_empty() {
        let _ = writeln!(text, "  state: none stored");
    }
    for (i, tier) in status.tiers.iter().enumerate() {
        let _ = writeln!(text, "  state of tier {}: {tier}", i + 1);
    }
    if let Some(entries) = status.log_entries {
        let _ = writeln!(text, "  sliding log entries: {entries}");
    }
    text
}

/// `10/1s, 500/1m`, the way `set-quota` takes them (with ` burst B` when it differs).
fn quotas_text(quotas: &Quotas) -> String {
    let tiers: Vec<String> = quotas
        .iter()
        .map(|quota| {
            let mut text = format!("{}/{}", quota.limit(), duration_text(quota.period()));
            if quota.burst() != quota.limit() {
                let _ = write!(text, " burst {}", quota.burst());
            }
            text
        })
        .collect();
    tiers.join(", ")
}

/// A duration in the largest unit that shows it whole: `1h`, `10m`, `30s`, `500ms`, `5µs`.
fn duration_text(duration: Duration) -> String {
    let micros = duration.as_micros();
    for (unit, size) in [
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1_000),
    ] {
        if micros >= size && micros.is_multiple_of(size) {
            return format!("{}{unit}", micros / size);
        }
    }
    format!("{micros}µs")
}

/// A time left, to the millisecond, `59.998s`; beyond an hour also in days, hours and minutes:
/// `2591999.998s (29d 23h 59m)`.
fn seconds_text(duration: Duration) -> String {
    let mut text = format!("{:.3}s", duration.as_secs_f64());
    let minutes = duration.as_secs() / 60;
    if minutes >= 60 {
        let (days, hours) = (minutes / (24 * 60), minutes / 60 % 24);
        let _ = write!(text, " ({days}d {hours}h {}m)", minutes % 60);
    }
    text
}

/// One constrained route of `limited`.
struct Limited {
    tenant: String,
    route: String,
    remaining: u64,
    limit: u64,
    reset_after: Duration,
    suspended: Option<Duration>,
}

/// The quotas a layer's derived scope names (`default:token-bucket:100/60s+5/1s:b10`) and its
/// algorithm; `None` for a scope that does not name them (a policy name).
fn scope_quotas(scope: &str) -> Option<(Algorithm, Quotas)> {
    let mut parts = scope.splitn(3, ':');
    let (_, algorithm, tiers) = (parts.next()?, parts.next()?, parts.next()?);
    let algorithm: Algorithm = algorithm.parse().ok()?;
    let quotas = tiers
        .split('+')
        .map(|tier| {
            let (tier, burst) = match tier.split_once(":b") {
                Some((tier, burst)) => (tier, Some(burst.parse().ok()?)),
                None => (tier, None),
            };
            let (limit, period) = tier.split_once('/')?;
            let limit: u64 = limit.parse().ok()?;
            let micros: u64 = match period.strip_suffix("us") {
                Some(us) => us.parse().ok()?,
                None => period.strip_suffix('s')?.parse::<u64>().ok()? * 1_000_000,
            };
            Quota::new(limit, Duration::from_micros(micros))
                .and_then(|quota| quota.with_burst(burst.unwrap_or(limit)))
                .ok()
        })
        .collect::<Option<Vec<_>>>()?;
    Some((algorithm, Quotas::new(quotas).ok()?))
}

/// `limited`: a bounded `SCAN` of the prefix (each call looks at 1000 keys, so Redis is never
/// blocked), then a peek (cost 0, nothing written) at every route whose quotas are known (a
/// derived scope names them; a route's override too) and a look at every tenant's suspension.
/// On a Cluster it scans every master.
async fn limited(request: &Request, limiter: &Limiter, store: &RedisStore) -> Result<(), String> {
    let prefix = request
        .prefix
        .as_deref()
        .unwrap_or(redlimit::limiter::DEFAULT_PREFIX);
    // Every storage key of this limiter starts as the empty key's does, up to its hash tag.
    let base = limiter.storage_key("");
    let head = base.split_once('{').map_or(base.as_str(), |(head, _)| head);
    let pattern = format!("{}{{*", head.replace('[', "\\[").replace('*', "\\*"));
    let mut found = Vec::new();
    for key in request.redis.scan(&pattern).await? {
        match limiter.stored_key(&key) {
            // A hashed id cannot be named back to its key: skipped.
            Some(StoredKey::Tenant { id }) if !id.starts_with('#') => {
                found.push((id.to_owned(), None));
            }
            Some(StoredKey::Route { id, scope }) if !id.starts_with('#') => {
                found.push((id.to_owned(), Some(scope.map(str::to_owned))));
            }
            _ => {}
        }
    }
    // SCAN may return a key more than once.
    found.sort();
    found.dedup();
    let mut rows = Vec::new();
    for (tenant, route) in found {
        let Some(route) = route else {
            // The tenant's controls: a suspension of every route.
            let status = limiter
                .inspect(tenant.as_str())
                .await
                .map_err(|e| e.to_string())?;
            if let Some(left) = status.suspended_for {
                rows.push(Limited {
                    tenant,
                    route: EVERY_ROUTE.to_owned(),
                    remaining: 0,
                    limit: 0,
                    reset_after: left,
                    suspended: Some(left),
                });
            }
            continue;
        };
        let target = match &route {
            Some(scope) => Target::scoped(scope, &tenant),
            None => Target::key(&tenant),
        };
        let status = limiter.inspect(target).await.map_err(|e| e.to_string())?;
        let known = route.as_deref().and_then(scope_quotas);
        let (algorithm, quotas) = match (&status.quota_override, known) {
            (Some(over), known) => (known.map_or(request.algorithm, |(a, _)| a), *over),
            (None, Some(known)) => known,
            (None, None) => continue,
        };
        let peeker = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .prefix(prefix)
            .build()
            .map_err(|e| e.to_string())?;
        let decision = match &route {
            Some(scope) => {
                peeker
                    .check_quotas(Target::scoped(scope, &tenant), &quotas, 0)
                    .await
            }
            None => peeker.check_quotas(&tenant, &quotas, 0).await,
        };
        let Some(decision) = decision.decision().copied() else {
            continue;
        };
        let suspended = decision.suspended.then_some(decision.retry_after);
        if suspended.is_some() || decision.remaining * 10 < decision.limit {
            rows.push(Limited {
                tenant,
                route: route.unwrap_or_else(|| "(unscoped)".to_owned()),
                remaining: decision.remaining,
                limit: decision.limit,
                reset_after: decision.reset_after,
                suspended,
            });
        }
    }
    let rows = by_constraint(rows);
    if request.json {
        let items: Vec<String> = rows
            .iter()
            .map(|row| {
                format!(
                    "{{\"tenant\":{},\"route\":{},\"remaining\":{},\"limit\":{},\"reset_after_ms\":{},\"suspended_ms\":{}}}",
                    json_string(&row.tenant),
                    json_string(&row.route),
                    row.remaining,
                    row.limit,
                    row.reset_after.as_millis(),
                    row.suspended.map_or("null".to_owned(), |s| s.as_millis().to_string()),
                )
            })
            .collect();
        println!("[{}]", items.join(","));
        return Ok(());
    }
    if rows.is_empty() {
        println!("no key is denied or under 10 % left");
    }
    for row in rows {
        match row.suspended {
            Some(left) => println!(
                "{} {}: suspended, {} left",
                row.tenant,
                row.route,
                seconds_text(left)
            ),
            None => println!(
                "{} {}: {} of {} left, full again in {}",
                row.tenant,
                row.route,
                row.remaining,
                row.limit,
                seconds_text(row.reset_after)
            ),
        }
    }
    Ok(())
}

/// A tenant's own row (its suspension of every route).
const EVERY_ROUTE: &str = "(every route)";

/// The rows tenant by tenant, the most constrained tenant first: by its most constrained row
/// (suspended, longest first, in whole ms; then the least share left), ties by name. Within a
/// tenant, its own row first, then its routes by name: an order no clock can flip, although
/// the tenant's row and a suspended route's row are read at different moments.
fn by_constraint(rows: Vec<Limited>) -> Vec<Limited> {
    let mut tenants: std::collections::BTreeMap<String, Vec<Limited>> = Default::default();
    for row in rows {
        tenants.entry(row.tenant.clone()).or_default().push(row);
    }
    let mut groups: Vec<Vec<Limited>> = tenants.into_values().collect();
    for group in &mut groups {
        group.sort_by(|a, b| {
            (b.route == EVERY_ROUTE)
                .cmp(&(a.route == EVERY_ROUTE))
                .then_with(|| a.route.cmp(&b.route))
        });
    }
    // Every group holds a row; the `BTreeMap` already ordered them by name.
    fn most(group: &[Limited]) -> Option<&Limited> {
        group.iter().min_by(|a, b| more_constrained(a, b))
    }
    groups.sort_by(|a, b| match (most(a), most(b)) {
        (Some(a), Some(b)) => more_constrained(a, b),
        _ => std::cmp::Ordering::Equal,
    });
    groups.into_iter().flatten().collect()
}

/// Which of two rows is more constrained: a suspension (the longer in whole ms: a peek's
/// `retry_after` is rounded up, a tenant's time left is exact), then the smaller share left.
fn more_constrained(a: &Limited, b: &Limited) -> std::cmp::Ordering {
    let ms = |d: &Option<Duration>| d.map(|d| d.as_micros().div_ceil(1000));
    let share =
        |row: &Limited, other: &Limited| u128::from(row.remaining) * u128::from(other.limit.max(1));
    ms(&b.suspended)
        .cmp(&ms(&a.suspended))
        .then_with(|| share(a, b).cmp(&share(b, a)))
}

/// `value` as a JSON string.
fn json_string(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
