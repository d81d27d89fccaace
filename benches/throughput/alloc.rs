//! Allocation counting: the figures say how many allocations a decision takes.

use super::*;

/// Counts every allocation (and reallocation) of the process.
///
/// Each thread counts on a cache line of its own: one shared counter had both cores fight over
/// one line on every allocation, which slowed a run in proportion to its allocations (the
/// layer's 22 per request against `check`'s 12) and so leaned on the ratios this bench exists
/// to measure.
pub(crate) struct CountingAlloc;

/// Counting shards, one cache line each; threads take them in turn (more threads than shards
/// share one, which only costs speed).
pub(crate) static ALLOCATIONS: [Shard; SHARDS] = [const { Shard(AtomicU64::new(0)) }; SHARDS];
pub(crate) const SHARDS: usize = 16;
/// The shard the next new thread takes.
pub(crate) static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

#[repr(align(128))]
pub(crate) struct Shard(AtomicU64);

thread_local! {
    /// This thread's shard, `usize::MAX` until its first allocation. A `const` `Copy` value:
    /// reading it never allocates and never runs a destructor, as an allocator needs.
    static SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

pub(crate) fn count_allocation() {
    let shard = SHARD
        .try_with(|shard| {
            if shard.get() == usize::MAX {
                shard.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS);
            }
            shard.get()
        })
        .unwrap_or(0);
    ALLOCATIONS[shard].0.fetch_add(1, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_allocation();
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

pub(crate) fn allocations() -> u64 {
    ALLOCATIONS
        .iter()
        .map(|shard| shard.0.load(Ordering::Relaxed))
        .sum()
}
