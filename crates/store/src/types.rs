//! The narrow trait the rest of bucketfs sees, and its value types.

use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

use crate::{FileAttrs, StoreError};

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
    /// (a Google Doc's export, which a listing never makes). A `head` of the key answers the
    /// real size; readers must not stop at `size`.
    pub size_unknown: bool,
}

impl ObjectMeta {
    pub fn is_prefix(&self) -> bool {
        self.key.ends_with('/')
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
    /// The store cannot address a key that starts or ends with whitespace: OpenDAL trims
    /// leading and trailing whitespace (`char::is_whitespace`) from every path it is given,
    /// so `"dup "` would read and write `"dup"`. Such keys are never shown or created.
    pub trims_whitespace: bool,
    /// Every segment of a listed key comes back trimmed too (OpenDAL's fs service lists a
    /// directory `a ` as `a/`), so a segment with whitespace at an end is never addressable.
    pub trims_segments: bool,
}

impl Capabilities {
    /// Whether `key` (relative to the store root) reaches exactly that object: false for a
    /// key the store would silently change (see [`Capabilities::trims_whitespace`]).
    pub fn addressable(&self, key: &str) -> bool {
        let edge = |c: Option<char>| c.is_some_and(char::is_whitespace);
        let trimmed = |s: &str| edge(s.chars().next()) || edge(s.chars().next_back());
        !(self.trims_whitespace && trimmed(key) || self.trims_segments && key.split('/').any(trimmed))
    }
}

/// Listing results, streamed page by page underneath so a huge directory is never one buffer.
pub type ListStream = BoxStream<'static, Result<ObjectMeta, StoreError>>;

/// An object's bytes as they arrive (one HTTP body's chunks, for S3 and GCS).
pub type ByteStream = BoxStream<'static, Result<Bytes, StoreError>>;

/// The operations bucketfs needs from an object store. Implementations must be cheap to
/// share (`Arc<dyn Store>`) and safe to call concurrently.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short description for logs and errors, never containing credentials.
    fn describe(&self) -> String;

    fn capabilities(&self) -> Capabilities;

    /// Verify the bucket exists and the credentials work (one cheap request).
    async fn check(&self) -> Result<(), StoreError>;

    /// Metadata of one object. `NotFound` if absent.
    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError>;

    /// Bytes `range` of `key`. The range is clamped to the object by the caller; a range
    /// past the end yields fewer bytes. With `if_match`, a changed object gives `Changed`.
    async fn get_range(&self, key: &str, range: Range<u64>, if_match: Option<&str>) -> Result<Bytes, StoreError>;

    /// [`Store::get_range`] as a stream of chunks as they arrive (one request), so a large
    /// range can be consumed without holding it in memory. The default reads the whole range
    /// with `get_range` and yields it as one chunk. The caller checks the total length.
    async fn get_range_stream(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<ByteStream, StoreError> {
        let data = self.get_range(key, range, if_match).await?;
        Ok(Box::pin(futures::stream::once(async move { Ok(data) })))
    }

    /// Entries under `prefix` (which is empty or ends with `/`). Non-recursive: direct
    /// children, with sub-prefixes reported once each as keys ending in `/`. The prefix
    /// itself (a directory marker) is not reported. On stores with `prefix_dirs`, a plain
    /// prefix (`d/na`, non-recursive) lists the entries of `d/` whose keys start with it, in
    /// key order, its exact key included: one request tells a file `d/na`, a directory
    /// `d/na/` and a link `d/na.rclonelink` apart.
    fn list(&self, prefix: &str, recursive: bool) -> ListStream;

    /// Store `data` as `key`, replacing any existing object. The returned `etag` is the
    /// upload's own (from its response), or `None`; `mtime` may be `None`.
    async fn put(&self, key: &str, data: Bytes) -> Result<ObjectMeta, StoreError>;

    /// Delete `key`; deleting a missing key succeeds.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;

    /// Server-side copy.
    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError>;

    /// Make `key` (ending in `/`) exist as a directory: a marker object on object stores,
    /// a real directory on a local fs.
    async fn create_dir(&self, key: &str) -> Result<(), StoreError>;

    /// Stream a new object into `key`. Large objects go up in parts of `opts.part_size`,
    /// `opts.concurrency` at a time, while the caller is still writing. Nothing is visible
    /// until `close` succeeds; `abort` leaves no parts behind.
    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError>;

    /// [`Store::head`] plus the content digests the store reports, for end-to-end
    /// verification. The default reports none.
    async fn head_digests(&self, key: &str) -> Result<ObjectDigests, StoreError> {
        Ok(ObjectDigests { meta: self.head(key).await?, etag: None, md5: None, checksum: None })
    }

    /// Whether uploads keep [`FileAttrs`] and [`Store::head_attrs`] returns them. Wrappers
    /// must forward this and the three methods below.
    fn keeps_attrs(&self) -> bool {
        false
    }

    /// [`Store::head`] plus the attributes the object carries (empty where none are kept).
    async fn head_attrs(&self, key: &str) -> Result<(ObjectMeta, FileAttrs), StoreError> {
        Ok((self.head(key).await?, FileAttrs::default()))
    }

    /// [`Store::put`], keeping `attrs` with the object where the store can.
    async fn put_with_attrs(&self, key: &str, data: Bytes, _attrs: &FileAttrs) -> Result<ObjectMeta, StoreError> {
        self.put(key, data).await
    }

    /// [`Store::writer`], keeping `attrs` with the object where the store can.
    async fn writer_with_attrs(
        &self,
        key: &str,
        opts: WriteOptions,
        _attrs: &FileAttrs,
    ) -> Result<Box<dyn ObjectWriter>, StoreError> {
        self.writer(key, opts).await
    }
}

/// What [`Store::head_digests`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectDigests {
    pub meta: ObjectMeta,
    /// The service's raw ETag, quotes removed (S3: the MD5 in hex for a single-request
    /// upload, `hex(md5(part md5s))-N` for an N-part upload; other forms mean neither).
    pub etag: Option<String>,
    /// MD5 of the whole content where the service keeps one (GCS `md5Hash`; GCS has none
    /// for composed objects).
    pub md5: Option<[u8; 16]>,
    /// S3's additional checksum of the object, where the store was asked for it
    /// (`StoreOptions::s3_checksum_mode`) and keeps one.
    pub checksum: Option<ObjectChecksum>,
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

/// Tuning for [`Store::writer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Bytes per part: S3's minimum part is 5 MiB; 8 MiB keeps 10,000 parts above 78 GiB.
    pub part_size: usize,
    /// Parts in flight at once.
    pub concurrency: usize,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self { part_size: 8 * 1024 * 1024, concurrency: 4 }
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
        for key in ["dup ", " lead", "d/x\t", "\u{3000}a/b"] {
            assert!(!object.addressable(key) && !folder.addressable(key), "{key:?}");
        }
        // Inside a key only the local folder changes names.
        for key in ["dir /x", "a/ b", "sp ace", "d /"] {
            assert!(object.addressable(key), "{key:?}");
        }
        assert!(!folder.addressable("dir /x") && !folder.addressable("d /") && folder.addressable("sp ace/x"));
        assert!(Capabilities::default().addressable(" any "), "Drive keeps every name");
    }
}
