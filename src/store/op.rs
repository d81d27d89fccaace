//! The one seam between the stores and the crate's script calls: [`ScriptOp`].
//!
//! Each kind of script call (a decision, a fleet control, a refund, ...) is an operation of its
//! own, in a file named after it (`ops/`, and the batch's in `redis/batch.rs`): which script it
//! runs, the keys and arguments it writes, and how it reads the reply. The Redis store runs any
//! operation through one path (`EVALSHA`, a load on `NOSCRIPT`, Cluster's resends), and lists
//! none of them.

use std::sync::LazyLock;

use crate::store::contract::{CheckRequest, StoreError};

/// One kind of script call, as the Redis store runs it. Crate-private, so sealed: only the
/// crate's own operations exist.
///
/// An operation is a small borrowed value (its request's references), built per call on the
/// stack and passed by reference: no box, no allocation of its own.
pub(crate) trait ScriptOp {
    /// What its reply reads as.
    type Output;

    /// The script it runs.
    fn script(&self) -> &'static Script;

    /// Appends `numkeys`, `KEYS` and `ARGV` to an `EVALSHA` or `EVAL` whose first argument (the
    /// SHA-1 or the body) is in place.
    fn write_args(&self, cmd: &mut redis::Cmd);

    /// Its reply, read into its output; an unreadable reply is [`StoreError::BadReply`].
    fn read_reply(&self, reply: redis::Value) -> Result<Self::Output, StoreError>;

    /// What a Cluster slot migration's refusal of a call on several keys (`TRYAGAIN Multiple
    /// keys request during rehashing`) does to it: by default it is resent, as any refusal
    /// that proves the script did not run.
    fn on_rehashing(&self) -> OnRehashing<'_> {
        OnRehashing::Resend
    }

    /// An error inside its reply that says the connection is stale, though the call itself
    /// answered: none by default, as a call that answers one decision fails whole. A batch's
    /// decisions answer on their own, and one's `READONLY` (a script's write on a demoted
    /// server) says so of its connection.
    fn stale_connection(&self, _reply: &redis::Value) -> Option<StoreError> {
        None
    }

    /// About how many arguments, and bytes in all, its call writes: its command is sized once,
    /// not grown argument by argument. By default a decision's (the SHA-1, two or three keys,
    /// its packed argument).
    fn capacity(&self) -> (usize, usize) {
        (8, 256)
    }

    /// An `EVALSHA` of this call (the SHA-1, `numkeys`, `KEYS` and `ARGV`).
    fn evalsha(&self) -> redis::Cmd {
        let (args, bytes) = self.capacity();
        let mut cmd = redis::Cmd::with_capacity(args, bytes);
        cmd.arg("EVALSHA");
        cmd.arg(self.script().hashed.get_hash());
        self.write_args(&mut cmd);
        cmd
    }

    /// The same call as an `EVAL` with the script's body, which cannot fail with `NOSCRIPT`.
    fn eval(&self) -> redis::Cmd {
        let (args, bytes) = self.capacity();
        let mut cmd = redis::Cmd::with_capacity(args, bytes + self.script().source.len());
        cmd.arg("EVAL");
        cmd.arg(self.script().source.as_str());
        self.write_args(&mut cmd);
        cmd
    }
}

/// See [`ScriptOp::on_rehashing`].
pub(crate) enum OnRehashing<'a> {
    /// Resent, as after any refusal made before the script ran.
    Resend,
    /// Handed back at once: its caller sends its parts again alone (a batch).
    HandBack,
    /// A decision (`timed`: see `wire/decide.rs`), decided in the split form instead
    /// (`lua/common.lua`'s header, "Split"), which no migration refuses.
    Split {
        request: CheckRequest<'a>,
        timed: bool,
    },
}

/// A script as the crate sends it: its body, its SHA-1, and which it is for the Redis store's
/// reload state.
pub(crate) struct Script {
    pub(crate) id: ScriptId,
    /// The body as sent (assembled from `lua/`).
    pub(crate) source: &'static LazyLock<String>,
    /// The body hashed once per process.
    pub(crate) hashed: LazyLock<redis::Script>,
}

/// The scripts the crate ships, one per wrapper in `lua/`: what the Redis store keeps a reload
/// state for (see `redis/reload.rs`). Several operations may run one script.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ScriptId {
    Decide = 0,
    Control = 1,
    Refund = 2,
    Block = 3,
    Slots = 4,
    Batch = 5,
}

impl ScriptId {
    /// How many there are.
    pub(crate) const COUNT: usize = 6;
}
