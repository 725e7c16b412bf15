//! The narrow trait the rest of bucketfs sees, and its value types.

use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

use crate::{FileAttrs, StoreError, StoreErrorKind};

/// One object (or directory prefix) as the store reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectMeta {
    /// Key relative to the store root. Prefixes (directories) end with `/`.
    pub key: String,
    pub size: u64,
    /// ETag (S3) or generation-derived ETag (GCS); `None` where the store has none (fs, memory).
    pub etag: Option<String>,
    pub mtime: Option<SystemTime>,
    /// `size` is a placeholder (0): the store learns the real size only by reading the object
    /// (a Google Doc's export, which a listing never makes), or, for a listed marker, the
    /// listing does not tell its size ([`ObjectMeta::may_hold_bytes`]). A `head` or `stat`
    /// of the key answers the real size; readers must not stop at `size`.
    pub size_unknown: bool,
}

impl ObjectMeta {
    pub fn is_prefix(&self) -> bool {
        self.key.ends_with('/')
    }

    /// A marker (`d/`) that holds bytes, or may: no file name can show them, and deleting
    /// or re-creating the marker would lose them. A listing tells an empty marker by its
    /// MD5; where it cannot, it says `size_unknown` and a `stat` of the key answers.
    pub fn may_hold_bytes(&self) -> bool {
        self.is_prefix() && (self.size > 0 || self.size_unknown)
    }

    /// The MD5 of the bytes where the ETag is one (S3's of a single-request upload; it
    /// may come quoted).
    pub fn etag_md5(&self) -> Option<[u8; 16]> {
        parse_md5_hex(self.etag.as_deref()?.trim_matches('"'))
    }
}

/// What a store can do; the core adapts instead of failing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `get_range` honours `if_match` (so a changed object is detected mid-read).
    pub read_if_match: bool,
    /// Server-side copy exists.
    pub copy: bool,
    /// Directories exist only as key prefixes (object stores), not as real entries (fs).
    pub prefix_dirs: bool,
    /// Longest key, in bytes, relative to the store root (the mount's prefix already taken
    /// off); `None` for no limit. S3 and GCS allow 1,024 bytes for the whole object name.
    pub max_key_len: Option<usize>,
    /// Longest name, in bytes, a new file may be given (its last key segment); `None` for
    /// the kernel's own limit (255). The local folder writes a file through a temporary
    /// name 9 bytes longer (OpenDAL's `name.XXXXXXXX`), so a new name there is at most 246.
    pub max_file_name_len: Option<usize>,
    /// The store cannot address a key that starts or ends with whitespace: OpenDAL trims
    /// leading and trailing whitespace (`char::is_whitespace`) from every path it is given,
    /// so `"dup "` would read and write `"dup"`. Such keys are never shown or created. It
    /// also drops a leading `/` and empty segments (`"a//b"` reaches `"a/b"`).
    pub trims_whitespace: bool,
    /// Every segment of a listed key comes back trimmed too (OpenDAL's fs service lists a
    /// directory `a ` as `a/`), so a segment with whitespace at an end is never addressable.
    pub trims_segments: bool,
    /// Uploads keep [`FileAttrs`] ([`PutOpts::attrs`]) and [`Store::head`] returns them.
    pub keeps_attrs: bool,
    /// [`Store::rename`] moves a file, or a directory with everything below it, in one
    /// request that keeps the object itself (Google Drive).
    pub moves: bool,
    /// [`Store::patch`] can make a new version from ranges of the current one without
    /// sending them again (S3 and S3-compatible stores, GCS).
    pub patches: bool,
    /// A listing of a plain prefix (`d/name`, not ending in `/`) costs a read of the whole
    /// directory `d/`: S3-compatible servers on their own endpoint (MinIO keeps objects
    /// as files and reads the directory; 133 ms per such LIST in a directory of 100,000
    /// keys, against 5 ms for `d/name/`). AWS S3 and GCS answer from an index.
    pub prefix_list_reads_dir: bool,
    /// Listings come as XML 1.0 (S3 and S3-compatible servers), which cannot carry most
    /// control characters: MinIO lists `a\x1fb` as `a\u{FFFD}b`, so a listed key holding
    /// U+FFFD may name another object, or none (and two objects may list as one name; the
    /// store checks such keys and lists the lost ones with U+001A). Keys holding such
    /// control characters are not addressable: never shown, created or moved. Its keys
    /// also travel as the request's URL path, whose `.` and `..` segments HTTP clients
    /// resolve (`a/../b` went to `b`, signed as `a/../b`: refused as a bad signature), so
    /// keys with such segments are not addressable there either.
    pub lists_xml: bool,
}

