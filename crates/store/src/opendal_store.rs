//! [`Store`] over OpenDAL's public `Operator` API (S3, GCS, local fs, memory).
//!
//! OpenDAL paths are relative to the operator root; directories end with `/` and the root
//! itself is `/`. Retries with backoff and per-request timeouts come from OpenDAL's layers,
//! added once where the operator is built ([`crate::location`]).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use opendal::{Metadata, Operator};

use crate::gcs::compose::{ComposeWriter, OpendalComposeBackend, PARTS_PREFIX};
use crate::{
    ByteStream, Capabilities, FileAttrs, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, Patch,
    Patched, PutOpts, Store, StoreError, StoreErrorKind, StoreExt, WriteOptions,
};

/// `mem://` versions: key -> (version, when its upload ended).
type Stamps = HashMap<String, (u64, SystemTime)>;

/// Keys per LIST request: S3's and GCS's maximum page size.
const LIST_PAGE: usize = 1000;

/// A read request (`reader_with`) pinned to `if_match`: to the generation on
/// stores whose identity is one (GCS), else to the ETag where the store honours If-Match.
macro_rules! with_precondition {
    ($store:expr, $req:expr, $if_match:expr) => {
        match $if_match {
            Some(tag) if $store.generation_identity => $req.if_version_match(tag),
            Some(tag) if $store.capabilities().read_if_match => $req.if_match(tag),
            _ => $req,
        }
    };
}

#[derive(Clone)]
pub struct OpendalStore {
    op: Operator,
    description: String,
    prefix_dirs: bool,
    /// GCS: identity is the object generation, checked with `x-goog-if-generation-match`;
    /// elsewhere it is the ETag, checked with `If-Match`.
    generation_identity: bool,
    /// GCS: the operator for compose requests, with a longer I/O timeout (see `location`).
    compose_op: Option<Operator>,
    /// The operator with another I/O timeout, for uploads (see [`OpendalStore::upload_operator`]).
    upload_ops: Option<UploadOperators>,
    /// The same without OpenDAL's retries, for requests this store sends again itself
    /// (`crate::retry`): a GCS create-only `put`.
    unretried_ops: Option<UploadOperators>,
    /// Tries after the first of what `crate::retry` sends again (composes, GCS create-only
    /// puts): the store's `--retries`, as OpenDAL's `RetryLayer` has.
    retries: usize,
    /// S3 and GCS: 1,024 bytes per object name, less the root prefix.
    max_key_len: Option<usize>,
    /// The local folder: see [`FS_TMP_NAME_MAX`].
    max_file_name_len: Option<usize>,
    /// The Content-Type uploads carry, where the service keeps one.
    content_type: crate::ContentType,
    /// `mem://`: OpenDAL's memory service reports neither ETag nor mtime, so two versions
    /// of one size would look alike (and a cache would serve the older). Each upload here
    /// stamps its key with a new version, reported as the ETag, and the time it ended.
    stamps: Option<Arc<Mutex<Stamps>>>,
    /// See [`Capabilities::prefix_list_reads_dir`].
    prefix_list_reads_dir: bool,
    /// GCS: the transport lets a compose into the key itself through
    /// ([`crate::gcs::in_place`]), which appends need.
    in_place_compose: bool,
    /// Requests sent without waiting (an append's temporary object deleted, a cancelled
    /// upload aborted): `settle`.
    background: crate::background::Background,
    /// The local folder's root: symbolic links below it are never followed (see
    /// [`OpendalStore::beneath`]).
    local_root: Option<std::path::PathBuf>,
}

/// Builds this store's operator with the given I/O timeout (`location` layers it).
pub type UploadOperators = Arc<dyn Fn(std::time::Duration) -> Operator + Send + Sync>;

