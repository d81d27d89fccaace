//! One [`Spec`] per algorithm: its name, tag byte, kind, state fields, Lua step and header
//! window, declared once beside its Rust step (`SPEC` in `src/algorithm/<algorithm>.rs`) and
//! read by everything else; and the scripts spliced from them (the steps into the driver, the
//! names into the controls).
//!
//! The scripts keep a few numbers and tag bytes as Lua literals (the driver runs them on every
//! call, and a splice-time substitution would hide them from whoever reads `lua/common.lua`).
//! The tests below hold each literal to its Rust source, so a change on one side fails there.

use std::sync::LazyLock;

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

/// The whole decision script: the driver with every step spliced in as a branch at its
/// `@steps` line (the loop over tiers), and every packed step once more at its `@packed-steps`
/// line (the one-tier path, which runs the step without the loop's bookkeeping).
pub(crate) static SOURCE: LazyLock<String> = LazyLock::new(|| {
    let branches = |only_packed: bool| -> String {
        Algorithm::ALL
            .iter()
            .map(|a| a.spec())
            .filter(|spec| !only_packed || !spec.is_log())
            .map(|spec| format!("  elseif alg == {} then\n{}", spec.tag, spec.lua_step()))
            .collect()
    };
    let driver = include_str!("../../lua/common.lua");
    let spliced = driver
        .replacen("-- @packed-steps\n", &branches(true), 1)
        .replacen("-- @steps\n", &branches(false), 1);
    let first = format!("elseif alg == {} then", Algorithm::ALL[0].spec().tag);
    assert_eq!(
        spliced.matches(&first).count(),
        2,
        "lua/common.lua has its @packed-steps and @steps lines"
    );
    spliced
});

/// The refund script, with every algorithm's refund step spliced in as a branch at its
/// `@refunds` line.
pub(crate) static REFUND_SOURCE: LazyLock<String> = LazyLock::new(|| {
    let branches: String = Algorithm::ALL
        .iter()
        .map(|a| a.spec())
        .filter_map(|spec| {
            let refund = spec.lua_refund()?;
            Some(format!("      elseif alg == {} then\n{refund}", spec.tag))
        })
        .collect();
    let script = include_str!("../../lua/refund.lua");
    let spliced = script.replacen("      -- @refunds\n", &branches, 1);
    assert_ne!(spliced, script, "lua/refund.lua has its @refunds line");
    spliced
});

