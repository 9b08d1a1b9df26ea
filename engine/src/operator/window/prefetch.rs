//! The engine's one use of `unsafe`: a prefetch hint, which the agg issues for the rows it will
//! aggregate next (their hash-table lines arrive while it works on the rows before them).

#![allow(unsafe_code)]

/// Asks the CPU to bring the cache line of `r` closer; does nothing elsewhere than x86-64.
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing the program observes and never faults, and
    // `r` is a valid reference besides.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>((r as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}
