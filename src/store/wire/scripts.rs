//! The scripts Redis runs, assembled from `lua/` and the algorithms' specs: the steps spliced
//! into the driver, the refund steps into the refund script, the names into the controls, the
//! decision script into the block script, the reading of the controls at the start of a key's
//! string (`lua/controls.lua`) wherever a script reads them, and into every script the values
//! of the shared constants ([`CONSTANTS`]).
//!
//! The Lua writes a shared number by its name in capitals (`MAX_EXACT`, `CONTROLS`,
//! `STATE_LEN`, ...); assembly writes the value in as a literal. So each number has one source,
//! here, and no call pays for a local holding it (a literal is a constant of the compiled
//! chunk).

use std::sync::LazyLock;

use super::layout::{
    CONTROLS, CONTROLS_HEAD, EXPIRY_HEAD, EXPIRY_MARK, MAX_REPLY_MS, OVERRIDE_IDLE_MS, QUOTA_BYTES,
    STAMP,
};
use crate::algorithm::{Algorithm, MAX_EXACT};
use crate::quota::MAX_TIERS;

/// The packed states' lengths as the scripts split a key's string: every tag but `WIDE_TAG`
/// takes `STATE_LEN` bytes, `WIDE_TAG` takes `WIDE_STATE_LEN` (the specs' lengths; a test holds
/// them to the specs).
fn state_lens() -> (usize, usize, u8) {
    let packed = || {
        Algorithm::ALL
            .iter()
            .filter_map(|a| Some((a.spec().state_len()?, a.spec().tag)))
    };
    let short = packed().map(|(len, _)| len).min().unwrap_or_default();
    let (wide, wide_tag) = packed().max().unwrap_or_default();
    (short, wide, wide_tag)
}

/// Every name in capitals the scripts share, with its value: the only place these numbers are
/// written for Lua.
pub(crate) static CONSTANTS: LazyLock<Vec<(&'static str, u64)>> = LazyLock::new(|| {
    let (short, wide, wide_tag) = state_lens();
    let log_tag = Algorithm::ALL
        .iter()
        .find(|a| a.spec().is_log())
        .map_or(0, |a| a.spec().tag);
    vec![
        // 2^53: every number the scripts handle stays an exact integer below it.
        ("MAX_EXACT", MAX_EXACT as u64),
        ("MAX_REPLY_MS", MAX_REPLY_MS as u64),
        ("OVERRIDE_IDLE_MS", OVERRIDE_IDLE_MS),
        // The controls at the start of a key's string: their tag byte, the byte holding the
        // override's tier count (the last of the head), a quota's bytes, the most tiers, and
        // the tag of the tenant's reset after them.
        ("CONTROLS", u64::from(CONTROLS)),
        ("CONTROLS_HEAD", CONTROLS_HEAD as u64),
        ("QUOTA_BYTES", QUOTA_BYTES as u64),
        ("MAX_TIERS", MAX_TIERS as u64),
        ("STAMP", u64::from(STAMP)),
        // A tier's state in a key's string.
        ("STATE_LEN", short as u64),
        ("WIDE_STATE_LEN", wide as u64),
        ("WIDE_TAG", u64::from(wide_tag)),
        // The sliding log's tag: it keeps a sorted set, not a packed state.
        ("LOG_TAG", u64::from(log_tag)),
        // A busy key's remembered expiry before its state.
        ("EXPIRY_MARK", u64::from(EXPIRY_MARK)),
        ("EXPIRY_HEAD", EXPIRY_HEAD as u64),
    ]
});

/// `script` with every shared constant's name, outside comments and strings, replaced by its
/// value.
fn with_constants(script: &str) -> String {
    renamed(script, |name| {
        CONSTANTS
            .iter()
            .find(|(constant, _)| *constant == name)
            .map(|(_, value)| value.to_string())
    })
}

/// `script` with every name outside comments and strings that `new` maps replaced.
fn renamed(script: &str, new: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(script.len());
    let mut rest = script;
    while let Some(c) = rest.chars().next() {
        let taken = if rest.starts_with("--") {
            rest.find('\n').unwrap_or(rest.len())
        } else if c == '\'' || c == '"' {
            string_len(rest, c)
        } else if c.is_ascii_alphabetic() || c == '_' {
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            match new(&rest[..len]) {
                Some(name) => {
                    out.push_str(&name);
                    rest = &rest[len..];
                    continue;
                }
                None => len,
            }
        } else {
            c.len_utf8()
        };
        out.push_str(&rest[..taken]);
        rest = &rest[taken..];
    }
    out
}

/// The reading of the controls at the start of a key's string (`lua/controls.lua`): its code
/// (the header comment left out) is spliced in, its stamp's part (between `@stamp` and `@end`)
/// only where asked for.
const CONTROLS_READ: &str = include_str!("../../../lua/controls.lua");

