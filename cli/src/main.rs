//! `redlimit`, the operator's command for the limiters of a fleet: look at a tenant, change its
//! quotas, suspend it, resume it, reset it, on every instance at once, while they run; list the
//! tenants limited now. See `redlimit --help` and the README's operator section.
//!
//! Exit status: 0 done, 1 Redis or permission trouble, 2 bad arguments.

mod cluster;
mod commands;
mod connect;
mod parse;
mod show;
mod urls;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};
use redlimit::Algorithm;

use connect::{Connection, Redis, Tls};

/// The environment variable read when no `--redis`, `--redis-cluster` or `--sentinel` is given.
const URL_VAR: &str = "REDIS_URL";
/// Where the header secret is read from when neither `--header-secret` nor
/// `--header-secret-file` is given.
const SECRET_VAR: &str = "REDLIMIT_HEADER_SECRET";

#[derive(Parser, Debug)]
#[command(
    name = "redlimit",
    version,
    about = "Look at and control the tenants of redlimit's limiters in Redis, on every instance at once",
    after_help = "KEY is the key as the layer's extractor returns it, e.g. ip:203.0.113.7.\n\
                  A tenant or route stored hashed (a space, braces, over 200 bytes, a leading #)\n\
                  is shown as #<sha256> (# and 64 lower-case hex digits); KEY and --scope take\n\
                  that form to name it (a key of that very form: give its own stored form).\n\
                  DURATION is a whole number and a unit: 500ms, 30s, 10m, 1h.\n\
                  Exit status: 0 done, 1 Redis or permission trouble, 2 bad arguments.\n\
                  On a Cluster, inspect and limited read every slot or exit 1 naming each master\n\
                  they could not read, with its slots and why (and slots no master serves).\n\
                  A quota's period may also be in microseconds: 5µs (or 5us)."
)]
struct Cli {
    #[command(flatten)]
    connection: ConnectionArgs,
    #[command(flatten)]
    key: KeyArgs,
    #[command(subcommand)]
    command: Command,
}

/// Where the limiters' Redis is. Never a default: an operator names the Redis a change goes to.
#[derive(Args, Debug)]
struct ConnectionArgs {
    /// The limiters' Redis [default: $REDIS_URL]
    #[arg(long, value_name = "URL", global = true, conflicts_with_all = ["redis_cluster", "sentinel"])]
    redis: Option<String>,
    /// The limiters' Redis Cluster, any of its nodes; inspect and limited scan every master
    /// (a comma in a password stays in it: the list is cut between URLs)
    #[arg(
        long,
        value_name = "URL,URL,...",
        global = true,
        conflicts_with = "sentinel"
    )]
    redis_cluster: Option<String>,
    /// The sentinels that monitor the limiters' Redis (with --service; a comma in a password
    /// stays in it)
    #[arg(long, value_name = "URL,URL,...", global = true, requires = "service")]
    sentinel: Option<String>,
    /// The name the sentinels monitor the primary under (`sentinel monitor NAME ...`)
    #[arg(long, value_name = "NAME", global = true, requires = "sentinel")]
    service: Option<String>,
    /// A file holding the password of the URL's user (instead of a password in the URL)
    #[arg(long, value_name = "PATH", global = true)]
    password_file: Option<PathBuf>,
    /// The CA certificates (PEM) that sign the server's, for rediss:// (a private CA)
    #[arg(long, value_name = "PATH", global = true)]
    tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) for rediss:// with client authentication, with --tls-key
    #[arg(long, value_name = "PATH", global = true, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM)
    #[arg(long, value_name = "PATH", global = true, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// Which limiter and which of its keys.
#[derive(Args, Debug)]
struct KeyArgs {
    /// The limiters' key prefix [default: redlimit]
    #[arg(long, value_name = "PREFIX", global = true)]
    prefix: Option<String>,
    /// The route: the layer's scope (its policy name when it has one; RateLimitLayer::scope(),
    /// e.g. default:token-bucket:10/60s; #<sha256>, as inspect shows a route stored hashed,
    /// names that stored route) [default: unscoped, as Limiter::check]
    #[arg(long, value_name = "SCOPE", global = true)]
    scope: Option<String>,
    /// set-quota and clear-quota: the override of every route of the key (a route's own
    /// override stays first)
    #[arg(long, global = true)]
    all_routes: bool,
    /// Print JSON
    #[arg(long, global = true)]
    json: bool,
    /// The limiters' algorithm [default: token-bucket]
    #[arg(long, value_name = "NAME", global = true, value_parser = algorithm)]
    algorithm: Option<Algorithm>,
    /// KEY is the value of request header NAME (an API key), hashed as HeaderKey::named(NAME)
    /// hashes it
    #[arg(long, value_name = "NAME", global = true)]
    header: Option<String>,
    /// The secret of HeaderKey::with_secret. On the command line other users see it in `ps`
    /// and it stays in the shell's history: prefer --header-secret-file or
    /// $REDLIMIT_HEADER_SECRET [default: $REDLIMIT_HEADER_SECRET, else none]
    #[arg(long, value_name = "SECRET", global = true)]
    header_secret: Option<String>,
    /// A file holding the secret of HeaderKey::with_secret, byte for byte (a trailing newline
    /// dropped); the way to prefer, with $REDLIMIT_HEADER_SECRET: it shows in no `ps` and no
    /// history [default: $REDLIMIT_HEADER_SECRET, else none]
    #[arg(
        long,
        value_name = "PATH",
        global = true,
        conflicts_with = "header_secret"
    )]
    header_secret_file: Option<PathBuf>,
}

