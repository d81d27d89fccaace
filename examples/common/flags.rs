//! A small command-line reader for the examples whose arguments are not the servers' (the fleet
//! example): `--flag value`, `--flag=value`, plain arguments, and `--` before plain
//! arguments that start with `-`.
#![allow(dead_code)] // each example uses only what it needs

use super::cli::CliError;

/// One argument: a flag (with its `=value` when given inline) or a plain argument.
#[derive(Debug, PartialEq)]
pub enum Arg {
    /// `--name` or `--name=value` (also `-h`).
    Flag {
        name: String,
        inline: Option<String>,
    },
    /// Anything else, and everything after `--`.
    Plain(String),
}

/// The arguments, one [`Arg`] at a time; a flag's value is taken with [`Args::value`].
#[derive(Debug)]
pub struct Args<I> {
    rest: I,
    only_plain: bool,
}

impl<I: Iterator<Item = String>> Args<I> {
    pub fn new(args: impl IntoIterator<IntoIter = I>) -> Self {
        Args {
            rest: args.into_iter(),
            only_plain: false,
        }
    }

    /// The next argument, or `None` at the end.
    pub fn next_arg(&mut self) -> Option<Arg> {
        let arg = self.rest.next()?;
        if self.only_plain || !arg.starts_with('-') || arg == "-" {
            return Some(Arg::Plain(arg));
        }
        if arg == "--" {
            self.only_plain = true;
            return self.next_arg();
        }
        Some(match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => Arg::Flag {
                name: name.to_owned(),
                inline: Some(value.to_owned()),
            },
            _ => Arg::Flag {
                name: arg,
                inline: None,
            },
        })
    }

    /// The value of flag `name`: its inline `=value`, else the next argument.
    pub fn value(&mut self, name: &str, inline: Option<String>) -> Result<String, CliError> {
        inline
            .or_else(|| self.rest.next())
            .ok_or_else(|| CliError::Invalid(format!("{name} needs a value (see --help)")))
    }
}

/// A flag given twice is a mistake, not "the last one wins".
pub fn set_once<T>(slot: &mut Option<T>, name: &str, value: T) -> Result<(), CliError> {
    if slot.is_some() {
        return Err(CliError::Invalid(format!("give {name} once")));
    }
    *slot = Some(value);
    Ok(())
}