/// How long one I/O call (a read of the next bytes of a body, the sending of a small
/// upload) may take before it is retried; uploads of more bytes get longer (see
/// [`OpendalStore::upload_operator`]).
pub(crate) const IO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The slowest upload, per connection, that never times out: 128 KiB/s (an 8 MiB part in
/// 64 s). OpenDAL's I/O timeout bounds each call, and sending a part is one call, so a fixed
/// 10 s failed every part on links under 0.8 MB/s per connection (a 45 Mbit/s uplink shared
/// by 8 parts), retrying in vain.
const UPLOAD_FLOOR_BYTES_PER_SEC: u64 = 128 * 1024;

/// Longest object name S3 and GCS accept, in bytes.
const OBJECT_KEY_MAX: usize = 1024;

/// Longest file name the local folder can write: OpenDAL's fs service writes through a
/// temporary `name.XXXXXXXX` beside it (9 bytes longer), and a name has 255 bytes at most.
const FS_TMP_NAME_MAX: usize = 255 - 9;

impl OpendalStore {
    /// `description` is shown in logs and errors; it must not contain credentials.
    pub fn new(op: Operator, description: String, prefix_dirs: bool) -> Self {
        let info = op.info();
        let generation_identity = info.scheme() == "gcs";
        let max_key_len = (info.scheme() == "s3" || info.scheme() == "gcs")
            .then(|| OBJECT_KEY_MAX.saturating_sub(info.root().trim_start_matches('/').len()));
        let max_file_name_len = (info.scheme() == "fs").then_some(FS_TMP_NAME_MAX);
        let content_type = crate::ContentType::default();
        let stamps = (info.scheme() == "memory").then(Default::default);
        let local_root = (info.scheme() == "fs").then(|| std::path::PathBuf::from(info.root()));
        Self {
            op,
            description,
            prefix_dirs,
            generation_identity,
            compose_op: None,
            upload_ops: None,
            unretried_ops: None,
            retries: 3,
            max_key_len,
            max_file_name_len,
            content_type,
            stamps,
            prefix_list_reads_dir: false,
            in_place_compose: false,
            background: Default::default(),
            local_root,
        }
    }

    /// The local folder: `key` names a path whose every component below the root is no
    /// symbolic link. OpenDAL's fs service follows links, so a link `d -> /etc` in the
    /// folder showed `/etc` in the mount, readable and writable by whoever may use the
    /// mount (`allow_other`, a CSI volume). Links are skipped, as other sync tools skip
    /// them unless asked: not listed, not found, not written through. Components that do
    /// not exist yet end the walk (a write creates them as directories).
    fn beneath(&self, op: &str, key: &str) -> Result<(), StoreError> {
        let Some(root) = &self.local_root else { return Ok(()) };
        let mut path = root.clone();
        for part in key.split('/').filter(|p| !p.is_empty()) {
            path.push(part);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(StoreError::new(
                        crate::StoreErrorKind::NotFound,
                        format!(
                            "{op} {key}: {} is a symbolic link, which a local folder store does not follow",
                            path.display()
                        ),
                    ));
                }
                Ok(_) => {}
                Err(_) => return Ok(()),
            }
        }
        Ok(())
    }

    /// A local folder's name that is not UTF-8 is listed with U+FFFD in place of its
    /// bytes, so its key names another file (one of that very name, whose bytes a read
    /// would give) or none. Such a key is shown only where a file of that name exists,
    /// with that file's size and mtime (`m` takes them); else it is left out, and `false`.
    fn local_name_holds(&self, m: &mut ObjectMeta) -> bool {
        let Some(root) = self.local_root.as_ref().filter(|_| m.key.contains('\u{FFFD}')) else { return true };
        match std::fs::symlink_metadata(root.join(m.key.trim_end_matches('/'))) {
            Ok(md) if md.is_dir() == m.is_prefix() => {
                if !md.is_dir() {
                    m.size = md.len();
                    m.mtime = md.modified().ok().or(m.mtime);
                }
                true
            }
            _ => {
                tracing::warn!(key = %m.key, "a name in the folder is not UTF-8: not shown");
                false
            }
        }
    }

    /// The local folder: a listed `key` is a symbolic link (skipped, as [`Self::beneath`]
    /// refuses it; the listed prefix was checked by `beneath` once), or names nothing
    /// there: OpenDAL's fs service trims every segment it lists, so `only ` and `dsp /x`
    /// came as `only` and `dsp/x`, names no file has (`cat` gave `ESTALE`, `rm` removed
    /// nothing and returned 0). Such names are not shown (SEMANTICS.md, the keys table).
    fn listed_unreachable(&self, key: &str) -> bool {
        self.local_root.as_ref().is_some_and(|root| {
            match std::fs::symlink_metadata(root.join(key.trim_end_matches('/'))) {
                Ok(m) => m.file_type().is_symlink(),
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            }
        })
    }

    /// A listed key holding U+FFFD, on a store whose listings are XML
    /// ([`Capabilities::lists_xml`]): that key only if the store answers for it (a HEAD
    /// with the listed ETag; for a prefix, a listing of it) and only once in this listing
    /// (`shown`). Otherwise the listing lost the object's real key (MinIO sends U+FFFD for
    /// a control character), and each U+FFFD becomes U+001A, which no key shown here holds:
    /// the object is not shown, and the directories above know they hold a key not shown.
    async fn xml_listed(
        &self,
        mut m: ObjectMeta,
        shown: &Mutex<std::collections::HashSet<String>>,
    ) -> Result<ObjectMeta, StoreError> {
        // A prefix answers with its marker (an empty directory made here) or a key below.
        let answers = match self.op.stat(&m.key).await {
            Ok(found) if m.is_prefix() || m.etag.is_none() => found.is_dir() == m.is_prefix(),
            Ok(found) => found.etag().map(|e| e.trim_matches('"')) == m.etag.as_deref().map(|e| e.trim_matches('"')),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound && m.is_prefix() => {
                let mut l = self.list(&m.key, false);
                l.try_next().await?.is_some()
            }
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => false,
            // Not allowed to ask (a policy without GetObject): shown, as before the check.
            Err(e) if e.kind() == opendal::ErrorKind::PermissionDenied => true,
            Err(e) => return Err(StoreError::from_opendal("head", &m.key, e)),
        };
        if !(answers && shown.lock().unwrap().insert(m.key.clone())) {
            tracing::warn!(key = %m.key, "a listed key holds a character the listing could not carry: not shown");
            m.key = m.key.replace('\u{FFFD}', "\u{1A}");
        }
        Ok(m)
    }

    /// An S3-compatible server on its own endpoint: see [`Capabilities::prefix_list_reads_dir`].
    pub fn with_prefix_list_reading_dir(mut self) -> Self {
        self.prefix_list_reads_dir = true;
        self
    }

    /// `mem://`: `key` now holds a new version (see `stamps`).
    fn stamp(&self, key: &str) {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        if let Some(s) = &self.stamps {
            s.lock().unwrap().insert(key.to_string(), (NEXT.fetch_add(1, Relaxed), SystemTime::now()));
        }
    }

    /// Uploads carry this Content-Type policy (default: guessed from the extension).
    pub fn with_content_type(mut self, c: crate::ContentType) -> Self {
        self.content_type = c;
        self
    }

    /// What an upload to `key` with `put`'s attributes stores beside its bytes.
    pub fn headers_for(&self, key: &str, put: &PutOpts) -> crate::headers::Headers {
        crate::headers::Headers::new(&self.op.info().capability(), put, self.content_type.for_key(key))
    }

    /// Build upload operators with `ops` (see `OpendalStore::upload_operator`).
    pub fn with_upload_operators(mut self, ops: UploadOperators) -> Self {
        self.upload_ops = Some(ops);
        self
    }

    /// Build operators without OpenDAL's retries with `ops`, and send again what
    /// `crate::retry` sends at most `retries` more times.
    pub fn with_unretried_upload_operators(mut self, ops: UploadOperators, retries: usize) -> Self {
        self.unretried_ops = Some(ops);
        self.retries = retries;
        self
    }

    /// The operator for an upload whose one I/O call sends `bytes` (a whole small object,
    /// or one part): its I/O timeout lets it run at [`UPLOAD_FLOOR_BYTES_PER_SEC`], and is
    /// never shorter than the store's own.
    fn upload_operator(&self, bytes: u64) -> Operator {
        let io = upload_io_timeout(bytes);
        match &self.upload_ops {
            Some(build) if io > IO_TIMEOUT => build(io),
            _ => self.op.clone(),
        }
    }

    /// As [`Self::upload_operator`], but without OpenDAL's retries (`None`: no builder).
    fn unretried_upload_operator(&self, bytes: u64) -> Option<Operator> {
        self.unretried_ops.as_ref().map(|build| build(upload_io_timeout(bytes).max(IO_TIMEOUT)))
    }

    /// The operator's transport is wrapped in [`crate::gcs::in_place::InPlaceCompose`]: GCS
    /// appends are composed into the key (else they upload whole).
    pub fn with_in_place_compose(mut self) -> Self {
        self.in_place_compose = true;
        self
    }

    /// Use `op` (the same service, other layers) for GCS compose requests.
    pub fn with_compose_operator(mut self, op: Operator) -> Self {
        self.compose_op = Some(op);
        self
    }

    fn meta(&self, key: &str, m: &Metadata) -> ObjectMeta {
        // GCS: the generation only. An answer without one (an XML upload's completion may
        // carry only an ETag) leaves the identity unknown, to be asked for, rather than an
        // ETag that no listing or HEAD reports and no generation precondition accepts.
        let etag = if self.generation_identity { m.version() } else { m.etag().or(m.version()) };
        let mut meta = ObjectMeta {
            key: key.to_string(),
            size: if m.is_dir() { 0 } else { m.content_length() },
            etag: etag.map(str::to_string),
            mtime: m.last_modified().map(Into::into),
            size_unknown: false,
        };
        if let Some((version, at)) = self.stamps.as_ref().and_then(|s| s.lock().unwrap().get(key).copied()) {
            (meta.etag, meta.mtime) = (Some(format!("\"mem-{:x}-{version}\"", mem_epoch())), Some(at));
        }
        if let Some(root) = &self.local_root {
            crate::local::identify(root, &mut meta);
        }
        meta
    }
}

