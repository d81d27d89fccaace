//! Concurrency slots: the argument of `lua/slots.lua` and its Rust mirror over the memory
//! store's encoding of the sorted set (16 bytes per slot: the lease's end as a little-endian
//! double, then the id's 8-byte hash; the ids themselves are the holders' business).

/// The operations' bytes.
pub(crate) const ACQUIRE: u8 = b'a';
pub(crate) const RENEW: u8 = b'n';
pub(crate) const RELEASE: u8 = b'r';

/// One slot call on the memory store's encoding `held`, the steps of `lua/slots.lua`: the
/// reply `(ok, n, wait_us)` and the new encoding (`None`: nothing held, the key is deleted).
pub(crate) fn slots_step(
    held: &[u8],
    op: u8,
    limit: u64,
    lease_us: u64,
    ids: &[u64],
    now: u64,
) -> ((bool, u64, u64), Option<Vec<u8>>) {
    // Leases that have ended are free (as ZREMRANGEBYSCORE -inf now).
    let mut slots: Vec<(f64, u64)> = held
        .chunks_exact(16)
        .map(|c| {
            let end = f64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            let id = u64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
            (end, id)
        })
        .filter(|&(end, _)| end > now as f64)
        .collect();
    let end = (now + lease_us) as f64;
    // ZADD: a new lease's end for `id`; whether it was added (not held before).
    let add = |slots: &mut Vec<(f64, u64)>, id: u64| match slots.iter_mut().find(|s| s.1 == id) {
        Some(slot) => {
            slot.0 = end;
            false
        }
        None => {
            slots.push((end, id));
            true
        }
    };
    let reply = match op {
        ACQUIRE => {
            let before = slots.len() as u64;
            if before >= limit {
                let oldest = slots.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
                (false, 0, (oldest - now as f64).max(0.0) as u64)
            } else {
                for &id in ids {
                    add(&mut slots, id);
                }
                (true, limit - before - 1, 0)
            }
        }
        RENEW => {
            // A slot the store lost is put back: its request is still in flight.
            let restored = ids.iter().filter(|&&id| add(&mut slots, id)).count() as u64;
            (restored == 0, restored, 0)
        }
        _ => {
            let before = slots.len();
            slots.retain(|s| !ids.contains(&s.1));
            let removed = (before - slots.len()) as u64;
            (removed > 0, removed, 0)
        }
    };
    let bytes: Vec<u8> = slots
        .iter()
        .flat_map(|(end, id)| end.to_le_bytes().into_iter().chain(id.to_le_bytes()))
        .collect();
    (reply, (!bytes.is_empty()).then_some(bytes))
}

#[cfg(test)]
mod tests {
    use super::{slots_step, ACQUIRE, RENEW};

    /// A renewal of a slot the store lost (the key gone) puts it back, with its id.
    #[test]
    fn a_renewal_puts_a_lost_slot_back() {
        let ((ok, _, _), after) = slots_step(&[], RENEW, 1, 1_000, &[7], 5_000);
        let held = after.unwrap_or_default();
        assert_eq!(
            held.len(),
            16,
            "{} bytes held after the renewal (ok {ok})",
            held.len()
        );
        // It counts against the limit again.
        let ((admitted, _, _), _) = slots_step(&held, ACQUIRE, 1, 1_000, &[8], 5_001);
        assert!(!admitted);
    }
}
