//! GCS pieces OpenDAL's GCS service lacks; the operator itself is built in
//! [`crate::location`] and used through [`crate::opendal_store`].
//!
//! - [`compose`]: OpenDAL's GCS writer uploads through the XML multipart API, which the GCS
//!   emulator (fake-gcs-server) does not have; this writer uploads parts as temporary
//!   objects and joins them with the JSON API's `compose`.
//! - `generation`: OpenDAL leaves `ifGenerationMatch` on a download to the server, and an
//!   emulator that ignores it returns another generation's bytes; this HTTP transport
//!   wrapper refuses an answer whose `x-goog-generation` is not the one asked for.
//! - [`in_place`]: OpenDAL refuses a compose into one of its own sources (GCS's append);
//!   this HTTP transport wrapper lets a marked destination through as the key itself.
//! - `user_project`: the billing project of `--billing-project` (requester-pays buckets),
//!   which OpenDAL's GCS builder has no option for.

pub mod compose;
pub(crate) mod generation;
pub mod in_place;
pub(crate) mod user_project;
