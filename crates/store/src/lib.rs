//! The store layer: the only crate that knows OpenDAL (and Drive's REST API).
//!
//! Everything above this crate sees the narrow [`Store`] trait: `head`, ranged `get`, a
//! listing stream, `put`, a streaming multipart `writer`, `delete`, `copy`, `create_dir`,
//! plus a [`Capabilities`] value; each call takes an options struct, and [`StoreExt`]
//! adds the convenience forms (`stat`, `get_range`, `read`) on top. Keys are relative
//! to the mounted bucket prefix, never start with `/`, and directory markers end with `/`.
//!
//! - [`opendal_store`] implements the trait over OpenDAL's public `Operator` API.
//! - [`gcs`] holds what OpenDAL's GCS service lacks: [`gcs::compose`] uploads large GCS
//!   objects as parallel parts joined by `compose`; a transport wrapper checks generations.
//! - [`gdrive`] is a small Google Drive v3 client (whole tree in memory, changes feed).
//! - [`patch`] makes a new version from the current one and the changed ranges (S3
//!   `UploadPartCopy`, GCS `compose`), for uploads that send only what changed.
//! - [`metered`] is a decorator counting requests, errors, bytes and latency (Prometheus).
//! - [`s3`] holds what OpenDAL's S3 service lacks, for `bucketfs cp`: [`s3::checksum`]
//!   makes S3 confirm the crc32c of every upload; [`s3::checksum_mode`] asks S3 HEADs for
//!   the object's checksum.
//! - [`events`] listens to change events the store pushes (`mount --notify`).
//! - [`location`] parses `s3://`, `gs://`, `file://` and `mem://` URLs and builds a store.
//! - `testing` (feature `testing`) holds the doubles: an in-memory store with latency and
//!   throughput knobs, and a wrapper that fails the Nth call of an operation.

pub mod attrs;
pub mod background;
pub mod content_type;
pub mod detached;
mod error;
pub mod events;
pub mod gcs;
pub mod gdrive;
pub mod headers;
mod local;
pub mod location;
pub mod metered;
pub mod opendal_store;
pub mod patch;
pub mod region;
mod retry;
pub mod s3;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod types;

pub use attrs::{new_create_tag, FileAttrs};
pub use content_type::ContentType;
pub use error::{redact_urls, StoreError, StoreErrorKind};
pub use types::{
    multipart_etag_parts, parse_md5_hex, same_version, ByteStream, Capabilities, GetOpts, HeadOpts, ListStream,
    ObjectChecksum, ObjectHead, ObjectMeta, ObjectWriter, Patch, PatchSource, Patched, PutDone, PutOpts, Store,
    StoreExt, WriteOptions,
};
