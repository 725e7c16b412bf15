//! A bounded pool of page-aligned block buffers, reused across fetches.
//!
//! Every block the read path fetches from the store or reads from the disk cache lands in
//! one of these buffers. A fresh 2 MiB allocation costs 512 page faults and zeroing, and
//! freeing it hands the pages back (malloc serves buffers this big with mmap); a pooled
//! buffer pays that once. Buffers are page-aligned and one page longer than a block, so
//! the disk cache can write a block and read a block file (data and trailer) with `O_DIRECT`.
//!
//! Bound: at most `max` buffers ever belong to the pool, in use or free. When all of them
//! are in use, [`BlockPool::take`] hands out a fresh unpooled buffer that is freed when
//! dropped, so the pool adds at most `max` buffers of memory and never blocks a reader.
//! The read path sizes `max` from its own bounds (memory cache + prefetch budget + disk
//! queue, see [`crate::read::ReadCache::new`]), so in steady state every live block is a
//! pooled one. A buffer goes back to the pool when the last [`Bytes`] view of it drops.
//!
//! The same pool serves `bucketfs cp`'s downloads, which fill a buffer piece by piece
//! ([`BlockBuf::push`]) and write it with `O_DIRECT`; they ask for
//! [`BlockPool::huge_pages`]: buffers aligned to a transparent huge page, which the
//! kernel is asked to back with one.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Alignment (address, length and file offset) of `O_DIRECT` I/O.
pub const ALIGN: usize = 4096;

