//! The scripts Redis runs, assembled from `lua/` and the algorithms' specs: the steps spliced
//! into the driver, the refund steps into the refund script, the names into the controls, the
//! decision script into the block script, and into every script the values of the shared
//! constants ([`CONSTANTS`]).
//!
//! The Lua writes a shared number by its name in capitals (`MAX_EXACT`, `CONTROLS`,
//! `STATE_LEN`, ...); assembly writes the value in as a literal. So each number has one source,
//! here, and no call pays for a local holding it (a literal is a constant of the compiled
//! chunk).

use std::sync::LazyLock;

use super::layout::{CONTROLS, CONTROLS_HEAD, MAX_REPLY_MS, OVERRIDE_IDLE_MS, QUOTA_BYTES, STAMP};
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
    ]
});

/// `script` with every shared constant's name, outside comments and strings, replaced by its
/// value.
fn with_constants(script: &str) -> String {
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
            match CONSTANTS.iter().find(|(name, _)| *name == &rest[..len]) {
                Some((_, value)) => {
                    out.push_str(&value.to_string());
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
    let script = include_str!("../../lua/refund.lua");
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
    let spliced = include_str!("../../lua/control.lua").replacen("-- @names\n", &line, 1);
    assert!(
        spliced.contains(&line),
        "lua/control.lua has its @names line"
    );
    with_constants(&spliced)
});

/// The block script: the decision script as a function, spliced into `lua/block.lua`.
pub(crate) static BLOCK_SOURCE: LazyLock<String> = LazyLock::new(|| {
    let wrapper = include_str!("../../lua/block.lua");
    let spliced = wrapper.replacen("-- @decide\n", &SOURCE, 1);
    assert_ne!(spliced, wrapper, "lua/block.lua has its @decide line");
    with_constants(&spliced)
});

/// The concurrency slots' script.
pub(crate) static SLOTS_SOURCE: LazyLock<String> =
    LazyLock::new(|| with_constants(include_str!("../../lua/slots.lua")));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::layout::ARGS_HEADER;

    /// Every script as sent, and the files it is made of.
    fn scripts() -> [(&'static str, &'static str, &'static str); 5] {
        [
            ("common.lua", include_str!("../../lua/common.lua"), &SOURCE),
            (
                "control.lua",
                include_str!("../../lua/control.lua"),
                &CONTROL_SOURCE,
            ),
            (
                "refund.lua",
                include_str!("../../lua/refund.lua"),
                &REFUND_SOURCE,
            ),
            (
                "block.lua",
                include_str!("../../lua/block.lua"),
                &BLOCK_SOURCE,
            ),
            (
                "slots.lua",
                include_str!("../../lua/slots.lua"),
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
