//! Write-back: an upload cut off that may still land under a name another file took since.

use std::time::Duration;

use bucketfs_store::testing::Op;
use bucketfs_store::{FileAttrs, PutOpts, Store};

use bucketfs_store::testing::MemStore;

use super::tests::{object, over_held_puts, queue_empty, upload_shown};
use crate::fs::{Fs, ROOT_INO};

/// Wait until `key` holds `b"B"`; panics after `limit`.
async fn holds_b(mem: &MemStore, key: &str, limit: Duration) {
    let b = async {
        while object(mem, key).await.as_deref() != Some(b"B".as_slice()) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(limit, b).await.unwrap_or_else(|_| panic!("B never went up under {key}"));
}

/// X's cut-off PUT of `A` lands now, after B reached X: once the queue is empty (the
/// resend done), X holds B again.
async fn late_landing_is_overwritten(fs: &Fs, mem: &MemStore, limit: Duration) {
    mem.put("X", bytes::Bytes::from_static(b"A"), Default::default()).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    queue_empty(fs, limit).await;
    assert_eq!(object(mem, "X").await.unwrap(), b"B", "the replaced file's late upload stayed");
}

/// `echo A > X; echo B > B; mv B X` while both uploads are in flight: the rename cancels them,
/// but the store may still complete it after B's bytes went up under X. B goes up there
/// once more a moment later, over it. Before, X held A for good (tester I: 3 of 10 rounds
/// on GCS, some on S3), `bucketfs sync` said all was done.
#[tokio::test]
async fn a_rename_over_a_file_whose_upload_was_cut_off_is_sent_again() {
    let limit = crate::fs_write_back::WRITER_PATIENCE * 4;
    let (mem, held, fs) = over_held_puts("rename-over-cut-off", 0);
    let hang = held.hold(Op::Put, 2); // X's upload and B's hang
    let (x, fh) = fs.create(ROOT_INO, "X", 0, None).await.unwrap();
    fs.write(fh, 0, b"A").await.unwrap();
    fs.release(fh).await.unwrap();
    upload_shown(&fs, x.ino, limit).await; // X's upload hangs
    let (b, fh) = fs.create(ROOT_INO, "B", 0, None).await.unwrap();
    fs.write(fh, 0, b"B").await.unwrap();
    fs.release(fh).await.unwrap();
    upload_shown(&fs, b.ino, limit).await; // B is still to go up when renamed
    fs.rename(ROOT_INO, "B", ROOT_INO, "X", false).await.unwrap();
    holds_b(&mem, "X", limit).await;
    late_landing_is_overwritten(&fs, &mem, limit).await;
    drop(hang);
}

/// The same with B uploaded already and held by a reader (staged, clean): it moves by a
/// copy, and its staged bytes go up under X again a moment later, over the late object.
#[tokio::test]
async fn a_clean_file_renamed_over_a_cut_off_upload_is_sent_again() {
    let limit = crate::fs_write_back::WRITER_PATIENCE * 4;
    let (mem, held, fs) = over_held_puts("clean-rename-over-cut-off", 0);
    let (b, w) = fs.create(ROOT_INO, "B", 0, None).await.unwrap();
    fs.write(w, 0, b"B").await.unwrap();
    let reader = fs.open(b.ino, false, false).await.unwrap();
    fs.release(w).await.unwrap();
    holds_b(&mem, "B", limit).await;
    let hang = held.hold(Op::Put, 1);
    let (x, fh) = fs.create(ROOT_INO, "X", 0, None).await.unwrap();
    fs.write(fh, 0, b"A").await.unwrap();
    fs.release(fh).await.unwrap();
    upload_shown(&fs, x.ino, limit).await; // X's upload hangs
    fs.rename(ROOT_INO, "B", ROOT_INO, "X", false).await.unwrap();
    holds_b(&mem, "X", limit).await;
    late_landing_is_overwritten(&fs, &mem, limit).await;
    assert_eq!(fs.read(reader, 0, 10).await.unwrap().as_ref(), b"B");
    fs.release(reader).await.unwrap();
    drop(hang);
}

/// `echo A > X` cut off, then `rm X; mv O X` (or `mv O X` over it) with O another client's
/// object never opened here: A lands late, after the move. O's bytes go up under X again;
/// before, only a log line said O was no longer staged, and its bytes were gone from the
/// bucket (tester G, GCS, 4 of 4).
#[tokio::test]
async fn a_file_never_opened_here_renamed_onto_a_cut_off_name_goes_up_again() {
    let limit = crate::fs_write_back::WRITER_PATIENCE * 4;
    for unlink in [true, false] {
        let (mem, held, fs) = over_held_puts(&format!("store-file-onto-cut-off-{unlink}"), 0);
        mem.put("O", bytes::Bytes::from_static(b"B"), Default::default()).await.unwrap();
        fs.lookup(ROOT_INO, "O").await.unwrap();
        let hang = held.hold(Op::Put, 1);
        let (x, fh) = fs.create(ROOT_INO, "X", 0, None).await.unwrap();
        fs.write(fh, 0, b"A").await.unwrap();
        fs.release(fh).await.unwrap();
        upload_shown(&fs, x.ino, limit).await; // X's upload hangs
        if unlink {
            fs.unlink(ROOT_INO, "X").await.unwrap(); // cut off
        }
        fs.rename(ROOT_INO, "O", ROOT_INO, "X", false).await.unwrap();
        assert!(fs.sync_write_back().await.is_empty());
        holds_b(mem.as_ref(), "X", limit).await; // the move was sent
        let attrs = FileAttrs { mtime: Some(std::time::SystemTime::now()), ..Default::default() };
        mem.put("X", bytes::Bytes::from_static(b"A"), PutOpts { attrs, ..Default::default() }).await.unwrap();
        assert!(fs.sync_write_back().await.is_empty());
        queue_empty(&fs, limit).await;
        assert_eq!(object(mem.as_ref(), "X").await.unwrap(), b"B", "unlink {unlink}: the moved file's bytes were lost");
        drop(hang);
    }
}