impl Capabilities {
    /// Whether `key` (relative to the store root) reaches exactly that object: false for a
    /// key the store would silently change (see [`Capabilities::trims_whitespace`]).
    pub fn addressable(&self, key: &str) -> bool {
        let edge = |c: Option<char>| c.is_some_and(char::is_whitespace);
        let trimmed = |s: &str| edge(s.chars().next()) || edge(s.chars().next_back());
        let normalized = key.starts_with('/') || key.contains("//");
        let xml_unsafe = |c: char| c < ' ' && !matches!(c, '\t' | '\n' | '\r') || matches!(c, '\u{FFFE}' | '\u{FFFF}');
        !(self.trims_whitespace && (trimmed(key) || normalized)
            || self.trims_segments && key.split('/').any(trimmed)
            || self.lists_xml && (key.contains(xml_unsafe) || key.split('/').any(|s| s == "." || s == "..")))
    }
}

/// Listing results, streamed page by page underneath so a huge directory is never one buffer.
pub type ListStream = BoxStream<'static, Result<ObjectMeta, StoreError>>;

/// An object's bytes as they arrive (one HTTP body's chunks, for S3 and GCS).
pub type ByteStream = BoxStream<'static, Result<Bytes, StoreError>>;

/// The operations bucketfs needs from an object store. Implementations must be cheap to
/// share (`Arc<dyn Store>`) and safe to call concurrently.
///
/// Each call is one method; what varies between uses of a call (attributes kept, digests
/// asked for, a precondition) is a field of its options struct ([`HeadOpts`], [`GetOpts`],
/// [`PutOpts`], [`WriteOptions`]), so a wrapper forwards the whole struct and a new option
/// needs no new method. Convenience forms (a meta-only head, a read into one buffer) are in
/// [`StoreExt`], built on these methods and never overridden.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short description for logs and errors, never containing credentials.
    fn describe(&self) -> String;

    fn capabilities(&self) -> Capabilities;

    /// Verify the bucket exists and the credentials work (one cheap request).
    async fn check(&self) -> Result<(), StoreError>;

    /// Metadata of one object, with the attributes it carries (empty where the store keeps
    /// none) and, if `opts.digests`, its content digests. `NotFound` if absent.
    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError>;

    /// Bytes `range` of `key` as a stream of chunks as they arrive (one request), so a large
    /// range can be consumed without holding it in memory. The range is clamped to the
    /// object by the caller; a range past the end yields fewer bytes (the caller checks the
    /// total length). With `opts.if_match`, a changed object gives `Changed`.
    async fn get(&self, key: &str, range: Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError>;

    /// Entries under `prefix` (which is empty or ends with `/`). Non-recursive: direct
    /// children, with sub-prefixes reported once each as keys ending in `/`. The prefix
    /// itself (a directory marker) is not reported, unless it may hold bytes
    /// ([`ObjectMeta::may_hold_bytes`]: another client can put content at `d/`). On stores
    /// with `prefix_dirs`, a plain prefix (`d/na`, non-recursive) lists the entries of `d/`
    /// whose keys start with it, in key order, its exact key included: one request tells a
    /// file `d/na`, a directory `d/na/` and a link `d/na.rclonelink` apart.
    fn list(&self, prefix: &str, recursive: bool) -> ListStream;

    /// Store `data` as `key`, replacing any existing object. The returned `etag` is the
    /// upload's own (from its response), or `None`; `mtime` may be `None`.
    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError>;

    /// [`Store::put`], saying how many tries before the one answered were cut off (a
    /// timeout or a dropped connection, after the request may have been sent whole): the
    /// store may still complete such a try later, over a newer version. A store that
    /// sends no put twice itself answers 0; every wrapper forwards this call.
    async fn put_tried(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<PutDone, StoreError> {
        Ok(PutDone { meta: self.put(key, data, opts).await?, cut_tries: 0 })
    }

    /// Delete `key`; deleting a missing key succeeds.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;

    /// Delete `key` only while it holds the version `seen` describes ([`same_version`]):
    /// what a move copied, so another client's newer version stays (`Changed`, nothing
    /// deleted). A missing key succeeds. Here: a check, then the delete, with a moment
    /// between them; a store that can attach the condition to the delete overrides it.
    async fn delete_version(&self, key: &str, seen: &ObjectMeta) -> Result<(), StoreError> {
        if self.holds_version(key, seen).await? {
            self.delete(key).await?;
        }
        Ok(())
    }

    /// Server-side copy.
    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError>;

    /// Move `from` to `to` in one request, keeping the object (on Drive its ID, sharing
    /// and revisions; a folder moves with everything below it). A file at `to` is
    /// replaced. Only where [`Capabilities::moves`]; elsewhere `Unsupported`, and callers
    /// copy and delete.
    async fn rename(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let _ = to;
        Err(StoreError::new(
            StoreErrorKind::Unsupported,
            format!("rename {from:?}: {} moves by copy and delete", self.describe()),
        ))
    }

    /// Make `key` (ending in `/`) exist as a directory: a marker object on object stores,
    /// a real directory on a local fs.
    async fn create_dir(&self, key: &str) -> Result<(), StoreError>;

    /// Stream a new object into `key`. Large objects go up in parts of `opts.part_size`,
    /// `opts.concurrency` at a time, while the caller is still writing; `opts.put` says
    /// what the object is stored with, as for [`Store::put`]. Nothing is visible until
    /// `close` succeeds; `abort` leaves no parts behind.
    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError>;

    /// Make a new version of `key` from ranges of its current version, copied inside the
    /// store, and new bytes read from `p.source`, so unchanged bytes are not sent again
    /// (S3: a multipart upload of `UploadPartCopy` parts and new parts; GCS: the new tail
    /// uploaded and composed after the object; see [`crate::patch`]). Only over the version
    /// `p.base` names: if the key holds another, `Changed`, and nothing is replaced; a
    /// failure leaves the current version as it was. `Unsupported` where the store, or this
    /// change's shape, cannot: the caller uploads whole.
    async fn patch(&self, key: &str, p: Patch<'_>, opts: WriteOptions) -> Result<Patched, StoreError> {
        let _ = (p, opts);
        Err(StoreError::new(StoreErrorKind::Unsupported, format!("patch {key:?}: {} uploads whole", self.describe())))
    }

    /// Delete the temporary objects (parts, tails of appends) that an earlier process with
    /// this owner tag left behind (see `gcs::compose::set_parts_owner`): it was killed inside
    /// an upload. Only call it while no upload of this owner runs. Returns how many.
    async fn clean_parts(&self, owner: &str) -> Result<usize, StoreError> {
        let _ = owner;
        Ok(0)
    }

    /// Wait for the requests this store sent in the background (the deletes of an
    /// append's temporary objects, [`crate::background`]), for a bounded time: at unmount
    /// and `bucketfs sync`, so a clean unmount leaves none of them in the bucket.
    async fn settle(&self) {}

    /// This store sending each request once, for a caller that sends again itself and must
    /// know that a try failed: write-back's deferred deletes and moves, which send a change
    /// late only on a condition (the object still the one unlinked or moved). A DELETE
    /// sent again by the store a few seconds after a refused try removed the object
    /// another client had written meanwhile (tester N). `None`: sent once already.
    fn sending_once(&self) -> Option<std::sync::Arc<dyn Store>> {
        None
    }
}

/// Reads the bytes of a new version for [`Store::patch`] (the caller's local file).
pub trait PatchSource: Send + Sync {
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Bytes>;
}

/// A new version of an object as its differences from the current one ([`Store::patch`]).
pub struct Patch<'a> {
    /// The identity (ETag, GCS generation) of the version the kept ranges are from.
    pub base: &'a str,
    pub base_len: u64,
    /// How many uploads the base was assembled from, if known (a GCS composite object may
    /// have at most 1,024 components).
    pub base_pieces: Option<u32>,
    /// The new version's length.
    pub len: u64,
    /// Sorted, disjoint ranges within both lengths where the new bytes are the base's.
    pub kept: &'a [Range<u64>],
    pub source: &'a dyn PatchSource,
    /// What the new version is stored with.
    pub put: PutOpts,
}