/// `mem://` versions of this process: each mount's memory store is a new, empty bucket,
/// and the disk cache, which every `mem://` mount shares by default, names a file by key
/// and version. With a counter alone every mount's first upload of a key was `mem-1`, and
/// a new mount read an earlier mount's bytes from the cache (tester M).
fn mem_epoch() -> u64 {
    static EPOCH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(|| {
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (u64::from(std::process::id()) << 40)
    })
}

/// The I/O timeout of an upload call sending `bytes`: see [`UPLOAD_FLOOR_BYTES_PER_SEC`].
fn upload_io_timeout(bytes: u64) -> std::time::Duration {
    std::time::Duration::from_secs(bytes.div_ceil(UPLOAD_FLOOR_BYTES_PER_SEC).min(3600))
}

fn od_path(key: &str) -> &str {
    if key.is_empty() {
        "/"
    } else {
        key
    }
}

#[async_trait]
impl Store for OpendalStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn capabilities(&self) -> Capabilities {
        let cap = self.op.info().capability();
        Capabilities {
            // The local folder: `get` checks the version itself (`local::read_pinned`).
            read_if_match: cap.read_with_if_match || self.local_root.is_some(),
            copy: cap.copy,
            prefix_dirs: self.prefix_dirs,
            max_key_len: self.max_key_len,
            max_file_name_len: self.max_file_name_len,
            // Every path goes through OpenDAL's normalize_path, which trims it.
            trims_whitespace: true,
            // The local folder's lister trims each name it reads (checked by hand: a
            // directory `a ` lists as `a/`); object stores list keys as stored.
            trims_segments: !self.prefix_dirs,
            keeps_attrs: cap.write_with_user_metadata,
            moves: false,
            // S3 with native `UploadPartCopy` (not when OpenDAL checksums uploads), GCS.
            patches: self.generation_identity || (self.op.info().scheme() == "s3" && cap.write_can_copy_from),
            prefix_list_reads_dir: self.prefix_list_reads_dir,
            lists_xml: self.op.info().scheme() == "s3",
        }
    }

    async fn check(&self) -> Result<(), StoreError> {
        // One LIST of at most one key: fails with NotFound for a missing bucket and
        // PermissionDenied for bad credentials, and needs no object to exist.
        let mut lister =
            self.op.lister_with("/").limit(1).await.map_err(|e| StoreError::from_opendal("list", "/", e))?;
        if let Some(r) = lister.next().await {
            r.map_err(|e| StoreError::from_opendal("list", "/", e))?;
        }
        Ok(())
    }

    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        self.beneath("head", key)?;
        // An S3 operator built with `s3_checksum_mode` answers with the object's checksum.
        let (m, asked) = match opts.digests {
            true => crate::s3::checksum_mode::asking(self.op.stat(od_path(key))).await,
            false => (self.op.stat(od_path(key)).await, Default::default()),
        };
        let m = m.map_err(|e| StoreError::from_opendal("head", key, e))?;
        let user = m.user_metadata().map(|u| u.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        let own = |v: Option<&str>| v.map(str::to_string);
        let attrs = FileAttrs::from_metadata(&user.unwrap_or_default()).with_headers(crate::attrs::Foreign {
            content_type: own(m.content_type()),
            cache_control: own(m.cache_control()),
            content_disposition: own(m.content_disposition()),
            content_encoding: own(m.content_encoding()),
            user: Vec::new(),
        });
        // A real directory (local fs) reports as a prefix, like a marker object would.
        let mut meta = match m.is_dir() && !key.ends_with('/') && !key.is_empty() {
            true => self.meta(&format!("{key}/"), &m),
            false => self.meta(key, &m),
        };
        if opts.marker_bytes && meta.is_prefix() && self.prefix_dirs {
            (meta.size, meta.size_unknown) = self.marker_bytes(key).await?;
        }
        if !opts.digests {
            return Ok(ObjectHead { attrs, ..ObjectHead::of(meta) });
        }
        Ok(ObjectHead {
            meta,
            attrs,
            etag: m.etag().map(|e| e.trim_matches('"').to_string()),
            md5: m.content_md5().and_then(parse_md5),
            checksum: asked.checksum,
            first_part: asked.first_part,
        })
    }

    async fn get(&self, key: &str, range: Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        self.beneath("get", key)?;
        if range.start >= range.end {
            return Ok(Box::pin(futures::stream::empty()));
        }
        if let (Some(root), Some(tag)) = (&self.local_root, opts.if_match) {
            return crate::local::read_pinned(&crate::local::path_of(root, key), key, tag, range).await;
        }
        let req = with_precondition!(self, self.op.reader_with(key), opts.if_match);
        let reader = req.await.map_err(|e| StoreError::from_opendal("get", key, e))?;
        // No chunk option: one streaming request for the whole range.
        let stream = reader.into_stream(range).await.map_err(|e| StoreError::from_opendal("get", key, e))?;
        let key = key.to_string();
        Ok(stream
            .map_err(move |e| StoreError::from_opendal("get", &key, e))
            .map_ok(|buf| futures::stream::iter(Iterator::map(buf, Ok)))
            .try_flatten()
            .boxed())
    }

    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        let op = self.op.clone();
        let prefix = prefix.to_string();
        let this = self.clone();
        let stream = async move {
            this.beneath("list", &prefix)?;
            let lister = op
                .lister_with(od_path(&prefix))
                .recursive(recursive)
                .limit(LIST_PAGE)
                .await
                .map_err(|e| StoreError::from_opendal("list", &prefix, e))?;
            let p = prefix.clone();
            let shown = Arc::new(Mutex::new(std::collections::HashSet::new()));
            Ok::<_, StoreError>(lister.map_err(move |e| StoreError::from_opendal("list", &p, e)).try_filter_map(
                move |entry| {
                    let key = entry.path().trim_start_matches('/').to_string();
                    // Temporary upload parts (gcs::compose) are never part of a listing.
                    // A marker is listed with no size: one whose MD5 is known and not the
                    // empty content's may hold bytes (`ObjectMeta::may_hold_bytes`).
                    let mut m = this.meta(&key, entry.metadata());
                    m.size_unknown = m.is_prefix() && this.prefix_dirs && md5_says_bytes(entry.metadata());
                    let named = this.local_name_holds(&mut m);
                    // The directory itself is not its own entry unless it may hold bytes; a
                    // plain prefix (`d/name`, see `Store::list`) lists its exact key like any
                    // other.
                    let own = key == prefix && prefix.ends_with('/') && !m.size_unknown;
                    let keep =
                        !own && !this.listed_unreachable(&key) && !key.is_empty() && !key.starts_with(PARTS_PREFIX);
                    let (this, shown) = (this.clone(), shown.clone());
                    async move {
                        match keep && named {
                            true if this.capabilities().lists_xml && m.key.contains('\u{FFFD}') => {
                                Ok(Some(this.xml_listed(m, &shown).await?))
                            }
                            keep => Ok(keep.then_some(m)),
                        }
                    }
                },
            ))
        };
        futures::stream::once(stream).try_flatten().boxed()
    }

    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        Ok(self.put_tried(key, data, opts).await?.meta)
    }

    async fn put_tried(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<crate::PutDone, StoreError> {
        self.beneath("put", key)?;
        let headers = self.headers_for(key, &opts);
        let created = |e| StoreError::from_opendal("put", key, e).if_created(opts.if_not_exists);
        // Each try sent again here, not by OpenDAL's RetryLayer, which would not say so: a
        // try cut off by a timeout may still be completed by the store, over a newer version
        // or a name removed since (tester G: a GCS PUT retried after 45 s of latency landed
        // after the next close). The caller watches the key then (late.rs in the core).
        let mut tries = 0;
        let m = match self.unretried_upload_operator(data.len() as u64) {
            // GCS create-only: OpenDAL sends it as a resumable session, and its RetryLayer
            // would retry a cut close by asking the session's status, which fake-gcs-server
            // answers by storing the bytes it holds, none after a cut: a 0-byte object under
            // the key, and "writer got too much data" (tester A). Here each try is a new
            // session sending all the bytes, with `ifGenerationMatch=0` every time. The
            // object appears only at a session's completing PUT; a try that completed
            // unanswered makes the next one refused (`Exists`), and the caller tells its
            // own by the create tag (`landed_here`), as on S3.
            Some(op) => crate::retry::again(self.retries, "put", key, |n| {
                tries = n;
                let req = crate::apply_headers!(op.write_with(key, data.clone()), &headers);
                std::future::IntoFuture::into_future(req.if_not_exists(opts.if_not_exists))
            })
            .await
            .map_err(created)?,
            None => {
                let op = self.upload_operator(data.len() as u64);
                let mut req = crate::apply_headers!(op.write_with(key, data), &headers);
                if opts.if_not_exists {
                    req = req.if_not_exists(true);
                }
                req.await.map_err(created)?
            }
        };
        self.stamp(key);
        // The identity comes from this upload's own response, never from a later HEAD: another
        // writer may have replaced the object in between (then we would claim their ETag).
        Ok(crate::PutDone { meta: self.meta(key, &m), cut_tries: tries as u32 })
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.beneath("delete", key)?;
        self.op.delete(od_path(key)).await.map_err(|e| StoreError::from_opendal("delete", key, e))?;
        if let Some(s) = &self.stamps {
            s.lock().unwrap().remove(key);
        }
        Ok(())
    }

    async fn delete_version(&self, key: &str, seen: &ObjectMeta) -> Result<(), StoreError> {
        self.beneath("delete", key)?;
        // Checked here first: an S3-compatible server may ignore `If-Match` on a DELETE
        // (MinIO does), and a local folder has no condition to send.
        if !self.holds_version(key, seen).await? {
            return Ok(());
        }
        // And sent with the delete where the store takes it (GCS, AWS S3): no moment between.
        let req = self.op.delete_with(od_path(key));
        let req = match seen.etag.as_deref() {
            Some(g) if self.generation_identity => req.if_version_match(g),
            Some(tag) if self.op.info().capability().delete_with_if_match => req.if_match(tag),
            _ => req,
        };
        match req.await {
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => {}
            r => r.map_err(|e| StoreError::from_opendal("delete", key, e))?,
        }
        if let Some(s) = &self.stamps {
            s.lock().unwrap().remove(key);
        }
        Ok(())
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.beneath("copy", from)?;
        self.beneath("copy", to)?;
        if !self.op.info().capability().copy {
            // OpenDAL's memory service has no copy; the data is local, so read and write.
            let data = self.op.read(from).await.map_err(|e| StoreError::from_opendal("copy", from, e))?;
            self.put(to, data.to_bytes(), PutOpts::default()).await?;
            return Ok(());
        }
        if let Some(root) = self.local_root.clone() {
            // A new file renamed into place (`local::finish_copy`), keeping the mtime.
            let mtime =
                self.op.stat(from).await.map_err(|e| StoreError::from_opendal("copy", from, e))?.last_modified();
            let tmp = crate::local::copy_key(&root, to);
            self.op.copy(from, &tmp).await.map_err(|e| StoreError::from_opendal("copy", from, e))?;
            let (t, dst) = (tmp.clone(), to.to_string());
            let finished =
                tokio::task::spawn_blocking(move || crate::local::finish_copy(&root, &t, &dst, mtime.map(Into::into)))
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            return finished.map_err(|e| {
                let kind = match e.kind() {
                    std::io::ErrorKind::PermissionDenied => StoreErrorKind::PermissionDenied,
                    _ => StoreErrorKind::Other,
                };
                StoreError::new(kind, format!("copy {from:?} to {to:?}: {e}"))
            });
        }
        match self.op.copy(from, to).await {
            Ok(_) => Ok(()),
            // S3: the source changed between OpenDAL's HEAD and the copy it pinned to it.
            Err(e) if e.kind() == opendal::ErrorKind::Conflict => {
                Err(StoreError::new(StoreErrorKind::Changed, format!("copy {from:?}: it changed while being copied")))
            }
            Err(e) => Err(StoreError::from_opendal("copy", from, e)),
        }
    }

    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        self.beneath("mkdir", key)?;
        self.op.create_dir(key).await.map_err(|e| StoreError::from_opendal("mkdir", key, e))
    }

    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        self.beneath("put", key)?;
        if let Some(compose_op) = self.compose_op.clone().filter(|_| self.op.info().scheme() == "gcs") {
            // OpenDAL's GCS writer needs the XML multipart API; parts + compose need only
            // the JSON API (which emulators have too), and `location` sets a compose
            // operator only for those (`--gcs-upload`). Compose keeps no metadata, so only
            // a one-part object keeps `attrs` (SEMANTICS.md).
            let backend = OpendalComposeBackend {
                op: self.upload_operator(opts.part_size as u64),
                compose_op,
                store: self.clone(),
                headers: self.headers_for(key, &opts.put),
                put: opts.put,
                retries: self.retries,
            };
            let w = ComposeWriter::new(Arc::new(backend), key, opts.part_size, opts.concurrency);
            return Ok(Box::new(w.with_background(self.background.clone())));
        }
        let op = self.upload_operator(opts.part_size as u64);
        let req = op.writer_with(key).chunk(opts.part_size).concurrent(opts.concurrency.max(1));
        let mut req = crate::apply_headers!(req, &self.headers_for(key, &opts.put));
        // S3: `If-None-Match: *` on the single PUT or on CompleteMultipartUpload.
        if opts.put.if_not_exists {
            req = req.if_not_exists(true);
        }
        let created = |e| StoreError::from_opendal("upload", key, e).if_created(opts.put.if_not_exists);
        let w = req.await.map_err(created)?;
        // Dropped before its end (a cancelled upload): aborted in the background.
        let w = crate::detached::DetachedWriter::new(w, key, &self.background);
        let if_not_exists = opts.put.if_not_exists;
        Ok(Box::new(OpendalWriter { store: self.clone(), key: key.to_string(), w: Some(w), if_not_exists }))
    }

    async fn clean_parts(&self, owner: &str) -> Result<usize, StoreError> {
        if !self.prefix_dirs || owner.is_empty() {
            return Ok(0);
        }
        let mine = format!("{PARTS_PREFIX}{owner}-");
        let err = |e| StoreError::from_opendal("list", PARTS_PREFIX, e);
        let mut lister = self.op.lister_with(PARTS_PREFIX).recursive(true).await.map_err(err)?;
        let mut keys = Vec::new();
        while let Some(entry) = lister.try_next().await.map_err(err)? {
            if entry.path().starts_with(&mine) && !entry.path().ends_with('/') {
                keys.push(entry.path().to_string());
            }
        }
        for k in &keys {
            self.op.delete(k).await.map_err(|e| StoreError::from_opendal("delete", k, e))?;
        }
        Ok(keys.len())
    }

    fn sending_once(&self) -> Option<Arc<dyn Store>> {
        // Uploads (a link's body, a directory marker) without `crate::retry`'s tries either.
        let build = self.unretried_ops.clone()?;
        let op = build(IO_TIMEOUT);
        Some(Arc::new(Self { op, upload_ops: Some(build), retries: 0, ..self.clone() }))
    }

    async fn settle(&self) {
        let within = std::time::Duration::from_secs(10);
        if !self.background.settle(within).await {
            tracing::warn!(
                "temporary objects not deleted within {within:?}: the next mount of this mount point deletes them"
            );
        }
    }

    async fn patch(&self, key: &str, p: Patch<'_>, opts: WriteOptions) -> Result<Patched, StoreError> {
        // GCS appends need the transport that composes into the key itself.
        let gcs_unable = self.generation_identity && !self.in_place_compose;
        if !self.capabilities().patches || p.put.if_not_exists || gcs_unable {
            return Err(StoreError::new(crate::StoreErrorKind::Unsupported, format!("patch {key:?}: upload whole")));
        }
        let t = crate::patch::Target {
            key,
            headers: self.headers_for(key, &p.put),
            part_size: opts.part_size as u64,
            concurrency: opts.concurrency,
            retries: self.retries,
        };
        if !self.generation_identity {
            let op = self.upload_operator(opts.part_size as u64);
            let (meta, sent, copied) = crate::patch::s3(&op, &t, &p, &self.background).await?;
            self.stamp(key);
            return Ok(Patched { meta, sent, copied, pieces: None });
        }
        let compose_op = self.compose_op.clone().unwrap_or_else(|| self.op.clone());
        let (base_len, len, part) = (p.base_len, p.len, opts.part_size as u64);
        let source = p.source;
        let upload = |tmp: String| async move {
            let mut w = self.writer(&tmp, WriteOptions { put: PutOpts::default(), ..opts }).await?;
            let mut at = base_len;
            while at < len {
                let n = part.min(len - at) as usize;
                let data = match crate::patch::read_piece(source, key, at..at + n as u64) {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = w.abort().await;
                        return Err(e);
                    }
                };
                w.write(data).await?;
                at += n as u64;
            }
            w.close().await?;
            Ok((len - base_len).div_ceil(part).max(1) as u32)
        };
        let (meta, sent, pieces) = crate::patch::gcs(&compose_op, &t, &p, upload, &self.background).await?;
        Ok(Patched { meta, sent, copied: base_len, pieces })
    }
}

