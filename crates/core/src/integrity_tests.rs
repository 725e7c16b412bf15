//! Tests for the integrity rules of docs/SEMANTICS.md ("The mount's own state wins", names
//! kept byte for byte, handles that outlive their name), each one a bug seen on a real
//! mount before it was fixed. The same cases run through the kernel in tests/test_integrity.py.

use super::*;
use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{GetOpts, PutOpts, StoreExt};
use bytes::Bytes;

fn cfg(ttl_ms: u64) -> FsConfig {
    let dir = std::env::temp_dir().join(format!("bucketfs-integrity-test-{}", std::process::id()));
    FsConfig {
        staging_dir: dir,
        metadata_ttl: Duration::from_millis(ttl_ms),
        cache_bytes: 0,
        list_ahead_keys: 0,
        ..FsConfig::default()
    }
}

async fn names(fs: &Fs, dir: u64) -> Vec<String> {
    fs.dir_snapshot(dir).await.unwrap().iter().skip(2).map(|e| e.name.clone()).collect()
}

#[tokio::test]
async fn a_listing_never_shrinks_a_file_open_for_writing() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg(1000));
    let (attr, fh) = fs.create(ROOT_INO, "log", 0, None).await.unwrap();
    fs.write(fh, 0, &[b'A'; 100]).await.unwrap();
    fs.fsync(fh).await.unwrap(); // the bucket has 100 bytes
    fs.write(fh, 100, &[b'B'; 1000]).await.unwrap();
    // The listing says 100 bytes (the uploaded object); the mount holds 1,100.
    fs.table.lock().unwrap().invalidate_listing(ROOT_INO);
    assert_eq!(names(&fs, ROOT_INO).await, ["log"]);
    assert_eq!(fs.cached_attr(attr.ino).unwrap().size, 1100, "readdirplus must show the local size");
    assert_eq!(fs.getattr(attr.ino).await.unwrap().size, 1100);
    assert_eq!(fs.read(fh, 0, 4096).await.unwrap().len(), 1100);
    // An O_APPEND write lands at the size the kernel was told: 1,100.
    fs.write(fh, 1100, &[b'C'; 10]).await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    let m = store.stat("log").await.unwrap();
    assert_eq!(m.size, 1110);
    let data = store.get_range("log", 0..1110, GetOpts::default()).await.unwrap();
    assert_eq!(&data[1100..], b"CCCCCCCCCC");
    // Once closed and uploaded, listings are the truth again.
    store.put("log", Bytes::from_static(b"replaced"), PutOpts::default()).await.unwrap();
    fs.table.lock().unwrap().invalidate_listing(ROOT_INO);
    names(&fs, ROOT_INO).await;
    assert_eq!(fs.cached_attr(attr.ino).unwrap().size, 8);
}

#[tokio::test]
async fn a_listing_does_not_undo_a_pwrite_past_another_handles_upload() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg(1000));
    let (attr, h1) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    let h2 = fs.open(attr.ino, true, false).await.unwrap();
    fs.write(h2, 0, &[1; 21_252]).await.unwrap();
    fs.flush(h2).await.unwrap();
    fs.release(h2).await.unwrap();
    fs.write(h1, 389_979, &[2; 11_192]).await.unwrap();
    fs.table.lock().unwrap().invalidate_listing(ROOT_INO);
    names(&fs, ROOT_INO).await;
    assert_eq!(fs.getattr(attr.ino).await.unwrap().size, 401_171);
    assert_eq!(fs.read(h1, 0, 500_000).await.unwrap().len(), 401_171);
    fs.flush(h1).await.unwrap();
    fs.release(h1).await.unwrap();
    assert_eq!(store.stat("f").await.unwrap().size, 401_171);
}

