//! Symbolic links: symlink(2) and readlink(2) over link objects ([`crate::links`] says
//! how they are stored).
//!
//! The kernel asks `readlink` at every path walk through a link (`ls -l`, a build opening
//! files through a linked directory), so a target is kept for the version of the link
//! object the node knows ([`Fs::links`]): read again while the node is fresh (within the
//! TTL, or on a write-back mount, the bucket's main writer) costs no request, and another
//! client's change shows once a listing or HEAD gives the node a new version.
//!
//! On a write-back mount `symlink` journals the link object and returns; it is put in the
//! background (deletes.rs), and `readlink` answers from the journal until then.

use crate::fs::Fs;
use crate::inode::{Kind, Version};
use crate::links::{bad_target, bad_target_size, may_be_link, BadTarget, TARGET_MAX};
use bucketfs_store::{GetOpts, PutOpts, StoreExt};

/// Bytes of link targets kept in memory at most.
const CACHED_TARGETS_BYTES: u64 = 16 << 20;

/// The cache of link targets ([`Fs::links`]), weighed by bytes.
pub(crate) fn cache() -> moka::sync::Cache<u64, (Version, bytes::Bytes)> {
    moka::sync::Cache::builder()
        .weigher(|_, (_, t): &(Version, bytes::Bytes)| (t.len() + 96) as u32)
        .max_capacity(CACHED_TARGETS_BYTES)
        .build()
}

impl Fs {
    /// symlink(2): write the link object (`PUT <name>.rclonelink`, content = target), or on
    /// a write-back mount journal it and return.
    pub async fn symlink(&self, parent: u64, name: &str, target: &str) -> Result<crate::fs::Attr, crate::FsError> {
        use crate::FsError;
        let (key, _intent) = self.name_intent(parent, name, Kind::Symlink).await?;
        if target.is_empty() || target.contains('\0') {
            return Err(FsError::NotFound); // ENOENT, as Linux answers an empty target
        }
        if target.len() > TARGET_MAX || !may_be_link(name) {
            return Err(FsError::NameTooLong);
        }
        if self.resolve(parent, name).await?.is_some() {
            return Err(FsError::Exists);
        }
        let body = bytes::Bytes::copy_from_slice(target.as_bytes());
        let meta = match self.deletes.as_ref().filter(|_| self.write_back()) {
            // Journaled, put in the background (deletes.rs): the kernel holds the directory
            // locked for this call, so a store that hangs would stall every lookup there.
            Some(d) => {
                d.defer_link(&key, target).await?;
                None
            }
            None => Some(self.store.put(&key, body.clone(), PutOpts::default()).await?),
        };
        let mut child = match &meta {
            Some(m) => self.child_meta(name, m, Kind::Symlink),
            None => self.child_meta(name, &Default::default(), Kind::Symlink),
        };
        // Stores that answer without a size; a link not made yet has neither (the listing
        // kept here answers lookups with this entry).
        child.size = target.len() as u64;
        if meta.is_none() {
            child.mtime = std::time::SystemTime::now();
        }
        let mut t = self.table.lock().unwrap();
        let ino = t.upsert(parent, &child);
        t.remember(ino);
        t.listing_insert(parent, child);
        let Some(n) = t.get_mut(ino) else { return Err(FsError::NotFound) };
        let Some(meta) = meta else {
            // Ours, its tag not known until the object is made: a listing's tag is taken as
            // this link's, not as another client's object.
            n.version = Version::Unknown;
            return Ok(self.attr(n));
        };
        // The version this mount wrote: a lookup racing this one may have recorded another
        // client's link of that name.
        self.keep_target(ino, &n.version, meta.etag.as_deref(), body);
        Ok(self.attr(n))
    }

    /// readlink(2): the link object's content.
    pub async fn readlink(&self, ino: u64) -> Result<bytes::Bytes, crate::FsError> {
        let node = self.node(ino)?;
        if node.kind != Kind::Symlink {
            return Err(crate::FsError::InvalidName); // EINVAL: not a link
        }
        let known = matches!(node.version, Version::Tag(_)) && (self.write_back() || self.fresh(node.validated));
        if let Some((_, target)) = self.links.get(&ino).filter(|(v, _)| known && *v == node.version) {
            return Ok(target);
        }
        if let Some(target) = self.deletes.as_ref().and_then(|d| d.pending_link(&node.key)) {
            return Ok(bytes::Bytes::from(target)); // made here, its object still to come
        }
        let meta = self.store.stat(&node.key).await?;
        // A target Linux cannot hold (another client's link) fails rather than being served
        // cut short; the size tells a long or empty one without a read.
        if let Some(bad) = bad_target_size(meta.size).filter(|_| !meta.size_unknown) {
            return Err(bad_link(&node.key, bad));
        }
        // A store that tells no size: one byte past the longest target tells a longer one.
        let size = if meta.size_unknown { TARGET_MAX as u64 + 1 } else { meta.size };
        let target = self.store.get_range(&node.key, 0..size, GetOpts { if_match: meta.etag.as_deref() }).await?;
        if let Some(bad) = bad_target(&target) {
            return Err(bad_link(&node.key, bad));
        }
        let mut known = node.version;
        if known == Version::Unknown {
            // Ours (made in the background, or moved): the object read is its version.
            if let Some(v) = self.table.lock().unwrap().learn_own_version(ino, meta.etag.as_deref()) {
                known = v;
            }
        }
        self.keep_target(ino, &known, meta.etag.as_deref(), target.clone());
        Ok(target)
    }

    /// Keep `target`, read or written as the object with `etag`, if that is the version
    /// the node knows (`known`) and a tagged one, and a target Linux can hold (only those
    /// are served from here).
    fn keep_target(&self, ino: u64, known: &Version, etag: Option<&str>, target: bytes::Bytes) {
        let version = Version::from_store(etag);
        if matches!(version, Version::Tag(_)) && version == *known && bad_target(&target).is_none() {
            self.links.insert(ino, (version, target));
        }
    }
}

/// readlink's error for the link object `key` whose target Linux cannot hold: ENAMETOOLONG
/// for one too long, EIO otherwise. Logged, as the kernel tells the caller only the errno.
fn bad_link(key: &str, bad: BadTarget) -> crate::FsError {
    tracing::warn!(?key, "link object not served: {bad}");
    match bad {
        BadTarget::TooLong => crate::FsError::NameTooLong,
        BadTarget::Empty | BadTarget::Nul => crate::FsError::Store(bucketfs_store::StoreError::new(
            bucketfs_store::StoreErrorKind::Other,
            format!("link object {key:?}: {bad}"),
        )),
    }
}
