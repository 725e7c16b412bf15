//! Symbolic links: symlink(2) and readlink(2) over link objects ([`crate::links`] says
//! how they are stored).

use crate::inode::Kind;
use crate::links::{may_be_link, TARGET_MAX};
use bucketfs_store::{GetOpts, PutOpts, StoreExt};

impl crate::fs::Fs {
    /// symlink(2): write the link object (`PUT <name>.rclonelink`, content = target).
    pub async fn symlink(&self, parent: u64, name: &str, target: &str) -> Result<crate::fs::Attr, crate::FsError> {
        use crate::FsError;
        let key = self.new_key(parent, name, Kind::Symlink)?;
        if target.is_empty() || target.contains('\0') {
            return Err(FsError::NotFound); // ENOENT, as Linux answers an empty target
        }
        if target.len() > TARGET_MAX || !may_be_link(name) {
            return Err(FsError::NameTooLong);
        }
        if self.resolve(parent, name).await?.is_some() {
            return Err(FsError::Exists);
        }
        let meta = self.store.put(&key, bytes::Bytes::copy_from_slice(target.as_bytes()), PutOpts::default()).await?;
        let child = self.child_meta(name, &meta, Kind::Symlink);
        let mut t = self.table.lock().unwrap();
        let ino = t.upsert(parent, &child);
        t.remember(ino);
        t.listing_insert(parent, child);
        if let Some(n) = t.get_mut(ino) {
            n.size = target.len() as u64; // stores that answer without a size
        }
        let n = t.get(ino).expect("just inserted");
        Ok(self.attr(n))
    }

    /// readlink(2): the link object's content.
    pub async fn readlink(&self, ino: u64) -> Result<bytes::Bytes, crate::FsError> {
        let node = self.node(ino)?;
        if node.kind != Kind::Symlink {
            return Err(crate::FsError::InvalidName); // EINVAL: not a link
        }
        let meta = self.store.stat(&node.key).await?;
        let size = meta.size.min(TARGET_MAX as u64);
        Ok(self.store.get_range(&node.key, 0..size, GetOpts { if_match: meta.etag.as_deref() }).await?)
    }
}