/// `script` with the reading of the controls spliced in, as code, at each of its lines
/// `-- @controls <string> -> <n>, <len>, <until_us>[, <stamp>, <at>]`, the names given put for
/// the snippet's (see `lua/controls.lua`); the stamp's part only with five names.
fn with_controls(script: &str) -> String {
    let code = CONTROLS_READ
        .lines()
        .skip_while(|line| line.starts_with("--"))
        .map(|line| format!("{line}\n"))
        .collect::<String>();
    let (before, rest) = code
        .split_once("    -- @stamp\n")
        .expect("lua/controls.lua has its @stamp line");
    let (stamp, after) = rest
        .split_once("    -- @end\n")
        .expect("lua/controls.lua has its @end line");
    script
        .lines()
        .map(|line| {
            let indent = &line[..line.len() - line.trim_start().len()];
            let Some(call) = line.trim_start().strip_prefix("-- @controls ") else {
                return format!("{line}\n");
            };
            let (string, names) = call
                .split_once(" -> ")
                .unwrap_or_else(|| panic!("`{line}`: `-- @controls <string> -> <names>`"));
            let names: Vec<&str> = names.split(", ").collect();
            let params = ["n", "len", "until_us", "stamp", "at"];
            let snippet = match names.len() {
                3 => format!("{before}{after}"),
                5 => format!("{before}{stamp}{after}"),
                _ => panic!("`{line}`: three names, or five with the stamp"),
            };
            let snippet = renamed(&snippet, |name| {
                if name == "s" {
                    return Some(string.to_owned());
                }
                let at = params.iter().position(|p| *p == name)?;
                names.get(at).map(|name| (*name).to_owned())
            });
            snippet.lines().map(|l| format!("{indent}{l}\n")).collect()
        })
        .collect()
}

/// The length of the Lua string literal that opens `s` with `quote`, escapes included.
fn string_len(s: &str, quote: char) -> usize {
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            c if c == quote => return i + 1,
            _ => {}
        }
    }
    s.len()
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
    let driver = with_controls(include_str!("../../../lua/common.lua"));
    let spliced = driver
        .replacen("-- @packed-steps\n", &branches(true), 1)
        .replacen("-- @steps\n", &branches(false), 1);
    let first = format!("elseif alg == {} then", Algorithm::ALL[0].spec().tag);
    assert_eq!(
        spliced.matches(&first).count(),
        2,
        "lua/common.lua has its @packed-steps and @steps lines"
    );
    with_constants(&spliced)
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
    let script = with_controls(include_str!("../../../lua/refund.lua"));
    let spliced = script.replacen("      -- @refunds\n", &branches, 1);
    assert_ne!(spliced, script, "lua/refund.lua has its @refunds line");
    with_constants(&spliced)
});

/// The fleet controls' script, with every algorithm's name under its tag at its `@names` line.
pub(crate) static CONTROL_SOURCE: LazyLock<String> = LazyLock::new(|| {
    let names: Vec<String> = Algorithm::ALL
        .iter()
        .map(|a| format!("[{}] = '{}'", a.spec().tag, a.spec().name))
        .collect();
    let line = format!("local NAMES = {{ {} }}\n", names.join(", "));
    let spliced =
        with_controls(include_str!("../../../lua/control.lua")).replacen("-- @names\n", &line, 1);
    assert!(
        spliced.contains(&line),
        "lua/control.lua has its @names line"
    );
    with_constants(&spliced)
});

/// The block script: the decision script as a function, spliced into `lua/block.lua`.
pub(crate) static BLOCK_SOURCE: LazyLock<String> = LazyLock::new(|| {
    let wrapper = with_controls(include_str!("../../../lua/block.lua"));
    let spliced = wrapper.replacen("-- @decide\n", &SOURCE, 1);
    assert_ne!(spliced, wrapper, "lua/block.lua has its @decide line");
    with_constants(&spliced)
});

/// The batch script: the decision script as a function of its keys and argument, reading the
/// call's one `clock` instead of calling `TIME` itself, spliced into `lua/batch.lua`.
pub(crate) static BATCH_SOURCE: LazyLock<String> = LazyLock::new(|| {
    // What the decision script reads from KEYS, ARGV, TIME and the tenant's key, and what the
    // function reads instead (its parameters `skey, lkey, key3, args, tenant`, and the call's
    // `clock`).
    const READS: [(&str, &str); 6] = [
        // Looked up once per call, in lua/batch.lua, instead of once per decision.
        (
            "local spack, sunpack, call, rpcall = struct.pack, struct.unpack, redis.call, \
             redis.pcall\n",
            "",
        ),
        (
            "local args, split = ARGV[1], ARGV[2]",
            "local split = false",
        ),
        ("local skey, lkey = KEYS[1], KEYS[2]\n", ""),
        ("  tkey = KEYS[3]\n", "  tkey = key3\n"),
        (
            "  local t = call('TIME')\n  now = t[1] * 1000000 + t[2]\n",
            "  now = clock\n",
        ),
        (
            "  s, t = rpcall('GET', skey), rpcall('GET', tkey)\n",
            "  s, t = rpcall('GET', skey), tenant\n",
        ),
    ];
    let mut decide = SOURCE.clone();
    for (read, instead) in READS {
        assert_eq!(
            decide.matches(read).count(),
            1,
            "lua/common.lua has `{read}` once"
        );
        decide = decide.replacen(read, instead, 1);
    }
    let wrapper = include_str!("../../../lua/batch.lua");
    let spliced = wrapper.replacen("-- @decide\n", &decide, 1);
    assert_ne!(spliced, wrapper, "lua/batch.lua has its @decide line");
    with_constants(&spliced)
});