fn algorithm(name: &str) -> Result<Algorithm, String> {
    name.parse()
        .map_err(|e: redlimit::algorithm::UnknownAlgorithm| e.to_string())
}

/// A tenant's key, as the layer's extractor hands it to the limiter (or a header's value).
#[derive(Args, Debug)]
struct Key {
    /// The key, e.g. ip:203.0.113.7 (with --header: the header's value); #<sha256>, as
    /// limited and inspect show a key stored hashed, names that stored key
    #[arg(value_name = "KEY", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    key: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// What the key looks like (override, suspension, state), and every route where it has
    /// state
    Inspect(Key),
    /// The tenants denied now or with under 10 % left: the most constrained tenant first, each
    /// tenant's own row first, then its routes by name (a bounded SCAN of the prefix)
    Limited {
        /// Refresh the list in place every INTERVAL until interrupted
        #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "2s")]
        watch: Option<String>,
    },
    /// Replace the key's quotas on every instance, e.g. 10/1s 500/1m (1 to 8 tiers, checked
    /// together)
    SetQuota {
        #[command(flatten)]
        key: Key,
        /// The tiers: N requests per DURATION (a period also in whole µs: 5µs or 5us), each
        /// followed by `burst B` when at most B at once differs from N; apart by spaces or
        /// commas, so the override inspect prints (10/1s, 500/1h burst 600) is taken as printed
        #[arg(value_name = "N/DURATION", required = true)]
        tiers: Vec<String>,
    },
    /// Back to the callers' own quotas
    ClearQuota(Key),
    /// Deny every request on the key for DURATION (at most 30 days), on every route (with
    /// --scope: on that route only)
    Suspend {
        #[command(flatten)]
        key: Key,
        /// How long, e.g. 10m
        #[arg(value_name = "DURATION")]
        duration: String,
    },
    /// End a suspension
    Resume(Key),
    /// Forget the key's usage on every route (with --scope: on that route only; an override
    /// and a suspension stay)
    Reset(Key),
    /// Print the shell completions of redlimit
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
}

/// Why a command failed: the input (exit 2) or Redis (exit 1); or it stopped because the
/// reader of its output has gone (exit 0, nothing to say).
#[derive(Debug)]
pub enum Failure {
    Input(String),
    Store(String),
    Closed,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        // Written here, not by clap_complete, which panics on a closed stdout.
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "redlimit", &mut script);
        return match commands::emit(&String::from_utf8_lossy(&script)) {
            Ok(()) | Err(Failure::Closed) => ExitCode::SUCCESS,
            Err(Failure::Input(message) | Failure::Store(message)) => {
                eprintln!("error: {message}");
                ExitCode::from(1)
            }
        };
    }
    let mut secrets = Vec::new();
    let result = match request(cli, &mut secrets) {
        Ok((connection, request)) => commands::run(&connection, &request).await,
        Err(failure) => Err(failure),
    };
    let (code, message) = match result {
        Ok(()) | Err(Failure::Closed) => return ExitCode::SUCCESS,
        Err(Failure::Input(message)) => (2, message),
        Err(Failure::Store(message)) => (1, with_acl_hint(message)),
    };
    eprintln!("error: {}", scrubbed(&message, &secrets));
    ExitCode::from(code)
}

/// What the command line asks for, checked.
#[derive(Debug)]
pub struct Request {
    pub prefix: Option<String>,
    pub scope: Option<String>,
    pub all_routes: bool,
    pub json: bool,
    pub algorithm: Algorithm,
    /// The key as the limiter sees it (hashed when `--header` was given).
    pub key: String,
    /// The key as given on the command line (before any hashing), for `--json`.
    pub given: String,
    /// How the key was given, for printing: `x-api-key header "k-123"` or the key itself.
    pub shown: String,
    pub action: Action,
}

