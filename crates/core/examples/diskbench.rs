//! Micro-benchmark of the disk cache's write path as the read path drives it (no FUSE, no
//! network): each 2 MiB block is copied into a pooled buffer in 256 KiB pieces (as a
//! streamed GET delivers it, with the CRC32C of each piece taken while it is hot), then
//! written with `DiskCache::put`, into objects of 64 MiB. Reports this thread's CPU time
//! per GiB twice: into an empty cache, and through a full one (each object evicts one).
//!
//! Run: `cargo run --release -p bucketfs-core --example diskbench [-- MiB DIR]`; DIR must
//! be on the disk the cache would use (tmpfs takes the plain-I/O path). DIR is deleted.

use std::path::PathBuf;

use bucketfs_core::block_pool::{round_up, BlockPool, ALIGN};
use bucketfs_core::disk_cache::DiskCache;
use bucketfs_core::read::BLOCK;

/// Bytes of each object written.
const OBJECT: u64 = 64 * 1024 * 1024;

/// CPU seconds (user + system) this thread has used.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let dir = args.next().map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("bucketfs-diskbench"));
    let blocks = mib * 1024 * 1024 / BLOCK;
    let _ = std::fs::remove_dir_all(&dir);
    // A cache holding a quarter of what is written: the second pass evicts on every block.
    let cache = DiskCache::open(&dir, mib * 1024 * 1024 / 4).unwrap();
    let pool = BlockPool::new(BLOCK as usize + ALIGN, 16);
    let source: Vec<u8> = (0..BLOCK as usize).map(|i| (i * 131 % 251) as u8).collect();
    println!("{mib} MiB in {} blocks of 2 MiB, cache of {} MiB at {}", blocks, mib / 4, dir.display());
    for pass in ["empty cache at first", "full cache (evicting)"] {
        let t = thread_cpu();
        for b in 0..blocks {
            let mut buf = pool.take();
            let mut crc = 0u32;
            for piece in source.chunks(256 * 1024) {
                let at = piece.as_ptr() as usize - source.as_ptr() as usize;
                let dst = &mut buf.space()[at..at + piece.len()];
                dst.copy_from_slice(piece);
                crc = crc32c::crc32c_append(crc, dst);
            }
            let n = source.len();
            buf.space()[n..round_up(n)].fill(0);
            let padded = buf.into_bytes(round_up(n));
            // New keys each pass, so the second pass never finds the first one's blocks.
            let per = OBJECT / BLOCK;
            cache.put(&format!("{pass}-{}", b / per), "id", OBJECT, b % per, &padded, n, crc);
        }
        let cpu = thread_cpu() - t;
        println!("{pass}: {:.3} CPU s per GiB", cpu * 1024.0 / mib as f64);
    }
    drop(cache);
    let _ = std::fs::remove_dir_all(&dir);
}
