//! How the bench stops when it cannot stand behind its figures: a [`Failure`] says what went
//! wrong, `main` prints it and exits with status 1, after every server the bench started is
//! stopped (a panic would say less, and `process::exit` would leave the servers running).

use std::fmt;

/// Why the bench stopped.
#[derive(Debug)]
pub(crate) struct Failure(pub(crate) String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a step of the bench gives, or why the bench stops.
pub(crate) type Checked<T = ()> = Result<T, Failure>;

/// Stops the bench with a formatted [`Failure`] unless the condition holds.
macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err($crate::failure::Failure(format!($($message)+)));
        }
    };
}
pub(crate) use ensure;

/// A formatted [`Failure`].
macro_rules! failure {
    ($($message:tt)+) => {
        $crate::failure::Failure(format!($($message)+))
    };
}
pub(crate) use failure;
