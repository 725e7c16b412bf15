use super::*;

fn dir(tag: &str) -> PathBuf {
    // Under the target directory, not /tmp: on a disk, so O_DIRECT is exercised where the
    // file system supports it (tmpfs would take the plain-I/O path).
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/test-tmp")
        .join(format!("bucketfs-dc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn pool() -> BlockPool {
    BlockPool::new(64 * 1024 + ALIGN, 4)
}

/// A block as the read path hands it over: in a pooled buffer, zero-padded to a page.
fn pooled(pool: &BlockPool, data: &[u8]) -> Bytes {
    let mut b = pool.take();
    let end = round_up(data.len());
    b.space()[..data.len()].copy_from_slice(data);
    b.space()[data.len()..end].fill(0);
    b.into_bytes(end)
}

#[test]
fn survives_reopen_and_detects_corruption() {
    let (d, p) = (dir("reopen"), pool());
    let c = DiskCache::open(&d, 1 << 20).unwrap();
    c.put("k", "e1", 0, b"hello block", 11, crc32c::crc32c(b"hello block"));
    assert_eq!(&c.get("k", "e1", 0, &p).unwrap()[..], b"hello block");
    assert!(c.get("k", "e2", 0, &p).is_none(), "another identity never hits");
    drop(c);
    let c = DiskCache::open(&d, 1 << 20).unwrap();
    assert_eq!(&c.get("k", "e1", 0, &p).unwrap()[..], b"hello block", "survives a remount");
    // Flip one byte of the data: the checksum catches it, the block is dropped.
    let path = c.path_of("k", "e1", 0);
    let mut raw = std::fs::read(&path).unwrap();
    raw[6] ^= 0xff;
    std::fs::write(&path, raw).unwrap();
    assert!(c.get("k", "e1", 0, &p).is_none());
    assert!(!path.exists(), "a corrupted block is deleted");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn aligned_blocks_round_trip_including_a_short_last_block() {
    let (d, p) = (dir("aligned"), pool());
    let c = DiskCache::open(&d, 1 << 20).unwrap();
    let full: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let short = &full[..10_000]; // not a multiple of a page
    for (b, data) in [(0u64, &full[..]), (1, short)] {
        let block = pooled(&p, data);
        c.put("k", "e", b, &block, data.len(), crc32c::crc32c(data));
        let path = c.path_of("k", "e", b);
        assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, round_up(data.len()) + ALIGN);
        assert_eq!(&c.get("k", "e", b, &p).unwrap()[..], data, "block {b} reads back exactly");
    }
    // Corrupt the trailer's length: caught, deleted.
    let path = c.path_of("k", "e", 1);
    let mut raw = std::fs::read(&path).unwrap();
    let at = round_up(short.len()) + 12;
    raw[at] ^= 1;
    std::fs::write(&path, raw).unwrap();
    assert!(c.get("k", "e", 1, &p).is_none());
    assert!(!path.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn old_format_files_are_never_served() {
    let (d, p) = (dir("old"), pool());
    std::fs::create_dir_all(&d).unwrap();
    // The previous format: CRC32C (4 bytes) then the data, in a `.blk` file.
    let data = b"old block bytes";
    let mut old = crc32c::crc32c(data).to_le_bytes().to_vec();
    old.extend_from_slice(data);
    let old_path = d.join("00000000000000000000000000000000.blk");
    std::fs::write(&old_path, &old).unwrap();
    // The format before the trailer named its file (version 2, `.b2`): removed as well.
    let v2_path = d.join("00000000000000000000000000000000.b2");
    std::fs::write(&v2_path, vec![0u8; 2 * ALIGN]).unwrap();
    let c = DiskCache::open(&d, 1 << 20).unwrap();
    assert!(!old_path.exists(), "old-format files are removed at start-up");
    assert!(!v2_path.exists(), "version-2 files are removed at start-up");
    assert_eq!(c.used_bytes(), 0);
    // Old-format bytes under a current name (say, copied in): a miss, and deleted.
    c.put("k", "e", 0, data, data.len(), crc32c::crc32c(data));
    let path = c.path_of("k", "e", 0);
    let mut padded = old.clone();
    padded.resize(2 * ALIGN, 0);
    std::fs::write(&path, &padded).unwrap();
    assert!(c.get("k", "e", 0, &p).is_none());
    assert!(!path.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn size_is_bounded() {
    let d = dir("bound");
    let c = DiskCache::open(&d, 40_000).unwrap();
    for i in 0..50 {
        c.put("k", "e", i, &[7u8; 1000], 1000, crc32c::crc32c(&[7u8; 1000]));
    }
    assert!(c.used_bytes() <= 40_000, "{}", c.used_bytes());
    let files = std::fs::read_dir(&d).unwrap().count();
    assert!(files <= 5, "{files} block files for a 40 kB cache (8 KiB each)");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_block_file_under_another_blocks_name_is_never_served() {
    let (d, p) = (dir("swap"), pool());
    let c = DiskCache::open(&d, 1 << 20).unwrap();
    let (a, b) = (vec![1u8; 5000], vec![2u8; 5000]);
    c.put("k", "e", 0, &a, a.len(), crc32c::crc32c(&a));
    c.put("k", "e", 1, &b, b.len(), crc32c::crc32c(&b));
    // Block 0's intact file (data, length and checksum all valid) under block 1's name: what
    // a reader would see if an evicted file it had open were written over with another block.
    std::fs::copy(c.path_of("k", "e", 0), c.path_of("k", "e", 1)).unwrap();
    assert!(c.get("k", "e", 1, &p).is_none(), "the trailer names another file");
    assert_eq!(&c.get("k", "e", 0, &p).unwrap()[..], &a[..]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_full_cache_writes_new_blocks_over_evicted_files() {
    use std::os::unix::fs::MetadataExt;
    let (d, p) = (dir("spare"), pool());
    let slot = (64 * 1024 + ALIGN) as u64; // a 64 KiB block's file
    let max = 32 * slot; // spares: up to max / 16 = 2 files; the index holds the other 30
    let c = DiskCache::open(&d, max).unwrap();
    let block = |i: u64| -> Vec<u8> { (0..64 * 1024).map(|j| (j as u64 * 31 + i) as u8).collect() };
    let put = |i: u64| {
        let data = block(i);
        c.put("k", "e", i, &pooled(&p, &data), data.len(), crc32c::crc32c(&data));
    };
    let spares = || -> Vec<u64> {
        let files = std::fs::read_dir(&d).unwrap().flatten();
        files.filter(|e| e.path().to_string_lossy().ends_with(SPARE_EXT)).map(|e| e.metadata().unwrap().ino()).collect()
    };
    for i in 0..40 {
        put(i);
        assert!(c.used_bytes() <= max, "{} bytes held after {} blocks", c.used_bytes(), i + 1);
        assert!(spares().len() <= 2, "spares stay within their bound");
    }
    for i in 40..44 {
        let kept = spares();
        assert!(!kept.is_empty(), "evicted files are kept as spares");
        put(i);
        let ino = std::fs::metadata(c.path_of("k", "e", i)).unwrap().ino();
        assert!(kept.contains(&ino), "block {i} was written over an evicted file");
        assert_eq!(&c.get("k", "e", i, &p).unwrap()[..], &block(i)[..], "block {i} reads back exactly");
    }
    let files = std::fs::read_dir(&d).unwrap().count() as u64;
    assert!(files * slot <= max, "{files} files on disk for a bound of {max} bytes");
    drop(c);
    // A remount deletes the spares (one may have been half written) and keeps the blocks.
    let c = DiskCache::open(&d, max).unwrap();
    assert!(spares().is_empty());
    assert_eq!(&c.get("k", "e", 43, &p).unwrap()[..], &block(43)[..]);
    std::fs::remove_dir_all(&d).unwrap();
}
