//! A Redis Cluster as `CLUSTER NODES` describes it: the masters to scan, the slots each serves,
//! and what a scan that could not read every slot says about the slots it missed.

/// The hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// A master that serves slots, from a line of `CLUSTER NODES`.
#[derive(Debug, PartialEq, Eq)]
pub struct Master {
    /// `None` when the node does not know its own (the given node's is used).
    pub host: Option<String>,
    pub port: u16,
    /// As `CLUSTER NODES` shows them, e.g. `master,fail?`.
    pub flags: String,
    /// The ranges it serves, first and last slot included (migration markers left out).
    pub slots: Vec<(u16, u16)>,
}

/// Every master with slots in a `CLUSTER NODES` reply (lines of `id host:port@bus[,hostname]
/// flags master ping pong epoch link slot...`), whatever its flags: one flagged `fail?` (only
/// suspected) or `fail` (agreed) still holds its slots until a replica takes them over, and is
/// read or named as unread like any other. A master without slots (its replica took over, or
/// an empty one) holds no keys to scan.
pub fn masters(nodes: &str) -> Vec<Master> {
    let mut masters = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, address, flags, ..] = fields.as_slice() else {
            continue;
        };
        if !flags.split(',').any(|flag| flag == "master") {
            continue;
        }
        if fields.len() < 9 {
            continue; // no slots: nothing to scan
        }
        let address = address.split(['@', ',']).next().unwrap_or_default();
        let Some((host, port)) = address.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse() else {
            continue;
        };
        masters.push(Master {
            host: (!host.is_empty()).then(|| host.to_owned()),
            port,
            flags: (*flags).to_owned(),
            slots: fields[8..]
                .iter()
                .filter_map(|field| range(field))
                .collect(),
        });
    }
    masters
}

/// A slot field, `5` or `0-5460`; `None` for a migration marker (`[5->-id]`, `[5-<-id]`).
fn range(field: &str) -> Option<(u16, u16)> {
    let (first, last) = field.split_once('-').unwrap_or((field, field));
    let (first, last) = (first.parse().ok()?, last.parse().ok()?);
    (first <= last && last < SLOTS).then_some((first, last))
}

/// `0-5460 5462`: slot ranges as `CLUSTER NODES` writes them.
pub fn ranges_text(ranges: &[(u16, u16)]) -> String {
    let texts: Vec<String> = ranges
        .iter()
        .map(|&(first, last)| match first == last {
            true => first.to_string(),
            false => format!("{first}-{last}"),
        })
        .collect();
    texts.join(" ")
}

/// The slots in `slots` (ascending) as ranges of consecutive slots.
fn runs(slots: impl Iterator<Item = u16>) -> Vec<(u16, u16)> {
    let mut ranges: Vec<(u16, u16)> = Vec::new();
    for slot in slots {
        match ranges.last_mut() {
            Some((_, last)) if *last + 1 == slot => *last = slot,
            _ => ranges.push((slot, slot)),
        }
    }
    ranges
}

/// What a scan knows of a slot.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// No master serves it.
    Unserved,
    /// Its master could not be read.
    Unread,
    Read,
}

/// Which slots a scan read, and why it could not read the others.
pub struct Coverage {
    slots: Vec<Slot>,
    /// One entry per master that could not be read: who, which slots, why.
    unread: Vec<String>,
}

impl Coverage {
    /// No slot read yet.
    pub fn new() -> Coverage {
        Coverage {
            slots: vec![Slot::Unserved; usize::from(SLOTS)],
            unread: Vec::new(),
        }
    }

    /// `master` was scanned to the end.
    pub fn read(&mut self, master: &Master) {
        for &(first, last) in &master.slots {
            self.slots[usize::from(first)..=usize::from(last)].fill(Slot::Read);
        }
    }

    /// `master`, at `address`, could not be scanned, for `reason`.
    pub fn unread(&mut self, master: &Master, address: &str, reason: &str) {
        for &(first, last) in &master.slots {
            for slot in &mut self.slots[usize::from(first)..=usize::from(last)] {
                if *slot == Slot::Unserved {
                    *slot = Slot::Unread;
                }
            }
        }
        self.unread.push(format!(
            "master {address} ({}) serving slots {}: {reason}",
            master.flags,
            ranges_text(&master.slots)
        ));
    }

    /// `None` when every slot was read; else the one-line error that says how many were not,
    /// and names each master that could not be read (its address, flags, slots and why) and
    /// the slots no master serves.
    pub fn missing(&self) -> Option<String> {
        let state = |wanted: &'static [Slot]| {
            (0..SLOTS).filter(move |&slot| wanted.contains(&self.slots[usize::from(slot)]))
        };
        let count = state(&[Slot::Unserved, Slot::Unread]).count();
        if count == 0 {
            return None;
        }
        let mut parts = self.unread.clone();
        let unserved = runs(state(&[Slot::Unserved]));
        if !unserved.is_empty() {
            parts.push(format!(
                "slots {}: no master serves them",
                ranges_text(&unserved)
            ));
        }
        Some(format!(
            "not every slot of the cluster could be read ({count} of {SLOTS} not read; their \
             tenants would be left out): {}",
            parts.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_with_slots_whatever_their_flags() {
        let nodes = "\
a 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b 10.0.0.2:7001@17001,node-b master - 0 0 2 connected 5461-10921 [10922->-e]
c 10.0.0.3:7002@17002 slave b 0 0 2 connected
d 10.0.0.4:7003@17003 master,fail? - 0 0 3 connected 10922-16000
e :7004@17004 master,fail - 0 0 4 disconnected 16001 16002-16383
f 10.0.0.6:7005@17005 master - 0 0 5 connected
";
        let masters = masters(nodes);
        let found: Vec<_> = masters
            .iter()
            .map(|m| (m.host.as_deref(), m.port, m.flags.as_str(), m.slots.clone()))
            .collect();
        assert_eq!(
            found,
            [
                (Some("10.0.0.1"), 7000, "myself,master", vec![(0, 5460)]),
                (Some("10.0.0.2"), 7001, "master", vec![(5461, 10921)]),
                (Some("10.0.0.4"), 7003, "master,fail?", vec![(10922, 16000)]),
                (
                    None,
                    7004,
                    "master,fail",
                    vec![(16001, 16001), (16002, 16383)]
                ),
            ]
        );
    }

    #[test]
    fn coverage_names_the_unread_masters_and_the_unserved_slots() {
        let nodes = "\
a 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
d 10.0.0.4:7003@17003 master,fail? - 0 0 3 connected 5461-10000 10002
";
        let masters = masters(nodes);
        let mut coverage = Coverage::new();
        coverage.read(&masters[0]);
        assert!(coverage.missing().is_some());
        coverage.unread(&masters[1], "10.0.0.4:7003", "Connection refused");
        assert_eq!(
            coverage.missing().unwrap(),
            "not every slot of the cluster could be read (10923 of 16384 not read; their \
             tenants would be left out): master 10.0.0.4:7003 (master,fail?) serving slots \
             5461-10000 10002: Connection refused; slots 10001 10003-16383: no master serves \
             them"
        );
        let all = "a 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-16383";
        let mut coverage = Coverage::new();
        coverage.read(&super::masters(all)[0]);
        assert_eq!(coverage.missing(), None);
    }
}
