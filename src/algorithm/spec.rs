//! One [`Spec`] per algorithm: its name, tag byte, kind, state fields, Lua step (with its
//! refund), Rust refund, header window, largest burst and leasing, declared once beside its Rust
//! step (`SPEC` in `src/algorithm/<algorithm>.rs`) and read by everything else, the scripts
//! assembled from them included (`src/store/wire/scripts.rs`).

use super::{Algorithm, PackedStep, RefundStep};
use crate::quota::Quota;

/// Everything the crate knows about one algorithm, in one place.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The name on command lines and in logs (`Algorithm::name`).
    pub name: &'static str,
    /// The byte naming it in the script's arguments, and its state strings' first byte.
    pub tag: u8,
    /// How the driver runs it.
    pub kind: Kind,
    /// The doubles of its state string after the tag, in order (what `inspect` shows); empty
    /// for the sliding log, which keeps a sorted set.
    pub fields: &'static [&'static str],
    /// Its Lua step (`lua/<algorithm>.lua`): the decision step, spliced into the driver, then,
    /// after its `-- @refund` line, the refund step, spliced into `lua/refund.lua`.
    pub lua: &'static str,
    /// How a refund gives units back to its state (the Rust twin of the Lua after `@refund`);
    /// `None` for the sliding log, whose entries the refund script removes itself.
    pub refund: Option<RefundStep>,
    /// The window the `RateLimit-Policy` header announces.
    pub window: Window,
    /// The largest burst it serves (`None`: any), refused with
    /// [`QuotaError::BurstTooLargeForSlidingLog`](crate::QuotaError::BurstTooLargeForSlidingLog).
    pub max_burst: Option<u64>,
    /// Whether units consumed now and spent later in process (token leases) admit no more than
    /// the store would have, and until when.
    pub leasing: Leasing,
}

/// How units leased from the store may be spent in process (token leases for hot keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leasing {
    /// A unit is a unit whenever it is spent (token bucket, GCRA).
    Anytime,
    /// A unit counts in the window it was consumed in: a lease ends with its window, and only
    /// one tier's window is named by the reply (fixed window).
    WithinWindow,
    /// A unit's weight depends on when it is spent (sliding window), or each request's own
    /// time is recorded (sliding log): leasing would not be exact, so it is refused.
    Refused,
}

/// How the driver runs an algorithm.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// A pure step over the packed state string.
    Packed(PackedStep),
    /// The sliding log: a log of admission times (a sorted set in Redis).
    Log,
}

/// The longest time from an empty key back to its full capacity: the bound of every
/// `reset_after` (and every finite `retry_after`) the step answers, announced as the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Window {
    /// `burst` units refilled at `limit` per `period`, rounded up to the µs as the steps do.
    Refill,
    /// One `period`.
    Period,
    /// Two periods: the current window's count weighs on through the next one.
    TwoPeriods,
}

impl Window {
    /// The window of `quota` in µs.
    pub(crate) fn full_again_us(self, quota: &Quota) -> u128 {
        let period = quota.period().as_micros();
        match self {
            Window::Refill => {
                (u128::from(quota.burst()) * period).div_ceil(u128::from(quota.limit().max(1)))
            }
            Window::Period => period,
            Window::TwoPeriods => 2 * period,
        }
    }
}

impl Spec {
    /// The length of its state string (tag and doubles); `None` for the sliding log.
    pub(crate) const fn state_len(&self) -> Option<usize> {
        match self.kind {
            Kind::Packed(_) => Some(1 + 8 * self.fields.len()),
            Kind::Log => None,
        }
    }

    /// Whether it keeps a sorted set (and its controls under a key of their own).
    pub(crate) const fn is_log(&self) -> bool {
        matches!(self.kind, Kind::Log)
    }

    /// Its Lua decision step: the step file up to its `@refund` line.
    pub(crate) fn lua_step(&self) -> &'static str {
        self.lua
            .split_once(REFUND_LINE)
            .map_or(self.lua, |(step, _)| step)
    }

    /// Its Lua refund step: the step file after its `@refund` line (`None`: it has none).
    pub(crate) fn lua_refund(&self) -> Option<&'static str> {
        self.lua.split_once(REFUND_LINE).map(|(_, refund)| refund)
    }
}

/// The line of a step file after which its refund step begins.
const REFUND_LINE: &str = "-- @refund\n";

impl Spec {}

/// The packed algorithm whose state strings start with `tag`.
pub(crate) fn packed_by_tag(tag: u8) -> Option<Algorithm> {
    Algorithm::ALL
        .iter()
        .copied()
        .find(|a| a.spec().tag == tag && !a.spec().is_log())
}

/// The shortest packed state: the length the driver gives a tier whose tag no algorithm has
/// (the last `elseif tag` branch of its split).
const SHORTEST_STATE: usize = {
    let mut shortest = usize::MAX;
    let mut i = 0;
    while i < Algorithm::ALL.len() {
        if let Some(len) = Algorithm::ALL[i].spec().state_len() {
            if len < shortest {
                shortest = len;
            }
        }
        i += 1;
    }
    shortest
};

/// How many bytes the tier state starting with `tag` takes in a key's string, as the driver
/// splits it: 1 for an empty tier (0), the packed state's length, the shortest for others.
pub(crate) fn state_len_of(tag: u8) -> usize {
    if tag == 0 {
        return 1;
    }
    packed_by_tag(tag)
        .and_then(|a| a.spec().state_len())
        .unwrap_or(SHORTEST_STATE)
}

