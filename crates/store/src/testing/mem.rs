//! An in-memory [`Store`] that behaves like an object store (flat keys, prefix directories,
//! ETags that change on every put) with optional per-request latency and a throughput cap.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use crate::{
    ByteStream, Capabilities, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, Patch, Patched,
    PutOpts, Store, StoreError, WriteOptions,
};
use std::sync::Arc;

type Objects = BTreeMap<String, (Bytes, String, SystemTime)>;

/// Entries in one page of a listing (S3's and GCS's default).
const LIST_PAGE: usize = 1000;

/// Every key of `objects` starting with `dir` (a directory `d/` and all below it).
fn keys_below(objects: &Objects, dir: &str) -> Vec<String> {
    objects.range(dir.to_string()..).map(|(k, _)| k).take_while(|k| k.starts_with(dir)).cloned().collect()
}
type AttrMap = std::collections::HashMap<String, crate::FileAttrs>;

#[derive(Default)]
pub struct MemStore {
    /// key -> (data, etag, mtime). One lock; every call holds it only to copy out.
    objects: Arc<Mutex<Objects>>,
    next_etag: Arc<AtomicU64>,
    latency: Duration,
    /// Bytes per second for `get`; 0 means unlimited.
    bytes_per_sec: u64,
    /// Count of requests made, for tests that assert "no HEAD per entry" and the like.
    pub requests: AtomicU64,
    /// Attributes kept with objects (user metadata).
    attrs: Arc<Mutex<AttrMap>>,
    /// Reported in [`Capabilities::max_key_len`] (not enforced).
    max_key_len: Option<usize>,
    /// Reported in [`Capabilities::max_file_name_len`] (not enforced).
    max_file_name_len: Option<usize>,
    /// Reported in [`Capabilities::trims_whitespace`] (keys are kept exactly).
    trims_whitespace: bool,
    /// Report no `read_if_match` and ignore `if_match`, as stores that cannot pin a read do.
    no_if_match: bool,
    /// Tell the MD5 of the content in heads asked for digests, as GCS does (off: none, as
    /// a local folder, or S3 with SSE-KMS, whose ETags are no MD5).
    md5: bool,
    /// Report [`Capabilities::moves`] and move in one request, keeping ETags, as Drive does.
    moves: bool,
    /// ETags are the MD5 of the bytes, as S3's of a single-request upload (the same bytes
    /// written again give the same ETag), not a new one per upload.
    content_etags: bool,
    /// Report [`Capabilities::patches`] and build patched versions ([`Store::patch`]).
    patches: bool,
    /// Bytes [`Store::patch`] read from its sources, and kept from the base.
    pub patch_sent: AtomicU64,
    pub patch_copied: AtomicU64,
    /// Patched objects' component counts, limited to 1,024 as GCS limits composites;
    /// patches refused for reaching it.
    pieces: Arc<Mutex<std::collections::HashMap<String, u32>>>,
    pub patch_refused: AtomicU64,
    /// Report [`Capabilities::prefix_list_reads_dir`] (listings cost the same here).
    prefix_list_reads_dir: bool,
    /// Listings of a plain prefix (`d/name`, not ending in `/`), for tests of the probes.
    pub plain_prefix_lists: AtomicU64,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every request waits `latency` first (a round trip).
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Report [`Capabilities::trims_whitespace`] as OpenDAL-backed stores do (the keys are
    /// still kept exactly), so the core's refusal of such names can be tested.
    pub fn trimming_whitespace(mut self) -> Self {
        self.trims_whitespace = true;
        self
    }

    /// Tell the MD5 of an object in a head asked for digests, as GCS does.
    pub fn with_md5(mut self) -> Self {
        self.md5 = true;
        self
    }

    /// ETags that are the MD5 of the bytes, as S3's ([`MemStore::content_etags`]).
    pub fn with_content_etags(mut self) -> Self {
        self.content_etags = true;
        self
    }

    /// Report [`Capabilities::read_if_match`] false, as stores that cannot pin a read do.
    pub fn without_if_match(mut self) -> Self {
        self.no_if_match = true;
        self
    }

    /// Move files and directories in one request that keeps each object's ETag and mtime
    /// ([`Capabilities::moves`]), and delete a directory (`d/`) with everything in it, as
    /// Google Drive does.
    pub fn with_moves(mut self) -> Self {
        self.moves = true;
        self
    }

    /// Make new versions from the kept ranges of the current one ([`Store::patch`]), as S3
    /// does with `UploadPartCopy` (any shape here).
    pub fn with_patches(mut self) -> Self {
        self.patches = true;
        self
    }

    /// Report that a plain prefix's listing reads the whole directory, as MinIO's does.
    pub fn with_prefix_list_reading_dir(mut self) -> Self {
        self.prefix_list_reads_dir = true;
        self
    }

    /// Report a limit on new file names, as the local folder does.
    pub fn with_max_file_name_len(mut self, bytes: usize) -> Self {
        self.max_file_name_len = Some(bytes);
        self
    }

    /// Report a key length limit, as S3 and GCS stores do.
    pub fn with_max_key_len(mut self, bytes: usize) -> Self {
        self.max_key_len = Some(bytes);
        self
    }

    /// Reads are paced to `bytes_per_sec`.
    pub fn with_throughput(mut self, bytes_per_sec: u64) -> Self {
        self.bytes_per_sec = bytes_per_sec;
        self
    }

    async fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }

