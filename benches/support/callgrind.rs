//! Reads a callgrind output file: the instructions spent in each source file.
//!
//! The format (valgrind's "Callgrind Format Specification"): `fl=`, `fi=` and `fe=` name the
//! source file of the cost lines that follow (`fi=`/`fe=` the file of code inlined into the
//! function), a name may be compressed (`fl=(3) /path` defines id 3, a later `fl=(3)` reuses
//! it; `cfi=`, `cfl=` and `jfi=` share the same ids), and a cost line starts with a digit, `+`,
//! `-` or `*` (its positions, then one figure per event). The cost line after a `calls=` line
//! is the call's inclusive cost: it belongs to the callee, not to the current file. A position
//! may be relative to the previous cost line's (`+2`, `-3`, `*` the same).
//!
//! Instructions at line 0 (code the compiler made without a source line: no debug
//! information, or glue such as drops and moves, which the line table files under whatever file
//! its compilation unit started with) belong to no file.

use std::collections::{BTreeMap, HashMap};

/// What one callgrind output file says, per source file.
pub struct SelfCost {
    /// Instructions (`Ir`) executed in each source file's own code, inlined code in the file it
    /// came from.
    pub by_file: BTreeMap<String, u64>,
    /// Instructions at line 0: of no source file.
    pub no_line: u64,
    /// The file's `summary:` (or `totals:`) figure: every instruction counted.
    pub total: u64,
}

/// The self cost of every source file named in `text`, a callgrind output file of one part.
///
/// Fails on a line it cannot read, on a dump without `Ir`, and when the files' figures do not
/// add up to the dump's total (each instruction is the self cost of exactly one file).
pub fn self_cost(text: &str) -> Result<SelfCost, String> {
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut by_file: BTreeMap<String, u64> = BTreeMap::new();
    let mut no_line = 0;
    let mut file = String::from("???");
    // The positions of a cost line (`line` by default), the one that is the line, and the
    // previous cost line's, which a relative position counts from.
    let mut previous = vec![0_i64];
    let mut line_column = Some(0);
    let mut ir = None;
    let mut total = None;
    let mut inclusive_next = false;
    for (number, line) in text.lines().enumerate() {
        let bad = |what: &str| format!("callgrind output line {}: {what}: {line}", number + 1);
        match line.bytes().next() {
            Some(b'0'..=b'9' | b'+' | b'-' | b'*') => {
                let mut fields = line.split_whitespace();
                for last in previous.iter_mut() {
                    let position = fields.next().ok_or_else(|| bad("a position missing"))?;
                    *last = position_of(position, *last).ok_or_else(|| bad("not a position"))?;
                }
                if std::mem::take(&mut inclusive_next) {
                    continue; // a call's inclusive cost
                }
                let event = ir.ok_or_else(|| bad("a cost line before `events:`"))?;
                let figure = fields.nth(event).unwrap_or("0");
                let figure: u64 = figure.parse().map_err(|_| bad("not a cost"))?;
                match line_column.map(|column| previous[column]) {
                    Some(0) | None => no_line += figure,
                    Some(_) => *by_file.entry(file.clone()).or_default() += figure,
                }
            }
            _ => {
                if let Some(name) = ["fl=", "fi=", "fe="]
                    .iter()
                    .find_map(|key| line.strip_prefix(key))
                {
                    file = resolve(&mut names, name).ok_or_else(|| bad("an unknown file id"))?;
                } else if let Some(name) = ["cfi=", "cfl=", "jfi="]
                    .iter()
                    .find_map(|key| line.strip_prefix(key))
                {
                    resolve(&mut names, name).ok_or_else(|| bad("an unknown file id"))?;
                } else if line.starts_with("calls=") {
                    inclusive_next = true;
                } else if let Some(columns) = line.strip_prefix("positions:") {
                    let columns: Vec<&str> = columns.split_whitespace().collect();
                    line_column = columns.iter().position(|column| *column == "line");
                    previous = vec![0; columns.len()];
                } else if let Some(events) = line.strip_prefix("events:") {
                    ir = events.split_whitespace().position(|event| event == "Ir");
                    if ir.is_none() {
                        return Err(bad("no `Ir` event"));
                    }
                } else if let Some(figures) = line
                    .strip_prefix("summary:")
                    .or_else(|| line.strip_prefix("totals:"))
                {
                    let event = ir.ok_or_else(|| bad("a total before `events:`"))?;
                    total = figures
                        .split_whitespace()
                        .nth(event)
                        .and_then(|figure| figure.parse().ok());
                }
            }
        }
    }
    let total = total.ok_or("callgrind output without `summary:` or `totals:`")?;
    let sum = by_file.values().sum::<u64>() + no_line;
    if sum != total {
        return Err(format!(
            "callgrind output: the files' self costs add up to {sum}, its total is {total}"
        ));
    }
    Ok(SelfCost {
        by_file,
        no_line,
        total,
    })
}

/// A position column's value: `*` (the same as the previous cost line's), `+n` or `-n` (from
/// it), a number, or a `0x` address.
fn position_of(text: &str, previous: i64) -> Option<i64> {
    match text.as_bytes().first()? {
        b'*' => Some(previous),
        b'+' => Some(previous + parse_position(&text[1..])?),
        b'-' => Some(previous - parse_position(&text[1..])?),
        _ => parse_position(text),
    }
}

fn parse_position(text: &str) -> Option<i64> {
    match text.strip_prefix("0x") {
        Some(hex) => i64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The name of `(id) name`, `(id)` (an id defined before) or `name`, defining the id.
fn resolve(names: &mut HashMap<u64, String>, text: &str) -> Option<String> {
    let Some(rest) = text.strip_prefix('(') else {
        return Some(text.to_owned());
    };
    let (id, name) = rest.split_once(')')?;
    let id: u64 = id.parse().ok()?;
    let name = name.trim_start();
    if name.is_empty() {
        names.get(&id).cloned()
    } else {
        names.insert(id, name.to_owned());
        Some(name.to_owned())
    }
}
