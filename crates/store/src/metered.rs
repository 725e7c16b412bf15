//! A store decorator that counts what goes through it, and renders the counts for
//! Prometheus.
//!
//! [`MeteredStore`] wraps any `Arc<dyn Store>` and implements [`Store`] itself, so the core
//! never knows it is measured. Per operation it counts requests, errors (by
//! [`StoreErrorKind`]) and a latency histogram; across operations, bytes read and written
//! (the [`ObjectWriter`] it returns counts its bytes too). Everything lives in atomics in a
//! shared [`Metrics`] handle: no lock, no allocation on the request path.
//!
//! A listing is one request; its latency runs until the stream ends (or is dropped), and
//! so does a read (`get`, one request whose bytes count as they pass). An
//! upload through a writer is one `upload` request, timed from `writer` to `close`.

use std::fmt::Write as _;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

use crate::{
    ByteStream, Capabilities, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, Patch, Patched,
    PutOpts, Store, StoreError, StoreErrorKind, WriteOptions,
};

/// The operations counted, in the order of [`Op::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Check,
    Head,
    Get,
    List,
    Put,
    Delete,
    Copy,
    Rename,
    CreateDir,
    Upload,
    Patch,
}

impl Op {
    pub const ALL: [Op; 11] = [
        Op::Check,
        Op::Head,
        Op::Get,
        Op::List,
        Op::Put,
        Op::Delete,
        Op::Copy,
        Op::Rename,
        Op::CreateDir,
        Op::Upload,
        Op::Patch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Check => "check",
            Op::Head => "head",
            Op::Get => "get",
            Op::List => "list",
            Op::Put => "put",
            Op::Delete => "delete",
            Op::Copy => "copy",
            Op::Rename => "rename",
            Op::CreateDir => "create_dir",
            Op::Upload => "upload",
            Op::Patch => "patch",
        }
    }
}

const KINDS: [StoreErrorKind; 10] = [
    StoreErrorKind::NotFound,
    StoreErrorKind::InvalidName,
    StoreErrorKind::PermissionDenied,
    StoreErrorKind::Changed,
    StoreErrorKind::Exists,
    StoreErrorKind::RateLimited,
    StoreErrorKind::Unsupported,
    StoreErrorKind::Config,
    StoreErrorKind::Unavailable,
    StoreErrorKind::Other,
];

fn kind_name(k: StoreErrorKind) -> &'static str {
    match k {
        StoreErrorKind::NotFound => "not_found",
        StoreErrorKind::PermissionDenied => "permission_denied",
        StoreErrorKind::Changed => "changed",
        StoreErrorKind::Exists => "exists",
        StoreErrorKind::InvalidName => "invalid_name",
        StoreErrorKind::RateLimited => "rate_limited",
        StoreErrorKind::Unsupported => "unsupported",
        StoreErrorKind::Config => "config",
        StoreErrorKind::Unavailable => "unavailable",
        StoreErrorKind::Other => "other",
    }
}

/// Upper bounds of the latency buckets, in microseconds (Prometheus' usual 5 ms..10 s
/// ladder; a bucket store round trip is 1 ms on a LAN and ~20-100 ms over the internet).
pub const LATENCY_BUCKETS_US: [u64; 11] =
    [5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000];

#[derive(Default)]
struct OpStats {
    requests: AtomicU64,
    errors: [AtomicU64; KINDS.len()],
    /// Non-cumulative counts per bucket; the last slot is "above every bound" (+Inf).
    latency: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    latency_sum_us: AtomicU64,
}

/// Counters shared by a [`MeteredStore`] and whoever reports them.
#[derive(Default)]
pub struct Metrics {
    ops: [OpStats; Op::ALL.len()],
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    /// Bytes a patched upload ([`Store::patch`]) kept in the store instead of sending.
    bytes_copied: AtomicU64,
}

/// Sums over every operation, for a human summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    pub requests: u64,
    /// Failed requests other than "not found" (which lookups expect all the time).
    pub errors: u64,
    pub not_found: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub bytes_copied: u64,
}

