//! Tests of [`MeteredStore`] counting and of the Prometheus rendering.

use super::*;
use crate::testing::MemStore;
use crate::StoreExt;
use futures::StreamExt;

fn metered() -> (MeteredStore, Arc<Metrics>) {
    let m = Metrics::new();
    (MeteredStore::new(Arc::new(MemStore::new()), m.clone()), m)
}

#[tokio::test]
async fn counts_requests_errors_and_bytes() {
    let (s, m) = metered();
    s.put("a", Bytes::from_static(b"hello"), PutOpts::default()).await.unwrap();
    assert_eq!(s.get_range("a", 0..5, GetOpts::default()).await.unwrap().len(), 5);
    assert_eq!(s.stat("missing").await.unwrap_err().kind, StoreErrorKind::NotFound);
    let mut w = s.writer("b", WriteOptions::default()).await.unwrap();
    w.write(Bytes::from_static(b"123")).await.unwrap();
    w.write(Bytes::from_static(b"4567")).await.unwrap();
    w.close().await.unwrap();
    let listed: Vec<_> = s.list("", false).collect().await;
    assert_eq!(listed.len(), 2);

    assert_eq!(m.requests(Op::Put), 1);
    assert_eq!(m.requests(Op::Get), 1);
    assert_eq!(m.requests(Op::Head), 1);
    assert_eq!(m.requests(Op::Upload), 1);
    assert_eq!(m.requests(Op::List), 1);
    assert_eq!(m.errors(Op::Head, StoreErrorKind::NotFound), 1);
    let t = m.totals();
    assert_eq!(t, Totals { requests: 5, errors: 0, not_found: 1, bytes_read: 5, bytes_written: 12, bytes_copied: 0 });
}

#[tokio::test]
async fn a_streamed_read_is_one_get_and_counts_its_bytes() {
    let (s, m) = metered();
    s.put("a", Bytes::from_static(b"hello world"), PutOpts::default()).await.unwrap();
    let got: Vec<Bytes> = s.get("a", 2..9, GetOpts::default()).await.unwrap().map(Result::unwrap).collect().await;
    assert_eq!(got.concat(), b"llo wor");
    assert_eq!((m.requests(Op::Get), m.totals().bytes_read), (1, 7));
    // Dropped half-way: still one request, only the bytes that passed.
    let mut st = s.get("a", 0..11, GetOpts::default()).await.unwrap();
    let first = st.next().await.unwrap().unwrap().len() as u64;
    drop(st);
    assert_eq!((m.requests(Op::Get), m.totals().bytes_read), (2, 7 + first));
    assert!(s.get("missing", 0..1, GetOpts::default()).await.is_err());
    assert_eq!(m.errors(Op::Get, StoreErrorKind::NotFound), 1);
}

#[tokio::test]
async fn a_dropped_listing_is_still_one_request() {
    let (s, m) = metered();
    s.put("x/1", Bytes::new(), PutOpts::default()).await.unwrap();
    drop(s.list("", true));
    assert_eq!(m.requests(Op::List), 1);
}

#[test]
fn renders_prometheus_text() {
    let m = Metrics::default();
    let t = Instant::now();
    m.record(Op::Get, t, None);
    m.record(Op::Get, t, Some(StoreErrorKind::Unavailable));
    m.add_read(42);
    let text = m.render(&[("bucketfs_pending_uploads", "Dirty staged files.", 3)]);
    for line in [
        "# TYPE bucketfs_store_requests_total counter",
        "bucketfs_store_requests_total{op=\"get\"} 2",
        "bucketfs_store_requests_total{op=\"head\"} 0",
        "bucketfs_store_errors_total{op=\"get\",kind=\"unavailable\"} 1",
        "bucketfs_store_read_bytes_total 42",
        "bucketfs_store_written_bytes_total 0",
        "# TYPE bucketfs_store_request_duration_seconds histogram",
        "bucketfs_store_request_duration_seconds_bucket{op=\"get\",le=\"0.005\"} 2",
        "bucketfs_store_request_duration_seconds_bucket{op=\"get\",le=\"+Inf\"} 2",
        "bucketfs_store_request_duration_seconds_count{op=\"get\"} 2",
        "# TYPE bucketfs_pending_uploads gauge",
        "bucketfs_pending_uploads 3",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    // No error line for a kind that never happened; every sample line is `name{labels} value`.
    assert!(!text.contains("kind=\"not_found\""));
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let (_, v) = l.rsplit_once(' ').unwrap();
        assert!(v.parse::<f64>().is_ok(), "{l}");
    }
}

#[test]
fn histogram_buckets_are_cumulative() {
    let m = Metrics::default();
    let s = m.stats(Op::Head);
    s.latency[0].fetch_add(1, Relaxed); // <= 5 ms
    s.latency[4].fetch_add(2, Relaxed); // <= 100 ms
    s.latency[LATENCY_BUCKETS_US.len()].fetch_add(1, Relaxed); // > 10 s
    let text = m.render(&[]);
    let b = |le: &str| format!("bucketfs_store_request_duration_seconds_bucket{{op=\"head\",le=\"{le}\"}}");
    assert!(text.contains(&format!("{} 1\n", b("0.005"))));
    assert!(text.contains(&format!("{} 1\n", b("0.05"))));
    assert!(text.contains(&format!("{} 3\n", b("0.1"))));
    assert!(text.contains(&format!("{} 3\n", b("10"))));
    assert!(text.contains(&format!("{} 4\n", b("+Inf"))));
}

#[test]
fn seconds_are_exact_decimals() {
    assert_eq!(seconds(5_000), "0.005");
    assert_eq!(seconds(2_500_000), "2.5");
    assert_eq!(seconds(10_000_000), "10");
    assert_eq!(seconds(1), "0.000001");
}
