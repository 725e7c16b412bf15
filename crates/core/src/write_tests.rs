//! Unit tests of the staged file itself (see `write.rs`).

use super::*;
use std::os::unix::fs::FileExt;

/// A fresh staged file (inode `ino`) in a directory of its own, named by `tag`.
fn staged(tag: &str, ino: u64) -> (std::path::PathBuf, Staged) {
    let dir = std::env::temp_dir().join(format!("bucketfs-write-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let st = Staged::create(&dir, ino, PartBudget::new(1 << 20)).unwrap();
    (dir, st)
}

/// A kernel write (passthrough) that lands between an upload's last check and its
/// commit is not absorbed as committed: the next check still sees it.
#[test]
fn a_kernel_write_after_the_last_check_is_never_taken_as_committed() {
    let (dir, mut st) = staged("late", 1);
    let kernel = st.watch_external("k", None).unwrap();
    kernel.write_all_at(b"first", 0).unwrap();
    assert!(st.observe().unwrap(), "a kernel write is seen");
    // (the upload of "first" happens here)
    std::thread::sleep(std::time::Duration::from_millis(5)); // a new mtime
    kernel.write_all_at(b"second write", 0).unwrap();
    st.mark_committed_as_is().unwrap();
    assert!(st.observe().unwrap(), "the later write is still a change");
    assert!(st.dirty);
    assert_eq!(st.size, 12);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process's shared mapping of a file the kernel writes for it (passthrough), written
/// again after an upload on a page it had made dirty before: the write is seen. The kernel
/// moves the mtime only when a write faults, on a clean page: the upload writes the pages
/// out first, so every later write faults. Before, a linker's `mv out.tmp out` (an upload)
/// then a write to the same page left the bucket without it, for good (tester T).
#[tokio::test]
async fn a_mapped_write_after_an_upload_on_a_page_dirty_before_is_seen() {
    let (dir, mut st) = staged("mapped", 5);
    let kernel = st.watch_external("k", None).unwrap();
    kernel.set_len(8192).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of 8 KiB of a file of that length, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            kernel.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let page = map as *mut u8;
    // SAFETY: within the mapping.
    unsafe { std::ptr::copy_nonoverlapping(b"abc".as_ptr(), page, 3) };
    assert!(st.observe().unwrap());
    let mem = bucketfs_store::testing::MemStore::new();
    st.upload(&mem, "k", &WriteOptions::default(), &FileAttrs::default()).await.unwrap();
    assert!(!st.dirty);
    std::thread::sleep(std::time::Duration::from_millis(20)); // a new mtime on any kernel
                                                              // SAFETY: within the mapping.
    unsafe { std::ptr::copy_nonoverlapping(b"def".as_ptr(), page.add(10), 3) };
    let seen = st.observe().unwrap();
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(map, 8192) };
    assert!(seen, "a write through the mapping after the upload was missed");
    assert!(st.dirty);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A version committed by an fsync and sent again after a cut-off upload (one that may still
/// land over it) keeps the fsync's promise: a change after it copies it aside, synced, as
/// after the fsync itself; not as an unsynced close would.
#[tokio::test]
async fn an_fsynced_version_sent_again_is_still_kept_synced() {
    let (dir, mut st) = staged("sent", 2);
    st.set_key("k").unwrap();
    st.write(0, b"the fsynced version").unwrap();
    st.commit_as(true, false).unwrap();
    st.commit().unwrap(); // the close after the fsync
    assert!(st.keeps_synced(), "a close after an fsync commits the same version");
    let mem = bucketfs_store::testing::MemStore::new();
    st.upload(&mem, "k", &WriteOptions::default(), &FileAttrs::default()).await.unwrap();
    st.send_again("k").unwrap();
    assert!(st.keeps_synced(), "sent again, the version is still the fsync's");
    assert_eq!(st.key(), Some("k"));
    st.write(0, b"X").unwrap();
    assert_eq!(std::fs::read(st.base_path()).unwrap(), b"the fsynced version");
    st.commit().unwrap(); // a plain close of new bytes: not synced
    assert!(!st.keeps_synced());
    let _ = std::fs::remove_dir_all(&dir);
}

/// As above for a file the kernel writes unseen (passthrough): a close after the fsync that
/// found no change keeps the fsync'd version synced, also once it is sent again.
#[tokio::test]
async fn an_fsynced_version_the_kernel_wrote_is_still_kept_synced() {
    let (dir, mut st) = staged("kernel", 3);
    let kernel = st.watch_external("k", None).unwrap();
    kernel.write_all_at(b"the fsynced version", 0).unwrap();
    assert!(st.observe().unwrap());
    st.commit_as(true, true).unwrap(); // the fsync
    assert!(!st.observe().unwrap(), "nothing changed since");
    st.commit().unwrap(); // the close after it
    assert!(st.keeps_synced(), "a close after an fsync commits the same version");
    let mem = bucketfs_store::testing::MemStore::new();
    st.upload(&mem, "k", &WriteOptions::default(), &FileAttrs::default()).await.unwrap();
    st.send_again("k").unwrap();
    assert!(st.keeps_synced(), "sent again, the version is still the fsync's");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file the kernel writes directly (watched), committed, then appended to through us (an
/// ordinary open beside it): the next look at the file takes our append for a kernel
/// write, so the committed version must be copied aside before it, not trusted as the
/// file's prefix. It was not, and a crash then lost the version the close returned for
/// (review).
#[test]
fn an_append_through_us_to_a_watched_file_keeps_the_committed_version_aside() {
    let (dir, mut st) = staged("watched", 4);
    let kernel = st.watch_external("k", None).unwrap();
    kernel.write_all_at(b"committed", 0).unwrap();
    assert!(st.observe().unwrap());
    st.commit().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5)); // a new mtime
    st.write(9, b"+appended").unwrap();
    st.observe().unwrap(); // sees the file changed
    assert_eq!(std::fs::read(st.base_path()).unwrap(), b"committed", "the committed version is not kept aside");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An `O_TRUNC` open of a file once handed to the kernel empties it at once only while the
/// kernel holds it (a passthrough open's description): then the kernel reads it itself.
/// With none held, the opens are ordinary ones, whose reads in flight come to us: emptied
/// at the open, one sent before it came back short and the kernel zero-filled it, zeros
/// nobody wrote (tester C); it waits for the first write, as without passthrough.
#[test]
fn an_o_trunc_empties_a_watched_file_at_once_only_while_the_kernel_holds_it() {
    let (dir, mut st) = staged("trunc-watched", 6);
    let kernel = st.watch_external("k", None).unwrap();
    kernel.write_all_at(&[7u8; 8192], 0).unwrap();
    assert!(st.observe().unwrap());
    st.truncate_on_open(None).unwrap();
    assert_eq!(st.file.metadata().unwrap().len(), 0, "the kernel holds it: emptied at once");
    kernel.write_all_at(&[8u8; 8192], 0).unwrap();
    assert!(st.observe().unwrap());
    drop(kernel); // the last passthrough open released
    st.truncate_on_open(None).unwrap();
    assert_eq!(st.file.metadata().unwrap().len(), 8192, "emptied while reads in flight come to us");
    let old = st.read_old(4096, 4096).ok().map(|r| r.unwrap());
    assert_eq!(old.as_deref(), Some(&[8u8; 4096][..]), "a read in flight sees the old bytes");
    st.write(0, b"new").unwrap();
    assert_eq!((st.size, st.file.metadata().unwrap().len()), (3, 3), "the first write applies it");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `.late` note recovery reads back is the one written: the tag and every MD5.
#[test]
fn a_late_note_reads_back_as_written() {
    let note = super::LateNote { ours: Some("\"abc\"".into()), md5s: vec![[1; 16], [0xfe; 16]] };
    assert_eq!(super::LateNote::parse(&note.to_text()), note);
    let none = super::LateNote { ours: None, md5s: Vec::new() };
    assert_eq!(super::LateNote::parse(&none.to_text()), none);
}