#[tokio::test]
async fn names_a_store_would_trim_are_refused_never_aliased() {
    let store = Arc::new(MemStore::new().trimming_whitespace());
    store.put("dup", Bytes::from_static(b"first"), PutOpts::default()).await.unwrap();
    store.put("dup ", Bytes::from_static(b"other"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg(1000));
    for bad in ["dup ", " lead", "tab\t", "nbsp\u{a0}", "ideo\u{3000}", "nl\n"] {
        assert!(matches!(fs.create(ROOT_INO, bad, 0, None).await, Err(FsError::InvalidName)), "{bad:?}");
        assert!(matches!(fs.lookup(ROOT_INO, bad).await, Err(FsError::NotFound)), "{bad:?} must not alias");
    }
    assert!(matches!(fs.mkdir(ROOT_INO, " lead", None).await, Err(FsError::InvalidName)));
    // Inside a directory, and as a directory's trailing character, the key keeps its bytes.
    let d = fs.mkdir(ROOT_INO, "dir ", None).await.unwrap();
    let (_, fh) = fs.create(d.ino, " inner", 0, None).await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(store.stat("dir / inner").await.is_ok());
    assert_eq!(names(&fs, ROOT_INO).await, ["dir ", "dup"], "\"dup \" is not shown");
    let f = fs.lookup(ROOT_INO, "dup").await.unwrap();
    assert!(matches!(fs.rename(ROOT_INO, "dup", ROOT_INO, "dup\t", false).await, Err(FsError::InvalidName)));
    assert_eq!(fs.getattr(f.ino).await.unwrap().size, 5);
}

#[tokio::test]
async fn a_reader_keeps_reading_after_its_parent_directory_is_renamed() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg(1000));
    let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
    let (f, fh) = fs.create(d.ino, "f", 0, None).await.unwrap();
    fs.release(fh).await.unwrap();
    let reader = fs.open(f.ino, false, false).await.unwrap();
    let writer = fs.open(f.ino, true, false).await.unwrap();
    let data: Vec<u8> = (0..30_000u32).map(|i| (i % 251) as u8).collect();
    fs.write(writer, 0, &data).await.unwrap();
    fs.flush(writer).await.unwrap();
    fs.release(writer).await.unwrap();
    fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await.unwrap();
    assert!(store.stat("d/f").await.is_err());
    assert_eq!(fs.read(reader, 0, 65_536).await.unwrap()[..], data[..]);
    assert_eq!(fs.read(reader, 28_672, 4096).await.unwrap()[..], data[28_672..]);
}

#[tokio::test]
async fn an_open_file_deleted_or_unlinked_keeps_its_attributes() {
    let store = Arc::new(MemStore::new());
    store.put("gone", Bytes::from(vec![7u8; 5000]), PutOpts::default()).await.unwrap();
    store.put("unl", Bytes::from(vec![8u8; 300]), PutOpts::default()).await.unwrap();
    let clock = crate::Clock::manual();
    let fs = Fs::new(store.clone(), FsConfig { clock: clock.clone(), ..cfg(50) });
    let gone = fs.lookup(ROOT_INO, "gone").await.unwrap();
    let fh = fs.open(gone.ino, false, false).await.unwrap();
    let unl = fs.lookup(ROOT_INO, "unl").await.unwrap();
    let fh2 = fs.open(unl.ino, false, false).await.unwrap();
    store.delete("gone").await.unwrap();
    fs.unlink(ROOT_INO, "unl").await.unwrap();
    clock.advance(Duration::from_millis(120));
    let a = fs.getattr(gone.ino).await.expect("fstat of an open file deleted behind the mount");
    assert_eq!((a.nlink, a.size), (0, 5000));
    let b = fs.getattr(unl.ino).await.expect("fstat of an open file unlinked here");
    assert_eq!((b.nlink, b.size), (0, 300));
    assert!(matches!(fs.read(fh, 0, 100).await, Err(FsError::Stale(_))), "ESTALE, not ENOENT");
    fs.release(fh).await.unwrap();
    fs.release(fh2).await.unwrap();
    assert!(matches!(fs.lookup(ROOT_INO, "gone").await, Err(FsError::NotFound)));
    fs.check_invariants();
}

#[tokio::test]
async fn a_read_cut_mid_stream_never_returns_wrong_bytes() {
    let mem = Arc::new(MemStore::new());
    let data: Vec<u8> = (0..12u32 << 20).map(|i| (i % 253) as u8).collect();
    mem.put("big", Bytes::from(data.clone()), PutOpts::default()).await.unwrap();
    // The first three GETs deliver 1 MiB and a bit, then the connection "drops".
    let cut = FailStore::new(mem.clone(), Op::Get, 1, 3, bucketfs_store::StoreErrorKind::Unavailable)
        .mid_stream((1 << 20) + 17);
    let fs = Fs::new(Arc::new(cut), cfg(1000));
    let f = fs.lookup(ROOT_INO, "big").await.unwrap();
    let fh = fs.open(f.ino, false, false).await.unwrap();
    let (mut off, mut errors) = (0usize, 0);
    while off < data.len() {
        match fs.read(fh, off as u64, 1 << 20).await {
            Ok(got) => {
                assert!(!got.is_empty(), "a short read at {off} would look like the end of the file");
                assert_eq!(got[..], data[off..off + got.len()], "wrong bytes at {off}");
                off += got.len();
            }
            Err(e) => {
                eprintln!("read at {off}: {e}");
                errors += 1;
                assert!(errors < 10, "the reader never recovered");
            }
        }
    }
}