impl OpendalStore {
    /// Whether marker `key` holds bytes, as (size, size unknown). OpenDAL takes a key ending
    /// in `/` for a directory: its `stat` answers from a listing with no length, and it
    /// reads no such key. So a HEAD of the key (presigned, sent through the operator's own
    /// transport) gives the length; an encrypted object's ETag is no MD5. A mount that
    /// cannot sign one asks a listing for the marker's MD5, and an MD5 that is not the
    /// empty content's counts as holding bytes.
    async fn marker_bytes(&self, key: &str) -> Result<(u64, bool), StoreError> {
        let err = |e| StoreError::from_opendal("head", key, e);
        let req = match self.op.presign_stat(key, std::time::Duration::from_secs(60)).await {
            Ok(p) => {
                let mut req = http::Request::builder().method(p.method()).uri(p.uri());
                for (k, v) in p.header() {
                    req = req.header(k, v);
                }
                req.body(opendal::Buffer::new()).ok()
            }
            Err(e) => {
                tracing::debug!(key, "size of a marker: no HEAD ({e}); its listed MD5 answers");
                None
            }
        };
        let Some(req) = req else {
            let mut lister = self.op.lister_with(key).limit(1).await.map_err(err)?;
            let says = match lister.next().await.transpose().map_err(err)? {
                Some(e) if e.path().trim_start_matches('/') == key => md5_says_bytes(e.metadata()),
                _ => false,
            };
            return Ok((0, says));
        };
        // Outside the operator's timeout layer: bounded here. A failure is an error (the
        // caller's operation fails and can be tried again), not a guess either way.
        let failed = |why: String| StoreError::new(crate::StoreErrorKind::Other, format!("HEAD {key}: {why}"));
        let fetch = self.op.context().http_transport().fetch(req);
        let r = match tokio::time::timeout(std::time::Duration::from_secs(30), fetch).await {
            Err(_) => return Err(failed("no answer in 30 s".into())),
            Ok(r) => r.map_err(err)?,
        };
        match r.status() {
            s if s.is_success() => {
                let len = r.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
                tracing::debug!(key, ?len, "size of a marker");
                Ok(len.map_or((0, true), |n| (n, false)))
            }
            http::StatusCode::NOT_FOUND => Ok((0, false)),
            s => Err(failed(s.to_string())),
        }
    }
}