/// The fleet controls' script, with every algorithm's name under its tag at its `@names` line.
pub(crate) static CONTROL_SOURCE: LazyLock<String> = LazyLock::new(|| {
    let names: Vec<String> = Algorithm::ALL
        .iter()
        .map(|a| format!("[{}] = '{}'", a.spec().tag, a.spec().name))
        .collect();
    let line = format!("local NAMES = {{ {} }}\n", names.join(", "));
    let spliced = include_str!("../../lua/control.lua").replacen("-- @names\n", &line, 1);
    assert!(
        spliced.contains(&line),
        "lua/control.lua has its @names line"
    );
    spliced
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::layout::{ARGS_HEADER, MAX_REPLY_MS, OVERRIDE_IDLE_MS, QUOTA_BYTES};
    use crate::algorithm::{Args, Refund, MAX_EXACT};
    use crate::quota::MAX_TIERS;

    /// The number in the script's `local NAME = <number>` line.
    fn lua_constant(source: &str, name: &str) -> u64 {
        let prefix = format!("local {name} = ");
        let line = source
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line"));
        let digits: String = line.chars().take_while(char::is_ascii_digit).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {line:?}"))
    }

    #[test]
    fn the_scripts_constants_are_rusts() {
        for source in [SOURCE.as_str(), CONTROL_SOURCE.as_str()] {
            assert_eq!(lua_constant(source, "MAX_EXACT"), MAX_EXACT as u64);
            assert_eq!(lua_constant(source, "OVERRIDE_IDLE_MS"), OVERRIDE_IDLE_MS);
        }
        assert_eq!(lua_constant(&SOURCE, "MAX_REPLY_MS"), MAX_REPLY_MS as u64);
    }

    /// The argument lengths the driver accepts (one tier's, the shortest and longest of
    /// several, and the count of tiers) are the ones Rust packs: the header, a quota's size,
    /// and 1 to `MAX_TIERS` tiers.
    #[test]
    fn the_scripts_argument_lengths_are_rusts() {
        let len = |tiers: usize| ARGS_HEADER + QUOTA_BYTES * tiers;
        let check = format!(
            "len ~= {} and (len < {} or len > {} or (len - {ARGS_HEADER}) % {QUOTA_BYTES} ~= 0)",
            len(1),
            len(2),
            len(MAX_TIERS),
        );
        assert!(SOURCE.contains(&check), "lua/common.lua checks `{check}`");
        let tiers = format!("local tiers = (len - {ARGS_HEADER}) / {QUOTA_BYTES}\n");
        assert!(SOURCE.contains(&tiers), "lua/common.lua has `{tiers}`");
        let told = format!("per tier (1 to {MAX_TIERS})");
        assert!(SOURCE.contains(&told), "the error names `{told}`");
        assert!(SOURCE.contains(&format!("One tier packs {} bytes", len(1))));
    }

    /// The tag bytes and state lengths the scripts spell out are the specs'.
    #[test]
    fn the_scripts_tags_and_state_lengths_are_the_specs() {
        let mut lens: Vec<usize> = Algorithm::ALL
            .iter()
            .filter_map(|a| a.spec().state_len())
            .collect();
        lens.sort_unstable();
        lens.dedup();
        let not_one = |var: &str| {
            lens.iter()
                .map(|len| format!("{var} ~= {len}"))
                .collect::<Vec<_>>()
                .join(" and ")
        };
        assert!(SOURCE.contains(&not_one("len")), "{}", not_one("len"));
        assert!(CONTROL_SOURCE.contains(&not_one("#s")), "{}", not_one("#s"));
        // The split of a key's string into tiers: every longer state by its tag, the shortest
        // for the rest.
        let (mut common, mut control) = (String::new(), String::new());
        for a in Algorithm::ALL {
            let spec = a.spec();
            match spec.state_len() {
                Some(len) if len != SHORTEST_STATE => {
                    common.push_str(&format!(
                        "      elseif tag == {} then\n        stored, at = string.sub(s, at, at + {}), at + {len}\n",
                        spec.tag,
                        len - 1
                    ));
                    control.push_str(&format!("tag == {} and {len} or ", spec.tag));
                }
                _ => {}
            }
        }
        let s = SHORTEST_STATE;
        common.push_str(&format!(
            "      elseif tag then\n        stored, at = string.sub(s, at, at + {}), at + {s}\n",
            s - 1
        ));
        control.push_str(&format!("{s})"));
        assert!(
            SOURCE.contains(&common),
            "lua/common.lua splits by\n{common}"
        );
        assert!(
            CONTROL_SOURCE.contains(&control),
            "lua/control.lua: {control}"
        );
        let log = Algorithm::ALL.iter().find(|a| a.spec().is_log()).unwrap();
        assert!(SOURCE.contains(&format!("local log = alg == {}\n", log.spec().tag)));
    }

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
            let len = spec.state_len().unwrap_or_default();
            let sized = format!("if stored and #stored == {len} then");
            assert!(
                spec.lua.contains(&sized),
                "{a}: its Lua step lacks {sized:?}"
            );
            let read = format!("tag == {} and ", spec.tag);
            assert!(spec.lua.contains(&read), "{a}: its Lua step lacks {read:?}");
        }
    }

    /// Every algorithm's refund is its own: a packed step has a Rust refund step, and a Lua one
    /// after its `@refund` line, spliced into the refund script under its tag (and not into the
    /// decision script); the sliding log, whose entries the refund script removes itself, has
    /// neither. Each gives back what an admission took, in the window it was taken in.
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
            let branch = format!("elseif alg == {} then\n{lua}", spec.tag);
            assert!(
                REFUND_SOURCE.contains(&branch),
                "{a}: lua/refund.lua lacks its refund"
            );
            assert!(
                !SOURCE.contains(lua),
                "{a}: its refund is in the decision script"
            );
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
            // The drivers, and the production modes' scripts (src/store/redis/refund.rs, block.rs, slots.rs).
            let scripts = [
                "common.lua",
                "control.lua",
                "refund.lua",
                "block.lua",
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
