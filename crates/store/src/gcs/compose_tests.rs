//! Unit tests of [`ComposeWriter`] over an in-memory backend that enforces GCS's compose
//! limit and can fail chosen calls.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::*;

#[derive(Default)]
struct FakeGcs {
    objects: Arc<Mutex<BTreeMap<String, Bytes>>>,
    /// Fail the Nth `put_part` call (1-based); 0: never.
    fail_part: u64,
    /// A part is stored this long after its request, even if the caller lets go of it (as
    /// a server stores a request already sent).
    part_delay: Option<std::time::Duration>,
    part_calls: AtomicU64,
    /// Fail this many `delete` calls, the first ones (the store out).
    failing_deletes: AtomicU64,
    compose_calls: AtomicU64,
    puts: AtomicU64,
}

#[async_trait]
impl ComposeBackend for FakeGcs {
    async fn put_part(&self, key: &str, data: Vec<Bytes>) -> Result<(), StoreError> {
        let n = self.part_calls.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::task::yield_now().await;
        if n == self.fail_part {
            return Err(StoreError::new(StoreErrorKind::Unavailable, "injected part failure"));
        }
        let Some(delay) = self.part_delay else {
            self.objects.lock().unwrap().insert(key.into(), data.concat().into());
            return Ok(());
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (objects, key) = (self.objects.clone(), key.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            objects.lock().unwrap().insert(key, data.concat().into());
            let _ = tx.send(());
        });
        let _ = rx.await;
        Ok(())
    }
    async fn compose(&self, sources: &[String], to: &str) -> Result<ObjectMeta, StoreError> {
        assert!(!sources.is_empty() && sources.len() <= MAX_COMPOSE_SOURCES, "{} sources", sources.len());
        self.compose_calls.fetch_add(1, Ordering::SeqCst);
        let mut objects = self.objects.lock().unwrap();
        let mut out = Vec::new();
        for s in sources {
            out.extend_from_slice(objects.get(s).ok_or_else(|| StoreError::not_found(s.clone()))?);
        }
        let size = out.len() as u64;
        objects.insert(to.into(), out.into());
        let etag = Some(format!("gen-{}", self.compose_calls.load(Ordering::SeqCst)));
        Ok(ObjectMeta { key: to.into(), size, etag, mtime: Some(std::time::SystemTime::now()), size_unknown: false })
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let failing = self.failing_deletes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(StoreError::new(StoreErrorKind::Unavailable, "injected delete failure"));
        }
        self.objects.lock().unwrap().remove(key);
        Ok(())
    }
    async fn put(&self, key: &str, data: Bytes) -> Result<ObjectMeta, StoreError> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.objects.lock().unwrap().insert(key.into(), data);
        self.head(key).await
    }
    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let size = self.objects.lock().unwrap().get(key).ok_or_else(|| StoreError::not_found(key))?.len();
        Ok(ObjectMeta { key: key.into(), size: size as u64, etag: None, mtime: None, size_unknown: false })
    }
}

impl FakeGcs {
    fn keys(&self) -> Vec<String> {
        self.objects.lock().unwrap().keys().cloned().collect()
    }
    fn get(&self, key: &str) -> Bytes {
        self.objects.lock().unwrap()[key].clone()
    }
}

fn data(n: usize) -> Bytes {
    (0..n).map(|i| (i * 7 % 253) as u8).collect::<Vec<_>>().into()
}

/// Write `body` in `piece`-byte writes through a writer with `part` bytes per part.
async fn upload(gcs: &Arc<FakeGcs>, body: &Bytes, part: usize, piece: usize) -> Result<ObjectMeta, StoreError> {
    let mut w = ComposeWriter::new(gcs.clone(), "obj", part, 4);
    for c in body.chunks(piece.max(1)) {
        w.write(body.slice_ref(c)).await?;
    }
    w.close().await
}

#[tokio::test]
async fn small_objects_are_one_put() {
    for n in [0, 1, 99, 100] {
        let gcs = Arc::new(FakeGcs::default());
        let body = data(n);
        let m = upload(&gcs, &body, 100, 7).await.unwrap();
        assert_eq!(m.size, n as u64);
        assert_eq!(gcs.get("obj"), body);
        assert_eq!(gcs.puts.load(Ordering::SeqCst), 1, "{n} bytes");
        assert_eq!(gcs.part_calls.load(Ordering::SeqCst), 0, "{n} bytes");
        assert_eq!(gcs.keys(), ["obj"]);
    }
}