/// Whether a string of `len` bytes is one tier's state exactly (a packed state's length):
/// such a string never starts with controls, so the driver skips looking for them.
pub(crate) fn is_one_state(len: usize) -> bool {
    Algorithm::ALL
        .iter()
        .any(|a| a.spec().state_len() == Some(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Args, Refund};

    /// Every packed step, in Rust and in Lua, writes a state of its spec's length under its spec's
    /// tag.
    #[test]
    fn every_step_writes_its_specs_state() {
        for a in Algorithm::ALL {
            let spec = a.spec();
            let Kind::Packed(step) = spec.kind else {
                continue;
            };
            let args = Args {
                now: 1e6,
                cost: 1.0,
                limit: 10.0,
                period: 1e6,
                burst: 10.0,
            };
            let state = step(None, &args).state.expect("an admission writes");
            assert_eq!(Some(state.as_bytes().len()), spec.state_len(), "{a}");
            assert_eq!(state.as_bytes()[0], spec.tag, "{a}");
            // Its Lua step writes and reads the same layout under the same tag.
            let doubles = "d".repeat(spec.fields.len());
            let write = format!("state = spack('<B{doubles}', {}, ", spec.tag);
            assert!(
                spec.lua.contains(&write),
                "{a}: its Lua step lacks {write:?}"
            );
            // It reads its state where it begins in `stored` (`sat`: after the remembered
            // expiry in the driver's one-tier form).
            let len = spec.state_len().unwrap_or_default();
            let sized = format!("if stored and #stored == sat + {} then", len - 1);
            assert!(
                spec.lua.contains(&sized),
                "{a}: its Lua step lacks {sized:?}"
            );
            let sized = format!("sunpack('<B{doubles}', stored, sat)");
            assert!(
                spec.lua.contains(&sized),
                "{a}: its Lua step lacks {sized:?}"
            );
            let read = format!("tag == {} and ", spec.tag);
            assert!(spec.lua.contains(&read), "{a}: its Lua step lacks {read:?}");
        }
    }

    /// Every algorithm's refund is its own: a packed step has a Rust refund step, and a Lua one
    /// after its `@refund` line (`src/store/wire/scripts.rs` holds the splice); the sliding log,
    /// whose entries the refund script removes itself, has neither. Each gives back what an
    /// admission took, in the window it was taken in.
    #[test]
    fn every_algorithm_refunds_its_own_state() {
        for a in Algorithm::ALL {
            let spec = a.spec();
            assert_eq!(
                spec.refund.is_some(),
                !spec.is_log(),
                "{a}: its Spec's refund"
            );
            assert_eq!(
                spec.lua_refund().is_some(),
                !spec.is_log(),
                "{a}: the `-- @refund` line of lua/<algorithm>.lua"
            );
            let (Kind::Packed(step), Some(refund), Some(lua)) =
                (spec.kind, spec.refund, spec.lua_refund())
            else {
                continue;
            };
            let write = format!(
                "new = spack('<B{}', {}, ",
                "d".repeat(spec.fields.len()),
                spec.tag
            );
            assert!(lua.contains(&write), "{a}: its Lua refund lacks {write:?}");
            // Four units taken, then given back in the same window: full again.
            let args = |cost| Args {
                now: 5e6,
                cost,
                limit: 10.0,
                period: 1e6,
                burst: 10.0,
            };
            let taken = step(None, &args(4.0)).state.expect("an admission writes");
            let back = Refund {
                units: 4.0,
                start: 5e6,
                period: 1e6,
                burst: 10.0,
            };
            let given = refund(taken.as_bytes(), &back).expect("units given back");
            assert_eq!(
                step(Some(given.as_bytes()), &args(0.0)).remaining,
                10.0,
                "{a}"
            );
            // A refund never gives more than the capacity.
            let full = refund(given.as_bytes(), &back);
            let peek = full.map_or(10.0, |s| step(Some(s.as_bytes()), &args(0.0)).remaining);
            assert_eq!(peek, 10.0, "{a}: a refund above the capacity");
        }
    }

    /// Tags and names are unique, and every step file in `lua/` is some algorithm's.
    #[test]
    fn every_lua_step_is_registered_once() {
        for (i, a) in Algorithm::ALL.iter().enumerate() {
            for b in &Algorithm::ALL[i + 1..] {
                assert_ne!(a.spec().tag, b.spec().tag, "{a} and {b}");
                assert_ne!(a.name(), b.name());
            }
            assert!(a.spec().tag != 0 && a.spec().tag != b'M' && a.spec().tag != b'E');
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            // The driver, the controls' reading, the controls, the production modes' scripts and the
            // batch script
            // (src/store/wire/scripts.rs).
            let scripts = [
                "common.lua",
                "controls.lua",
                "control.lua",
                "refund.lua",
                "block.lua",
                "batch.lua",
                "slots.lua",
            ];
            if scripts.contains(&name.as_str()) {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            let owners = Algorithm::ALL
                .iter()
                .filter(|a| a.spec().lua == source)
                .count();
            assert_eq!(owners, 1, "lua/{name}: add it to Algorithm::ALL");
        }
    }
}