fn op_index(op: Op) -> usize {
    Op::ALL.iter().position(|o| *o == op).expect("every op is in ALL")
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn stats(&self, op: Op) -> &OpStats {
        &self.ops[op_index(op)]
    }

    /// One request of `op` finished after `start`, with `err` if it failed.
    pub fn record(&self, op: Op, start: Instant, err: Option<StoreErrorKind>) {
        let s = self.stats(op);
        s.requests.fetch_add(1, Relaxed);
        if let Some(k) = err {
            let i = KINDS.iter().position(|x| *x == k).expect("every kind is in KINDS");
            s.errors[i].fetch_add(1, Relaxed);
        }
        let us = start.elapsed().as_micros().min(u64::MAX as u128) as u64;
        let b = LATENCY_BUCKETS_US.iter().position(|bound| us <= *bound).unwrap_or(LATENCY_BUCKETS_US.len());
        s.latency[b].fetch_add(1, Relaxed);
        s.latency_sum_us.fetch_add(us, Relaxed);
    }

    pub fn add_read(&self, n: u64) {
        self.bytes_read.fetch_add(n, Relaxed);
    }

    pub fn add_written(&self, n: u64) {
        self.bytes_written.fetch_add(n, Relaxed);
    }

    pub fn requests(&self, op: Op) -> u64 {
        self.stats(op).requests.load(Relaxed)
    }

    pub fn errors(&self, op: Op, kind: StoreErrorKind) -> u64 {
        let i = KINDS.iter().position(|x| *x == kind).expect("every kind is in KINDS");
        self.stats(op).errors[i].load(Relaxed)
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            bytes_copied: self.bytes_copied.load(Relaxed),
            ..Totals::default()
        };
        for op in Op::ALL {
            t.requests += self.requests(op);
            for k in KINDS {
                match k {
                    StoreErrorKind::NotFound => t.not_found += self.errors(op, k),
                    _ => t.errors += self.errors(op, k),
                }
            }
        }
        t
    }

    /// Prometheus text exposition format (version 0.0.4). `gauges` are extra
    /// `(name, help, value)` lines from outside the store (the core's caches and uploads).
    pub fn render(&self, gauges: &[(&str, &str, u64)]) -> String {
        let mut o = String::new();
        o.push_str("# HELP bucketfs_store_requests_total Store requests, by operation.\n");
        o.push_str("# TYPE bucketfs_store_requests_total counter\n");
        for op in Op::ALL {
            let _ = writeln!(o, "bucketfs_store_requests_total{{op=\"{}\"}} {}", op.name(), self.requests(op));
        }
        o.push_str("# HELP bucketfs_store_errors_total Failed store requests, by operation and kind.\n");
        o.push_str("# TYPE bucketfs_store_errors_total counter\n");
        for op in Op::ALL {
            for k in KINDS {
                let n = self.errors(op, k);
                if n > 0 {
                    let _ = writeln!(
                        o,
                        "bucketfs_store_errors_total{{op=\"{}\",kind=\"{}\"}} {n}",
                        op.name(),
                        kind_name(k)
                    );
                }
            }
        }
        for (name, help, v) in [
            ("bucketfs_store_read_bytes_total", "Bytes received from the store.", self.bytes_read.load(Relaxed)),
            ("bucketfs_store_written_bytes_total", "Bytes sent to the store.", self.bytes_written.load(Relaxed)),
            (
                "bucketfs_store_copied_bytes_total",
                "Bytes of new versions copied inside the store instead of sent (uploads of what changed).",
                self.bytes_copied.load(Relaxed),
            ),
        ] {
            let _ = write!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n");
        }
        let h = "bucketfs_store_request_duration_seconds";
        let _ = write!(o, "# HELP {h} Store request latency.\n# TYPE {h} histogram\n");
        for op in Op::ALL {
            let s = self.stats(op);
            let mut cumulative = 0;
            for (i, bound) in LATENCY_BUCKETS_US.iter().enumerate() {
                cumulative += s.latency[i].load(Relaxed);
                let _ = writeln!(o, "{h}_bucket{{op=\"{}\",le=\"{}\"}} {cumulative}", op.name(), seconds(*bound));
            }
            cumulative += s.latency[LATENCY_BUCKETS_US.len()].load(Relaxed);
            let _ = writeln!(o, "{h}_bucket{{op=\"{}\",le=\"+Inf\"}} {cumulative}", op.name());
            let _ = writeln!(o, "{h}_sum{{op=\"{}\"}} {}", op.name(), seconds(s.latency_sum_us.load(Relaxed)));
            let _ = writeln!(o, "{h}_count{{op=\"{}\"}} {cumulative}", op.name());
        }
        for (name, help, v) in gauges {
            let _ = write!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n");
        }
        o
    }
}

/// Microseconds as a decimal number of seconds without float noise ("0.005", "2.5", "10").
fn seconds(us: u64) -> String {
    let (whole, frac) = (us / 1_000_000, us % 1_000_000);
    if frac == 0 {
        return whole.to_string();
    }
    format!("{whole}.{}", format!("{frac:06}").trim_end_matches('0'))
}

/// The decorator; see the module docs.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    fn done<T>(&self, op: Op, start: Instant, r: Result<T, StoreError>) -> Result<T, StoreError> {
        self.metrics.record(op, start, r.as_ref().err().map(|e| e.kind));
        r
    }
}