/// The concurrency slots' script.
pub(crate) static SLOTS_SOURCE: LazyLock<String> =
    LazyLock::new(|| with_constants(include_str!("../../../lua/slots.lua")));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::wire::layout::ARGS_HEADER;

    /// Every script as sent, and the files it is made of (the controls' reading as part of the
    /// decision script).
    fn scripts() -> [(&'static str, &'static str, &'static str); 7] {
        [
            (
                "common.lua",
                include_str!("../../../lua/common.lua"),
                &SOURCE,
            ),
            ("controls.lua", CONTROLS_READ, &SOURCE),
            (
                "control.lua",
                include_str!("../../../lua/control.lua"),
                &CONTROL_SOURCE,
            ),
            (
                "refund.lua",
                include_str!("../../../lua/refund.lua"),
                &REFUND_SOURCE,
            ),
            (
                "block.lua",
                include_str!("../../../lua/block.lua"),
                &BLOCK_SOURCE,
            ),
            (
                "batch.lua",
                include_str!("../../../lua/batch.lua"),
                &BATCH_SOURCE,
            ),
            (
                "slots.lua",
                include_str!("../../../lua/slots.lua"),
                &SLOTS_SOURCE,
            ),
        ]
    }

    /// The code of a Lua source: comments and string literals blanked out.
    fn code(source: &str) -> String {
        let mut out = String::new();
        let mut rest = source;
        while let Some(c) = rest.chars().next() {
            let blank = if rest.starts_with("--") {
                rest.find('\n').unwrap_or(rest.len())
            } else if c == '\'' || c == '"' {
                string_len(rest, c)
            } else {
                out.push(c);
                rest = &rest[c.len_utf8()..];
                continue;
            };
            out.push(' ');
            rest = &rest[blank..];
        }
        out
    }

    /// The names in capitals a Lua source's code uses.
    fn capitals(source: &str) -> Vec<String> {
        code(source)
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| {
                w.len() > 1
                    && w.starts_with(|c: char| c.is_ascii_uppercase())
                    && w.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            })
            .map(str::to_owned)
            .collect()
    }

    /// Every script, the steps included, writes a shared number only by its name: a name in
    /// capitals is a shared constant (or Redis's `KEYS`, `ARGV`, the controls' `NAMES`, a
    /// step's `MAX_SKEW`), none is declared in Lua, and none is left in a script as sent.
    #[test]
    fn every_script_takes_its_constants_from_rust() {
        let steps = Algorithm::ALL.iter().map(|a| (a.name(), a.spec().lua, ""));
        let own = ["KEYS", "ARGV", "NAMES", "MAX_SKEW"];
        for (name, source, sent) in scripts().into_iter().chain(steps) {
            for word in capitals(source) {
                let shared = CONSTANTS.iter().any(|(c, _)| *c == word);
                assert!(
                    shared || own.contains(&word.as_str()),
                    "{name}: `{word}` is no shared constant (add it to CONSTANTS)"
                );
            }
            for (constant, value) in CONSTANTS.iter() {
                let declared = format!("local {constant} ");
                assert!(!source.contains(&declared), "{name} declares {constant}");
                assert!(
                    !capitals(sent).iter().any(|w| w == constant),
                    "{name} as sent still names {constant}"
                );
                if *value > 1000 {
                    assert!(
                        !code(source).contains(&value.to_string()),
                        "{name}: {value}"
                    );
                }
            }
            // The controls, the reset's stamp, the state lengths and the tags the driver and
            // the modes read are named, never spelled as numbers.
            let spelled = [
                "== 77",
                "== 69",
                "10 + 24",
                "#s ~= 17",
                "#s ~= 25",
                "len ~= 17",
                "and 25 or 17",
                "== 108",
                "== 119",
            ];
            let driver_or_mode = !Algorithm::ALL.iter().any(|a| a.name() == name);
            for spelled in spelled.iter().filter(|_| driver_or_mode) {
                assert!(!code(source).contains(spelled), "{name} spells `{spelled}`");
            }
        }
    }

    /// The controls at the start of a key's string are read in one place, `lua/controls.lua`:
    /// no other script (nor step) compares a byte with their tag, reads their tier count at
    /// `CONTROLS_HEAD`, works out their length or reads the reset's stamp after them; and every
    /// `@controls` line is spliced.
    #[test]
    fn every_script_reads_the_controls_through_one_snippet() {
        let steps = Algorithm::ALL.iter().map(|a| (a.name(), a.spec().lua, ""));
        let by_hand = [
            "CONTROLS_HEAD)",
            "CONTROLS_HEAD + QUOTA_BYTES",
            "== STAMP and",
        ];
        let mut splices = 0;
        for (name, source, sent) in scripts().into_iter().chain(steps) {
            if name == "controls.lua" {
                continue;
            }
            assert!(
                !capitals(source).iter().any(|w| w == "CONTROLS"),
                "{name} compares a byte with the controls' tag: use `-- @controls`"
            );
            for spelled in by_hand {
                assert!(
                    !code(source).contains(spelled),
                    "{name} reads the controls by hand (`{spelled}`): use `-- @controls`"
                );
            }
            splices += source.matches("-- @controls ").count();
            assert!(!sent.contains("-- @controls"), "{name} as sent");
        }
        assert!(
            splices >= 8,
            "the scripts read the controls at {splices} places"
        );
    }

    /// A `@controls` line becomes the snippet with its names: three for the controls, five for
    /// the reset's stamp after them too.
    #[test]
    fn the_controls_splice_puts_its_names_in() {
        let three = with_controls("  -- @controls t -> a, b, c\n");
        assert!(three.starts_with("  b = 0\n"), "{three}");
        assert!(
            three.contains("  a = string.byte(t, CONTROLS_HEAD)\n"),
            "{three}"
        );
        assert!(three.contains("c = sunpack('<d', t, 2)\n"), "{three}");
        assert!(!three.contains("STAMP") && !three.contains('@'), "{three}");
        let five = with_controls("-- @controls s -> n, clen, u, st, pos\nx = 1\n");
        assert!(
            five.contains("st, pos = sunpack('<d', s, pos + 1), pos + 9\n"),
            "{five}"
        );
        assert!(five.contains("if clen and #s >= clen then"), "{five}");
        assert!(!five.contains('@'), "{five}");
        assert!(five.ends_with("end\nx = 1\n"), "{five}");
        for script in [&*SOURCE, &CONTROL_SOURCE, &REFUND_SOURCE, &BLOCK_SOURCE] {
            assert!(
                script.contains("string.byte(t, 10)"),
                "the tenant's controls"
            );
        }
    }

    /// The constants are Rust's, and the two state lengths the scripts split by are the specs'
    /// (a state of a third length would need the scripts' split to learn it).
    #[test]
    fn the_constants_are_the_specs_and_the_layouts() {
        let value = |name: &str| CONSTANTS.iter().find(|(c, _)| *c == name).unwrap().1;
        assert_eq!(value("CONTROLS"), u64::from(b'M'));
        assert_eq!(value("STAMP"), u64::from(b'E'));
        let (short, wide, wide_tag) = state_lens();
        for a in Algorithm::ALL {
            let spec = a.spec();
            if let Some(len) = spec.state_len() {
                let split = if spec.tag == wide_tag { wide } else { short };
                assert_eq!(
                    split, len,
                    "{a}: the scripts split its state as {split} bytes"
                );
                assert_eq!(crate::algorithm::state_len_of(spec.tag), len, "{a}");
            }
        }
        let log = Algorithm::ALL.iter().find(|a| a.spec().is_log()).unwrap();
        assert_eq!(value("LOG_TAG"), u64::from(log.spec().tag));
        // The remembered expiry reads as controls without override to every reader of them.
        assert_eq!(value("EXPIRY_MARK"), u64::from(CONTROLS));
        assert_eq!(value("EXPIRY_HEAD"), CONTROLS_HEAD as u64);
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

    /// Every algorithm's step is in the decision script under its tag, and every refund step
    /// in the refund script (and not in the decision script).
    #[test]
    fn every_algorithm_is_spliced_under_its_tag() {
        for a in Algorithm::ALL {
            let spec = a.spec();
            let registered = format!("elseif alg == {} then", spec.tag);
            assert!(SOURCE.contains(&registered), "{a} has no Lua step");
            let Some(refund) = spec.lua_refund() else {
                continue;
            };
            let branch = format!("{registered}\n{}", with_constants(refund));
            assert!(
                REFUND_SOURCE.contains(&branch),
                "{a}: lua/refund.lua lacks its refund"
            );
            assert!(
                !SOURCE.contains(&branch),
                "{a}: its refund is in the decision script"
            );
        }
    }
}
