//! The examples' command lines, read from their usage text, so help and parser cannot disagree:
//! a usage line `--NAME VALUE  help` declares a flag with a value, `--NAME  help` a switch. A value
//! comes next or after `=` (`--limit 5`, `--limit=5`); a flag given twice is refused.
#![allow(dead_code)] // each example uses what it needs

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use redlimit::quota::QuotaError;
use redlimit::Quota;

/// What the command line asked for instead of running: the help, or a usage error (status 2).
#[derive(Debug)]
pub enum CliError {
    Help,
    Invalid(String),
}

/// A usage error saying `message`.
pub fn invalid(message: impl Into<String>) -> CliError {
    CliError::Invalid(message.into())
}

/// The flags given (by name) and the plain arguments.
#[derive(Debug, Default)]
pub struct Given {
    values: HashMap<String, String>,
    pub plain: Vec<String>,
}

/// Reads `args` against the flags `usage` declares.
pub fn read(usage: &str, args: impl IntoIterator<Item = String>) -> Result<Given, CliError> {
    let mut given = Given::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Err(CliError::Help);
        }
        if !arg.starts_with('-') {
            given.plain.push(arg);
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (arg.as_str(), None),
        };
        // `--NAME VALUE  help` or `--NAME  help`: whether the declaration names a value.
        let declared = usage.lines().map(str::trim_start).find_map(|line| {
            let declaration = line.split("  ").next()?;
            let (flag, value) = declaration.split_once(' ').unwrap_or((declaration, ""));
            (flag == name).then_some((!value.is_empty()).then_some(value))
        });
        let Some(takes_value) = declared else {
            return Err(invalid(format!("unknown argument {name:?} (see --help)")));
        };
        let value = match (takes_value, inline) {
            (None, None) => String::new(),
            (None, Some(_)) => return Err(invalid(format!("{name} takes no value"))),
            (Some(_), Some(value)) => value,
            (Some(_), None) => args
                .next()
                .ok_or_else(|| invalid(format!("{name} needs a value (see --help)")))?,
        };
        if given.values.insert(name.to_owned(), value).is_some() {
            return Err(invalid(format!("give {name} once")));
        }
    }
    Ok(given)
}

impl Given {
    /// The value of `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether switch (or flag) `name` was given.
    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// A count of at least 1, `default` when not given.
    pub fn count(&self, name: &str, default: u64) -> Result<u64, CliError> {
        let Some(value) = self.get(name) else {
            return Ok(default);
        };
        match value.parse::<u64>() {
            Ok(0) => Err(invalid(format!("{name} must be at least 1"))),
            Ok(n) => Ok(n),
            Err(_) => Err(invalid(format!("{name}: {value:?} is not a whole number"))),
        }
    }

    /// `500ms`, `1s`, `1m`: [`redlimit::quota::parse_duration`], `default` when not given.
    pub fn duration(&self, name: &str, default: Duration) -> Result<Duration, CliError> {
        self.get(name).map_or(Ok(default), |value| {
            redlimit::quota::parse_duration(value).map_err(|e| invalid(format!("{name}: {e}")))
        })
    }

    /// Refuses plain arguments: the program takes flags only.
    pub fn no_plain(&self) -> Result<(), CliError> {
        match self.plain.first() {
            Some(plain) => Err(invalid(format!(
                "unexpected argument {plain:?} (see --help)"
            ))),
            None => Ok(()),
        }
    }

    /// The value of `name`, one of `choices`; the first when not given.
    pub fn one_of<'a>(&'a self, name: &str, choices: &[&'a str]) -> Result<&'a str, CliError> {
        let value = self.get(name).unwrap_or(choices[0]);
        if choices.contains(&value) {
            return Ok(value);
        }
        let (last, rest) = choices.split_last().expect("choices");
        let expected = format!("{} or {last}", rest.join(", "));
        let message = format!("{name}: expected {expected}, got {value:?}");
        Err(invalid(message))
    }

    /// A count from 1 to `max`, `default` when not given.
    pub fn count_at_most(&self, name: &str, default: u64, max: u64) -> Result<u64, CliError> {
        match self.count(name, default)? {
            n if n > max => Err(invalid(format!("{name}: at most {max}"))),
            n => Ok(n),
        }
    }

    /// `--limit` and `--period` as a [`Quota`], an error naming the flag at fault.
    pub fn quota(&self, limit: u64, period: Duration) -> Result<Quota, CliError> {
        let period = self.duration("--period", period)?;
        Quota::new(self.count("--limit", limit)?, period).map_err(|e| match e {
            QuotaError::ZeroPeriod | QuotaError::PeriodTooLong => invalid(format!("--period: {e}")),
            _ => invalid(format!("--limit: {e}")),
        })
    }

    /// The value parsed by `FromStr` (an address, an algorithm), `default` when not given.
    pub fn parsed<T: std::str::FromStr>(&self, name: &str, default: &str) -> Result<T, CliError>
    where
        T::Err: std::fmt::Display,
    {
        let value = self.get(name).unwrap_or(default);
        value
            .parse()
            .map_err(|e| invalid(format!("{name}: {value:?}: {e}")))
    }
}

/// `parsed`, or what to exit with: the usage on `--help` (status 0), the error on stderr (2).
pub fn or_exit<T>(parsed: Result<T, CliError>, usage: &str) -> Result<T, ExitCode> {
    match parsed {
        Ok(options) => Ok(options),
        Err(CliError::Help) => {
            println!("{usage}");
            Err(ExitCode::SUCCESS)
        }
        Err(CliError::Invalid(message)) => {
            eprintln!("error: {message}");
            Err(ExitCode::from(2))
        }
    }
}

/// A program's `main` after its arguments were read into `parsed`: what [`or_exit`] exits with,
/// else `run` with the options, and the [`exit_code`] of its end.
pub async fn main<T, F, E>(
    usage: &str,
    parsed: Result<T, CliError>,
    run: impl FnOnce(T) -> F,
) -> ExitCode
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    match or_exit(parsed, usage) {
        Ok(options) => exit_code(run(options).await),
        Err(code) => code,
    }
}

/// The status of a run that ended: success, or its error printed and failure.
pub fn exit_code(ran: Result<(), impl std::fmt::Display>) -> ExitCode {
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `url` without its password, for printing.
pub fn redacted(url: &str) -> String {
    match url
        .split_once("://")
        .and_then(|(s, rest)| Some((s, rest.rsplit_once('@')?)))
    {
        Some((scheme, (user_info, host))) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// The Redis to try when no store flag is given: `REDIS_URL`, or `redis://127.0.0.1:6379`.
pub fn default_redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Whether a Redis at `url` answers PING within 300 ms.
pub async fn redis_answers(url: &str) -> bool {
    let ping = async {
        let client = redis::Client::open(url)?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
    };
    let timeout = Duration::from_millis(300);
    matches!(tokio::time::timeout(timeout, ping).await, Ok(Ok(_)))
}