#[tokio::test]
async fn parts_compose_in_order_and_leave_nothing() {
    // 101 bytes: two parts; 3,300 bytes of 100: 33 parts (> 32); 110,000: 1,100 parts (3 levels).
    for (n, parts, piece) in [(101, 2, 13), (3_300, 33, 100), (3_301, 34, 1000), (110_000, 1_100, 4096)] {
        let gcs = Arc::new(FakeGcs::default());
        let body = data(n);
        let m = upload(&gcs, &body, 100, piece).await.unwrap();
        assert_eq!(m.size, n as u64);
        assert_eq!(gcs.get("obj"), body, "{n} bytes");
        assert_eq!(gcs.part_calls.load(Ordering::SeqCst), parts, "{n} bytes");
        assert_eq!(gcs.keys(), ["obj"], "{n} bytes: temporary objects left");
    }
}

#[tokio::test]
async fn a_failed_part_fails_the_upload_and_cleans_up() {
    let gcs = Arc::new(FakeGcs { fail_part: 5, ..FakeGcs::default() });
    let e = upload(&gcs, &data(2_000), 100, 50).await.unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Unavailable);
    assert!(gcs.keys().is_empty(), "left behind: {:?}", gcs.keys());
}

/// Parts whose delete failed too (the store out as the upload failed) are deleted again in
/// the store's background work, which `settle` waits for (tester U: five parts, 40 MB, were
/// left in the bucket after `bucketfs sync`, until the next mount of the mount point).
#[tokio::test]
async fn parts_whose_delete_failed_are_deleted_again_in_the_background() {
    let gcs = Arc::new(FakeGcs { fail_part: 5, failing_deletes: AtomicU64::new(4), ..FakeGcs::default() });
    let bg = crate::background::Background::default();
    let mut w = ComposeWriter::new(gcs.clone(), "obj", 100, 1).with_background(bg.clone());
    let body = data(2_000);
    let mut failed = None;
    for c in body.chunks(100) {
        if let Err(e) = w.write(body.slice_ref(c)).await {
            failed = Some(e);
            break;
        }
    }
    assert!(failed.is_some(), "the fifth part's failure fails the upload");
    assert!(!gcs.keys().is_empty(), "no delete failed: nothing tested");
    assert!(bg.settle(std::time::Duration::from_secs(30)).await, "the deletes were not waited for");
    assert!(gcs.keys().is_empty(), "left behind: {:?}", gcs.keys());
}

#[tokio::test]
async fn abort_deletes_uploaded_parts() {
    let gcs = Arc::new(FakeGcs::default());
    let mut w = ComposeWriter::new(gcs.clone(), "obj", 100, 2);
    w.write(data(1_000)).await.unwrap();
    w.abort().await.unwrap();
    assert!(gcs.keys().is_empty(), "left behind: {:?}", gcs.keys());
    assert!(w.write(data(1)).await.is_err(), "writing after abort must fail");
}

#[tokio::test]
async fn dropping_mid_upload_deletes_parts_in_the_background() {
    let gcs = Arc::new(FakeGcs::default());
    let mut w = ComposeWriter::new(gcs.clone(), "obj", 100, 2);
    w.write(data(1_000)).await.unwrap();
    drop(w);
    for _ in 0..100 {
        if gcs.keys().is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("left behind: {:?}", gcs.keys());
}

/// A writer dropped with part uploads in flight (a cancelled upload): its clean-up waits
/// for them (a part sent is stored even so) and runs in the store's background work, so
/// `settle` returns only when no part is left.
#[tokio::test]
async fn a_writer_dropped_with_parts_in_flight_leaves_nothing_once_settled() {
    let delay = std::time::Duration::from_millis(100);
    let gcs = Arc::new(FakeGcs { part_delay: Some(delay), ..FakeGcs::default() });
    let bg = crate::background::Background::default();
    let mut w = ComposeWriter::new(gcs.clone(), "obj", 100, 4).with_background(bg.clone());
    w.write(data(350)).await.unwrap(); // three parts in flight
    assert!(gcs.keys().is_empty());
    drop(w);
    assert!(bg.settle(std::time::Duration::from_secs(10)).await);
    assert!(gcs.keys().is_empty(), "left behind: {:?}", gcs.keys());
    tokio::time::sleep(2 * delay).await;
    assert!(gcs.keys().is_empty(), "landed after the clean-up: {:?}", gcs.keys());
}
