//! [`Store`] over the Google Drive v3 API (`gdrive://[FOLDER-ID]`). A folder in a shared
//! drive, or a shared drive itself (`gdrive://SHARED-DRIVE-ID`: a drive's ID is its root
//! folder's), is listed and followed with Drive's shared-drive parameters.
//!
//! OpenDAL's Drive service is path-based and fixed to Google's hosts, so it can show
//! neither repeated names nor exported Docs, cannot follow the changes feed and cannot
//! reach an emulator; this is a small client of our own (docs/ARCHITECTURE.md).
//!
//! - At the first call the whole tree is listed (every file that is not trashed) and kept
//!   as a path map ([`tree`]), as GCSF does; `head` and `list` are answered from it.
//! - It stays fresh through the changes feed, read before a `head`/`list` when the last
//!   read is older than the poll interval (`BUCKETFS_GDRIVE_POLL_SECS`, default 1 s, like `--metadata-ttl`):
//!   an idle mount sends nothing.
//! - Our own writes update the map at once from the API's answer.
//! - Reads are ranged `alt=media` downloads; Docs/Sheets/Slides are exported whole
//!   (Drive's export has no ranges), cached per version, and read-only. A listing never
//!   exports: a Doc not exported yet is listed with size 0 marked unknown
//!   ([`ObjectMeta::size_unknown`]), as rclone shows it; its `head` (the mount makes one when
//!   the Doc is opened) exports it and answers the real size, remembered per version apart
//!   from the bytes so later listings show it. A Doc Drive will not export (over 10 MB) is
//!   still listed; reading it fails with a message that says why.
//! - `delete` moves to Drive's trash; `copy` is `files.copy`; `rename` is `files.update`
//!   (new name and parent: the file keeps its ID, sharing and revisions, and a folder moves
//!   with everything in it, in one request); writes are one multipart
//!   request up to one part, else a resumable upload sent part by part.
//! - Creates (mkdir, new files, copies) name the new file with an ID from
//!   `files.generateIds`, so a retry after a lost answer finds it made (409) instead of
//!   making a duplicate; a resumable upload resumes from what Drive says it holds.

pub mod auth;
pub mod client;
pub mod tree;

use std::ops::Range;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use reqwest::Method;
use serde_json::json;

use self::auth::{Auth, Credentials};
use self::client::{Body, Client, GOOGLE_API};
use self::tree::{drive_name, File, Tree, FOLDER};
use crate::{
    ByteStream, Capabilities, FileAttrs, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, PutOpts,
    Store, StoreError, StoreErrorKind, WriteOptions,
};

/// How a Drive store is set up.
#[derive(Debug, Clone)]
pub struct DriveConfig {
    /// Folder ID to mount; `root` is My Drive.
    pub folder: String,
    /// API host (and token/consent host) instead of Google's: the tests' emulator.
    pub endpoint: Option<String>,
    /// Hide Google Docs/Sheets/Slides instead of showing their exports.
    pub hide_docs: bool,
    /// What a service account asks for (a refresh token has what it was granted).
    pub scope: auth::Scope,
    pub poll: Duration,
    pub retries: usize,
    pub request_timeout: Duration,
}

struct State {
    tree: Tree,
    /// The shared drive mounted in (None: My Drive).
    drive: Option<String>,
    page_token: String,
    refreshed: Instant,
}

/// An exported Google Doc: (file ID, version) and its bytes.
type Export = ((String, String), Bytes);

/// What an export of one version of a Doc gave: its size, or Drive's lasting refusal.
type ExportSize = (String, Result<u64, StoreError>);

pub struct GdriveStore {
    client: Client,
    cfg: DriveConfig,
    state: Mutex<Option<State>>,
    /// Serialises loads and change reads so one runs at a time; holds when the last one
    /// failed, and why: that answers every call that waited for it (against a store that
    /// hangs, each waiter sending the request again made the k-th wait k times as long).
    refresh: tokio::sync::Mutex<Option<(Instant, StoreError)>>,
    exports: Mutex<Vec<Export>>,
    /// By file ID: what the export of its current version gave (see the module docs).
    export_sizes: Mutex<std::collections::HashMap<String, ExportSize>>,
    /// By file ID: held while it is exported, so concurrent listings export it once.
    exporting: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Ourselves, for listing streams and writers that outlive a `&self` call.
    me: Weak<GdriveStore>,
}

