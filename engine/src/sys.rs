//! The one module with `unsafe` code: five things past what safe Rust offers, each measured to
//! matter.
//!
//! - [`lower_priority`]: a client's heavy work (`weir verify` recomputing results) runs at a
//!   lower priority than the nodes it checks, which may share its cores.
//! - [`background_thread`]: uploader threads run as `SCHED_BATCH` (an FFI call). The same CPU
//!   share as other threads, but a waking uploader does not preempt the running thread. On a
//!   machine whose cores the pinned workers keep busy, every fsync an upload waits for would
//!   end with the uploader preempting a worker — sometimes in the middle of an alignment or a
//!   state copy. Measured with `weir-e2e checkpoints`, runs with and without this call: pause
//!   p99 2.6–5.9 ms (median 3.0) with it, 2.9–9.2 ms (median 4.7) without, for about 2.5 ms more
//!   trigger-to-commit time. The workers yield to waiting threads between polls anyway
//!   (`runtime/worker.rs`), so uploads still run promptly.
//! - [`prefetch`]: a prefetch hint, which the agg issues for the rows it aggregates next (their
//!   hash-table lines arrive while it works on the rows before them; `weir-e2e agg`: 132 against
//!   107–110 ns per row at 1,000,000 keys without and with it).
//! - [`truncate`]: the fixed-point conversion of every value the agg sums, without the
//!   saturating checks of `as` (see `operator/window/fixed.rs` for what it measured).
//! - [`TableBuf`]: the window tables' arrays, large ones on transparent huge pages (raw memory
//!   mappings: see `table_buf.rs` for why and what it measured).

#![allow(unsafe_code)]

mod table_buf;
pub(crate) use table_buf::TableBuf;

/// Lowers the calling thread's priority, and that of the threads it starts afterwards, to nice
/// 10 in the batch class (Linux; elsewhere nothing): nodes on the same cores get about ten times
/// its CPU share while both run, and it is not woken ahead of them. Failure is logged.
pub fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: both calls act on the calling thread only (pid and who 0) and read no memory
        // but `param`, a valid, initialised `sched_param` that outlives the call; raising one's
        // own nice value and SCHED_BATCH with priority 0 are permitted to unprivileged threads.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        // SAFETY: as above.
        let n = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
        if r != 0 || n != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot lower this thread's priority");
        }
    }
}

/// Puts the calling thread in the batch scheduling class (Linux; elsewhere nothing). Failure only
/// costs latency: it is logged, not returned.
pub(crate) fn background_thread() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` with pid 0 acts on the calling thread only; `param` is a
        // valid, initialised `sched_param` that outlives the call, and SCHED_BATCH with priority
        // 0 is permitted to unprivileged threads. No memory is shared with the kernel afterwards.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if r != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot run an uploader as SCHED_BATCH");
        }
    }
}

/// `y` truncated toward zero when that fits in an i64 other than `i64::MIN`, else `i64::MIN`
/// (NaN and infinities included): the conversion as x86-64's hardware does it, without the
/// checks `as` adds for saturation and NaN (elsewhere, those checks).
#[inline(always)]
pub fn truncate(y: f64) -> i64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2, the only target feature these two intrinsics need, is part of x86-64's
    // baseline; they read and write registers only.
    unsafe {
        use core::arch::x86_64::{_mm_cvttsd_si64, _mm_set_sd};
        _mm_cvttsd_si64(_mm_set_sd(y))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        const TWO_63: f64 = 9_223_372_036_854_775_808.0;
        if y.abs() < TWO_63 { y as i64 } else { i64::MIN }
    }
}

/// `if a < b { a } else { b }` (`b` when either is NaN) in x86-64's one instruction; the
/// compiler otherwise builds it from a packed compare and masks.
#[inline(always)]
pub fn min_or_second(a: f64, b: f64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 (part of x86-64's baseline) is the only target feature these intrinsics
    // need; they read and write registers only.
    unsafe {
        use core::arch::x86_64::{_mm_cvtsd_f64, _mm_min_sd, _mm_set_sd};
        _mm_cvtsd_f64(_mm_min_sd(_mm_set_sd(a), _mm_set_sd(b)))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        if a < b { a } else { b }
    }
}

/// `if a > b { a } else { b }` (`b` when either is NaN), as [`min_or_second`].
#[inline(always)]
pub fn max_or_second(a: f64, b: f64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `min_or_second`.
    unsafe {
        use core::arch::x86_64::{_mm_cvtsd_f64, _mm_max_sd, _mm_set_sd};
        _mm_cvtsd_f64(_mm_max_sd(_mm_set_sd(a), _mm_set_sd(b)))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        if a > b { a } else { b }
    }
}

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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::truncate;

    /// The calling thread's scheduling policy, from `/proc` (field 41 of `stat`).
    fn policy() -> u32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(41 - 3).unwrap().parse().unwrap()
    }

    #[test]
    fn a_background_thread_runs_in_the_batch_class() {
        let p = std::thread::spawn(|| {
            let before = policy();
            super::background_thread();
            (before, policy())
        })
        .join()
        .unwrap();
        assert_eq!(p, (libc::SCHED_OTHER as u32, libc::SCHED_BATCH as u32));
    }

    #[test]
    fn truncation_matches_as_within_i64_and_gives_its_minimum_past_it() {
        let two_63 = 9_223_372_036_854_775_808.0f64;
        let below = f64::from_bits(two_63.to_bits() - 1);
        for x in [0.0, -0.0, 3.7, -3.7, 0.5, -0.999, 4.5e15 + 0.5, 1e18, -1e18, below, -below] {
            assert_eq!(truncate(x), x as i64, "{x}");
        }
        for x in [two_63, -two_63, 1e300, -1e300, f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            assert_eq!(truncate(x), i64::MIN, "{x}");
        }
    }
}
