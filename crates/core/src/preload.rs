//! Loading the whole tree at mount (`--preload-tree`), GCSF's approach: one recursive LIST
//! (paged by the store, 1,000 keys a request) fills the listing of every directory, so a
//! first `find` or `ls -R` makes no further requests. Bounded by `max_entries`: a bigger
//! bucket is refused with a message (listing per directory still works). The listings stay
//! valid for `valid_for`; the mount refreshes them in the background before then.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::TryStreamExt;

use crate::fs::{Fs, Kind};
use crate::inode::{ChildMeta, Listing, ROOT_INO};
use crate::{names, FsError};

impl Fs {
    /// Load every key into the listing cache; returns the number of entries loaded.
    pub async fn preload_tree(&self, max_entries: usize, valid_for: Duration) -> Result<usize, FsError> {
        let started = Instant::now();
        let since = self.table.lock().unwrap().change_seq();
        // Directory key -> its children. The root is "".
        let mut dirs: HashMap<String, HashMap<String, ChildMeta>> = HashMap::from([(String::new(), HashMap::new())]);
        let mut count = 0usize;
        let mut stream = self.store.list("", true);
        while let Some(m) = stream.try_next().await? {
            let segments: Vec<&str> = m.key.trim_end_matches('/').split('/').collect();
            if !segments.iter().all(|s| names::valid_segment(s)) {
                continue; // never exposed (see names.rs)
            }
            count += 1;
            if count > max_entries {
                return Err(FsError::Local(format!(
                    "the bucket holds over {max_entries} keys; not preloading the tree (directories are listed as they are opened)"
                )));
            }
            let mut parent = String::new();
            for (i, seg) in segments.iter().enumerate() {
                let last = i + 1 == segments.len();
                let is_dir = !last || m.key.ends_with('/');
                let meta = if is_dir {
                    self.child_meta(seg, &bucketfs_store::ObjectMeta { key: String::new(), size: 0, etag: None, mtime: None }, Kind::Dir)
                } else {
                    let (name, kind) = crate::links::classify(seg);
                    self.child_meta(name, &m, kind)
                };
                // A directory shadows a file, a file a link (SEMANTICS.md).
                crate::links::merge_child(dirs.entry(parent.clone()).or_default(), meta);
                parent = format!("{parent}{seg}/");
                if is_dir {
                    dirs.entry(parent.clone()).or_default();
                }
            }
        }
        // Install parents before children, so each directory has an inode when listed.
        let mut keys: Vec<String> = dirs.keys().cloned().collect();
        keys.sort_by_key(|k| k.matches('/').count());
        let mut t = self.table.lock().unwrap();
        let mut inos: HashMap<String, u64> = HashMap::from([(String::new(), ROOT_INO)]);
        for key in keys {
            let Some(&ino) = inos.get(&key) else { continue };
            let children = dirs.remove(&key).unwrap_or_default();
            for (name, meta) in &children {
                if meta.kind == Kind::Dir {
                    let child = t.upsert(ino, meta);
                    inos.insert(format!("{key}{name}/"), child);
                }
            }
            t.set_listing_since(ino, Listing { at: started, valid_for, children }, since);
        }
        tracing::info!(entries = count, ms = started.elapsed().as_millis() as u64, "tree preloaded");
        Ok(count)
    }
}
