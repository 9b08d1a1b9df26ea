//! [`TableBuf`]: the fixed-length arrays of the window tables, large ones on 2 MiB pages.
//!
//! Why: from a million keys on, every row the agg adds lands on a random line of hundreds of
//! megabytes of tables, and with 4 KiB pages every such access also misses the TLB: the page
//! walk (two-dimensional in a virtual machine) held the prefetch that asks for the line, and
//! with it the agg's loop (`perf annotate` of `weir-e2e agg 4000000`: 81 % of the loop's samples
//! on the instruction after the prefetch). Transparent huge pages cover 2 MiB per TLB entry, but
//! this machine's setting (`madvise`, Debian's default) gives them only to memory that asks, and
//! only in whole aligned 2 MiB: a table of a million keys' shard is 256 KiB to 1 MiB. So tables
//! from [`HUGE_FROM`] up come from aligned 2 MiB chunks advised `MADV_HUGEPAGE`, each chunk
//! carved into blocks of one size; tables of 2 MiB and more are aligned mappings of their own.
//!
//! Invariants: a buffer owns `len` initialised elements (written with `T::default()` when made);
//! a chunk's blocks are all of one power-of-two size, each either owned by one buffer or on the
//! arena's free list of that size; a chunk with no owned block has none on a free list, and is
//! either one of at most [`SPARE`] spare chunks (re-carved for the next size asked) or unmapped.
//! Where the kernel refuses the advice or the mapping, a table is an ordinary heap allocation:
//! only speed depends on this, never correctness.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Mutex;

/// The huge page size, the chunk size and alignment.
const HUGE: usize = 2 << 20;

/// Buffers from this many bytes (a 4 KiB page) on come from huge-page chunks.
///
/// Not larger: at 100,000 keys a shard's table is 32 KiB and a window's 256 of them 8 MiB; on
/// small pages that is 2,048 of them, as many as the second-level TLB holds, so rows would miss it
/// too. `weir-e2e agg 100000`, three pairs: 19.7 / 20.0 / 20.1 ns per row from 4 KiB against
/// 21.7 / 21.6 / 21.4 from 256 KiB.
const HUGE_FROM: usize = 4 << 10;

/// Where a buffer's memory came from (and goes back to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Home {
    /// A `Box<[T]>`.
    Heap,
    /// A block of a chunk of the arena, of this many bytes.
    Block(usize),
    /// A mapping of its own, of this many bytes.
    Mapping(usize),
}

/// A fixed-length array of `T`, dereferencing to a slice.
pub struct TableBuf<T: Copy + Default> {
    ptr: NonNull<T>,
    len: usize,
    home: Home,
}

// SAFETY: a `TableBuf` owns its elements exclusively, as a `Box<[T]>` does; the arena it may
// return its block to is behind a mutex.
unsafe impl<T: Copy + Default + Send> Send for TableBuf<T> {}
// SAFETY: shared access only reads the elements, as for `Box<[T]>`.
unsafe impl<T: Copy + Default + Sync> Sync for TableBuf<T> {}

impl<T: Copy + Default> TableBuf<T> {
    /// `len` elements, each `T::default()`.
    pub(crate) fn new(len: usize) -> Self {
        let bytes = len.checked_mul(size_of::<T>()).expect("a table of that many slots would not fit in memory");
        let placed = if bytes >= HUGE_FROM && align_of::<T>() <= HUGE && cfg!(target_os = "linux") {
            place(bytes)
        } else {
            None
        };
        let Some((p, home)) = placed else {
            let b: Box<[T]> = vec![T::default(); len].into_boxed_slice();
            let ptr = NonNull::new(Box::into_raw(b).cast::<T>()).expect("a box is not null");
            return Self { ptr, len, home: Home::Heap };
        };
        let ptr = p.cast::<T>();
        for i in 0..len {
            // SAFETY: `place` returned at least `bytes` writable bytes aligned to 2 MiB (blocks
            // sit at multiples of their power-of-two size), so element `i < len` is in bounds and
            // aligned; `write` does not read the uninitialised memory it replaces.
            unsafe { ptr.as_ptr().add(i).write(T::default()) };
        }
        Self { ptr, len, home }
    }

    /// Whether the memory came from a huge-page chunk or mapping.
    #[cfg(test)]
    fn on_huge_pages(&self) -> bool {
        self.home != Home::Heap
    }
}

impl<T: Copy + Default> Default for TableBuf<T> {
    fn default() -> Self {
        Self::new(0)
    }
}