    fn snapshot(&self, key: &str) -> Option<(Bytes, String, SystemTime)> {
        self.objects.lock().unwrap().get(key).cloned()
    }
}

#[async_trait]
impl Store for MemStore {
    fn describe(&self) -> String {
        "memstore://".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_if_match: !self.no_if_match,
            copy: true,
            prefix_dirs: true,
            max_key_len: self.max_key_len,
            max_file_name_len: self.max_file_name_len,
            trims_whitespace: self.trims_whitespace,
            trims_segments: false,
            keeps_attrs: true,
            moves: self.moves,
            patches: self.patches,
            prefix_list_reads_dir: self.prefix_list_reads_dir,
            lists_xml: false,
        }
    }

    async fn check(&self) -> Result<(), StoreError> {
        self.request().await;
        Ok(())
    }

    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        self.request().await;
        let (data, etag, mtime) = self.snapshot(key).ok_or_else(|| StoreError::not_found(key))?;
        let meta = ObjectMeta {
            key: key.into(),
            size: data.len() as u64,
            etag: Some(etag),
            mtime: Some(mtime),
            size_unknown: false,
        };
        let attrs = self.attrs.lock().unwrap().get(key).cloned().unwrap_or_default();
        let md5 = (opts.digests && self.md5).then(|| <md5::Md5 as md5::Digest>::digest(&data[..]).into());
        Ok(ObjectHead { attrs, md5, ..ObjectHead::of(meta) })
    }

    async fn get(&self, key: &str, range: Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        self.request().await;
        let (data, etag, _) = self.snapshot(key).ok_or_else(|| StoreError::not_found(key))?;
        if !self.no_if_match && opts.if_match.is_some_and(|t| t != etag) {
            return Err(StoreError::new(crate::StoreErrorKind::Changed, format!("{key} changed")));
        }
        let end = range.end.min(data.len() as u64) as usize;
        let start = (range.start as usize).min(end);
        if self.bytes_per_sec > 0 {
            let secs = (end - start) as f64 / self.bytes_per_sec as f64;
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        }
        let data = data.slice(start..end);
        Ok(futures::stream::once(async move { Ok(data) }).boxed())
    }

    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        if !prefix.is_empty() && !prefix.ends_with('/') {
            self.plain_prefix_lists.fetch_add(1, Ordering::Relaxed);
        }
        let objects = self.objects.lock().unwrap();
        let mut out: Vec<ObjectMeta> = Vec::new();
        for (key, (data, etag, mtime)) in objects.range(prefix.to_string()..) {
            let Some(rest) = key.strip_prefix(prefix) else { break };
            if rest.is_empty() && (prefix.is_empty() || prefix.ends_with('/')) && data.is_empty() {
                continue; // the directory marker itself (a plain prefix lists its exact key)
            }
            match (recursive, rest.find('/')) {
                (false, Some(i)) => {
                    let dir = format!("{prefix}{}", &rest[..=i]);
                    if out.last().map(|m| &m.key) != Some(&dir) {
                        out.push(ObjectMeta { key: dir, size: 0, etag: None, mtime: None, size_unknown: false });
                    }
                }
                _ => out.push(ObjectMeta {
                    key: key.clone(),
                    size: data.len() as u64,
                    etag: Some(etag.clone()),
                    mtime: Some(*mtime),
                    size_unknown: false,
                }),
            }
        }
        if !recursive {
            // As S3 and GCS send them: each page of 1,000 entries in key order, its common
            // prefixes first, then its objects (so `logs/` comes before the file `log`).
            for page in out.chunks_mut(LIST_PAGE) {
                page.sort_by_key(|m| !m.is_prefix());
            }
        }
        let latency = self.latency;
        self.requests.fetch_add(1, Ordering::Relaxed);
        futures::stream::once(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            futures::stream::iter(out.into_iter().map(Ok))
        })
        .flatten()
        .boxed()
    }

    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        self.request().await;
        self.pieces.lock().unwrap().remove(key);
        store_object(&self.objects, &self.attrs, self.etags(), key, data, opts)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.request().await;
        let mut objects = self.objects.lock().unwrap();
        let mut attrs = self.attrs.lock().unwrap();
        // As Drive does (`with_moves`), deleting a folder takes everything in it.
        let below = match self.moves && key.ends_with('/') {
            true => keys_below(&objects, key),
            false => vec![key.to_string()],
        };
        for k in below {
            objects.remove(&k);
            attrs.remove(&k);
        }
        Ok(())
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let (data, _, _) = self.snapshot(from).ok_or_else(|| StoreError::not_found(from))?;
        self.put(to, data, PutOpts::default()).await.map(|_| ())
    }

    async fn rename(&self, from: &str, to: &str) -> Result<(), StoreError> {
        if !self.moves {
            return Err(StoreError::new(crate::StoreErrorKind::Unsupported, format!("rename {from:?}")));
        }
        self.request().await;
        let mut objects = self.objects.lock().unwrap();
        let mut attrs = self.attrs.lock().unwrap();
        // A directory (`d/`) moves with every key below it; a file alone.
        let keys: Vec<String> = match from.ends_with('/') {
            true => keys_below(&objects, from),
            false => objects.contains_key(from).then(|| from.to_string()).into_iter().collect(),
        };
        if keys.is_empty() {
            return Err(StoreError::not_found(format!("rename {from:?}: not found")));
        }
        for k in keys {
            let moved = format!("{to}{}", &k[from.len()..]);
            let object = objects.remove(&k).expect("listed above");
            objects.insert(moved.clone(), object);
            if let Some(a) = attrs.remove(&k) {
                attrs.insert(moved, a);
            }
        }
        Ok(())
    }

    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        self.put(key, Bytes::new(), PutOpts::default()).await.map(|_| ())
    }

    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        self.request().await;
        self.pieces.lock().unwrap().remove(key);
        Ok(Box::new(MemWriter {
            objects: self.objects.clone(),
            attrs: self.attrs.clone(),
            next_etag: self.next_etag.clone(),
            content_etags: self.content_etags,
            key: key.into(),
            buf: Vec::new(),
            opts: opts.put,
        }))
    }

    async fn patch(&self, key: &str, p: Patch<'_>, _opts: WriteOptions) -> Result<Patched, StoreError> {
        if !self.patches {
            return Err(StoreError::new(crate::StoreErrorKind::Unsupported, format!("patch {key:?}")));
        }
        self.request().await;
        let (base, etag, _) = self.snapshot(key).ok_or_else(|| StoreError::not_found(key))?;
        if etag != p.base || base.len() as u64 != p.base_len {
            return Err(StoreError::new(crate::StoreErrorKind::Changed, format!("patch {key:?}: changed")));
        }
        let data = crate::patch::assemble(&base, &p)
            .map_err(|e| StoreError::new(crate::StoreErrorKind::Other, format!("patch {key:?}: {e}")))?;
        if p.base_pieces.is_some_and(|n| n >= crate::patch::MAX_PIECES) {
            // As the GCS store does: the caller uploads whole before the server's limit.
            return Err(StoreError::new(crate::StoreErrorKind::Unsupported, format!("patch {key:?}: many pieces")));
        }
        let pieces = self.pieces.lock().unwrap().get(key).copied().unwrap_or(1);
        if pieces >= 1024 {
            self.patch_refused.fetch_add(1, Ordering::Relaxed);
            let msg = format!("patch {key:?}: the object has {pieces} components, the most a composite may have");
            return Err(StoreError::new(crate::StoreErrorKind::Other, msg));
        }
        let copied: u64 = p.kept.iter().map(|r| r.end - r.start).sum();
        let sent = p.len - copied;
        self.patch_sent.fetch_add(sent, Ordering::Relaxed);
        self.patch_copied.fetch_add(copied, Ordering::Relaxed);
        let meta = store_object(&self.objects, &self.attrs, self.etags(), key, data, p.put)?;
        self.pieces.lock().unwrap().insert(key.to_string(), pieces + 1);
        Ok(Patched { meta, sent, copied, pieces: p.base_pieces.map(|n| n + 1) })
    }
}