/// The command, its arguments parsed.
#[derive(Debug)]
pub enum Action {
    Inspect,
    Limited {
        watch: Option<std::time::Duration>,
    },
    /// Boxed: a `Quotas` holds its tiers inline.
    SetQuota(Box<redlimit::Quotas>),
    ClearQuota,
    Suspend(std::time::Duration),
    Resume,
    Reset,
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure::Input(message.into())
}

/// Checks the command line and reads the files it names; `secrets` gets every password, which
/// no message may show (the header secret only hashes keys: no message holds it).
fn request(cli: Cli, secrets: &mut Vec<String>) -> Result<(Connection, Request), Failure> {
    let connection = connection(cli.connection, secrets)?;
    let KeyArgs {
        prefix,
        scope,
        all_routes,
        json,
        algorithm,
        header,
        header_secret,
        header_secret_file,
    } = cli.key;
    if prefix.as_deref() == Some("") {
        return Err(invalid("--prefix must not be empty"));
    }
    if scope.as_deref() == Some("") {
        return Err(invalid("--scope must not be empty"));
    }
    let (raw_key, action) = match cli.command {
        Command::Limited { watch } => {
            if header.is_some() || scope.is_some() || all_routes {
                return Err(invalid(
                    "limited takes no --header, --scope or --all-routes",
                ));
            }
            let watch = watch.as_deref().map(parse::interval).transpose();
            let watch = watch.map_err(Failure::Input)?;
            (String::new(), Action::Limited { watch })
        }
        Command::Inspect(key) => (key.key, Action::Inspect),
        Command::SetQuota { key, tiers } => {
            let quotas = parse::quotas(&tiers).map_err(Failure::Input)?;
            (key.key, Action::SetQuota(Box::new(quotas)))
        }
        Command::ClearQuota(key) => (key.key, Action::ClearQuota),
        Command::Suspend { key, duration } => {
            let duration = parse::suspension(&duration).map_err(Failure::Input)?;
            (key.key, Action::Suspend(duration))
        }
        Command::Resume(key) => (key.key, Action::Resume),
        Command::Reset(key) => (key.key, Action::Reset),
        Command::Completions { .. } => unreachable!("answered before any check"),
    };
    if all_routes && scope.is_some() {
        return Err(invalid(
            "--all-routes names every route: give it without --scope",
        ));
    }
    if all_routes && !matches!(action, Action::SetQuota(_) | Action::ClearQuota) {
        return Err(invalid(
            "--all-routes is for set-quota and clear-quota only",
        ));
    }
    // A secret in the environment is for the commands that hash; one on the command line
    // without `--header` is a mistake.
    let (key, shown) = match header {
        _ if matches!(action, Action::Limited { .. }) => (String::new(), String::new()),
        Some(name) => {
            let from_env = std::env::var_os(SECRET_VAR).map(|s| s.into_encoded_bytes());
            let from_file = header_secret_file.as_deref().map(secret_file).transpose()?;
            let secret = header_secret
                .map(String::into_bytes)
                .or(from_file)
                .or(from_env);
            let key = parse::header_key(&name, &raw_key, secret).map_err(Failure::Input)?;
            (key, format!("{name} header {raw_key:?}"))
        }
        None if header_secret.is_some() => {
            return Err(invalid("--header-secret needs --header NAME"))
        }
        None if header_secret_file.is_some() => {
            return Err(invalid("--header-secret-file needs --header NAME"))
        }
        None => (raw_key.clone(), format!("{raw_key:?}")),
    };
    let request = Request {
        prefix,
        scope,
        all_routes,
        json,
        algorithm: algorithm.unwrap_or_default(),
        key,
        given: raw_key,
        shown,
        action,
    };
    Ok((connection, request))
}