impl<T: Copy + Default> std::ops::Deref for TableBuf<T> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` points to `len` initialised elements this buffer owns (see `new`; for
        // `len == 0` a dangling, aligned pointer, which a slice of length zero allows).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy + Default> std::ops::DerefMut for TableBuf<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy + Default> Clone for TableBuf<T> {
    fn clone(&self) -> Self {
        let mut c = Self::new(self.len);
        c.copy_from_slice(self);
        c
    }
}

impl<T: Copy + Default> std::fmt::Debug for TableBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableBuf").field("len", &self.len).field("home", &self.home).finish()
    }
}

impl<T: Copy + Default> Drop for TableBuf<T> {
    fn drop(&mut self) {
        match self.home {
            Home::Heap => {
                let s = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
                // SAFETY: made by `Box::into_raw` of a `Box<[T]>` of `len` elements in `new`,
                // and dropped once (here).
                drop(unsafe { Box::from_raw(s) });
            }
            Home::Block(bytes) => ARENA.lock().unwrap_or_else(|e| e.into_inner()).give(self.ptr.cast(), bytes),
            Home::Mapping(bytes) => unmap(self.ptr.cast(), bytes),
        }
    }
}

/// Memory for `bytes`: a block of a chunk when it divides one, else a mapping of its own.
fn place(bytes: usize) -> Option<(NonNull<u8>, Home)> {
    if bytes.is_power_of_two() && bytes < HUGE {
        let p = ARENA.lock().unwrap_or_else(|e| e.into_inner()).take(bytes)?;
        return Some((p, Home::Block(bytes)));
    }
    let mapped = bytes.div_ceil(HUGE) * HUGE;
    map_huge(mapped).map(|p| (p, Home::Mapping(mapped)))
}

/// Chunks carved into blocks: free blocks by size, and blocks owned per chunk.
#[derive(Default)]
struct Arena {
    free: HashMap<usize, Vec<usize>>,
    owned: HashMap<usize, usize>,
    /// Chunks no block uses, kept for the next chunk of any block size (at most [`SPARE`]).
    spare: Vec<usize>,
}

/// Unused chunks kept mapped: a window's first tables grow through every size, freeing chunks
/// of small blocks while the larger ones need new chunks, and a fresh chunk is a 2 MiB page the
/// kernel clears (`perf record` of `weir run --keys 4000000`: `clear_page_erms` 14 % of all
/// samples with every unused chunk unmapped, 10 % on 4 KiB pages).
const SPARE: usize = 32;

static ARENA: std::sync::LazyLock<Mutex<Arena>> = std::sync::LazyLock::new(Default::default);

impl Arena {
    fn take(&mut self, bytes: usize) -> Option<NonNull<u8>> {
        let free = self.free.entry(bytes).or_default();
        let p = match free.pop() {
            Some(p) => p,
            None => {
                let chunk = match self.spare.pop() {
                    Some(c) => c,
                    None => map_huge(HUGE)?.as_ptr() as usize,
                };
                free.extend((1..HUGE / bytes).rev().map(|i| chunk + i * bytes));
                chunk
            }
        };
        *self.owned.entry(p & !(HUGE - 1)).or_default() += 1;
        NonNull::new(p as *mut u8)
    }

    fn give(&mut self, p: NonNull<u8>, bytes: usize) {
        let p = p.as_ptr() as usize;
        let chunk = p & !(HUGE - 1);
        let owned = self.owned.get_mut(&chunk).expect("a block's chunk is known");
        *owned -= 1;
        let free = self.free.entry(bytes).or_default();
        if *owned > 0 {
            free.push(p);
            return;
        }
        // Nothing of the chunk is in use: its blocks leave the free list, and it is kept for
        // the next chunk of any size or goes back to the kernel.
        self.owned.remove(&chunk);
        free.retain(|&q| q & !(HUGE - 1) != chunk);
        if self.spare.len() < SPARE {
            self.spare.push(chunk);
        } else {
            unmap(NonNull::new(chunk as *mut u8).expect("not null"), HUGE);
        }
    }
}

/// `bytes` (a multiple of [`HUGE`]) of fresh memory aligned to [`HUGE`], advised to be backed by
/// huge pages; `None` when the kernel refuses the mapping.
#[cfg(target_os = "linux")]
fn map_huge(bytes: usize) -> Option<NonNull<u8>> {
    let len = bytes + HUGE;
    // SAFETY: an anonymous private mapping at an address of the kernel's choice touches no
    // existing memory; the result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let start = p as usize;
    let aligned = (start + HUGE - 1) & !(HUGE - 1);
    let (head, tail) = (aligned - start, start + len - (aligned + bytes));
    // SAFETY: the head and tail are parts of the mapping just made, outside `aligned..+bytes`,
    // and nothing refers to them. `madvise` only advises on memory of that mapping.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((aligned + bytes) as *mut libc::c_void, tail);
        }
        // Refused (THP off, an old kernel): ordinary pages, the same results.
        libc::madvise(aligned as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
    }
    NonNull::new(aligned as *mut u8)
}

#[cfg(not(target_os = "linux"))]
fn map_huge(_bytes: usize) -> Option<NonNull<u8>> {
    None
}

fn unmap(p: NonNull<u8>, bytes: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: `p..p + bytes` is a whole mapping (or chunk) made by `map_huge`, of which no
    // buffer owns anything any more.
    unsafe {
        libc::munmap(p.as_ptr().cast(), bytes);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Default, Debug, PartialEq)]
    #[repr(C, align(64))]
    struct Line([u64; 8]);

    fn filled(n: usize, seed: u64) -> TableBuf<Line> {
        let mut b = TableBuf::<Line>::new(n);
        assert!(b.iter().all(|l| *l == Line::default()), "made with defaults");
        for (i, l) in b.iter_mut().enumerate() {
            l.0 = [seed + i as u64; 8];
        }
        b
    }

    #[test]
    fn buffers_of_every_size_hold_their_elements_apart_and_clone() {
        // Heap (2 KiB), blocks of 64 KiB, 256 KiB and 1 MiB (several per chunk), a 4 MiB mapping.
        let sizes = [32, 1024, 4096, 4096, 16384, 16384, 65536];
        let bufs: Vec<_> = sizes.iter().enumerate().map(|(k, &n)| filled(n, k as u64 * 1_000_000)).collect();
        for (k, b) in bufs.iter().enumerate() {
            assert_eq!(b.len(), sizes[k]);
            assert_eq!(b.on_huge_pages(), cfg!(target_os = "linux") && sizes[k] * 64 >= HUGE_FROM);
            assert!(b.iter().enumerate().all(|(i, l)| l.0[7] == k as u64 * 1_000_000 + i as u64), "buffer {k}");
            let c = b.clone();
            assert_eq!(&c[..], &b[..]);
        }
        // Dropped on another thread (as the uploader drops a snapshot's tables).
        std::thread::spawn(move || drop(bufs)).join().unwrap();
    }

    #[test]
    fn a_chunk_no_block_uses_leaves_the_free_list_and_is_kept_for_any_size_up_to_a_bound() {
        if !cfg!(target_os = "linux") {
            return;
        }
        // An arena of its own (the global one serves tests running beside this one).
        let mut arena = Arena::default();
        let bytes = 512 << 10;
        let blocks: Vec<_> = (0..5).map(|_| arena.take(bytes).expect("mapped")).collect();
        let chunk = |p: &NonNull<u8>| p.as_ptr() as usize & !(HUGE - 1);
        // Four blocks to a chunk, at multiples of their size: the fifth opens a second chunk.
        assert!(blocks[..4].iter().all(|p| chunk(p) == chunk(&blocks[0])));
        assert_ne!(chunk(&blocks[4]), chunk(&blocks[0]));
        assert!(blocks.iter().all(|p| p.as_ptr() as usize % bytes == 0));
        assert_eq!(arena.owned.len(), 2);
        // Blocks written end to end do not overlap.
        for (k, p) in blocks.iter().enumerate() {
            // SAFETY: each block is `bytes` of mapped, writable memory the test owns.
            unsafe { std::ptr::write_bytes(p.as_ptr(), k as u8 + 1, bytes) };
        }
        for (k, p) in blocks.iter().enumerate() {
            // SAFETY: as above, written just before.
            let s = unsafe { std::slice::from_raw_parts(p.as_ptr(), bytes) };
            assert!(s.iter().all(|&b| b == k as u8 + 1), "block {k}");
        }
        let c0 = chunk(&blocks[0]);
        for p in &blocks[..3] {
            arena.give(*p, bytes);
        }
        assert_eq!(arena.owned.get(&c0), Some(&1), "one block of the first chunk still owned");
        // A block given back is taken again before a new chunk is mapped.
        let again = arena.take(bytes).expect("a free block");
        assert_eq!(chunk(&again), c0);
        arena.give(again, bytes);
        arena.give(blocks[3], bytes);
        assert!(!arena.owned.contains_key(&c0), "no block of the first chunk is owned");
        assert!(arena.free[&bytes].iter().all(|&q| q & !(HUGE - 1) != c0), "and its blocks left the free list");
        assert_eq!(arena.spare, vec![c0], "it is kept");
        // The spare chunk serves the next size asked, without a fresh mapping.
        let big = arena.take(1 << 20).expect("a block");
        assert_eq!(chunk(&big), c0);
        assert!(arena.spare.is_empty());
        arena.give(big, 1 << 20);
        arena.give(blocks[4], bytes);
        assert!(arena.owned.is_empty() && arena.free.values().all(|f| f.is_empty()));
        assert_eq!(arena.spare.len(), 2);
        // Past `SPARE`, chunks go back to the kernel.
        let many: Vec<_> = (0..2 * (SPARE + 3)).map(|_| arena.take(HUGE / 2).expect("a block")).collect();
        many.iter().for_each(|p| arena.give(*p, HUGE / 2));
        assert_eq!(arena.spare.len(), SPARE);
        for c in arena.spare.drain(..) {
            unmap(NonNull::new(c as *mut u8).expect("not null"), HUGE);
        }
    }
}
