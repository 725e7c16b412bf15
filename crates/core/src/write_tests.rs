//! Unit tests of the staged file itself (see `write.rs`).

use super::*;
use std::os::unix::fs::FileExt;

/// A kernel write (passthrough) that lands between an upload's last check and its
/// commit is not absorbed as committed: the next check still sees it.
#[test]
fn a_kernel_write_after_the_last_check_is_never_taken_as_committed() {
    let dir = std::env::temp_dir().join(format!("bucketfs-write-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut st = Staged::create(&dir, 1, PartBudget::new(1 << 20)).unwrap();
    let kernel = st.watch_external("k").unwrap();
    kernel.write_all_at(b"first", 0).unwrap();
    assert!(st.observe().unwrap(), "a kernel write is seen");
    // (the upload of "first" happens here)
    std::thread::sleep(std::time::Duration::from_millis(5)); // a new mtime
    kernel.write_all_at(b"second write", 0).unwrap();
    st.mark_committed_as_is().unwrap();
    assert!(st.observe().unwrap(), "the later write is still a change");
    assert!(st.dirty);
    assert_eq!(st.size, 12);
    let _ = std::fs::remove_file(&st.path);
    let _ = std::fs::remove_file(st.open_path());
}