/// What [`Store::put_tried`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutDone {
    pub meta: ObjectMeta,
    /// Tries cut off before the one answered, which the store may still complete later.
    pub cut_tries: u32,
}

/// What [`Store::patch`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patched {
    pub meta: ObjectMeta,
    /// Bytes sent from the source.
    pub sent: u64,
    /// Bytes copied inside the store.
    pub copied: u64,
    /// How many uploads the new version is assembled from, if known.
    pub pieces: Option<u32>,
}

/// Forms of [`Store`]'s calls that callers often want, built on them (so every wrapper
/// gets them right by forwarding the calls). Implemented for every store; not overridable.
#[async_trait]
pub trait StoreExt: Store {
    /// [`Store::head`]'s metadata alone.
    async fn stat(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        Ok(self.head(key, HeadOpts::default()).await?.meta)
    }

    /// Whether `key` still holds the version `seen` ([`same_version`]): `false` if it is
    /// gone, `Changed` if it holds another (what [`Store::delete_version`] checks first).
    async fn holds_version(&self, key: &str, seen: &ObjectMeta) -> Result<bool, StoreError> {
        match self.stat(key).await {
            Err(e) if e.kind == StoreErrorKind::NotFound => Ok(false),
            Ok(now) if !same_version(&now, seen) => {
                Err(StoreError::new(StoreErrorKind::Changed, format!("delete {key:?}: another version is there")))
            }
            r => r.map(|_| true),
        }
    }