/// How a [`MemStore`] names versions.
#[derive(Clone, Copy)]
enum Etags<'a> {
    Counter(&'a AtomicU64),
    Content,
}

impl<'a> Etags<'a> {
    fn new(content: bool, next: &'a AtomicU64) -> Self {
        if content {
            Etags::Content
        } else {
            Etags::Counter(next)
        }
    }
}

impl MemStore {
    fn etags(&self) -> Etags<'_> {
        Etags::new(self.content_etags, &self.next_etag)
    }
}

/// Store `data` as `key` with what `opts` asks, as one atomic step.
fn store_object(
    objects: &Mutex<Objects>,
    attrs: &Mutex<AttrMap>,
    etags: Etags<'_>,
    key: &str,
    data: Bytes,
    opts: PutOpts,
) -> Result<ObjectMeta, StoreError> {
    let etag = match etags {
        Etags::Counter(next) => format!("\"{}\"", next.fetch_add(1, Ordering::Relaxed) + 1),
        Etags::Content => {
            let md5: [u8; 16] = <md5::Md5 as md5::Digest>::digest(&data[..]).into();
            format!("\"{}\"", md5.iter().map(|b| format!("{b:02x}")).collect::<String>())
        }
    };
    let mtime = SystemTime::now();
    let size = data.len() as u64;
    let mut objects = objects.lock().unwrap();
    if opts.if_not_exists && objects.contains_key(key) {
        return Err(StoreError::new(crate::StoreErrorKind::Exists, format!("put {key:?}: already exists")));
    }
    objects.insert(key.into(), (data, etag.clone(), mtime));
    drop(objects);
    match opts.attrs.is_empty() {
        true => attrs.lock().unwrap().remove(key),
        false => attrs.lock().unwrap().insert(key.into(), opts.attrs),
    };
    Ok(ObjectMeta { key: key.into(), size, etag: Some(etag), mtime: Some(mtime), size_unknown: false })
}

/// Buffers the upload; the object appears atomically at `close`, as on a real store.
struct MemWriter {
    objects: Arc<Mutex<Objects>>,
    attrs: Arc<Mutex<AttrMap>>,
    next_etag: Arc<AtomicU64>,
    content_etags: bool,
    key: String,
    buf: Vec<u8>,
    opts: PutOpts,
}

#[async_trait]
impl ObjectWriter for MemWriter {
    async fn write(&mut self, data: Bytes) -> Result<(), StoreError> {
        self.buf.extend_from_slice(&data);
        Ok(())
    }
    async fn close(&mut self) -> Result<ObjectMeta, StoreError> {
        let data = Bytes::from(std::mem::take(&mut self.buf));
        let etags = Etags::new(self.content_etags, &self.next_etag);
        store_object(&self.objects, &self.attrs, etags, &self.key, data, self.opts.clone())
    }
    async fn abort(&mut self) -> Result<(), StoreError> {
        self.buf.clear();
        Ok(())
    }
}