fn err(kind: StoreErrorKind, msg: String) -> StoreError {
    StoreError::new(kind, msg)
}

/// See [`GdriveStore::ranged`]: bytes at hand, or bytes `[a, b)` of the file with this id.
enum Ranged {
    Ready(Bytes),
    Download(String, u64, u64),
}

impl GdriveStore {
    /// Where a ranged read of `key` comes from: bytes at hand (an export, which Drive makes
    /// whole anyway; an empty range) or a download.
    async fn ranged(&self, key: &str, range: Range<u64>) -> Result<Ranged, StoreError> {
        self.fresh(false).await?;
        let f = self.lookup(key).ok_or_else(|| StoreError::not_found(format!("read {key:?}: not found")))?;
        if f.export().is_some() {
            let b = self.exported(key, &f).await?;
            let (a, e) = ((range.start as usize).min(b.len()), (range.end as usize).min(b.len()));
            return Ok(Ranged::Ready(b.slice(a..e)));
        }
        if range.start >= range.end || range.start >= f.size() {
            return Ok(Ranged::Ready(Bytes::new()));
        }
        Ok(Ranged::Download(f.id.clone(), range.start, range.end.min(f.size())))
    }

    pub fn open(cfg: DriveConfig) -> Result<Arc<Self>, StoreError> {
        let (creds, file_token_uri) = Credentials::from_env()?;
        let base = cfg.endpoint.as_deref().map(|e| e.trim_end_matches('/').to_string());
        let token_url = match &base {
            Some(b) => format!("{b}/token"),
            None => file_token_uri.unwrap_or_else(|| auth::GOOGLE_TOKEN_URL.into()),
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(cfg.request_timeout)
            .build()
            .map_err(|e| err(StoreErrorKind::Config, format!("cannot build the HTTP client: {e}")))?;
        let client = Client {
            auth: Auth::new(creds, token_url, http.clone()).with_scope(cfg.scope),
            http,
            api: base.unwrap_or_else(|| GOOGLE_API.into()),
            retries: cfg.retries,
            ids: Default::default(),
        };
        Ok(Arc::new_cyclic(|me| Self {
            client,
            cfg,
            state: Mutex::new(None),
            refresh: Default::default(),
            exports: Default::default(),
            export_sizes: Default::default(),
            exporting: Default::default(),
            me: me.clone(),
        }))
    }

    /// Load the tree if not yet loaded, else read the changes feed if it is older than the
    /// poll interval (`force`: whatever its age).
    async fn fresh(&self, force: bool) -> Result<(), StoreError> {
        let due = |s: &Option<State>| s.as_ref().is_none_or(|s| force || s.refreshed.elapsed() >= self.cfg.poll);
        if !due(&self.state.lock().unwrap()) {
            return Ok(());
        }
        let asked = Instant::now();
        let mut failed = self.refresh.lock().await;
        if let Some((_, e)) = failed.as_ref().filter(|(at, _)| *at >= asked) {
            return Err(e.clone());
        }
        let r = self.refresh_now(force).await;
        *failed = r.as_ref().err().map(|e| (Instant::now(), e.clone()));
        r
    }

    /// [`Self::fresh`]'s work, under its lock.
    async fn refresh_now(&self, force: bool) -> Result<(), StoreError> {
        let token = match self.state.lock().unwrap().as_ref() {
            Some(s) if !force && s.refreshed.elapsed() < self.cfg.poll => return Ok(()),
            Some(s) => Some((s.page_token.clone(), s.drive.clone())),
            None => None,
        };
        let Some((token, drive)) = token else {
            let root = self.client.get_file(&self.cfg.folder).await.map_err(|e| match e.kind {
                StoreErrorKind::NotFound => {
                    StoreError::not_found(format!("Drive folder {:?} not found", self.cfg.folder))
                }
                _ => e,
            })?;
            if !root.is_folder() {
                return Err(err(
                    StoreErrorKind::Config,
                    format!("{:?} is a file, not a Drive folder", self.cfg.folder),
                ));
            }
            // In a shared drive (its ID is its root folder's): list and follow that drive.
            let drive = root.drive_id.clone();
            // Take the changes token first so nothing made during the listing is missed.
            let page_token = self.client.start_page_token(drive.as_deref()).await?;
            let files = self.client.list_all(drive.as_deref()).await?;
            let mut tree = Tree::new(root.id, self.cfg.hide_docs);
            files.into_iter().for_each(|f| tree.upsert(f));
            tree.rebuild();
            *self.state.lock().unwrap() = Some(State { tree, drive, page_token, refreshed: Instant::now() });
            return Ok(());
        };
        let (changes, next) = self.client.changes(&token, drive.as_deref()).await?;
        let mut g = self.state.lock().unwrap();
        let s = g.as_mut().expect("loaded above");
        for c in changes {
            // Changes to a shared drive itself (changeType "drive") name no file: nothing
            // in the tree changes.
            let Some(id) = c.file_id.filter(|_| c.change_type != "drive") else { continue };
            match c.file {
                Some(f) if !c.removed => s.tree.upsert(f),
                _ => s.tree.remove(&id),
            }
        }
        s.tree.rebuild();
        s.page_token = next;
        s.refreshed = Instant::now();
        Ok(())
    }

    fn with_tree<T>(&self, f: impl FnOnce(&mut Tree) -> T) -> T {
        let mut g = self.state.lock().unwrap();
        f(&mut g.as_mut().expect("tree loaded before use").tree)
    }

    fn lookup(&self, key: &str) -> Option<File> {
        self.with_tree(|t| t.lookup(key).or_else(|| t.lookup(&format!("{key}/"))).cloned())
    }

    /// Move file `id` (named `key`) to Drive's trash, and out of the tree once it is there.
    async fn trash(&self, op: &str, key: &str, id: &str) -> Result<(), StoreError> {
        let path = format!("/drive/v3/files/{id}");
        self.client.meta(op, key, Method::PATCH, &path, &[], json!({"trashed": true})).await?;
        self.forget_file(id);
        Ok(())
    }

    /// Drop file `id` from the tree (our own delete, or one already done elsewhere).
    fn forget_file(&self, id: &str) {
        self.with_tree(|t| {
            t.remove(id);
            t.rebuild();
        });
    }

    /// Record a file the API just returned, so our own change is visible at once.
    fn learn(&self, f: File) {
        self.with_tree(|t| {
            t.upsert(f);
            t.rebuild();
        });
    }

    /// The parent folder ID and Drive name for a new `key`; missing parent folders are
    /// created, as a local filesystem store creates parent directories on write.
    async fn placement(&self, key: &str) -> Result<(String, String), StoreError> {
        self.fresh(false).await?;
        let trimmed = key.trim_end_matches('/');
        let (dir, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
        let mut parent = self.with_tree(|t| t.root().to_string());
        let mut at = String::new();
        for seg in dir.split('/').filter(|s| !s.is_empty()) {
            at.push_str(seg);
            at.push('/');
            parent = match self.lookup(&at) {
                Some(f) if f.is_folder() => f.id,
                Some(_) => return Err(err(StoreErrorKind::Other, format!("write {key:?}: {at:?} is a file"))),
                None => {
                    let body = json!({"name": drive_name(seg), "mimeType": FOLDER, "parents": [parent]});
                    let f = self.client.create("mkdir", &at, "/drive/v3/files", body).await?;
                    self.learn(f.clone());
                    f.id
                }
            };
        }
        Ok((parent, drive_name(name)))
    }

    fn meta(&self, key: &str, f: &File, size: u64) -> ObjectMeta {
        let key = if f.is_folder() && !key.ends_with('/') { format!("{key}/") } else { key.to_string() };
        ObjectMeta { key, size, etag: Some(f.etag()), mtime: f.mtime(), size_unknown: false }
    }

    /// What a listing says of a file, without a request: a Doc's size is its export's when
    /// this version was exported already, else unknown (see [`ObjectMeta::size_unknown`]).
    fn listed_meta(&self, key: &str, f: &File) -> ObjectMeta {
        if f.export().is_none() {
            return self.meta(key, f, f.size());
        }
        let version = f.version.clone().unwrap_or_default();
        match self.export_sizes.lock().unwrap().get(&f.id) {
            Some((v, Ok(size))) if *v == version => self.meta(key, f, *size),
            _ => ObjectMeta { size_unknown: true, ..self.meta(key, f, 0) },
        }
    }

    /// A file's metadata with its real size: a Doc is exported (once per version) to learn
    /// it. A Doc Drive refuses to export keeps an unknown size; reading it says why.
    async fn sized_meta(&self, key: &str, f: &File) -> Result<ObjectMeta, StoreError> {
        let listed = self.listed_meta(key, f);
        if !listed.size_unknown {
            return Ok(listed);
        }
        match self.exported(key, f).await {
            Ok(b) => Ok(self.meta(key, f, b.len() as u64)),
            Err(e) if e.kind == StoreErrorKind::PermissionDenied => Ok(listed),
            Err(e) => Err(e),
        }
    }

    async fn exported(&self, key: &str, f: &File) -> Result<Bytes, StoreError> {
        let id = (f.id.clone(), f.version.clone().unwrap_or_default());
        let one = self.exporting.lock().unwrap().entry(f.id.clone()).or_default().clone();
        let _one = one.lock().await;
        if let Some((_, b)) = self.exports.lock().unwrap().iter().find(|(k, _)| *k == id) {
            return Ok(b.clone());
        }
        if let Some((v, Err(e))) = self.export_sizes.lock().unwrap().get(&f.id) {
            if *v == id.1 {
                return Err(e.clone());
            }
        }
        let (mime, _) = f.export().expect("a Google Doc");
        let b = match self.client.export(&f.id, key, mime).await {
            Ok(b) => b,
            Err(e) if e.reason == "exportSizeLimitExceeded" => {
                let e = err(
                    StoreErrorKind::PermissionDenied,
                    format!(
                        "read {key:?}: Drive does not export Docs, Sheets or Slides over 10 MB; open it in Drive \
                         ({})",
                        e.err.message
                    ),
                );
                tracing::warn!(key, "drive: {}", e.message);
                self.export_sizes.lock().unwrap().insert(f.id.clone(), (id.1, Err(e.clone())));
                return Err(e);
            }
            Err(e) => return Err(e.err),
        };
        self.export_sizes.lock().unwrap().insert(f.id.clone(), (id.1.clone(), Ok(b.len() as u64)));
        let mut cache = self.exports.lock().unwrap();
        cache.retain(|((i, _), _)| *i != f.id);
        // Keep the last few exports (Drive caps an export at 10 MB).
        if cache.len() >= 8 {
            cache.remove(0);
        }
        cache.push((id, b.clone()));
        Ok(b)
    }

    /// `if_not_exists` on Drive: checked against the tree when the upload starts (Drive has
    /// no conditional create by name).
    fn create_only(key: &str, opts: &PutOpts, exists: bool) -> Result<(), StoreError> {
        match opts.if_not_exists && exists {
            true => Err(err(StoreErrorKind::Exists, format!("write {key:?}: already exists"))),
            false => Ok(()),
        }
    }

    fn read_only(key: &str) -> StoreError {
        err(
            StoreErrorKind::PermissionDenied,
            format!("write {key:?}: Google Docs, Sheets and Slides are shown as read-only exports"),
        )
    }

    /// Upload `data` as `key` in one request (new file, or new content of the existing one).
    async fn put_small(&self, key: &str, data: Bytes, attrs: &FileAttrs) -> Result<File, StoreError> {
        let f = match self.lookup(key) {
            Some(f) if f.export().is_some() => return Err(Self::read_only(key)),
            Some(f) if f.is_folder() => return Err(err(StoreErrorKind::Other, format!("write {key:?}: is a folder"))),
            Some(f) => self.client.upload_multipart(key, Some(&f.id), upload_meta(None, attrs), data).await?,
            None => {
                let placed = self.placement(key).await?;
                self.client.upload_multipart(key, None, upload_meta(Some(placed), attrs), data).await?
            }
        };
        self.learn(f.clone());
        Ok(f)
    }
}

#[async_trait]
impl Store for GdriveStore {
    fn describe(&self) -> String {
        format!("gdrive://{}", self.cfg.folder)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_if_match: false,
            copy: true,
            prefix_dirs: false,
            max_key_len: None,
            max_file_name_len: None,
            trims_whitespace: false,
            trims_segments: false,
            keeps_attrs: true,
            moves: true,
            patches: false,
            prefix_list_reads_dir: false,
            lists_xml: false,
        }
    }

    async fn check(&self) -> Result<(), StoreError> {
        self.fresh(false).await
    }

    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        self.fresh(false).await?;
        if key.is_empty() {
            return Ok(ObjectHead::of(ObjectMeta { key: String::new(), ..Default::default() }));
        }
        let f = self.lookup(key).ok_or_else(|| StoreError::not_found(format!("head {key:?}: not found")))?;
        let meta = self.sized_meta(key, &f).await?;
        let attrs = FileAttrs::from_metadata(&f.properties);
        let md5 = f.md5_checksum.as_deref().filter(|_| opts.digests).and_then(crate::parse_md5_hex);
        Ok(ObjectHead { attrs, md5, ..ObjectHead::of(meta) })
    }