    /// [`Store::get`] gathered into one buffer.
    async fn get_range(&self, key: &str, range: Range<u64>, opts: GetOpts<'_>) -> Result<Bytes, StoreError> {
        use futures::TryStreamExt;
        let chunks: Vec<Bytes> = self.get(key, range, opts).await?.try_collect().await?;
        Ok(match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.into_iter().next().unwrap_or_default(),
            _ => chunks.concat().into(),
        })
    }

    /// The whole object, read pinned to the identity its head reported (where the store
    /// can pin a read), so a replacement in between gives `Changed`, not mixed bytes.
    async fn read(&self, key: &str) -> Result<Bytes, StoreError> {
        let meta = self.stat(key).await?;
        self.get_range(key, 0..meta.size, GetOpts { if_match: meta.etag.as_deref() }).await
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// Options of [`Store::head`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeadOpts {
    /// Fill [`ObjectHead`]'s digests (`etag`, `md5`, `checksum`) where the store has them.
    pub digests: bool,
    /// For a marker (`d/`), learn whether it holds bytes ([`ObjectMeta::may_hold_bytes`]):
    /// its size, else `size_unknown` (on S3 and GCS, one HEAD more, or a listing where
    /// the mount cannot sign one).
    pub marker_bytes: bool,
}

/// Options of [`Store::get`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetOpts<'a> {
    /// The identity (ETag, or generation on GCS) the object must still have.
    pub if_match: Option<&'a str>,
}