#[tokio::test]
async fn a_replaced_file_never_reads_the_file_that_took_its_name() {
    // Found by the model test (tests/fsmodel.py), shrunk to these steps.
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg(1000));
    let d0 = fs.mkdir(ROOT_INO, "d0", None).await.unwrap();
    let (old, fh) = fs.create(d0.ino, "f3", 0, None).await.unwrap();
    fs.write(fh, 0, b"old bytes").await.unwrap();
    fs.release(fh).await.unwrap();
    let reader = fs.open(old.ino, false, false).await.unwrap();
    let (_, fh) = fs.create(ROOT_INO, "f5", 0, None).await.unwrap();
    fs.write(fh, 0, &[9; 1561]).await.unwrap();
    fs.release(fh).await.unwrap();
    fs.rename(ROOT_INO, "f5", d0.ino, "f3", false).await.unwrap();
    fs.rename(ROOT_INO, "d0", ROOT_INO, "d1", false).await.unwrap();
    let a = fs.getattr(old.ino).await.unwrap();
    assert_eq!((a.nlink, a.size), (0, 9), "the replaced file's own attributes");
    match fs.read(reader, 0, 4096).await {
        Ok(got) => assert_eq!(&got[..], b"old bytes"),
        Err(e) => assert!(matches!(e, FsError::Stale(_)), "{e}"),
    }
}

#[tokio::test]
async fn a_reader_keeps_the_bytes_of_a_file_unlinked_while_it_is_open() {
    // Found by the model test: the last writer's close dropped the staged bytes of an
    // unlinked file while a reader opened before it was still reading.
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg(1000));
    let (f, fh) = fs.create(ROOT_INO, "f2", 0, None).await.unwrap();
    fs.release(fh).await.unwrap();
    let reader = fs.open(f.ino, false, false).await.unwrap();
    let writer = fs.open(f.ino, true, true).await.unwrap();
    let data: Vec<u8> = (0..56_379u32).map(|i| (i % 249) as u8).collect();
    fs.write(writer, 0, &data).await.unwrap();
    fs.unlink(ROOT_INO, "f2").await.unwrap();
    fs.release(writer).await.unwrap();
    assert_eq!(fs.read(reader, 0, 65_536).await.unwrap()[..], data[..]);
    fs.release(reader).await.unwrap();
    assert!(!fs.staging.contains(f.ino), "dropped with the last handle");
    assert!(store.stat("f2").await.is_err(), "never uploaded");
}

#[tokio::test]
async fn without_if_match_a_replaced_file_is_stale_not_another_files_bytes() {
    // A store that cannot pin reads (the local folder, memory, Drive): found by the soak on
    // mem://, where the handle read the file that had taken its name.
    let store = Arc::new(MemStore::new().without_if_match());
    store.put("f", Bytes::from_static(b"old version"), PutOpts::default()).await.unwrap();
    store.put("g", Bytes::from_static(b"NEW VERSION"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), FsConfig { cache_bytes: 0, ..cfg(1000) });
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    let fh = fs.open(f.ino, false, false).await.unwrap();
    fs.rename(ROOT_INO, "g", ROOT_INO, "f", false).await.unwrap();
    assert!(matches!(fs.read(fh, 0, 100).await, Err(FsError::Stale(_))));
}