/// The MD5 of no bytes, as S3's ETag of a single-part upload or GCS's `md5Hash` tells it.
const EMPTY_MD5: [u8; 16] =
    [0xd4, 0x1d, 0x8c, 0xd9, 0x8f, 0x00, 0xb2, 0x04, 0xe9, 0x80, 0x09, 0x98, 0xec, 0xf8, 0x42, 0x7e];

/// Whether an entry's MD5 (GCS's `md5Hash`, else the ETag, an MD5 for S3's single-part
/// uploads) is known and not that of no bytes. An encrypted object's ETag looks like an
/// MD5 and is none: true then, and a HEAD's length answers (`OpendalStore::marker_bytes`).
fn md5_says_bytes(m: &Metadata) -> bool {
    m.content_md5().or(m.etag()).and_then(parse_md5).is_some_and(|md5| md5 != EMPTY_MD5)
}

/// `md5Hash` as GCS reports it (base64 of 16 bytes), or 32 hex digits.
fn parse_md5(s: &str) -> Option<[u8; 16]> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    use base64::Engine as _;
    let s = s.trim().trim_matches('"');
    if s.len() == 32 && s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return u128::from_str_radix(s, 16).ok().map(u128::to_be_bytes);
    }
    // Base64 (either alphabet): 16 bytes are 22 symbols plus "==".
    let s = s.trim_end_matches('=');
    let bytes = STANDARD_NO_PAD.decode(s).or_else(|_| URL_SAFE_NO_PAD.decode(s)).ok()?;
    bytes.try_into().ok()
}