/// Options of [`Store::put`] (and of a [`Store::writer`]'s object, [`WriteOptions::put`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutOpts {
    /// Kept with the object where the store can ([`Capabilities::keeps_attrs`]).
    pub attrs: FileAttrs,
    /// Create only: if the key holds an object when the upload completes, fail with
    /// [`crate::StoreErrorKind::Exists`] and leave it untouched (S3 `If-None-Match: *`, GCS
    /// `ifGenerationMatch=0` on the upload or the final compose; a local folder and Drive
    /// check when the upload starts; the memory store at completion).
    pub if_not_exists: bool,
}

/// What [`Store::head`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectHead {
    pub meta: ObjectMeta,
    /// The attributes the object carries (empty where none are kept).
    pub attrs: FileAttrs,
    /// With [`HeadOpts::digests`]: the service's raw ETag, quotes removed (S3: the MD5 in
    /// hex for a single-request upload, `hex(md5(part md5s))-N` for an N-part upload;
    /// other forms mean neither).
    pub etag: Option<String>,
    /// With [`HeadOpts::digests`]: MD5 of the whole content where the service keeps one
    /// (GCS `md5Hash`; GCS has none for composed objects).
    pub md5: Option<[u8; 16]>,
    /// With [`HeadOpts::digests`]: S3's additional checksum of the object, where the store
    /// was asked for it (`StoreOptions::s3_checksum_mode`) and keeps one.
    pub checksum: Option<ObjectChecksum>,
    /// With [`HeadOpts::digests`] and S3's checksum asked for: a multipart object's first
    /// part's size (its other parts but the last are the same size when uploaded by the
    /// usual tools), so that its multipart ETag or COMPOSITE checksum can be rebuilt.
    pub first_part: Option<u64>,
}

impl ObjectHead {
    /// A head of `meta` with no attributes and no digests.
    pub fn of(meta: ObjectMeta) -> Self {
        Self { meta, attrs: FileAttrs::default(), etag: None, md5: None, checksum: None, first_part: None }
    }

    /// The MD5 of the whole content, where the head tells it: the store's own (`md5`), or
    /// S3's ETag of a single-request upload (32 hex digits). Needs [`HeadOpts::digests`].
    pub fn content_md5(&self) -> Option<[u8; 16]> {
        if self.md5.is_some() {
            return self.md5;
        }
        parse_md5_hex(self.etag.as_deref()?)
    }
}

/// Whether `a` and `b` describe one version of an object: the same ETag (GCS: generation)
/// where the store tells one, else (a local folder) the same size and mtime.
pub fn same_version(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    match (&a.etag, &b.etag) {
        (Some(x), Some(y)) => x == y,
        (None, None) => a.size == b.size && a.mtime == b.mtime,
        _ => false,
    }
}