/// A store that can hold `Head` and `List` answers back ([`FailStore::hold`]), a mount of
/// it, and a file `f` written through the mount with `data`: its inode.
async fn overtaken_setup(data: &[u8]) -> (Arc<MemStore>, Arc<FailStore>, Arc<Fs>, u64) {
    let mem = Arc::new(MemStore::new());
    let store = Arc::new(FailStore::new(mem.clone(), Op::Put, u64::MAX, 0, bucketfs_store::StoreErrorKind::Other));
    let fs = Fs::new(store.clone(), cfg(1000));
    let (f, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(fh, 0, data).await.unwrap();
    fs.release(fh).await.unwrap();
    (mem, store, fs, f.ino)
}

/// Rewrite inode `ino` of `fs` with `data` (open with O_TRUNC, write, close).
async fn rewrite(fs: &Fs, ino: u64, data: &[u8]) {
    let fh = fs.open(ino, true, true).await.unwrap();
    fs.write(fh, 0, data).await.unwrap();
    fs.release(fh).await.unwrap();
}

#[tokio::test]
async fn a_head_answered_after_an_upload_does_not_bring_back_the_older_version() {
    // A `stat` after the TTL sends a HEAD; this mount rewrites the file before the answer
    // (the older version) arrives. Applied, it would pin the older ETag for a whole TTL:
    // stale cached bytes, reads refused by If-Match, a passthrough writer refused.
    let (mem, store, fs, ino) = overtaken_setup(b"version one").await;
    let node = fs.node(ino).unwrap();
    let late = store.hold(Op::Head, 1);
    let stat = fs.revalidate(&node, true);
    let writes = async {
        tokio::time::sleep(Duration::from_millis(50)).await; // the HEAD has its answer
        rewrite(&fs, ino, b"version two").await;
        late.add_permits(1);
    };
    let (attr, ()) = tokio::join!(stat, writes);
    attr.unwrap();
    let now = mem.stat("f").await.unwrap();
    assert_eq!(fs.node(ino).unwrap().version.tag(), now.etag.as_deref(), "the node is on the version uploaded last");
    let fh = fs.open(ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"version two");
}

#[tokio::test]
async fn a_listing_overtaken_by_an_upload_does_not_bring_back_the_older_version() {
    // `ls` lists the directory while this mount rewrites a file in it, twice: both listings
    // are overtaken (each rewrite lands while one is in flight). Their entries must not
    // put the node back on the version they saw.
    let (mem, store, fs, ino) = overtaken_setup(b"version 1").await;
    fs.table.lock().unwrap().invalidate_listing(ROOT_INO);
    let listings = store.hold(Op::List, 2);
    let ls = fs.dir_snapshot(ROOT_INO);
    let writes = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        rewrite(&fs, ino, b"version 2").await;
        listings.add_permits(1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        rewrite(&fs, ino, b"version 3").await;
        listings.add_permits(1);
    };
    let (snapshot, ()) = tokio::join!(ls, writes);
    assert!(snapshot.unwrap().iter().any(|e| e.name == "f"));
    assert_eq!(
        fs.node(ino).unwrap().version.tag(),
        mem.stat("f").await.unwrap().etag.as_deref(),
        "on the version uploaded last"
    );
    let fh = fs.open(ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"version 3");
}

#[tokio::test]
async fn a_head_answered_after_a_later_one_does_not_undo_it() {
    // Two HEADs of one file; another client replaces the object between their sends, and
    // the first answer (the older version) arrives last. Recorded, it put the node back on
    // a version the bucket no longer holds.
    let (mem, store, fs, ino) = overtaken_setup(b"version one").await;
    let node = fs.node(ino).unwrap();
    let late = store.hold(Op::Head, 1);
    let first = fs.revalidate(&node, false);
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await; // the first HEAD has its answer
        mem.put("f", Bytes::from_static(b"version two, longer"), PutOpts::default()).await.unwrap();
        let attr = fs.revalidate(&node, false).await.unwrap();
        late.add_permits(1);
        attr
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(second.size, 19);
    assert_eq!(first.unwrap().size, 19, "the late answer reports what the node holds");
    let now = mem.stat("f").await.unwrap();
    let n = fs.node(ino).unwrap();
    assert_eq!((n.size, n.version.tag()), (19, now.etag.as_deref()), "on the version the later HEAD saw");
}

#[tokio::test]
async fn a_listing_answered_after_a_later_head_does_not_undo_it() {
    // `ls` is sent; another client replaces a file; a `stat` past the TTL HEADs it and sees
    // the new version; then the listing (the old version) arrives. Its entry must not put
    // the node back on the old version, nor split a new inode off for it.
    let (mem, store, fs, ino) = overtaken_setup(b"version 1").await;
    fs.table.lock().unwrap().invalidate_listing(ROOT_INO);
    let listing = store.hold(Op::List, 1);
    let ls = fs.dir_snapshot(ROOT_INO);
    let stat = async {
        tokio::time::sleep(Duration::from_millis(50)).await; // the listing has its answer
        mem.put("f", Bytes::from_static(b"version 2, longer"), PutOpts::default()).await.unwrap();
        let attr = fs.revalidate(&fs.node(ino).unwrap(), true).await.unwrap();
        listing.add_permits(1);
        attr
    };
    let (snapshot, attr) = tokio::join!(ls, stat);
    assert_eq!(attr.size, 17);
    assert!(snapshot.unwrap().iter().any(|e| e.name == "f"));
    let found = fs.lookup(ROOT_INO, "f").await.unwrap();
    let now = mem.stat("f").await.unwrap();
    assert_eq!((found.ino, found.size), (ino, 17), "the name still leads to the node, at the new size");
    assert_eq!(fs.node(ino).unwrap().version.tag(), now.etag.as_deref());
    // The kernel forgets the inode; the listing (still fresh) answers the next lookup with
    // a new node, which must be the newer version too.
    fs.forget(ino, u64::MAX);
    assert!(fs.node(ino).is_err(), "forgotten");
    let again = fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_eq!(again.size, 17, "rebuilt from the listing at the newer version");
    assert_eq!(fs.node(again.ino).unwrap().version.tag(), now.etag.as_deref());
}

/// The kernel asks to create a name it believes absent (a negative entry it cached); if
/// another client made the object meanwhile, it is opened as open(2) opens an existing
/// file: emptied only with O_TRUNC, so `echo line >> shared.log` appends to what is there.
#[tokio::test]
async fn a_create_of_a_name_made_meanwhile_empties_it_only_with_o_trunc() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg(50));
    assert!(matches!(fs.lookup(ROOT_INO, "shared.log").await, Err(FsError::NotFound)));
    store.put("shared.log", Bytes::from_static(b"X"), PutOpts::default()).await.unwrap();
    store.put("t", Bytes::from_static(b"old"), PutOpts::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // past the TTL: the kernel's may be longer
    let append = libc::O_CREAT | libc::O_WRONLY | libc::O_APPEND;
    let (attr, fh) = fs.create(ROOT_INO, "shared.log", append, None).await.unwrap();
    assert_eq!(attr.size, 1, "opened as it is");
    fs.write(fh, 1, b"line").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(&store.get_range("shared.log", 0..5, GetOpts::default()).await.unwrap()[..], b"Xline");
    let trunc = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    let (attr, fh) = fs.create(ROOT_INO, "t", trunc, None).await.unwrap();
    assert_eq!(attr.size, 0);
    fs.write(fh, 0, b"new").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(store.stat("t").await.unwrap().size, 3);
    let excl = libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL;
    assert!(matches!(fs.create(ROOT_INO, "t", excl, None).await, Err(FsError::Exists)));
}

