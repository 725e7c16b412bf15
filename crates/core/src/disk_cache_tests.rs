use std::io::Read;
use std::os::unix::fs::MetadataExt;

use super::*;

/// Block size of these tests' caches.
const B: u64 = 64 * 1024;

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
    BlockPool::new(B as usize + ALIGN, 4)
}

fn cache(d: &Path, max: u64) -> Arc<DiskCache> {
    Arc::new(DiskCache::with_block(d, max, B).unwrap())
}

/// A block as the read path hands it over: in a pooled buffer, zero-padded to a page.
fn pooled(pool: &BlockPool, data: &[u8]) -> Bytes {
    let mut b = pool.take();
    let end = round_up(data.len());
    b.space()[..data.len()].copy_from_slice(data);
    b.space()[data.len()..end].fill(0);
    b.into_bytes(end)
}

fn object(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 31 + seed) as u8).collect()
}

/// Put `blocks` of `data` (a version of key `k`, identity `id`) as the read path does.
fn put_blocks(c: &DiskCache, p: &BlockPool, k: &str, id: &str, data: &[u8], blocks: impl IntoIterator<Item = u64>) {
    for b in blocks {
        let chunk = &data[(b * B) as usize..(((b + 1) * B) as usize).min(data.len())];
        c.put(k, id, data.len() as u64, b, &pooled(p, chunk), chunk.len(), crc32c::crc32c(chunk));
    }
}

fn read_all(w: &WholeFile) -> Vec<u8> {
    let mut v = Vec::new();
    (&w.file).read_to_end(&mut v).unwrap();
    v
}