/// OpenDAL's writer: multipart on S3, resumable upload on GCS, a temp file on fs.
struct OpendalWriter {
    store: OpendalStore,
    key: String,
    /// Aborted in the background if dropped before `close` or `abort` (a cancelled upload:
    /// a multipart upload's parts would stay in the bucket, unseen).
    w: Option<crate::detached::DetachedWriter>,
    /// Created with `PutOpts::if_not_exists`: a failed precondition means the key is taken.
    if_not_exists: bool,
}

impl OpendalWriter {
    fn writer(&mut self) -> Result<&mut crate::detached::DetachedWriter, StoreError> {
        self.w.as_mut().ok_or_else(|| {
            StoreError::new(crate::StoreErrorKind::Other, format!("upload of {} already ended", self.key))
        })
    }
}

#[cfg(test)]
#[test]
fn parses_md5_forms() {
    let want = [0xf8, 0x14, 0x89, 0x37, 0x77, 0xbc, 0xc2, 0x29, 0x5f, 0xff, 0x05, 0xf0, 0x0e, 0x50, 0x8d, 0xa6];
    assert_eq!(parse_md5("+BSJN3e8wilf/wXwDlCNpg=="), Some(want));
    assert_eq!(parse_md5("1B2M2Y8AsgTpgAmY7PhCfg=="), Some(EMPTY_MD5), "GCS's md5Hash of no bytes");
    assert_eq!(parse_md5("\"d41d8cd98f00b204e9800998ecf8427e\""), Some(EMPTY_MD5), "S3's ETag of no bytes");
    assert_eq!(parse_md5("f814893777bcc2295fff05f00e508da6"), Some(want));
    assert_eq!(parse_md5(""), None);
    assert_eq!(parse_md5("abc-2"), None);
    assert_eq!(parse_md5("-BSJN3e8wilf_wXwDlCNpg"), Some(want), "URL-safe, unpadded");
    assert_eq!(parse_md5("\"f814893777bcc2295fff05f00e508da6-3\""), None, "a multipart ETag");
    assert_eq!(parse_md5("+BSJN3e8wilf/wXwDlCNpgAA"), None, "17 bytes");
}

