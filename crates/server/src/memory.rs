//! How kairosd gets its memory: the allocator, and no transparent huge pages.

/// mimalloc: per-thread free lists instead of glibc's arenas. The submit path allocates and frees
/// many small buffers on different threads (decode, encode, replication, apply); with glibc that
/// cost ~10 % of the leader's CPU and grew and trimmed heaps (mprotect, page faults) all along.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (Linux `PR_SET_THP_DISABLE`), as databases
/// advise: mimalloc asks for them on its arenas, and the first touch of one zeroes 2 MiB inside
/// whatever request touched it. Under the submit benchmark that zeroing was ~6 % of all CPU
/// (`clear_page_erms` under `do_huge_pmd_anonymous_page`, reached from growing append and
/// decode buffers) and lifted p99 from ~12 ms to 14–20 ms. Whether it took effect is returned;
/// kairosd runs either way.
pub fn no_huge_pages() -> bool {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes no memory we hold.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 }
}

#[cfg(test)]
mod tests {
    #[test]
    fn after_it_the_kernel_reports_huge_pages_off_for_the_process() {
        assert!(super::no_huge_pages());
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("THP_enabled:")).expect("THP_enabled in status");
        assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
    }
}