#[async_trait]
impl Store for MeteredStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn check(&self) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.check().await;
        self.done(Op::Check, t, r)
    }

    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        let t = Instant::now();
        let r = self.inner.head(key, opts).await;
        self.done(Op::Head, t, r)
    }

    async fn get(&self, key: &str, range: Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        let t = Instant::now();
        match self.inner.get(key, range, opts).await {
            Ok(inner) => {
                Ok(Box::pin(MeteredRead { inner, metrics: self.metrics.clone(), start: t, err: None, done: false }))
            }
            Err(e) => self.done(Op::Get, t, Err(e)),
        }
    }

    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        let inner = self.inner.list(prefix, recursive);
        Box::pin(MeteredList { inner, metrics: self.metrics.clone(), start: Instant::now(), err: None, done: false })
    }

    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        Ok(self.put_tried(key, data, opts).await?.meta)
    }

    async fn put_tried(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<crate::PutDone, StoreError> {
        let (t, n) = (Instant::now(), data.len() as u64);
        let r = self.inner.put_tried(key, data, opts).await;
        if r.is_ok() {
            self.metrics.add_written(n);
        }
        self.done(Op::Put, t, r)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.delete(key).await;
        self.done(Op::Delete, t, r)
    }

    async fn delete_version(&self, key: &str, seen: &ObjectMeta) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.delete_version(key, seen).await;
        self.done(Op::Delete, t, r)
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.copy(from, to).await;
        self.done(Op::Copy, t, r)
    }

    async fn rename(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.rename(from, to).await;
        self.done(Op::Rename, t, r)
    }

    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.create_dir(key).await;
        self.done(Op::CreateDir, t, r)
    }

    /// Recorded with the bytes it sent and copied; an `Unsupported` answer is no request
    /// (the caller uploads whole).
    async fn patch(&self, key: &str, p: Patch<'_>, opts: WriteOptions) -> Result<Patched, StoreError> {
        let t = Instant::now();
        let r = self.inner.patch(key, p, opts).await;
        match &r {
            Err(e) if e.kind == StoreErrorKind::Unsupported => return r,
            Ok(done) => {
                self.metrics.add_written(done.sent);
                self.metrics.bytes_copied.fetch_add(done.copied, Relaxed);
            }
            Err(_) => {}
        }
        self.done(Op::Patch, t, r)
    }

    async fn clean_parts(&self, owner: &str) -> Result<usize, StoreError> {
        self.inner.clean_parts(owner).await
    }
    async fn settle(&self) {
        self.inner.settle().await
    }

    fn sending_once(&self) -> Option<Arc<dyn Store>> {
        let inner = self.inner.sending_once()?;
        Some(Arc::new(MeteredStore::new(inner, self.metrics.clone())))
    }

    /// The upload is recorded when the writer closes or aborts.
    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        let t = Instant::now();
        match self.inner.writer(key, opts).await {
            Ok(inner) => {
                Ok(Box::new(MeteredWriter { inner, metrics: self.metrics.clone(), start: t, finished: false }))
            }
            Err(e) => {
                self.metrics.record(Op::Upload, t, Some(e.kind));
                Err(e)
            }
        }
    }
}

/// A listing stream that records one `list` request when it ends or is dropped.
struct MeteredList {
    inner: ListStream,
    metrics: Arc<Metrics>,
    start: Instant,
    err: Option<StoreErrorKind>,
    done: bool,
}

impl MeteredList {
    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.metrics.record(Op::List, self.start, self.err);
        }
    }
}

impl Stream for MeteredList {
    type Item = Result<ObjectMeta, StoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let r = self.inner.as_mut().poll_next(cx);
        match &r {
            Poll::Ready(Some(Err(e))) => self.err = Some(e.kind),
            Poll::Ready(None) => self.finish(),
            _ => {}
        }
        r
    }
}

impl Drop for MeteredList {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A streamed read that counts its bytes as they pass and records one `get` request when
/// it ends or is dropped.
struct MeteredRead {
    inner: ByteStream,
    metrics: Arc<Metrics>,
    start: Instant,
    err: Option<StoreErrorKind>,
    done: bool,
}

impl MeteredRead {
    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.metrics.record(Op::Get, self.start, self.err);
        }
    }
}

impl Stream for MeteredRead {
    type Item = Result<Bytes, StoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let r = self.inner.as_mut().poll_next(cx);
        match &r {
            Poll::Ready(Some(Ok(b))) => self.metrics.add_read(b.len() as u64),
            Poll::Ready(Some(Err(e))) => self.err = Some(e.kind),
            Poll::Ready(None) => self.finish(),
            Poll::Pending => {}
        }
        r
    }
}

impl Drop for MeteredRead {
    fn drop(&mut self) {
        self.finish();
    }
}

/// An upload that counts its bytes and records one `upload` request at close or abort.
struct MeteredWriter {
    inner: Box<dyn ObjectWriter>,
    metrics: Arc<Metrics>,
    start: Instant,
    finished: bool,
}

impl MeteredWriter {
    fn finish(&mut self, err: Option<StoreErrorKind>) {
        if !self.finished {
            self.finished = true;
            self.metrics.record(Op::Upload, self.start, err);
        }
    }
}

#[async_trait]
impl ObjectWriter for MeteredWriter {
    async fn write(&mut self, data: Bytes) -> Result<(), StoreError> {
        let n = data.len() as u64;
        let r = self.inner.write(data).await;
        match &r {
            Ok(()) => self.metrics.add_written(n),
            Err(e) => self.finish(Some(e.kind)),
        }
        r
    }

    async fn close(&mut self) -> Result<ObjectMeta, StoreError> {
        let r = self.inner.close().await;
        self.finish(r.as_ref().err().map(|e| e.kind));
        r
    }

    async fn abort(&mut self) -> Result<(), StoreError> {
        self.finish(None);
        self.inner.abort().await
    }
}

#[cfg(test)]
#[path = "metered_tests.rs"]
mod tests;