/// An MD5 written as 32 hex digits (S3's ETag of a single-request upload, Drive's
/// `md5Checksum`); `None` for anything else.
pub fn parse_md5_hex(h: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    // Digits only: `from_str_radix` alone would take a sign (`+f`).
    (h.len() == 32 && h.bytes().all(|c| c.is_ascii_hexdigit())).then_some(())?;
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The part count of S3's multipart ETag `hex(md5 of the parts' md5s)-N` (quotes allowed),
/// if `etag` is one.
pub fn multipart_etag_parts(etag: &str) -> Option<u64> {
    let (h, n) = etag.trim_matches('"').split_once('-')?;
    parse_md5_hex(h)?;
    n.parse::<u64>().ok().filter(|&n| n > 0)
}

/// An S3 additional checksum as HeadObject reports it with `x-amz-checksum-mode: ENABLED`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectChecksum {
    /// The algorithm, lowercase as in the header name: `crc32`, `crc32c`, `crc64nvme`,
    /// `sha1` or `sha256`.
    pub algorithm: String,
    /// The digest's bytes (big-endian for the crcs), decoded from the header's base64.
    pub digest: Vec<u8>,
    /// `Some(N)` when the value ends in `-N`: a COMPOSITE checksum of an N-part upload,
    /// the digest of the parts' digests (concatenated in order), not of the content.
    pub parts: Option<u64>,
    /// `x-amz-checksum-type` (`COMPOSITE` or `FULL_OBJECT`), where the store sent it.
    pub kind: Option<String>,
}

/// Options of [`Store::writer`]: its tuning, and what the object is stored with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOptions {
    /// Bytes per part: S3's minimum part is 5 MiB; 8 MiB keeps 10,000 parts above 78 GiB.
    pub part_size: usize,
    /// Parts in flight at once.
    pub concurrency: usize,
    /// As for [`Store::put`] (an upload that fits one part may be one put).
    pub put: PutOpts,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self { part_size: 8 * 1024 * 1024, concurrency: 4, put: PutOpts::default() }
    }
}

/// An upload in progress; see [`Store::writer`].
#[async_trait]
pub trait ObjectWriter: Send + Sync {
    async fn write(&mut self, data: Bytes) -> Result<(), StoreError>;
    /// Finish the upload and return the new object's metadata.
    async fn close(&mut self) -> Result<ObjectMeta, StoreError>;
    /// Give up: no object is created and uploaded parts are discarded.
    async fn abort(&mut self) -> Result<(), StoreError>;
}

#[cfg(test)]
mod tests {
    use super::Capabilities;

    #[test]
    fn keys_a_store_would_change_are_not_addressable() {
        let object = Capabilities { trims_whitespace: true, ..Default::default() };
        let folder = Capabilities { trims_whitespace: true, trims_segments: true, ..Default::default() };
        for key in ["dup ", " lead", "d/x\t", "\u{3000}a/b", "p/x//y", "/abs", "d//"] {
            assert!(!object.addressable(key) && !folder.addressable(key), "{key:?}");
        }
        // Inside a key only the local folder changes names.
        for key in ["dir /x", "a/ b", "sp ace", "d /"] {
            assert!(object.addressable(key), "{key:?}");
        }
        assert!(!folder.addressable("dir /x") && !folder.addressable("d /") && folder.addressable("sp ace/x"));
        assert!(Capabilities::default().addressable(" any "), "Drive keeps every name");
        let s3 = Capabilities { trims_whitespace: true, lists_xml: true, ..Default::default() };
        for key in ["a\u{1f}b", "d/\u{8}/x", "lost\u{1A}", "x\u{b}y", "a\u{0}b"] {
            assert!(!s3.addressable(key) && object.addressable(key), "{key:?}");
        }
        assert!(s3.addressable("tab\tnew\nline\r/x\u{7f}") && s3.addressable("é/ü\u{FFFD}"));
        for key in ["a/../b", "evil/./dot", "..", "x/."] {
            assert!(!s3.addressable(key) && object.addressable(key), "{key:?}");
        }
        assert!(s3.addressable("a/..b/.c/..."));
    }

    #[test]
    fn the_content_md5_is_the_stores_own_or_an_etag_of_one_request() {
        use super::{ObjectHead, ObjectMeta};
        let meta = ObjectMeta { key: "k".into(), size: 3, etag: None, mtime: None, size_unknown: false };
        let head = |etag: Option<&str>, md5: Option<[u8; 16]>| ObjectHead {
            etag: etag.map(Into::into),
            md5,
            ..ObjectHead::of(meta.clone())
        };
        let abc = [0x90, 0x01, 0x50, 0x98, 0x3c, 0xd2, 0x4f, 0xb0, 0xd6, 0x96, 0x3f, 0x7d, 0x28, 0xe1, 0x7f, 0x72];
        assert_eq!(head(Some("900150983cd24fb0d6963f7d28e17f72"), None).content_md5(), Some(abc));
        assert_eq!(head(Some("900150983cd24fb0d6963f7d28e17f72-2"), None).content_md5(), None, "a multipart ETag");
        assert_eq!(head(Some("zz0150983cd24fb0d6963f7d28e17f72"), None).content_md5(), None);
        assert_eq!(head(Some("+00150983cd24fb0d6963f7d28e17f72"), None).content_md5(), None, "a sign");
        assert_eq!(head(Some("1234"), Some(abc)).content_md5(), Some(abc), "the store's own first");
        assert_eq!(head(None, None).content_md5(), None);
    }
}