/// Size and alignment of a transparent huge page (x86-64 and aarch64 with 4 KiB pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// `n` rounded up to a multiple of [`ALIGN`].
pub fn round_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Read from `input` into `buf` until it is full or the input ends (`read_exact` fails
/// there instead); the bytes read. Fills a block from a file or a part from a pipe.
pub fn read_full(input: &mut dyn std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Shared handle to the pool.
#[derive(Clone)]
pub struct BlockPool {
    inner: Arc<Inner>,
}

struct Inner {
    free: Mutex<Vec<Vec<u8>>>,
    /// Buffers created for the pool so far (never more than `max`).
    created: AtomicUsize,
    max: usize,
    /// Usable bytes per buffer (after alignment).
    size: usize,
    /// Alignment of each buffer's start: [`ALIGN`], or [`HUGE_PAGE`] for huge pages.
    align: usize,
}

impl BlockPool {
    /// A pool of at most `max` buffers of `size` usable bytes each.
    pub fn new(size: usize, max: usize) -> Self {
        Self::aligned(size, max, ALIGN)
    }

    /// A pool like [`BlockPool::new`] whose buffers start on a transparent huge page and
    /// ask the kernel to back them with huge pages (`MADV_HUGEPAGE`; without them, plain
    /// pages): an `O_DIRECT` write of a 2 MiB buffer then pins one page instead of 512,
    /// and the copy into it misses the TLB less. `size`: a multiple of [`HUGE_PAGE`].
    pub fn huge_pages(size: usize, max: usize) -> Self {
        Self::aligned(size, max, HUGE_PAGE)
    }

    fn aligned(size: usize, max: usize, align: usize) -> Self {
        let inner = Inner { free: Mutex::new(Vec::new()), created: AtomicUsize::new(0), max, size, align };
        Self { inner: Arc::new(inner) }
    }

    /// A buffer of [`BlockPool::size`] bytes (contents unspecified): a free pooled one, a
    /// new pooled one while fewer than `max` exist, or else an unpooled one.
    pub fn take(&self) -> BlockBuf {
        let (size, align) = (self.inner.size, self.inner.align);
        let reused = self.inner.free.lock().unwrap().pop();
        let (raw, pooled) = match reused {
            Some(raw) => (raw, true),
            None => {
                let pooled = self
                    .inner
                    .created
                    .fetch_update(Relaxed, Relaxed, |n| (n < self.inner.max).then_some(n + 1))
                    .is_ok();
                // One alignment more than asked, so an aligned start is in it: the slack is
                // never touched, so (allocated zeroed, by mmap at this size) never resident.
                let mut raw = vec![0u8; size + align];
                if align == HUGE_PAGE {
                    let at = raw.as_ptr().align_offset(align);
                    // SAFETY: advice on memory this Vec owns; an error (no huge pages)
                    // changes nothing.
                    unsafe { libc::madvise(raw.as_mut_ptr().add(at).cast(), size, libc::MADV_HUGEPAGE) };
                }
                (raw, pooled)
            }
        };
        let start = raw.as_ptr().align_offset(align);
        BlockBuf { raw, start, size, len: 0, pool: pooled.then(|| self.inner.clone()) }
    }

    /// Usable bytes per buffer.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// Buffers the pool holds (free and in use).
    pub fn pooled(&self) -> usize {
        self.inner.created.load(Relaxed)
    }

    /// Free buffers waiting to be reused.
    pub fn free(&self) -> usize {
        self.inner.free.lock().unwrap().len()
    }
}

/// One aligned buffer; back to its pool (if it has one) when dropped. Filled either whole
/// ([`BlockBuf::space`], then [`BlockBuf::into_bytes`]) or piece by piece
/// ([`BlockBuf::push`]; the bytes so far are [`AsRef::as_ref`]).
pub struct BlockBuf {
    raw: Vec<u8>,
    start: usize,
    /// Usable bytes from `start`.
    size: usize,
    /// Bytes filled (by `push` or `into_bytes`).
    len: usize,
    pool: Option<Arc<Inner>>,
}

impl BlockBuf {
    /// The whole usable buffer, aligned, to be filled.
    pub fn space(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.size]
    }

    /// Freeze the first `len` bytes into a [`Bytes`] (no copy); the buffer returns to the
    /// pool when the last view of it drops.
    pub fn into_bytes(mut self, len: usize) -> Bytes {
        assert!(len <= self.size, "block buffer overrun");
        self.len = len;
        Bytes::from_owner(self)
    }

    /// Bytes that still fit after those pushed.
    pub fn room(&self) -> usize {
        self.size - self.len
    }

    /// Append `b` to the bytes filled so far; more than [`BlockBuf::room`] panics.
    pub fn push(&mut self, b: &[u8]) {
        assert!(b.len() <= self.room(), "block buffer overrun");
        let at = self.start + self.len;
        self.raw[at..at + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    /// Forget the bytes filled, to fill the buffer again.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl AsRef<[u8]> for BlockBuf {
    fn as_ref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl Drop for BlockBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.free.lock().unwrap().push(std::mem::take(&mut self.raw));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_read_until_full_or_the_end() {
        // A reader that returns a few bytes at a time (like a pipe): the buffer is still filled.
        struct Trickle(Vec<u8>, usize);
        impl std::io::Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(3).min(self.0.len() - self.1);
                buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
                self.1 += n;
                Ok(n)
            }
        }
        let body: Vec<u8> = (0..10).collect();
        let mut input = Trickle(body.clone(), 0);
        let mut part = [0u8; 8];
        assert_eq!(read_full(&mut input, &mut part).unwrap(), 8);
        assert_eq!(&part[..], &body[..8]);
        assert_eq!(read_full(&mut input, &mut part).unwrap(), 2, "the input's end");
        assert_eq!(&part[..2], &body[8..]);
        assert_eq!(read_full(&mut input, &mut part).unwrap(), 0);
    }

    #[test]
    fn buffers_are_aligned_and_reused() {
        let pool = BlockPool::new(8192, 2);
        let mut b = pool.take();
        assert_eq!(b.space().len(), 8192);
        assert_eq!(b.space().as_ptr() as usize % ALIGN, 0, "page-aligned");
        b.space()[..3].copy_from_slice(b"abc");
        let addr = b.space().as_ptr() as usize;
        let bytes = b.into_bytes(3);
        let view = bytes.slice(1..3);
        drop(bytes);
        assert_eq!(&view[..], b"bc");
        assert_eq!(pool.free(), 0, "a live view keeps the buffer");
        drop(view);
        assert_eq!(pool.free(), 1, "the last view returns it");
        let mut again = pool.take();
        assert_eq!(again.space().as_ptr() as usize, addr, "the same buffer is reused");
        assert_eq!(pool.pooled(), 1);
    }

    #[test]
    fn huge_page_buffers_are_aligned_and_hold_what_was_pushed() {
        let pool = BlockPool::huge_pages(HUGE_PAGE, 1);
        let mut b = pool.take();
        assert!((b.as_ref().as_ptr() as usize).is_multiple_of(HUGE_PAGE));
        b.push(b"abc");
        b.push(&[7u8; 5000]);
        assert_eq!(b.as_ref().len(), 5003);
        assert_eq!(&b.as_ref()[..3], b"abc");
        assert!(b.as_ref()[3..].iter().all(|&x| x == 7));
        assert_eq!(b.room(), HUGE_PAGE - 5003);
        b.push(&vec![1u8; b.room()]);
        assert_eq!(b.room(), 0);
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.push(b"x"))).is_err(), "overrun refused");
        b.clear();
        assert!(b.as_ref().is_empty() && b.room() == HUGE_PAGE);
        // A dropped buffer is kept for the next take, and comes back empty.
        let addr = b.space().as_ptr() as usize;
        b.push(b"x");
        drop(b);
        let again = pool.take();
        assert_eq!(again.as_ref().as_ptr() as usize, addr, "the same buffer is reused");
        assert!(again.as_ref().is_empty() && again.room() == HUGE_PAGE);
    }

    #[test]
    fn pool_never_holds_more_than_its_bound() {
        let pool = BlockPool::new(4096, 3);
        let held: Vec<BlockBuf> = (0..10).map(|_| pool.take()).collect();
        assert_eq!(pool.pooled(), 3, "past the bound buffers are unpooled");
        drop(held);
        assert_eq!(pool.free(), 3, "only pooled buffers are kept");
        let again: Vec<BlockBuf> = (0..5).map(|_| pool.take()).collect();
        assert_eq!((pool.pooled(), pool.free()), (3, 0));
        drop(again);
        assert_eq!(pool.free(), 3);
    }
}