#[test]
fn one_sparse_file_per_version_written_once_is_the_whole_file() {
    let (d, p) = (dir("one"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(5 * B as usize / 2 + 100, 1); // a short last block, not page-aligned
    put_blocks(&c, &p, "k", "e", &data, [2, 0]);
    assert!(c.contains("k", "e", 0) && !c.contains("k", "e", 1) && c.contains("k", "e", 2));
    assert!(!c.is_complete("k", "e", data.len() as u64) && c.whole("k", "e", data.len() as u64).is_none());
    put_blocks(&c, &p, "k", "e", &data, [1, 1]);
    let path = c.path_of("k", "e");
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.len(), data.len() as u64, "exactly the object's length");
    assert!(std::fs::read(&path).unwrap() == data, "each block at its offset, once");
    assert!(m.blocks() * 512 <= round_up(data.len()) as u64 + 64 * 1024, "{} bytes on disk", m.blocks() * 512);
    let files = std::fs::read_dir(&d).unwrap().count();
    assert_eq!(files, 2, "a data file and its sidecar, nothing else");
    for b in 0..3 {
        let want = &data[(b * B) as usize..(((b + 1) * B) as usize).min(data.len())];
        assert!(c.get("k", "e", b, &p).unwrap() == want, "block {b} reads back");
    }
    assert!(c.get("k", "e2", 0, &p).is_none(), "another identity never hits");
    // Complete: the kernel reads that very file.
    let w = c.whole("k", "e", data.len() as u64).expect("complete");
    assert_eq!(w.file.metadata().unwrap().ino(), m.ino(), "no copy");
    assert!(read_all(&w) == data);
    assert!(c.whole("k", "e", data.len() as u64 + 1).is_none(), "a size mismatch is refused");
    assert!(c.used_bytes() <= data.len() as u64 + 8192);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn survives_a_remount_and_a_flipped_byte_is_a_miss() {
    let (d, p) = (dir("reopen"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(3 * B as usize, 2);
    put_blocks(&c, &p, "k", "e", &data, 0..2);
    drop(c);
    let c = cache(&d, 64 << 20);
    assert!(c.get("k", "e", 1, &p).unwrap() == data[B as usize..2 * B as usize], "survives a remount");
    assert!(!c.contains("k", "e", 2));
    put_blocks(&c, &p, "k", "e", &data, [2]);
    drop(c);
    // Flipped bytes: the checksums catch them, those blocks are dropped (for good).
    let path = d.join(format!("{}{DATA_EXT}", DiskCache::name("k", "e")));
    let mut raw = std::fs::read(&path).unwrap();
    raw[B as usize + 6] ^= 0xff;
    raw[2 * B as usize + 6] ^= 0xff;
    std::fs::write(&path, raw).unwrap();
    let c = cache(&d, 64 << 20);
    assert!(c.whole("k", "e", data.len() as u64).is_none(), "the whole-file check catches them");
    assert!(c.contains("k", "e", 0) && !c.contains("k", "e", 1) && !c.contains("k", "e", 2));
    drop(c);
    let c = cache(&d, 64 << 20);
    assert!(!c.contains("k", "e", 1), "a dropped block stays dropped after a remount");
    put_blocks(&c, &p, "k", "e", &data, [1]);
    assert!(c.get("k", "e", 1, &p).unwrap() == data[B as usize..2 * B as usize], "written again");
    // A flipped byte found by a read: that block alone is a miss.
    let mut raw = std::fs::read(&path).unwrap();
    raw[6] ^= 0xff;
    std::fs::write(&path, raw).unwrap();
    assert!(c.get("k", "e", 0, &p).is_none() && !c.contains("k", "e", 0) && c.contains("k", "e", 1));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_torn_sidecar_keeps_what_it_recorded_and_other_files_go() {
    let (d, p) = (dir("torn"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(3 * B as usize, 3);
    put_blocks(&c, &p, "k", "e", &data, 0..3);
    drop(c);
    let name = DiskCache::name("k", "e");
    let meta = d.join(format!("{name}{META_EXT}"));
    let mut raw = std::fs::read(&meta).unwrap();
    raw.truncate(HEADER + 2 * RECORD + 5); // the third record torn at a crash
    std::fs::write(&meta, &raw).unwrap();
    // Files of older formats, a spare, a temp file, a data file without its sidecar.
    let h = "00000000000000000000000000000000";
    let junk = [".b3", ".tmp", ".00000000.w", ".d", ".blk", ".b2.tmp", ".w"].map(|e| format!("{h}{e}"));
    let junk = junk.iter().map(String::as_str).chain(["0000.spare"]);
    for j in junk.clone() {
        std::fs::write(d.join(j), vec![0u8; 2 * ALIGN]).unwrap();
    }
    let c = cache(&d, 64 << 20);
    for j in junk {
        assert!(!d.join(j).exists(), "{j} is removed at start-up");
    }
    assert!(c.contains("k", "e", 1) && !c.contains("k", "e", 2), "records up to the torn one");
    assert!(c.get("k", "e", 1, &p).unwrap() == data[B as usize..2 * B as usize]);
    // The torn tail is cut: a block recorded after it is still known at the next start-up.
    assert_eq!(std::fs::metadata(&meta).unwrap().len(), (HEADER + 2 * RECORD) as u64);
    put_blocks(&c, &p, "k", "e", &data, [2]);
    drop(c);
    let c = cache(&d, 64 << 20);
    assert!(c.contains("k", "e", 2), "a record appended after the cut is read back");
    assert!(c.get("k", "e", 2, &p).unwrap() == data[2 * B as usize..]);
    // A header of another block size (or format): the version is dropped.
    drop(c);
    let mut raw = std::fs::read(&meta).unwrap();
    raw[12] ^= 1;
    std::fs::write(&meta, &raw).unwrap();
    let c = cache(&d, 64 << 20);
    assert!(!c.contains("k", "e", 0) && !meta.exists());
    assert_eq!(c.used_bytes(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn size_is_bounded_by_whole_files_least_recently_used() {
    let (d, p) = (dir("bound"), pool());
    let max = 40 * B;
    let c = cache(&d, max);
    let data = object(4 * B as usize, 4);
    for v in 0..30 {
        put_blocks(&c, &p, &format!("k{v}"), "e", &data, 0..4);
        assert!(c.used_bytes() <= max / 1024 * 1024, "{} bytes after {} files", c.used_bytes(), v + 1);
        // k0 is read between writes: it stays.
        assert!(c.get("k0", "e", 0, &p).is_some(), "the file in use stays (after {v})");
    }
    assert!(!c.contains("k1", "e", 0), "the least recently used went, whole");
    let on_disk: u64 = std::fs::read_dir(&d).unwrap().flatten().map(|e| e.metadata().unwrap().blocks() * 512).sum();
    assert!(on_disk <= max + 64 * ALIGN as u64, "{on_disk} bytes on disk for a bound of {max}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_object_too_large_for_the_cache_is_not_written() {
    let (d, p) = (dir("big"), pool());
    let c = cache(&d, 16 * B);
    let data = object(13 * B as usize, 5); // over 3/4 of the cache
    put_blocks(&c, &p, "big", "e", &data, 0..13);
    assert_eq!(c.used_bytes(), 0);
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "nothing written");
    let small = object(2 * B as usize, 6);
    put_blocks(&c, &p, "small", "e", &small, 0..2);
    assert!(c.is_complete("small", "e", small.len() as u64));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_pinned_file_outlives_its_eviction_and_comes_back_when_read() {
    let (d, p) = (dir("pin"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(2 * B as usize + 7, 7);
    put_blocks(&c, &p, "k", "e", &data, 0..3);
    let w = c.whole("k", "e", data.len() as u64).unwrap();
    assert!(c.whole_pinned("k", "e"));
    let path = c.path_of("k", "e");
    c.index.invalidate(&DiskCache::name("k", "e"));
    c.index.run_pending_tasks();
    assert!(path.exists() && !c.is_complete("k", "e", data.len() as u64), "evicted, kept while pinned");
    put_blocks(&c, &p, "k", "e", &data, [0]); // read again: back in the index, nothing written
    assert!(c.is_complete("k", "e", data.len() as u64));
    c.index.invalidate(&DiskCache::name("k", "e"));
    c.index.run_pending_tasks();
    drop(w);
    assert!(!path.exists(), "deleted at the last unpin");
    assert!(!c.whole_pinned("k", "e"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn renamed_with_its_object_then_taken_over_by_a_writer() {
    let (d, p) = (dir("move"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(5 * B as usize / 2, 8);
    let size = data.len() as u64;
    put_blocks(&c, &p, "k", "e", &data, 0..3);
    let w = c.whole("k", "e", size).expect("complete");
    // A rename here: the file follows, its pin with it.
    assert!(c.rekey_whole("k", "e", "k2", "e2"));
    assert!(!c.is_complete("k", "e", size) && c.is_complete("k2", "e2", size));
    assert!(read_all(&c.whole("k2", "e2", size).expect("under the new name")) == data);
    let path = c.path_of("k2", "e2");
    c.index.invalidate(&DiskCache::name("k2", "e2"));
    c.index.run_pending_tasks();
    assert!(path.exists(), "the pin taken before the rename still holds it");
    drop(w);
    assert!(!path.exists(), "the evicted file went with its last pin");
    // A writer takes it over: out of the cache, its bytes at the staged path.
    put_blocks(&c, &p, "k3", "e3", &data, 0..3);
    let staged = d.join("staged.data");
    assert!(c.take_whole("k3", "e3", size, &staged));
    assert!(!c.is_complete("k3", "e3", size) && std::fs::read(&staged).unwrap() == data);
    assert!(!c.take_whole("k3", "e3", size, &staged), "taken once");
    // And gives it back after an upload: the next open passes through to it.
    assert!(c.give_whole("k3", "e4", size, &staged) && !staged.exists());
    assert!(read_all(&c.whole("k3", "e4", size).unwrap()) == data);
    drop(c);
    let c = cache(&d, 64 << 20);
    assert!(read_all(&c.whole("k3", "e4", size).expect("adopted at a remount, checked")) == data);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_file_a_block_is_being_written_into_is_not_taken_over() {
    // Two readers fetch the same missing block: one completes the file, the other is still
    // writing its (old) copy when a writer's open takes the file over. That late write
    // would land over the writer's bytes in its staged file.
    let (d, p) = (dir("writing"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(5 * B as usize / 2, 9);
    let size = data.len() as u64;
    put_blocks(&c, &p, "k", "e", &data, [0, 2]);
    let name = DiskCache::name("k", "e");
    let late = c.entry_for(&name, "k", size, 1).expect("block 1 missing: a put begins");
    put_blocks(&c, &p, "k", "e", &data, [1]);
    assert!(c.is_complete("k", "e", size));
    let staged = d.join("staged.data");
    assert!(!c.take_whole("k", "e", size, &staged), "taken over while a block is written into it");
    // The late put ends (its block was there already).
    let mut m = c.entries.lock().unwrap();
    let e = m.get_mut(&name).filter(|e| e.gen == late).unwrap();
    e.writing -= 1;
    drop(m);
    assert!(c.take_whole("k", "e", size, &staged) && std::fs::read(&staged).unwrap() == data);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A directory moved away and back (Drive and S3 keep a moved object's identity): the
/// file readers pass through meets a copy of the same version left at the old name. It
/// must take the name, so a writer's takeover gets the readers' file (was EBUSY).
#[test]
fn a_pinned_file_moved_onto_a_copy_left_behind_takes_the_name() {
    let (d, p) = (dir("moveback"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(5 * B as usize / 2, 9);
    let size = data.len() as u64;
    put_blocks(&c, &p, "k", "e", &data, 0..3);
    assert!(c.rekey_whole("k", "e", "a/f", "e"), "left at a/f");
    put_blocks(&c, &p, "k", "e", &data, 0..3);
    assert!(c.rekey_whole("k", "e", "b/a/f", "e"));
    let readers = c.whole("b/a/f", "e", size).expect("pinned by a reader");
    assert!(c.rekey_whole("b/a/f", "e", "a/f", "e"), "the readers' file takes the name");
    let staged = d.join("staged.data");
    assert!(c.take_whole("a/f", "e", size, &staged));
    let (r, t) = (readers.file.metadata().unwrap(), std::fs::metadata(&staged).unwrap());
    assert_eq!((r.dev(), r.ino()), (t.dev(), t.ino()), "the writer took the readers' file");
    // An unpinned copy never displaces a pinned one.
    put_blocks(&c, &p, "x", "e", &data, 0..3);
    put_blocks(&c, &p, "y", "e", &data, 0..3);
    let _held = c.whole("y", "e", size).unwrap();
    assert!(!c.rekey_whole("x", "e", "y", "e"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Two mounts of one bucket share its default cache directory: each process gets a
/// directory of its own (files are written in place), and a later mount takes over what
/// an earlier one left.
#[test]
fn two_processes_never_share_a_directory() {
    let (d, p) = (dir("slots"), pool());
    let data = object(2 * B as usize, 10);
    let one = cache(&d, 64 << 20);
    let two = cache(&d, 64 << 20);
    assert_eq!(two.dir, d.join("mount-1"));
    put_blocks(&one, &p, "k", "e", &data, 0..2);
    put_blocks(&two, &p, "k", "e", &data, [0]);
    assert!(one.is_complete("k", "e", data.len() as u64), "the second did not cut the first's file");
    assert!(read_all(&one.whole("k", "e", data.len() as u64).unwrap()) == data);
    drop(one);
    let three = cache(&d, 64 << 20);
    assert_eq!(three.dir, d, "the first one's directory is free again");
    assert!(three.is_complete("k", "e", data.len() as u64), "and its files are used");
    assert!(two.contains("k", "e", 0) && !two.contains("k", "e", 1));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Eight threads put and get blocks of twelve versions, and take whole files, in a cache
/// that holds three: every block read back and every whole file is exact, and the bound
/// holds on disk.
#[test]
fn concurrent_puts_gets_and_evictions_never_serve_wrong_bytes() {
    let d = dir("churn");
    let max = 12 * B;
    let c = cache(&d, max);
    let objects: Vec<Vec<u8>> = (0..12).map(|v| object(3 * B as usize + 100 * v, v as u64 + 20)).collect();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (c, objects) = (&c, &objects);
            s.spawn(move || {
                let p = pool();
                let mut x = t * 7919 + 1;
                for _ in 0..300 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let v = (x >> 33) as usize % objects.len();
                    let (k, data) = (format!("k{v}"), &objects[v]);
                    let b = (x >> 20) % 4;
                    match x % 3 {
                        0 => put_blocks(c, &p, &k, "e", data, [b]),
                        1 => {
                            if let Some(got) = c.get(&k, "e", b, &p) {
                                let want = &data[(b * B) as usize..(((b + 1) * B) as usize).min(data.len())];
                                assert!(got == want, "block {b} of {k} is wrong");
                            }
                        }
                        _ => {
                            if let Some(w) = c.whole(&k, "e", data.len() as u64) {
                                assert!(read_all(&w) == *data, "whole {k} is wrong");
                            }
                        }
                    }
                }
            });
        }
    });
    assert!(c.used_bytes() <= max);
    let on_disk: u64 = std::fs::read_dir(&c.dir).unwrap().flatten().map(|e| e.metadata().unwrap().blocks() * 512).sum();
    assert!(on_disk <= max + 16 * ALIGN as u64, "{on_disk} bytes on disk for a bound of {max}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn blocks_of_one_file_put_at_once_are_all_counted() {
    // Readers' disk writes run on several threads, each indexing the file's size after it
    // let go of the entries' lock (`index_current` keeps the newest). The count drifted in a
    // read test on a busy machine (one block too many) because moka's weight of one key
    // written by two threads at once can be counted twice; `weighted`'s own test catches
    // that, this one rarely does (disk writes spread the inserts). What it holds: concurrent
    // writers' blocks all end up counted, once.
    let d = dir("counted");
    let c = cache(&d, 1 << 30);
    for round in 0..300u64 {
        let (k, blocks) = (format!("k{round}"), 4u64);
        let data = object((blocks * B) as usize - 100, round);
        let before = c.used_bytes();
        std::thread::scope(|s| {
            for b in 0..blocks {
                let (c, k, data) = (&c, &k, &data);
                s.spawn(move || put_blocks(c, &BlockPool::new(B as usize + ALIGN, 1), k, "e", data, [b]));
            }
        });
        let want = (data.len() as u64).div_ceil(1024) * 1024 + u64::from(OVERHEAD_KIB) * 1024;
        // moka settles its count in batches (100 ms at most each): asked again until it does,
        // so only a count that stays short fails.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while c.used_bytes() - before != want && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(c.used_bytes() - before, want, "round {round}: every block of {k} counted");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// `--cache-dir` may name a directory holding the user's own files: the start-up sweep
/// deletes what a cache wrote (a data file without its sidecar, older layouts' files) and
/// nothing else (it deleted every file there).
#[test]
fn only_the_caches_own_files_are_swept_at_start() {
    let d = dir("sweep");
    std::fs::create_dir_all(&d).unwrap();
    let hash = "0123456789abcdef0123456789abcdef";
    let theirs = ["notes.txt", "photo.d", "ABCDEF0123456789ABCDEF0123456789.m", "7.spare.bak", "Makefile"];
    let ours = [format!("{hash}.d"), format!("{hash}.b3"), format!("{hash}.0badf00d.w"), "12.spare".to_string()];
    for f in theirs.iter().map(|s| s.to_string()).chain(ours.iter().cloned()) {
        std::fs::write(d.join(&f), b"x").unwrap();
    }
    let _c = cache(&d, 64 << 20);
    for f in theirs {
        assert!(d.join(f).exists(), "{f}: a file the cache did not write was deleted");
    }
    for f in &ours {
        assert!(!d.join(f).exists(), "{f}: a stale cache file was kept");
    }
}

/// A block being written when its file's object is renamed: the write ends under the old
/// name. Rekeyed meanwhile, the entry stayed counted as being written for good (a writer's
/// takeover then refused the file: EBUSY) and the block was lost; it is not rekeyed then.
#[test]
fn a_file_with_a_block_being_written_is_not_rekeyed() {
    let (d, p) = (dir("rekey-writing"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(5 * B as usize / 2, 9);
    let size = data.len() as u64;
    put_blocks(&c, &p, "k", "e", &data, 0..2);
    let name = DiskCache::name("k", "e");
    let gen = c.entry_for(&name, "k", size, 2).expect("block 2 is missing: a write begins");
    assert!(!c.rekey_whole("k", "e", "k2", "e"), "rekeyed under a block's write");
    c.entries.lock().unwrap().get_mut(&name).filter(|e| e.gen == gen).unwrap().writing -= 1; // it ends
    put_blocks(&c, &p, "k", "e", &data, [2]);
    assert!(c.rekey_whole("k", "e", "k2", "e"));
    assert!(c.is_complete("k2", "e", size));
    let to = d.join("taken");
    assert!(c.take_whole("k2", "e", size, &to), "a writer cannot take it over");
    assert!(std::fs::read(&to).unwrap() == data);
}

/// Another object took the name (a local folder's file of the same size and mtime renamed
/// over it): its file goes even while pinned, the reader keeps its bytes, and the pin's
/// end leaves the next file of that name alone.
#[test]
fn a_forgotten_file_goes_while_its_reader_keeps_it() {
    let (d, p) = (dir("forget"), pool());
    let c = cache(&d, 64 << 20);
    let (old, new) = (object(5 * B as usize / 2, 3), object(5 * B as usize / 2, 4));
    let size = old.len() as u64;
    put_blocks(&c, &p, "k", "e", &old, 0..3);
    let reader = c.whole("k", "e", size).expect("complete");
    let path = c.path_of("k", "e");
    c.forget("k", "e");
    assert!(!path.exists() && !c.is_complete("k", "e", size) && c.whole("k", "e", size).is_none());
    assert!(read_all(&reader) == old, "the reader keeps the bytes it passes through");
    put_blocks(&c, &p, "k", "e", &new, 0..3);
    drop(reader);
    assert!(path.exists(), "the old file's last unpin deleted the new one");
    assert!(read_all(&c.whole("k", "e", size).expect("the new file")) == new);
    c.forget("x", "e"); // none: nothing happens
    std::fs::remove_dir_all(&d).unwrap();
}

/// Tester S: a whole data file written to while the mount runs (16 bytes zeroed by hand,
/// the page cache dropped) was handed to the kernel as it was: passthrough reads returned
/// the damaged bytes. A file changed since it was whole and intact is checked first.
#[test]
fn a_whole_file_changed_on_disk_is_checked_before_the_kernel_reads_it() {
    use std::os::unix::fs::FileExt;
    let (d, p) = (dir("changed"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(3 * B as usize, 5);
    let size = data.len() as u64;
    put_blocks(&c, &p, "k", "e", &data, 0..3);
    let path = c.path_of("k", "e");
    std::thread::sleep(std::time::Duration::from_millis(20)); // a later mtime
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[0u8; 16], B + 100).unwrap();
    drop(f);
    assert!(c.whole("k", "e", size).is_none(), "damaged bytes handed over");
    assert!(c.contains("k", "e", 0) && !c.contains("k", "e", 1), "the damaged block is dropped, the others kept");
    // Refetched, it is whole again; touched only (same bytes), it is checked and kept.
    put_blocks(&c, &p, "k", "e", &data, [1]);
    assert!(read_all(&c.whole("k", "e", size).expect("whole again")) == data);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&data[..16], 0).unwrap();
    drop(f);
    assert!(read_all(&c.whole("k", "e", size).expect("same bytes")) == data);
    // Damaged with its mtime set back after (`touch -r`: tester C): the ctime tells.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mtime = f.metadata().unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    f.write_all_at(&[1u8; 16], 2 * B + 7).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert!(c.whole("k", "e", size).is_none(), "damaged bytes behind an mtime set back handed over");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The cache directory removed while mounted (by hand, a cleanup job): caching went on
/// into nothing for the mount's life, and the usage still counted the files gone (tester
/// C). The next block made the directory again, with the old entries forgotten.
#[test]
fn a_cache_directory_removed_while_in_use_is_made_again() {
    let (d, p) = (dir("removed"), pool());
    let c = cache(&d, 64 << 20);
    let data = object(2 * B as usize, 9);
    put_blocks(&c, &p, "old", "e", &data, 0..2);
    c.index.run_pending_tasks();
    assert!(c.used_bytes() >= 2 * B);
    std::fs::remove_dir_all(&d).unwrap();
    put_blocks(&c, &p, "new", "e", &data, 0..1);
    assert!(d.is_dir(), "not made again");
    assert!(c.contains("new", "e", 0) && !c.contains("old", "e", 0));
    c.index.run_pending_tasks();
    assert!(c.used_bytes() < 2 * B, "files gone still counted: {}", c.used_bytes());
    put_blocks(&c, &p, "new", "e", &data, [1]);
    assert!(read_all(&c.whole("new", "e", data.len() as u64).expect("whole")) == data);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Two readers found the removed directory gone at once: the second one to make it again
/// found it locked by the first, our own descriptor, took it for another process's and
/// stopped caching for good (tester M, about 3 in 10 runs).
#[test]
fn a_cache_directory_made_again_twice_at_once_stays_ours() {
    let (d, p) = (dir("made-twice"), pool());
    let c = cache(&d, 64 << 20);
    std::fs::remove_dir_all(&d).unwrap();
    c.make_dir_again().unwrap();
    c.make_dir_again().expect("the second thread's try failed against the first one's lock");
    let data = object(B as usize, 4);
    put_blocks(&c, &p, "k", "e", &data, 0..1);
    assert!(c.contains("k", "e", 0), "caching stopped");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Two cached objects' sidecar and data file pairs swapped by hand between mounts: each was
/// served as the other's bytes, its block checksums intact (tester M). The header's
/// checksum covers the entry's name now: both are dropped at start-up.
#[test]
fn a_pair_of_cache_files_under_another_entrys_name_is_dropped() {
    let (d, p) = (dir("swapped"), pool());
    let c = cache(&d, 64 << 20);
    let (one, two) = (object(B as usize, 5), object(B as usize, 6));
    put_blocks(&c, &p, "one", "e", &one, 0..1);
    put_blocks(&c, &p, "two", "e", &two, 0..1);
    drop(c);
    let (a, b) = (DiskCache::name("one", "e"), DiskCache::name("two", "e"));
    for ext in [DATA_EXT, META_EXT] {
        let (pa, pb, tmp) = (d.join(format!("{a}{ext}")), d.join(format!("{b}{ext}")), d.join("swap"));
        std::fs::rename(&pa, &tmp).unwrap();
        std::fs::rename(&pb, &pa).unwrap();
        std::fs::rename(&tmp, &pb).unwrap();
    }
    let c = cache(&d, 64 << 20);
    assert!(!c.contains("one", "e", 0) && !c.contains("two", "e", 0), "a swapped pair is served");
    std::fs::remove_dir_all(&d).unwrap();
}