    async fn get(&self, key: &str, range: Range<u64>, _opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        match self.ranged(key, range).await? {
            Ranged::Ready(b) => Ok(futures::stream::once(async move { Ok(b) }).boxed()),
            Ranged::Download(id, a, b) => self.client.download_stream(&id, key, a, b).await,
        }
    }

    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        let prefix = prefix.to_string();
        let this = self.clone_handle();
        Box::pin(async_stream(async move {
            this.fresh(false).await?;
            if !prefix.is_empty() && this.with_tree(|t| t.lookup(&prefix).is_none()) {
                return Ok(Vec::new());
            }
            // A listing never exports: a Doc not exported yet shows size 0, marked unknown
            // (its `head`, made when it is opened, exports it and answers the real size).
            let entries = this.with_tree(|t| t.list(&prefix, recursive));
            Ok(entries.into_iter().map(|(k, f)| this.listed_meta(&k, &f)).collect())
        }))
    }

    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        self.fresh(false).await?;
        Self::create_only(key, &opts, self.lookup(key).is_some())?;
        let size = data.len() as u64;
        let f = self.put_small(key, data, &opts.attrs).await?;
        Ok(self.meta(key, &f, size))
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.fresh(false).await?;
        let Some(f) = self.lookup(key) else { return Ok(()) };
        match self.trash("delete", key, &f.id).await {
            Err(e) if e.kind == StoreErrorKind::NotFound => self.forget_file(&f.id),
            r => r?,
        }
        Ok(())
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.fresh(false).await?;
        let src = self.lookup(from).ok_or_else(|| StoreError::not_found(format!("copy {from:?}: not found")))?;
        let old = self.lookup(to);
        if old.as_ref().is_some_and(|o| o.export().is_some()) {
            return Err(Self::read_only(to));
        }
        let (parent, name) = self.placement(to).await?;
        let path = format!("/drive/v3/files/{}/copy", src.id);
        let f = self.client.create("copy", to, &path, json!({"name": name, "parents": [parent]})).await?;
        // Replace semantics: the copy takes the name, the old target goes to the trash. The
        // tree learns the copy only once the old one is gone from it: in between, a listing
        // showed both, the copy under a name nobody made (`f~1AbCdEfG`; found by the model
        // test's listers).
        let trashed = match &old {
            Some(o) => self.trash("copy", to, &o.id).await,
            None => Ok(()),
        };
        self.learn(f);
        trashed
    }

    async fn rename(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.fresh(false).await?;
        let src = self.lookup(from).ok_or_else(|| StoreError::not_found(format!("rename {from:?}: not found")))?;
        let old = self.lookup(to).filter(|o| o.id != src.id);
        if src.export().is_some() {
            return Err(Self::read_only(from));
        }
        if old.as_ref().is_some_and(|o| o.export().is_some()) {
            return Err(Self::read_only(to));
        }
        // files.update: a new name, and a new parent in place of the old one (an item has
        // exactly one parent; adding one without removing the other is refused).
        let (parent, name) = self.placement(to).await?;
        let previous = src.parents.join(",");
        let mut query = Vec::new();
        if src.parents.iter().all(|p| *p != parent) {
            query = vec![("addParents", parent.as_str()), ("removeParents", previous.as_str())];
        }
        let path = format!("/drive/v3/files/{}", src.id);
        let f = self.client.meta("rename", from, Method::PATCH, &path, &query, json!({"name": name})).await?;
        // As for a copy: the replaced file goes to the trash before the tree learns the
        // move, so no listing shows both under one name.
        let trashed = match &old {
            Some(o) => self.trash("rename", to, &o.id).await,
            None => Ok(()),
        };
        self.learn(f);
        trashed
    }

    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        self.fresh(false).await?;
        if key.is_empty() || self.lookup(key).is_some_and(|f| f.is_folder()) {
            return Ok(());
        }
        let (parent, name) = self.placement(key).await?;
        let body = json!({"name": name, "mimeType": FOLDER, "parents": [parent]});
        let f = self.client.create("mkdir", key, "/drive/v3/files", body).await?;
        self.learn(f);
        Ok(())
    }

    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        self.fresh(false).await?;
        Self::create_only(key, &opts.put, self.lookup(key).is_some())?;
        if self.lookup(key).is_some_and(|f| f.export().is_some()) {
            return Err(Self::read_only(key));
        }
        // Resumable chunks must be multiples of 256 KiB.
        let part = (opts.part_size.max(256 * 1024) / (256 * 1024)) * 256 * 1024;
        Ok(Box::new(DriveWriter {
            store: self.clone_handle(),
            key: key.to_string(),
            part,
            buf: BytesMut::new(),
            session: None,
            sent: 0,
            attrs: opts.put.attrs,
        }))
    }
}