/// A file named `x.rclonelink` would be the object of the link `x`: two names, one object
/// (the file would replace the link, and show as a link once listed). Refused; so is a
/// directory so named: on MinIO the link's object hid the keys under `x.rclonelink/` from
/// listings (tester W: a file in it gone after a remount).
#[tokio::test]
async fn no_file_takes_the_object_of_a_link() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg(1000));
    fs.symlink(ROOT_INO, "x", "target").await.unwrap();
    assert!(matches!(fs.create(ROOT_INO, "x.rclonelink", 0, None).await, Err(FsError::InvalidName)));
    let (_, fh) = fs.create(ROOT_INO, "a", 0, None).await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(matches!(fs.rename(ROOT_INO, "a", ROOT_INO, "x.rclonelink", false).await, Err(FsError::InvalidName)));
    assert_eq!(&store.get_range("x.rclonelink", 0..6, GetOpts::default()).await.unwrap()[..], b"target");
    assert!(matches!(fs.mkdir(ROOT_INO, "x.rclonelink", None).await, Err(FsError::InvalidName)));
    fs.mkdir(ROOT_INO, "d", None).await.unwrap();
    assert!(matches!(fs.rename(ROOT_INO, "d", ROOT_INO, "d.rclonelink", false).await, Err(FsError::InvalidName)));
    assert_eq!(names(&fs, ROOT_INO).await, ["a", "d", "x"]);
}

