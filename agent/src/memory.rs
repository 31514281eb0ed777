//! The agent's memory: mimalloc as the allocator, freed memory handed
//! back to the system at once and by idle workers, no transparent huge pages.

/// mimalloc instead of glibc malloc: glibc keeps the memory of a large batch
/// (a join of 100,000 keys) in its per-thread arenas long after it is freed;
/// mimalloc hands it back to the system (see [`collect_freed_memory`]).
/// The `system-allocator` feature keeps glibc's, for heap profilers that
/// hook malloc (`heaptrack`), whose figures are then glibc's.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// At most this often a runtime worker going idle returns freed memory.
const COLLECT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Called when a runtime worker goes idle: memory one thread allocated and
/// another freed (a batch decoded on one worker, applied on the other) is
/// only reclaimed by mimalloc when the allocating thread collects, and an
/// idle thread never would. Throttled, so a busy agent pays for it at most
/// once a second per worker.
pub(crate) fn collect_freed_memory() {
    thread_local! {
        static LAST: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
    }
    let now = std::time::Instant::now();
    if LAST.get().is_some_and(|last| now.duration_since(last) < COLLECT_EVERY) {
        return;
    }
    LAST.set(Some(now));
    if !cfg!(feature = "system-allocator") {
        // SAFETY: mi_collect only walks and releases this thread's own
        // mimalloc heap (the global allocator above); it takes no pointers.
        unsafe { libmimalloc_sys::mi_collect(true) }
    }
}

/// Transparent huge pages off for this process. mimalloc asks for them for
/// its arenas, and a 2 MiB page keeps all of itself resident while any
/// allocation in it lives, and is zeroed whole when first touched: an agent
/// holding 100,000 keys sat at 60–65 MiB with them and at 42–48 MiB without
/// (`keysync-bench --join 100000`), and a burst spent a tenth of its time
/// zeroing fresh huge pages. A refusal (a seccomp filter) changes nothing else.
pub(crate) fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes no pointers; it sets a flag of this process.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// mimalloc's `purge_delay` option (`mi_option_purge_delay` in mimalloc.h,
/// the same index in its v2 and v3; libmimalloc-sys names no constant).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Memory freed back to mimalloc's arenas is returned to the system at once,
/// not a second later (v3's default): a join or a first start frees and
/// allocates batches of thousands of keys several times a second, and each
/// batch's memory stayed resident until the next purge, on top of the next
/// batch's. The agents' peaks in a join of 100,000 keys fell from 139–196
/// MiB to 100–146 MiB (`keysync-bench --join 100000`), a first start's by 5
/// MiB, at no cost the benchmark could see (freed pages are decommitted, and
/// faulted in again when reused). `MIMALLOC_PURGE_DELAY` in the environment
/// (mimalloc's own variable, in milliseconds) still sets it instead.
pub(crate) fn purge_freed_memory_at_once() {
    if !cfg!(feature = "system-allocator") && std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an option; mimalloc reads options at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
    }
}

#[cfg(test)]
mod tests {
    /// The option set is mimalloc's purge delay: at its default (1000 ms in
    /// mimalloc v3, 10 ms in v2) until set, then 0.
    #[cfg(not(feature = "system-allocator"))]
    #[test]
    fn the_option_set_is_mimallocs_purge_delay() {
        // SAFETY: reads an option.
        let default = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert!(default == 1000 || default == 10, "option {} is {default}", super::MI_OPTION_PURGE_DELAY);
        super::purge_freed_memory_at_once();
        // SAFETY: reads an option.
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) }, 0);
    }
}
