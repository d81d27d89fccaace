//! The examples' command lines, read from a table: each [`Flag`] is a name, its value's
//! placeholder (none for a switch) and its help line, from which the usage text is made too.
//! Values come as the next argument or after `=` (`--limit 5`, `--limit=5`), each flag at most
//! once: a flag given twice is refused, never "the last one wins".
#![allow(dead_code)] // each example uses what it needs

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

/// One flag of a table: `--name VALUE  help`.
pub struct Flag {
    pub name: &'static str,
    /// The value's placeholder in the usage (`N`, `URL`); `None` for a switch.
    pub value: Option<&'static str>,
    pub help: &'static str,
}

/// A flag with a value.
pub const fn flag(name: &'static str, value: &'static str, help: &'static str) -> Flag {
    Flag {
        name,
        value: Some(value),
        help,
    }
}

/// A switch: a flag without a value.
pub const fn switch(name: &'static str, help: &'static str) -> Flag {
    Flag {
        name,
        value: None,
        help,
    }
}

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
    values: HashMap<&'static str, String>,
    pub plain: Vec<String>,
}

/// Reads `args` against `table`.
pub fn read(table: &[Flag], args: impl IntoIterator<Item = String>) -> Result<Given, CliError> {
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
        let Some(flag) = table.iter().find(|flag| flag.name == name) else {
            return Err(invalid(format!("unknown argument {name:?} (see --help)")));
        };
        let value = match (flag.value, inline) {
            (None, None) => String::new(),
            (None, Some(_)) => return Err(invalid(format!("{name} takes no value"))),
            (Some(_), Some(value)) => value,
            (Some(_), None) => args
                .next()
                .ok_or_else(|| invalid(format!("{name} needs a value (see --help)")))?,
        };
        if given.values.insert(flag.name, value).is_some() {
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
        self.get(name)
            .map_or(Ok(default), |value| count(name, value))
    }

    /// `500ms`, `1s`, `1m`: [`redlimit::quota::parse_duration`], `default` when not given.
    pub fn duration(&self, name: &str, default: Duration) -> Result<Duration, CliError> {
        self.get(name).map_or(Ok(default), |value| {
            redlimit::quota::parse_duration(value).map_err(|e| invalid(format!("{name}: {e}")))
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

/// A count of at least 1.
pub fn count(name: &str, value: &str) -> Result<u64, CliError> {
    match value.parse::<u64>() {
        Ok(0) => Err(invalid(format!("{name} must be at least 1"))),
        Ok(n) => Ok(n),
        Err(_) => Err(invalid(format!("{name}: {value:?} is not a whole number"))),
    }
}

/// The usage text: `head`, then one line per flag of `table`.
pub fn usage(head: &str, table: &[Flag]) -> String {
    let mut text = format!("{head}\n\noptions:\n");
    for flag in table {
        let left = format!("{} {}", flag.name, flag.value.unwrap_or(""));
        text += &format!("  {left:<29} {}\n", flag.help);
    }
    text + "  -h, --help                    print this help"
}

/// `parsed`, or what to exit with: the usage on `--help` (status 0), the error on stderr (2).
pub fn or_exit<T>(parsed: Result<T, CliError>, usage: impl Fn() -> String) -> Result<T, ExitCode> {
    match parsed {
        Ok(options) => Ok(options),
        Err(CliError::Help) => {
            println!("{}", usage());
            Err(ExitCode::SUCCESS)
        }
        Err(CliError::Invalid(message)) => {
            eprintln!("error: {message}");
            Err(ExitCode::from(2))
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
