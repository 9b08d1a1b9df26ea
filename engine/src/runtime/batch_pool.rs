//! Row batches recycled on the worker that emptied them.
//!
//! A source fills a fresh batch per output per poll, and the agg that reads it frees it on its
//! own worker. From the allocator, the source gets memory back whose lines the other core read
//! last (a batch is too large for glibc's per-thread cache, so it returns to the source's arena),
//! and every store of the next batch waits for those lines. Here an agg keeps the batches it
//! emptied on its worker's thread, and a source on that worker fills those next: the lines are
//! in the core's own cache. A batch encoded for another node is given back where it was encoded
//! (on the source's worker, `channel::encode`).
//!
//! Per thread on purpose, unlike the frame buffers' shared `weir_wire::frame::BufferPool`: what
//! this pool saves is the trip of a batch's lines between cores, which a shared pool would keep.
//!
//! Invariants: a pooled batch is empty; the pool holds at most [`KEEP`] batches per thread.

use std::cell::RefCell;

use weir_wire::Batch;

/// Batches a thread keeps (a poll of a source fills one per output).
const KEEP: usize = 16;

thread_local! {
    static POOL: RefCell<Vec<Batch>> = const { RefCell::new(Vec::new()) };
}

/// An empty batch with room for at least `rows` rows: one this thread emptied, or a new one.
pub(crate) fn take(rows: usize) -> Batch {
    POOL.with_borrow_mut(|pool| {
        while let Some(b) = pool.pop() {
            if b.capacity() >= rows {
                return b;
            }
        }
        Batch::with_capacity(rows)
    })
}

/// Keeps `batch` (emptied) for this thread's next [`take`], unless the pool is full.
pub(crate) fn give(mut batch: Batch) {
    batch.clear();
    POOL.with_borrow_mut(|pool| {
        if pool.len() < KEEP {
            pool.push(batch);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_given_back_is_taken_again_empty_and_a_too_small_one_is_not() {
        // The pool is the thread's: a test run on one thread may have left batches in it.
        POOL.with_borrow_mut(Vec::clear);
        let mut b = take(100);
        b.push(1, 2, 3.0);
        let ptr = b.ts.as_ptr();
        give(b);
        let again = take(100);
        assert!(again.is_empty());
        assert_eq!(again.ts.as_ptr(), ptr, "the same allocation comes back");
        give(Batch::with_capacity(10));
        let big = take(1000);
        assert!(big.capacity() >= 1000);
        assert!(POOL.with_borrow(Vec::is_empty), "the small batch was dropped, not kept");
    }
}