/// Drive's `md5Checksum` (32 hex digits) as bytes.
/// The metadata part of an upload: name and parent for a new file, and the attributes as
/// `properties` (a key missing from `attrs` stays as it was on an existing file).
fn upload_meta(placed: Option<(String, String)>, attrs: &FileAttrs) -> serde_json::Value {
    let mut m = match placed {
        Some((parent, name)) => json!({"name": name, "parents": [parent]}),
        None => json!({}),
    };
    if !attrs.is_empty() {
        m["properties"] = json!(attrs.to_metadata());
    }
    m
}

/// A cheap handle for streams and writers that outlive `&self`.
#[derive(Clone)]
struct Handle(Arc<GdriveStore>);

impl std::ops::Deref for Handle {
    type Target = GdriveStore;
    fn deref(&self) -> &GdriveStore {
        &self.0
    }
}

impl GdriveStore {
    fn clone_handle(&self) -> Handle {
        Handle(self.me.upgrade().expect("a GdriveStore lives in the Arc made by GdriveStore::open"))
    }
}

/// A listing computed at once, streamed entry by entry.
fn async_stream(
    fut: impl std::future::Future<Output = Result<Vec<ObjectMeta>, StoreError>> + Send + 'static,
) -> impl futures::Stream<Item = Result<ObjectMeta, StoreError>> + Send {
    use futures::{StreamExt, TryStreamExt};
    futures::stream::once(fut).map_ok(|v| futures::stream::iter(v.into_iter().map(Ok))).try_flatten().boxed()
}

