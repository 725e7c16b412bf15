//! Directory reads: opendir, readdir and releasedir, with and without opendir, over the
//! snapshots the kernel's readdir cache holds ([`crate::dir_cache`] says how it is kept true).

use crate::dir_cache::{uncookie, InvalidateDir};
use crate::error::FsError;
use crate::fs::{DirEntry, Fs, Kind};
use crate::inode::{ChildMeta, Node};
use crate::sync::Arc;
use std::time::Duration;

impl Fs {
    /// The kernel may keep directories' entries without opendir ([`Fs::readdir_unopened`]);
    /// `invalidate` drops them when their listing goes stale. Not with a TTL of 0: every
    /// read of a directory then lists it again.
    pub fn cache_dirs_without_opendir(&self, invalidate: InvalidateDir) -> bool {
        if self.cfg.metadata_ttl.is_zero() {
            return false;
        }
        let _ = self.dir_cache.invalidate.set(invalidate);
        true
    }

    /// The kernel invalidator, if the adapter gave one.
    pub(crate) fn invalidate_hook_of(&self) -> Option<InvalidateDir> {
        self.dir_cache.invalidate.get().cloned()
    }

    /// Whether [`Fs::cache_dirs_without_opendir`] was accepted.
    pub fn dirs_without_opendir(&self) -> bool {
        self.dir_cache.invalidate.get().is_some()
    }

    /// A readdir without opendir: the snapshot to answer from and its number (offsets are
    /// [`crate::dir_cache::cookie`]s). Offset 0 starts a read: it takes a new snapshot unless the listing is
    /// the one the current snapshot came from (so two readers of a directory page through
    /// the same one); later offsets page through the snapshot they name (else the current).
    pub async fn readdir_unopened(&self, ino: u64, offset: u64) -> Result<(Arc<Vec<DirEntry>>, u32), FsError> {
        self.readdir_page(ino, offset).await.map(|(entries, snap, _)| (entries, snap))
    }

    /// [`Fs::readdir_unopened`], with the index to answer from. A read whose snapshot is no
    /// longer kept (more readers began meanwhile than are kept) goes on in the current one
    /// after the last name it was given ([`Fs::readdir_page_end`]), so no name still there
    /// repeats or is skipped (by index, a name made meanwhile repeated one, 202 of 5,198,
    /// or a page of the new one ended the read: 202 names of 2,559).
    pub async fn readdir_page(&self, ino: u64, offset: u64) -> Result<(Arc<Vec<DirEntry>>, u32, usize), FsError> {
        let (snap, next) = uncookie(offset);
        if offset > 0 {
            if let Some(entries) = self.dir_cache.recent(ino, snap) {
                self.dir_cache.touch(ino, self.cfg.clock.now());
                return Ok((entries, snap, next));
            }
        }
        let (entries, now_snap) = self.readdir_snapshot(ino, offset).await?;
        let resumed = if offset > 0 && next > 2 { self.dir_cache.ended_at(ino, snap, next) } else { None };
        let start = match resumed {
            // `.` and `..` first, then the names in order.
            Some(last) => 2 + entries.get(2..).unwrap_or_default().partition_point(|e| e.name <= last),
            None => next,
        };
        Ok((entries, now_snap, start))
    }

    /// A read of `ino`'s snapshot `snap` (a [`Fs::readdir_page`] answer) stopped before
    /// index `next`, `name` the last name it gave.
    pub fn readdir_page_end(&self, ino: u64, snap: u32, next: usize, name: &str) {
        if snap != 0 {
            self.dir_cache.page_end(ino, snap, next, name);
        }
    }

    /// A read without opendir is about to be told that `ino`'s snapshot `entries` ended:
    /// the kernel then holds all of them in its cache. One that ends on a page edge is
    /// dropped first ([`crate::dir_cache::ends_on_a_page_edge`]: the kernel would end early
    /// the reads of other snapshots it holds offsets of), so reads of the directory ask us
    /// again. Before the reply, not after: a reader going on at once was ahead of a drop
    /// sent later. (Dropping a directory's pages waits for no request: the kernel holds
    /// none of its page locks while it waits for this reply.)
    pub fn readdir_ending(&self, ino: u64, entries: &[DirEntry]) {
        if !crate::dir_cache::ends_on_a_page_edge(entries) {
            return;
        }
        if let Some(invalidate) = self.invalidate_hook_of() {
            tracing::debug!(
                ino,
                entries = entries.len(),
                "the kernel's cache of this directory ends on a page edge: dropped"
            );
            invalidate(ino);
        }
    }

    /// The snapshot [`Fs::readdir_page`] answers from when the one asked for is not kept.
    async fn readdir_snapshot(&self, ino: u64, offset: u64) -> Result<(Arc<Vec<DirEntry>>, u32), FsError> {
        self.dir_cache.touch(ino, self.cfg.clock.now());
        let current = self.dir_cache.current(ino);
        if offset > 0 {
            if let Some((entries, _, snap)) = current {
                return Ok((entries, snap));
            }
        }
        let dir = self.listed_dir(ino).await?;
        let source = {
            let t = self.table.lock().unwrap();
            t.listing(ino).map(|l| (l.at, t.changed_at(ino)))
        };
        if let (Some((entries, was, snap)), Some(now)) = (&current, source) {
            if *was == now {
                // The kernel caches this read too: its drop may be due again (the last
                // one fired before this listing's end).
                if self.dir_cache.arm_expiry(ino) {
                    self.expire_dir_later(ino);
                }
                return Ok((entries.clone(), *snap));
            }
        }
        let entries = self.snapshot_of(&dir);
        let mut snap = 0;
        if let Some(source) = source {
            let (n, arm) = self.dir_cache.set_current(ino, &entries, source);
            snap = n;
            if arm {
                self.expire_dir_later(ino);
            }
        }
        Ok((entries, snap))
    }

