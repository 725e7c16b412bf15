//! Micro-benchmark of the read path alone (no FUSE, no network): a sequential read through
//! `FileReader`, in the kernel's 128 KiB and 1 MiB request sizes, against the in-memory
//! store with a round-trip latency and a per-request bandwidth cap (like one TCP stream),
//! compared with the plain parallel ranged download of the same object (the ceiling).
//!
//! Run: `cargo run --release -p bucketfs-core --example readbench [-- MiB LATENCY_MS MBPS WINDOW_MiB]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use bucketfs_core::read::{FileReader, ReadCache};
use bucketfs_store::testing::MemStore;
use bucketfs_store::{GetOpts, PutOpts, Store, StoreExt};
use bytes::Bytes;
use futures::StreamExt;

#[tokio::main]
async fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let mib = *args.first().unwrap_or(&256);
    let latency = Duration::from_millis(*args.get(1).unwrap_or(&20));
    let mbps = *args.get(2).unwrap_or(&100);
    let store = Arc::new(MemStore::new().with_latency(latency).with_throughput(mbps * 1_000_000));
    let size = mib * 1024 * 1024;
    let m = store.put("obj", Bytes::from(vec![7u8; size as usize]), PutOpts::default()).await.unwrap();
    println!("object {mib} MiB, {} ms a request, {mbps} MB/s per request", latency.as_millis());

    // The ceiling: 16 parallel ranged GETs of 8 MiB, as a downloader would do.
    let t = Instant::now();
    let part = 8 * 1024 * 1024u64;
    let ranges: Vec<_> = (0..size.div_ceil(part)).map(|i| i * part..((i + 1) * part).min(size)).collect();
    let total: usize = futures::stream::iter(ranges)
        .map(|r| {
            let s = store.clone();
            async move { s.get_range("obj", r, GetOpts::default()).await.unwrap().len() }
        })
        .buffer_unordered(16)
        .fold(0, |a, n| async move { a + n })
        .await;
    let ceiling = total as f64 / t.elapsed().as_secs_f64() / 1e6;
    println!("parallel ranged download (16 x 8 MiB): {ceiling:.0} MB/s");

    let window = args.get(3).copied().unwrap_or(64) << 20;
    for req in [128 * 1024u32, 1024 * 1024] {
        let cache = Arc::new(ReadCache::new(48 << 20, 96 << 20));
        let r = FileReader::new(store.clone(), cache, "obj".into(), m.etag.clone(), "id".into(), size, window);
        let t = Instant::now();
        let mut off = 0u64;
        while off < size {
            off += r.read(off, req).await.unwrap().len() as u64;
        }
        let rate = size as f64 / t.elapsed().as_secs_f64() / 1e6;
        println!(
            "sequential read, {} KiB requests: {rate:.0} MB/s ({:.0}% of the ceiling)",
            req / 1024,
            100.0 * rate / ceiling
        );
    }
}