/// The connection the flags (or `REDIS_URL`) describe, its files read.
fn connection(args: ConnectionArgs, secrets: &mut Vec<String>) -> Result<Connection, Failure> {
    let from_env = args.redis.is_none() && args.redis_cluster.is_none() && args.sentinel.is_none();
    let redis = match (args.redis, args.redis_cluster, args.sentinel, args.service) {
        (Some(url), ..) => Redis::Single(url),
        (None, Some(urls), ..) => Redis::Cluster(url_list("--redis-cluster", &urls)?),
        (None, None, Some(urls), Some(service)) => Redis::Sentinel {
            sentinels: url_list("--sentinel", &urls)?,
            service,
        },
        _ => match std::env::var(URL_VAR) {
            Ok(url) if !url.is_empty() => Redis::Single(url),
            _ => {
                return Err(invalid(format!(
                    "give the limiters' Redis: --redis URL (or --redis-cluster URL,URL,..., \
                     or --sentinel URL,... --service NAME), or set {URL_VAR}"
                )))
            }
        },
    };
    let urls = match &redis {
        Redis::Single(url) => std::slice::from_ref(url),
        Redis::Cluster(urls) => urls.as_slice(),
        Redis::Sentinel { sentinels, .. } => sentinels.as_slice(),
    };
    for url in urls {
        secrets.extend(urls::secrets(url));
    }
    for url in urls {
        if let Err(e) = redis::Client::open(url.as_str()) {
            let flag = match &redis {
                Redis::Single(_) if from_env => URL_VAR,
                Redis::Single(_) => "--redis",
                Redis::Cluster(_) => "--redis-cluster",
                Redis::Sentinel { .. } => "--sentinel",
            };
            let shown = urls::redacted(url);
            return Err(invalid(format!("{flag}: invalid URL {shown}: {e}")));
        }
    }
    let password = match &args.password_file {
        Some(path) => {
            let text = read("--password-file", path)?;
            let text = String::from_utf8(text)
                .map_err(|_| invalid(format!("--password-file {}: not UTF-8", path.display())))?;
            let password = text.trim_end_matches(['\r', '\n']).to_owned();
            if password.is_empty() {
                return Err(invalid(format!(
                    "--password-file {}: empty",
                    path.display()
                )));
            }
            secrets.extend(urls::encoded(&password));
            secrets.push(password.clone());
            Some(password)
        }
        None => None,
    };
    let tls = match (&args.tls_ca, &args.tls_cert, &args.tls_key) {
        (None, None, None) => None,
        (ca, cert, key) => Some(Tls {
            ca: ca.as_deref().map(|p| read("--tls-ca", p)).transpose()?,
            client: match (cert, key) {
                (Some(cert), Some(key)) => {
                    Some((read("--tls-cert", cert)?, read("--tls-key", key)?))
                }
                _ => None,
            },
        }),
    };
    Ok(Connection {
        redis,
        password,
        tls,
    })
}

/// A comma-separated list of URLs, at least one ([`urls::split_list`]: a comma of a password
/// stays in it).
fn url_list(flag: &str, value: &str) -> Result<Vec<String>, Failure> {
    let urls = urls::split_list(value);
    if urls.is_empty() {
        return Err(invalid(format!("{flag} needs at least one URL")));
    }
    Ok(urls)
}

/// The secret in the file of `--header-secret-file`: its bytes, without the newline an
/// editor or `echo` leaves at the end; an empty one is refused (a layer's secret is not empty).
fn secret_file(path: &Path) -> Result<Vec<u8>, Failure> {
    let mut secret = read("--header-secret-file", path)?;
    while secret.last().is_some_and(|b| matches!(b, b'\r' | b'\n')) {
        secret.pop();
    }
    if secret.is_empty() {
        return Err(invalid(format!(
            "--header-secret-file {}: empty",
            path.display()
        )));
    }
    Ok(secret)
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| invalid(format!("{flag} {}: {e}", path.display())))
}

/// `message` with every secret replaced by `***`.
fn scrubbed(message: &str, secrets: &[String]) -> String {
    let mut secrets: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
    // The longest first: a secret may contain another.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut message = message.to_owned();
    for secret in secrets {
        message = message.replace(secret.as_str(), "***");
    }
    message
}

/// A `NOPERM` refusal names the ACL rule the user lacks: `... run the 'scan' command` gets
/// `(the user needs +scan: see the README's operator ACL line)`.
fn with_acl_hint(message: String) -> String {
    const REFUSED: &str = "no permissions to run the '";
    let Some(start) = message.find(REFUSED).map(|at| at + REFUSED.len()) else {
        return message;
    };
    let Some(command) = message[start..].split('\'').next() else {
        return message;
    };
    format!("{message} (the user needs +{command}: see the README's operator ACL line)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn secrets_are_scrubbed_longest_first() {
        let secrets = ["pw".to_owned(), "pw-operator".to_owned(), String::new()];
        assert_eq!(
            scrubbed("WRONGPASS pw-operator and pw", &secrets),
            "WRONGPASS *** and ***"
        );
    }

    #[test]
    fn a_noperm_refusal_names_the_acl_rule() {
        let message =
            "Redis at x: NOPERM User limiter has no permissions to run the 'scan' command";
        assert!(with_acl_hint(message.to_owned())
            .ends_with("(the user needs +scan: see the README's operator ACL line)"));
        assert_eq!(with_acl_hint("refused".to_owned()), "refused");
    }
}