/// Buffers one part; the first full part opens a resumable session, `close` sends the
/// rest (or everything in one multipart request for a small file).
struct DriveWriter {
    store: Handle,
    key: String,
    part: usize,
    buf: BytesMut,
    session: Option<String>,
    sent: u64,
    attrs: FileAttrs,
}

impl DriveWriter {
    async fn open_session(&mut self) -> Result<(), StoreError> {
        let session = match self.store.lookup(&self.key) {
            Some(f) => self.store.client.upload_session(&self.key, Some(&f.id), upload_meta(None, &self.attrs)).await?,
            None => {
                let placed = self.store.placement(&self.key).await?;
                self.store.client.upload_session(&self.key, None, upload_meta(Some(placed), &self.attrs)).await?
            }
        };
        self.session = Some(session);
        Ok(())
    }
}

#[async_trait]
impl ObjectWriter for DriveWriter {
    async fn write(&mut self, data: Bytes) -> Result<(), StoreError> {
        self.buf.extend_from_slice(&data);
        while self.buf.len() > self.part {
            if self.session.is_none() {
                self.open_session().await?;
            }
            let chunk = self.buf.split_to(self.part).freeze();
            let n = chunk.len() as u64;
            self.store.client.upload_chunk(&self.key, self.session.as_ref().unwrap(), self.sent, chunk, None).await?;
            self.sent += n;
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<ObjectMeta, StoreError> {
        let rest = std::mem::take(&mut self.buf).freeze();
        let total = self.sent + rest.len() as u64;
        let f = match &self.session {
            None => self.store.put_small(&self.key, rest, &self.attrs).await?,
            Some(s) => {
                let f = self.store.client.upload_chunk(&self.key, s, self.sent, rest, Some(total)).await?;
                let f =
                    f.ok_or_else(|| err(StoreErrorKind::Other, format!("write {:?}: upload not complete", self.key)))?;
                self.store.learn(f.clone());
                f
            }
        };
        Ok(self.store.meta(&self.key, &f, total))
    }

    async fn abort(&mut self) -> Result<(), StoreError> {
        if let Some(s) = self.session.take() {
            let _ = self.store.client.send("abort", &self.key, Method::DELETE, &s, &Body::None, &[]).await;
        }
        self.buf.clear();
        Ok(())
    }
}