#[async_trait]
impl ObjectWriter for OpendalWriter {
    async fn write(&mut self, data: Bytes) -> Result<(), StoreError> {
        let (key, created) = (self.key.clone(), self.if_not_exists);
        let r = self.writer()?.write(data).await;
        r.map_err(|e| StoreError::from_opendal("upload", &key, e).if_created(created))
    }

    async fn close(&mut self) -> Result<ObjectMeta, StoreError> {
        let key = self.key.clone();
        let created = self.if_not_exists;
        let close = self.writer()?.close().await;
        let m = close.map_err(|e| StoreError::from_opendal("upload", &key, e).if_created(created))?;
        self.w = None;
        self.store.stamp(&key);
        // As in `put`: the response's own identity, never a later HEAD's.
        Ok(self.store.meta(&key, &m))
    }

    async fn abort(&mut self) -> Result<(), StoreError> {
        let key = self.key.clone();
        match self.w.take() {
            Some(mut w) => w.abort().await.map_err(|e| StoreError::from_opendal("abort upload", &key, e)),
            None => Ok(()),
        }
    }
}

/// `mem://`: two uploads of one size are two versions (ETag and mtime differ), and a HEAD
/// and a listing report the upload's own identity; a delete forgets it.
#[cfg(test)]
#[tokio::test]
async fn memory_versions_differ_by_upload() {
    let op = Operator::new(opendal::services::Memory::default()).unwrap();
    let s = OpendalStore::new(op, "mem://".into(), true);
    let a = s.put("k", Bytes::from_static(b"aaaa"), PutOpts::default()).await.unwrap();
    let b = s.put("k", Bytes::from_static(b"bbbb"), PutOpts::default()).await.unwrap();
    assert!(a.etag.is_some() && a.etag != b.etag, "{a:?} {b:?}");
    assert_eq!(s.head("k", HeadOpts::default()).await.unwrap().meta.etag, b.etag);
    let listed: Vec<ObjectMeta> = s.list("", false).try_collect().await.unwrap();
    assert_eq!(listed.iter().find(|m| m.key == "k").and_then(|m| m.etag.clone()), b.etag);
    s.delete("k").await.unwrap();
    let c = s.put("k", Bytes::from_static(b"cccc"), PutOpts::default()).await.unwrap();
    assert!(c.etag != b.etag && c.etag != a.etag);
}

