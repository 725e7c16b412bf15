//! S3 pieces OpenDAL's S3 service lacks, both used by `bucketfs cp`'s S3 store (see
//! [`crate::location`]'s `StoreOptions`); the operator itself is used through
//! [`crate::opendal_store`].
//!
//! - [`checksum`]: OpenDAL sends `x-amz-checksum-crc32c` on uploads but does not check that
//!   the server confirmed it, nor the completed object's composite checksum; this HTTP
//!   transport wrapper requires both.
//! - [`checksum_mode`]: OpenDAL's `stat` cannot send `x-amz-checksum-mode: ENABLED` and its
//!   `Metadata` keeps no checksum header; this wrapper adds and signs the header on a HEAD
//!   and hands the answer's checksum back to the caller.
//! - [`bucket`]: creating and deleting a bucket (the CSI controller's bucket per volume).

pub mod bucket;
pub mod checksum;
pub mod checksum_mode;