/// A readdirplus answered from a listing snapshot taken before a rename here must not link
/// the old name to the moved inode in the kernel (a later `echo x > d/a` would then write
/// to `d/b`): the entry names what is under the name now, or is left out.
#[tokio::test]
async fn a_readdirplus_from_an_old_snapshot_names_what_is_there_now() {
    let store = Arc::new(MemStore::new());
    store.put("d/a", Bytes::from_static(b"A"), PutOpts::default()).await.unwrap();
    store.put("d/c", Bytes::from_static(b"C"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg(1000));
    let d = fs.lookup(ROOT_INO, "d").await.unwrap();
    let fh = fs.opendir(d.ino).await.unwrap();
    let snapshot = fs.readdir(fh).unwrap();
    let listed = |name: &str| snapshot.iter().find(|e| e.name == name).unwrap().ino;
    let a = listed("a");
    fs.rename(d.ino, "a", d.ino, "b", false).await.unwrap();
    assert!(fs.entry_attr(d.ino, "a", listed("a")).is_none(), "`a` is gone, not `b`'s inode");
    fs.rename(d.ino, "b", d.ino, "c", false).await.unwrap();
    assert_eq!(fs.entry_attr(d.ino, "c", listed("c")).unwrap().ino, a, "`c` is now the moved file");
    assert_eq!(fs.entry_attr(d.ino, ".", d.ino).unwrap().ino, d.ino);
    fs.releasedir(fh);
}

/// `mv build build.old` while a compiler still writes into `build/`: a close during the
/// move must not upload to the old key (copied away or deleted by the move: its bytes lost,
/// or left behind under a name the mount no longer shows). It waits for the move and goes
/// up under the new name.
#[tokio::test]
async fn a_close_during_its_directory_rename_lands_under_the_new_name() {
    let mem = Arc::new(MemStore::new());
    let store = Arc::new(FailStore::new(mem.clone(), Op::Put, u64::MAX, 0, bucketfs_store::StoreErrorKind::Other));
    mem.put("build/obj.o", Bytes::from_static(b"o"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg(1000));
    let d = fs.lookup(ROOT_INO, "build").await.unwrap();
    let (_, fh) = fs.create(d.ino, "out", 0, None).await.unwrap();
    fs.write(fh, 0, b"v1").await.unwrap();
    fs.fsync(fh).await.unwrap();
    fs.write(fh, 0, b"v2, the last").await.unwrap();
    assert!(fs.lookup(ROOT_INO, "build.old").await.is_err());
    let listing = store.hold(Op::List, 1); // the move's listing of build/ waits
    let mover = fs.clone();
    let mv = tokio::spawn(async move { mover.rename(ROOT_INO, "build", ROOT_INO, "build.old", false).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closer = fs.clone();
    let close = tokio::spawn(async move {
        closer.flush(fh).await?;
        closer.release(fh).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!close.is_finished(), "the close uploaded while its directory was moving");
    listing.add_permits(1);
    mv.await.unwrap().unwrap();
    close.await.unwrap().unwrap();
    let keys: Vec<String> = {
        use futures::TryStreamExt;
        mem.list("", true).map_ok(|m| m.key).try_collect().await.unwrap()
    };
    assert_eq!(keys, ["build.old/", "build.old/obj.o", "build.old/out"]);
    assert_eq!(&mem.get_range("build.old/out", 0..12, GetOpts::default()).await.unwrap()[..], b"v2, the last");
}

/// On a store without ETags (file://) a version is named by size and mtime. A file the
/// kernel wrote through a shared mapping (passthrough) was uploaded at its last flush; its
/// staged file's mtime, taken into the node when the staged file went, happened to equal
/// the mtime of the version uploaded before (both one coarse clock tick), so the next open
/// read that older version's cached blocks: zeros instead of the mapped writes (CI, 1 run
/// in 5 of test_mmap_writes_reach_bucket_by_unmount[file]).
#[tokio::test]
async fn a_version_uploaded_keeps_its_name_when_its_staged_file_goes() {
    use std::os::unix::fs::FileExt;
    let root = std::env::temp_dir().join(format!("bucketfs-it-filestore-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let loc = bucketfs_store::location::Location::parse(&format!("file://{}", root.display())).unwrap();
    let store = bucketfs_store::location::open(&loc, &Default::default()).unwrap();
    let fs = Fs::new(store.clone(), FsConfig { cache_bytes: 64 << 20, ..cfg(1000) });
    let size = 256 * 1024;
    let (attr, fh) = fs.create(ROOT_INO, "mapped.bin", 0, None).await.unwrap();
    fs.write(fh, 0, &vec![0u8; size]).await.unwrap();
    let backing = fs.backing_file(fh).await.unwrap();
    fs.note_passthrough_open(fh);
    let long_ago = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    backing.file.set_modified(long_ago).unwrap();
    fs.flush(fh).await.unwrap(); // version 1: zeros, now in the read cache
    let v1 = store.stat("mapped.bin").await.unwrap().mtime.unwrap();
    // The kernel writes through the mapping; the staged file's mtime lands on v1's tick.
    let model: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
    backing.file.write_all_at(&model, 0).unwrap();
    backing.file.set_modified(v1).unwrap();
    fs.flush(fh).await.unwrap(); // version 2: the mapped bytes
    fs.release(fh).await.unwrap();
    let rfh = fs.open(attr.ino, false, false).await.unwrap();
    let got = fs.read(rfh, 0, size as u32).await.unwrap();
    assert!(got[..] == model[..], "the mount read an older version (zeros: {})", got.iter().all(|b| *b == 0));
    fs.release(rfh).await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

/// `overtaken_setup` with `f` (25 bytes) held open by a reader, and `new` (5 bytes) to
/// be renamed over it: (store, mount, `f`, `new`, the reader's handle).
async fn rename_over_setup() -> (Arc<FailStore>, Arc<Fs>, u64, u64, u64) {
    let (_mem, store, fs, f) = overtaken_setup(b"the replaced file, longer").await;
    let (new, fh) = fs.create(ROOT_INO, "new", 0, None).await.unwrap();
    fs.write(fh, 0, b"short").await.unwrap();
    fs.release(fh).await.unwrap();
    let reader = fs.open(f, false, false).await.unwrap();
    (store, fs, f, new.ino, reader)
}

#[tokio::test]
async fn a_head_answered_while_a_rename_replaces_the_file_keeps_the_replaced_ones_size() {
    // `mv new f` while `ls -l` stats `f` and a reader holds `f` open: the lister's HEAD
    // reaches the store after the copy put `new` under `f` but before the mount recorded
    // the move. Recorded on the replaced inode, the new file's size cut the reader's
    // reads short at it (model test, S3, seed 2091778498: reads of 0 bytes, fstat 0).
    // `split` false: an open's revalidation, which records the answer on the node itself.
    for split in [true, false] {
        let (store, fs, f, new, reader) = rename_over_setup().await;
        let node = fs.node(f).unwrap();
        let paused = store.hold(Op::Delete, 1); // the rename waits after deleting `new`
        let mv = fs.rename(ROOT_INO, "new", ROOT_INO, "f", false);
        let stat = async {
            tokio::time::sleep(Duration::from_millis(50)).await; // `f` is the copy of `new`
            let attr = fs.revalidate(&node, split).await.unwrap();
            paused.add_permits(1);
            attr
        };
        let (moved, attr) = tokio::join!(mv, stat);
        moved.unwrap();
        assert_eq!(attr.size, 25, "split {split}: the replaced file's own size while the rename runs");
        assert_eq!(fs.getattr(f).await.unwrap().size, 25, "fstat of the replaced file, still open");
        // Its reads: the cached bytes, else ESTALE (the version is gone), never a short read.
        assert!(matches!(fs.read(reader, 0, 100).await, Err(FsError::Stale(_))));
        let now = fs.lookup(ROOT_INO, "f").await.unwrap();
        assert_eq!((now.ino, now.size), (new, 5));
        fs.check_invariants();
    }
}

#[tokio::test]
async fn a_listing_taken_while_a_rename_replaces_a_file_keeps_the_replaced_ones_size() {
    // As above, with `ls -l` listing the directory in the middle of the rename.
    let (store, fs, f, _, _reader) = rename_over_setup().await;
    let paused = store.hold(Op::Delete, 1);
    let mv = fs.rename(ROOT_INO, "new", ROOT_INO, "f", false);
    let ls = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        fs.table.lock().unwrap().invalidate_listing(ROOT_INO);
        let seen = names(&fs, ROOT_INO).await;
        paused.add_permits(1);
        seen
    };
    let (moved, _) = tokio::join!(mv, ls);
    moved.unwrap();
    assert_eq!(fs.getattr(f).await.unwrap().size, 25, "fstat of the replaced file, still open");
    assert_eq!(names(&fs, ROOT_INO).await, ["f"]);
    fs.check_invariants();
}

#[tokio::test]
async fn a_version_put_by_another_client_while_a_handle_is_open_gets_a_new_inode() {
    // The kernel keeps one page cache per inode: a reader open on the old version read the
    // new version's pages once another process had read them, and fstat showed its size.
    let store = Arc::new(MemStore::new());
    store.put("f", Bytes::from_static(b"old version, longer"), PutOpts::default()).await.unwrap();
    let clock = crate::Clock::manual();
    let fs = Fs::new(store.clone(), FsConfig { clock: clock.clone(), ..cfg(50) });
    let old = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
    let reader = fs.open(old, false, false).await.unwrap();
    store.put("f", Bytes::from_static(b"new"), PutOpts::default()).await.unwrap();
    clock.advance(Duration::from_millis(60));
    let st = fs.getattr(old).await.unwrap();
    assert_eq!((st.size, st.nlink), (19, 0), "the open inode keeps its version, unlinked");
    let new = fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_ne!(new.ino, old);
    assert_eq!(new.size, 3);
    assert!(matches!(fs.open(old, false, false).await, Err(FsError::Stale(_))), "the kernel looks up again");
    let fh = fs.open(new.ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"new");
    // With no handle open, the inode takes the next version.
    fs.release(fh).await.unwrap();
    store.put("f", Bytes::from_static(b"third"), PutOpts::default()).await.unwrap();
    clock.advance(Duration::from_millis(60));
    assert_eq!(fs.getattr(new.ino).await.unwrap().size, 5);
    assert_eq!(fs.lookup(ROOT_INO, "f").await.unwrap().ino, new.ino);
    fs.release(reader).await.unwrap();
    fs.check_invariants();
}

#[tokio::test]
async fn a_file_moved_here_while_open_keeps_its_inode() {
    // The copy a rename makes is a new object (a new identity): still this mount's file,
    // also for a lister that sees the copy before the rename has learned its identity.
    let mem = Arc::new(MemStore::new());
    let store = Arc::new(FailStore::new(mem.clone(), Op::Put, u64::MAX, 0, bucketfs_store::StoreErrorKind::Other));
    mem.put("a", Bytes::from_static(b"moved"), PutOpts::default()).await.unwrap();
    mem.put("d/x", Bytes::from_static(b"in a directory"), PutOpts::default()).await.unwrap();
    let clock = crate::Clock::manual();
    let fs = Fs::new(store.clone(), FsConfig { clock: clock.clone(), ..cfg(50) });
    let a = fs.lookup(ROOT_INO, "a").await.unwrap().ino;
    let d = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
    let x = fs.lookup(d, "x").await.unwrap().ino;
    let (ha, hx) = (fs.open(a, false, false).await.unwrap(), fs.open(x, false, false).await.unwrap());
    names(&fs, ROOT_INO).await; // a fresh listing: the rename asks nothing about `b`
    let learn = store.hold(Op::Head, 1); // the rename's HEAD of the copy waits
    let mv = fs.rename(ROOT_INO, "a", ROOT_INO, "b", false);
    let ls = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        clock.advance(Duration::from_millis(60));
        fs.table.lock().unwrap().invalidate_listing(ROOT_INO);
        names(&fs, ROOT_INO).await;
        assert_eq!(fs.lookup(ROOT_INO, "b").await.unwrap().ino, a, "a lookup answered by the listing");
        learn.add_permits(1);
    };
    let (moved, ()) = tokio::join!(mv, ls);
    moved.unwrap();
    fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await.unwrap();
    clock.advance(Duration::from_millis(60));
    fs.table.lock().unwrap().invalidate_listing(ROOT_INO);
    names(&fs, ROOT_INO).await;
    assert_eq!(fs.lookup(ROOT_INO, "b").await.unwrap().ino, a);
    let e = fs.lookup(ROOT_INO, "e").await.unwrap().ino;
    assert_eq!(fs.lookup(e, "x").await.unwrap().ino, x);
    assert_eq!(fs.getattr(a).await.unwrap().nlink, 1);
    assert_eq!(&fs.read(ha, 0, 100).await.unwrap()[..], b"moved");
    assert_eq!(&fs.read(hx, 0, 100).await.unwrap()[..], b"in a directory");
    fs.check_invariants();
}

#[tokio::test]
async fn an_inode_split_off_within_the_ttl_is_not_opened_on_the_old_version() {
    // `ls` lists a replaced file while a reader holds it (a split) and `cat` opens it
    // through the kernel's entry, still fresh: the open must not pin the old version
    // (its reads would fail with ESTALE) but send the kernel to look the name up again.
    let store = Arc::new(MemStore::new());
    store.put("f", Bytes::from_static(b"old"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg(60_000));
    let old = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
    let reader = fs.open(old, false, false).await.unwrap();
    store.put("f", Bytes::from_static(b"newer"), PutOpts::default()).await.unwrap();
    fs.table.lock().unwrap().invalidate_listing(ROOT_INO);
    assert_eq!(names(&fs, ROOT_INO).await, ["f"]);
    assert!(matches!(fs.open(old, false, false).await, Err(FsError::Stale(_))));
    let new = fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_ne!(new.ino, old);
    let fh = fs.open(new.ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"newer");
    assert_eq!(fs.getattr(old).await.unwrap().size, 3);
    fs.release(reader).await.unwrap();
    fs.check_invariants();
}