/// A local folder's symbolic links are never followed: a link to a file or a directory
/// outside the folder is neither listed, found, read nor written through.
#[cfg(test)]
#[tokio::test]
async fn a_local_folder_never_follows_its_links() {
    let base = std::env::temp_dir().join(format!("bucketfs-links-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (root, outside) = (base.join("root"), base.join("outside"));
    std::fs::create_dir_all(root.join("real")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(root.join("real/f"), b"mine").unwrap();
    std::fs::write(outside.join("secret"), b"theirs").unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), root.join("l")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("d")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("real/d")).unwrap();
    let op = Operator::new(opendal::services::Fs::default().root(&root.to_string_lossy())).unwrap();
    let s = OpendalStore::new(op, "file://".into(), false);
    let keys = |l: Vec<ObjectMeta>| {
        let mut k: Vec<String> = l.into_iter().map(|m| m.key).collect();
        k.sort();
        k
    };
    assert_eq!(keys(s.list("", false).try_collect().await.unwrap()), ["real/"]);
    assert_eq!(keys(s.list("", true).try_collect().await.unwrap()), ["real/", "real/f"]);
    assert_eq!(keys(s.list("real/", false).try_collect().await.unwrap()), ["real/f"]);
    assert!(s.list("d/", false).try_collect::<Vec<_>>().await.is_err(), "listed through a link");
    let not_found = |r: Result<_, StoreError>| matches!(r, Err(e) if e.kind == crate::StoreErrorKind::NotFound);
    assert!(not_found(s.head("l", HeadOpts::default()).await.map(|_| ())));
    assert!(not_found(s.head("d/secret", HeadOpts::default()).await.map(|_| ())));
    assert!(not_found(s.get("real/d/secret", 0..6, GetOpts::default()).await.map(|_| ())));
    assert!(s.put("d/new", Bytes::from_static(b"x"), PutOpts::default()).await.is_err());
    assert!(s.delete("d/secret").await.is_err());
    assert!(s.copy("real/f", "d/copy").await.is_err());
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1, "nothing written or deleted outside");
    assert_eq!(s.head("real/f", HeadOpts::default()).await.unwrap().meta.size, 4);
    // Names with whitespace at a segment's end, which OpenDAL lists trimmed: not shown.
    std::fs::write(root.join("real/only "), b"x").unwrap();
    std::fs::create_dir_all(root.join("real/dsp ")).unwrap();
    std::fs::write(root.join("real/dsp /inner"), b"y").unwrap();
    assert_eq!(keys(s.list("real/", false).try_collect().await.unwrap()), ["real/f"]);
    assert_eq!(keys(s.list("", true).try_collect().await.unwrap()), ["real/", "real/f"]);
    std::fs::remove_dir_all(&base).unwrap();
}