    /// Over `--max-cached-entries`: drop the cached state of directories not in use (see
    /// `inode_trim.rs`), and what the kernel cached of their entries (their inode numbers
    /// are not kept). Called after a listing is installed.
    pub(crate) fn trim_names(&self) {
        let max = self.cfg.max_cached_entries;
        if max == 0 {
            return;
        }
        let dropped = {
            let mut t = self.table.lock().unwrap();
            let now = t.now();
            // The snapshots go with the nodes they name, under the table's lock: a readdir
            // either began before (in use: kept) or lists the directory again.
            let dropped = t.trim(max, max / 4 * 3, &|dir| !self.dir_cache.drop_if_idle(dir, now));
            if !dropped.is_empty() {
                t.shrink();
            }
            dropped
        };
        if dropped.is_empty() {
            return;
        }
        tracing::debug!(dirs = dropped.len(), max, "cached state of directories not in use dropped");
        self.drop_dir_caches(dropped);
    }

    /// Readers of `dirs` take new snapshots, and the kernel drops what it cached of their
    /// entries.
    pub(crate) fn drop_dir_caches(&self, dirs: Vec<u64>) {
        for &dir in &dirs {
            self.dir_cache.forget_snapshot(dir);
        }
        if let Some(invalidate) = self.dir_cache.invalidate.get().cloned().filter(|_| !dirs.is_empty()) {
            // Not from the request that changed them: the kernel may hold a lock that the
            // notification waits for.
            crate::sync::spawn(async move {
                for dir in dirs {
                    invalidate(dir);
                }
            });
        }
    }

    /// Drop the kernel's cache of `ino` when its listing's TTL runs out.
    fn expire_dir_later(&self, ino: u64) {
        // The listing's end by the mount's clock, as a real wait (the timer runs on tokio's).
        let now = self.cfg.clock.now();
        let left = self
            .table
            .lock()
            .unwrap()
            .listing(ino)
            .map_or(Duration::ZERO, |l| (l.at + l.valid_for).saturating_duration_since(now));
        let me = self.me.clone();
        crate::sync::spawn(async move {
            tokio::time::sleep(left).await;
            if let Some(fs) = me.upgrade() {
                fs.dir_cache.expired(ino);
            }
        });
    }

    /// The entries of directory `ino`, sorted by name, `.` and `..` first.
    pub(crate) async fn dir_snapshot(&self, ino: u64) -> Result<Arc<Vec<DirEntry>>, FsError> {
        let dir = self.listed_dir(ino).await?;
        Ok(self.snapshot_of(&dir))
    }

    /// Directory `ino`, with a listing to take a snapshot from.
    async fn listed_dir(&self, ino: u64) -> Result<Node, FsError> {
        let dir = self.node(ino)?;
        if dir.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        self.ensure_listing(&dir, true).await?;
        if !self.cfg.metadata_ttl.is_zero() && !self.table.lock().unwrap().listing_fresh(ino) {
            // Fetched while this mount changed the directory (see the module doc).
            self.ensure_listing(&dir, false).await?;
        }
        Ok(dir)
    }

    fn snapshot_of(&self, dir: &Node) -> Arc<Vec<DirEntry>> {
        let ino = dir.ino;
        let mut t = self.table.lock().unwrap();
        let overtaken = t.listing(ino).is_some_and(|l| l.overtaken);
        let mut metas: Vec<ChildMeta> =
            t.listing(ino).map(|l| l.children.values().cloned().collect()).unwrap_or_default();
        metas.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = Vec::with_capacity(metas.len() + 2);
        out.push(DirEntry { ino, kind: Kind::Dir, name: ".".into() });
        out.push(DirEntry { ino: dir.parent, kind: Kind::Dir, name: "..".into() });
        for m in &metas {
            // A listing entry updates what is known of the child, unless the mount's own
            // state is newer (`Node::local`): then the node, not the listing, is shown. An
            // overtaken listing may hold an entry older than an upload made here since: it
            // only names children (a known one keeps what the mount holds).
            let Some(child) = listed_node(&mut t, ino, m, overtaken) else { continue };
            let kind = t.get(child).map_or(m.kind, |n| n.kind);
            out.push(DirEntry { ino: child, kind, name: m.name.clone() });
        }
        Arc::new(out)
    }
}

/// The node of listing entry `m` of directory `dir` (made from it, or updated by it), or
/// `None` for a name removed here after an `overtaken` listing began.
pub(crate) fn listed_node(t: &mut crate::inode::InodeTable, dir: u64, m: &ChildMeta, overtaken: bool) -> Option<u64> {
    let known = t.child(dir, &m.name).filter(|n| overtaken && n.kind == m.kind).map(|n| n.ino);
    if overtaken && known.is_none() && t.removed_here(dir, &m.name) {
        return None; // removed here after the listing began
    }
    Some(known.unwrap_or_else(|| t.upsert(dir, m)))
}
