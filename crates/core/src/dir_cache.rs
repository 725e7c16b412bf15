//! Directory reads and the kernel's readdir cache.
//!
//! The kernel caches the entries it reads from a directory (FOPEN_CACHE_DIR), so reading a
//! directory again is answered without a readdir round trip. Two ways to keep that cache
//! true, chosen by the FUSE adapter at init:
//!
//! - **Without opendir** (the kernel offers FUSE_NO_OPENDIR_SUPPORT and the metadata TTL is
//!   not 0): the kernel sends no opendir or releasedir at all and keeps every directory's
//!   cache. Readdirs come without a handle ([`crate::Fs::readdir_unopened`]): offset 0 takes a new
//!   snapshot, later offsets page through it. The kernel drops its cache itself when the
//!   directory changes through it (its iversion); we drop it when the listing the
//!   snapshot came from goes stale (the TTL), through [`InvalidateDir`]. A listing fetched
//!   while this mount changed the directory may miss that change (see `ensure_listing`),
//!   so it is fetched once more before it is cached: that listing started after every
//!   change the kernel had seen completed.
//! - **With opendir** (otherwise): every opendir takes a snapshot and lets the kernel keep
//!   what an earlier open cached (FOPEN_KEEP_CACHE) only when the two are equal. The kernel
//!   fills its cache from whichever handle reads first after a drop; when other handles
//!   of the directory were open then, that may be one of theirs, with an older snapshot,
//!   so the cache's content is unknown and the next opendir drops it too.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::sync::{Arc, Mutex};
use std::time::Instant;

use crate::inode::Kind;

/// Which listing a snapshot came from: when it was fetched, and the directory's latest
/// change through this mount.
type Source = (Instant, u64);

/// Drops what the kernel cached of a directory's entries (the FUSE adapter's notifier).
/// One entry of a directory snapshot, in readdir order (`.` and `..` first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: String,
}

pub type InvalidateDir = Arc<dyn Fn(u64) + Send + Sync>;

#[derive(Default)]
struct DirState {
    /// The snapshot the kernel's cache holds (or is being filled from), if known.
    filled_from: Option<Arc<Vec<DirEntry>>>,
    /// Directory handles open now.
    open: usize,
    /// The snapshot readdirs without a handle page through, the listing it came from, and
    /// its number (offsets carry it: see [`cookie`]).
    pub(crate) current: Option<(Arc<Vec<DirEntry>>, Source, u32)>,
    /// The last few snapshots by number: a read that started on one pages on through it
    /// though another reader took a newer one meanwhile (no entry skipped or repeated).
    pub(crate) recent: std::collections::VecDeque<(u32, Arc<Vec<DirEntry>>)>,
    /// The kernel's cache of it is to be dropped when its listing goes stale.
    expiry_pending: bool,
    /// When a read or open of it last began (the mount's clock): in use for a while after.
    read_at: Option<Instant>,
    /// Where reads stopped (snapshot number, next index, last name given), the latest last:
    /// a read whose snapshot is no longer kept resumes after that name.
    ends: std::collections::VecDeque<(u32, usize, String)>,
}

/// Snapshots kept per directory for reads still paging through them, the least recently
/// paged through going first: a reader touches its own at every page, so it outlives the
/// snapshots of up to this many other readers begun after changes meanwhile (concurrent
/// listers of a directory being written to). One past that pages on in the current
/// snapshot, where names may repeat or be missed.
const RECENT: usize = 8;

/// Page ends remembered per directory ([`DirCache::page_end`]): readers paging at once.
const ENDS: usize = 1024;

/// The readdir offset of the entry after index `next` of snapshot number `snap`: the
/// snapshot in the high half, so a read continues in the snapshot it started on.
pub fn cookie(snap: u32, next: usize) -> u64 {
    (u64::from(snap) << 32) | next as u64
}

/// Whether the kernel's readdir cache of `entries` would end exactly on a page edge. It
/// then tells a reader whose offset is not in the cache (one paging through another
/// snapshot) that the directory ended, instead of asking us: its end-of-page test comes
/// before that fallback (fs/fuse/readdir.c, `fuse_readdir_cached`), and such readers'
/// listings stopped short (62 names of 254, 1,022 of 1,278). Packed as the kernel packs
/// them: each entry 24 bytes and its name, to a multiple of 8, none across a page edge.
pub fn ends_on_a_page_edge(entries: &[DirEntry]) -> bool {
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf only reads a constant of the system.
    let page = *PAGE.get_or_init(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096));
    let mut size = 0;
    for e in entries {
        let len = (24 + e.name.len() + 7) & !7;
        if size % page + len > page {
            size = (size / page + 1) * page;
        }
        size += len;
    }
    size > 0 && size % page == 0
}

/// The (snapshot number, index) a readdir offset names ([`cookie`]).
pub fn uncookie(offset: u64) -> (u32, usize) {
    ((offset >> 32) as u32, (offset & 0xffff_ffff) as usize)
}

#[derive(Default)]
pub(crate) struct DirCache {
    /// Lock level 5 (a leaf): no other lock is taken under it; never held across an await.
    dirs: Mutex<HashMap<u64, DirState>>,
    pub(crate) invalidate: OnceLock<InvalidateDir>,
    /// The last snapshot number given (1 up to 2^31 - 1, then 1 again: offsets stay
    /// positive).
    snaps: std::sync::atomic::AtomicU32,
}

impl DirCache {
    /// An opendir of `ino` took `entries`: may the kernel keep its cached entries?
    pub fn opened(&self, ino: u64, entries: &Arc<Vec<DirEntry>>) -> bool {
        let mut dirs = self.dirs.lock().unwrap();
        let st = dirs.entry(ino).or_default();
        let keep = st.filled_from.as_deref() == Some(entries.as_ref());
        if !keep {
            st.filled_from = (st.open == 0).then(|| entries.clone());
        }
        st.open += 1;
        keep
    }

    /// A read or open of `ino` begins at `now`: its cached state is in use (see
    /// [`DirCache::drop_if_idle`]).
    pub fn touch(&self, ino: u64, now: Instant) {
        self.dirs.lock().unwrap().entry(ino).or_default().read_at = Some(now);
    }

    /// Drop what is kept of `ino` (its snapshots) unless it is in use at `now`: a handle
    /// open, or a read begun less than `crate::inode::MIN_IDLE` ago. `true` if dropped
    /// (or nothing was kept): the inode table may then drop the nodes its snapshots name.
    pub fn drop_if_idle(&self, ino: u64, now: Instant) -> bool {
        let mut dirs = self.dirs.lock().unwrap();
        let Some(st) = dirs.get(&ino) else { return true };
        let recent = st.read_at.is_some_and(|at| now.saturating_duration_since(at) < crate::inode::MIN_IDLE);
        if st.open > 0 || recent {
            return false;
        }
        dirs.remove(&ino);
        true
    }

    /// Give back the room of a map far bigger than what it holds.
    pub fn shrink(&self) {
        let mut dirs = self.dirs.lock().unwrap();
        if dirs.capacity() > 4 * dirs.len() + 1024 {
            let len = dirs.len();
            dirs.shrink_to(2 * len);
        }
    }

    /// A handle of `ino` was released.
    pub fn released(&self, ino: u64) {
        if let Some(st) = self.dirs.lock().unwrap().get_mut(&ino) {
            st.open = st.open.saturating_sub(1);
        }
    }

    /// The kernel forgot `ino`, and its cache with it.
    pub fn forgotten(&self, ino: u64) {
        let mut dirs = self.dirs.lock().unwrap();
        if dirs.get(&ino).is_some_and(|st| st.open == 0) {
            dirs.remove(&ino);
        }
    }

    pub(crate) fn current(&self, ino: u64) -> Option<(Arc<Vec<DirEntry>>, Source, u32)> {
        self.dirs.lock().unwrap().get(&ino).and_then(|st| st.current.clone())
    }

    /// Snapshot number `snap` of `ino`, if still kept; it becomes the last to go.
    pub(crate) fn recent(&self, ino: u64, snap: u32) -> Option<Arc<Vec<DirEntry>>> {
        let mut dirs = self.dirs.lock().unwrap();
        let recent = &mut dirs.get_mut(&ino)?.recent;
        let at = recent.iter().position(|(n, _)| *n == snap)?;
        let kept = recent.remove(at)?;
        let entries = kept.1.clone();
        recent.push_back(kept);
        Some(entries)
    }

    /// A new snapshot number (1 up to 2^31 - 1, then 1 again: offsets stay positive).
    pub(crate) fn next_snap(&self) -> u32 {
        self.snaps.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 0x7fff_ffff + 1
    }

    /// Page through `entries` from now on; returns its number, and true when no drop of
    /// the kernel's cache is scheduled yet (the caller schedules one).
    pub(crate) fn set_current(&self, ino: u64, entries: &Arc<Vec<DirEntry>>, source: Source) -> (u32, bool) {
        let snap = self.next_snap();
        let mut dirs = self.dirs.lock().unwrap();
        let st = dirs.entry(ino).or_default();
        st.current = Some((entries.clone(), source, snap));
        if st.recent.len() == RECENT {
            st.recent.pop_front();
        }
        st.recent.push_back((snap, entries.clone()));
        (snap, !std::mem::replace(&mut st.expiry_pending, true))
    }

    /// True when no drop of the kernel's cache of `ino` is scheduled (the caller schedules
    /// one): the kernel caches what it reads now.
    pub(crate) fn arm_expiry(&self, ino: u64) -> bool {
        let mut dirs = self.dirs.lock().unwrap();
        !std::mem::replace(&mut dirs.entry(ino).or_default().expiry_pending, true)
    }

    /// A read of snapshot `snap` of `ino` stopped before index `next`, the last name it gave
    /// being `name`: where it goes on should the snapshot no longer be kept.
    pub(crate) fn page_end(&self, ino: u64, snap: u32, next: usize, name: &str) {
        let mut dirs = self.dirs.lock().unwrap();
        let Some(st) = dirs.get_mut(&ino) else { return };
        if st.ends.len() == ENDS {
            st.ends.pop_front();
        }
        st.ends.push_back((snap, next, name.to_string()));
    }

    /// The last name a read of snapshot `snap` gave before index `next`, if remembered.
    pub(crate) fn ended_at(&self, ino: u64, snap: u32, next: usize) -> Option<String> {
        let dirs = self.dirs.lock().unwrap();
        let ends = &dirs.get(&ino)?.ends;
        ends.iter().rev().find(|(s, n, _)| *s == snap && *n == next).map(|(_, _, name)| name.clone())
    }

    /// `ino`'s listing changed in place (a store event): readers take a new snapshot (the
    /// caller drops the kernel's cache).
    pub(crate) fn forget_snapshot(&self, ino: u64) {
        if let Some(st) = self.dirs.lock().unwrap().get_mut(&ino) {
            st.current = None;
            st.filled_from = None;
        }
    }

    /// The listing behind the kernel's cache of `ino` went stale: drop that cache.
    pub(crate) fn expired(&self, ino: u64) {
        if let Some(st) = self.dirs.lock().unwrap().get_mut(&ino) {
            st.expiry_pending = false;
        }
        if let Some(invalidate) = self.invalidate.get() {
            invalidate(ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Fs;

    fn snap(names: &[&str]) -> Arc<Vec<DirEntry>> {
        Arc::new(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| DirEntry { ino: i as u64 + 2, kind: Kind::File, name: n.to_string() })
                .collect(),
        )
    }

    #[test]
    fn a_cache_ending_on_a_page_edge_is_told_from_one_that_does_not() {
        let dir = |n: usize, len: usize| {
            let mut names = vec![".".to_string(), "..".to_string()];
            names.extend((0..n).map(|i| format!("{i:0len$}")));
            names.into_iter().map(|name| DirEntry { ino: 1, kind: Kind::File, name }).collect::<Vec<_>>()
        };
        // 8-byte names: 32 bytes each, 128 to a page.
        assert!(ends_on_a_page_edge(&dir(126, 8)));
        assert!(ends_on_a_page_edge(&dir(254, 8)));
        assert!(!ends_on_a_page_edge(&dir(253, 8)));
        assert!(!ends_on_a_page_edge(&dir(255, 8)));
        // 16-byte names: 40 bytes each, 102 to a page and 16 bytes left: never on the edge.
        assert!((0..2000).all(|n| !ends_on_a_page_edge(&dir(n, 16))));
        assert!(!ends_on_a_page_edge(&[]));
    }

    #[test]
    fn kept_only_while_the_snapshot_is_the_same() {
        let c = DirCache::default();
        assert!(!c.opened(1, &snap(&["a", "b"])), "nothing cached yet");
        c.released(1);
        assert!(c.opened(1, &snap(&["a", "b"])));
        c.released(1);
        assert!(!c.opened(1, &snap(&["a", "b", "c"])), "a new entry drops the cache");
        c.released(1);
        assert!(c.opened(1, &snap(&["a", "b", "c"])));
        c.released(1);
    }

    #[test]
    fn a_change_while_another_handle_is_open_leaves_the_cache_unknown() {
        let c = DirCache::default();
        assert!(!c.opened(1, &snap(&["a"])));
        // The first handle is still open and may fill the cache with its snapshot.
        assert!(!c.opened(1, &snap(&["a", "b"])));
        c.released(1);
        c.released(1);
        assert!(!c.opened(1, &snap(&["a", "b"])), "unknown content is dropped");
        c.released(1);
        assert!(c.opened(1, &snap(&["a", "b"])));
    }

    #[tokio::test]
    async fn without_opendir_one_snapshot_is_paged_and_the_kernel_cache_dropped_at_the_ttl() {
        use bucketfs_store::{testing::MemStore, PutOpts, Store};
        let store = Arc::new(MemStore::new());
        store.put("a", bytes::Bytes::from_static(b"1"), PutOpts::default()).await.unwrap();
        let ttl = std::time::Duration::from_millis(200);
        let cfg = crate::FsConfig { metadata_ttl: ttl, list_ahead_keys: 0, ..Default::default() };
        let fs = Fs::new(store.clone(), cfg);
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let d = dropped.clone();
        assert!(fs.cache_dirs_without_opendir(Arc::new(move |ino| d.lock().unwrap().push(ino))));
        let names = |e: &[DirEntry]| e.iter().map(|e| e.name.clone()).collect::<Vec<_>>();

        let (first, n1) = fs.readdir_unopened(crate::ROOT_INO, 0).await.unwrap();
        assert_eq!(names(&first), [".", "..", "a"]);
        let (second, _) = fs.readdir_unopened(crate::ROOT_INO, 0).await.unwrap();
        assert!(Arc::ptr_eq(&first, &second), "readers within the TTL share one snapshot");
        fs.mkdir(crate::ROOT_INO, "0", None).await.unwrap();
        let (third, n3) = fs.readdir_unopened(crate::ROOT_INO, 0).await.unwrap();
        assert_eq!(names(&third), [".", "..", "0", "a"], "a change through the mount is a new snapshot");
        assert_ne!(n1, n3);
        // A read that started before the change pages on through its own snapshot: index
        // 2 of the new one is "0", and "a" would have come twice.
        let (cont, n) = fs.readdir_unopened(crate::ROOT_INO, cookie(n1, 2)).await.unwrap();
        assert!(Arc::ptr_eq(&first, &cont) && n == n1, "a read continued in another snapshot");
        store.put("b", bytes::Bytes::from_static(b"2"), PutOpts::default()).await.unwrap();
        tokio::time::sleep(ttl + ttl / 2).await;
        assert_eq!(*dropped.lock().unwrap(), [crate::ROOT_INO], "dropped when the listing went stale");
        let (later, _) = fs.readdir_unopened(crate::ROOT_INO, cookie(n3, 2)).await.unwrap();
        assert!(Arc::ptr_eq(&third, &later), "a later offset pages through the same snapshot");
        let (again, _) = fs.readdir_unopened(crate::ROOT_INO, 0).await.unwrap();
        assert_eq!(names(&again), [".", "..", "0", "a", "b"], "offset 0 lists again");
    }

    /// Listers that each began after a change (a directory being written to) page through
    /// their own snapshots; one still paging keeps its snapshot however many began after it.
    #[test]
    fn a_reader_paging_keeps_its_snapshot_while_others_begin() {
        let c = DirCache::default();
        let source = (Instant::now(), 0);
        let first = snap(&["a", "b"]);
        let (n1, _) = c.set_current(1, &first, source);
        for i in 0..3 * RECENT {
            let (n, _) = c.set_current(1, &snap(&["a", "b", &format!("n{i}")]), (source.0, i as u64 + 1));
            assert!(c.recent(1, n).is_some());
            let page = c.recent(1, n1).unwrap_or_else(|| panic!("snapshot gone after {} others", i + 1));
            assert!(Arc::ptr_eq(&page, &first));
        }
        assert_eq!(c.dirs.lock().unwrap()[&1].recent.len(), RECENT, "bounded");
    }

    #[test]
    fn no_kernel_cache_without_opendir_at_a_ttl_of_zero() {
        let cfg = crate::FsConfig { metadata_ttl: std::time::Duration::ZERO, ..Default::default() };
        let fs = Fs::new(Arc::new(bucketfs_store::testing::MemStore::new()), cfg);
        assert!(!fs.cache_dirs_without_opendir(Arc::new(|_| {})));
        assert!(!fs.dirs_without_opendir());
    }

    #[test]
    fn a_forgotten_directory_starts_over() {
        let c = DirCache::default();
        c.opened(1, &snap(&["a"]));
        c.released(1);
        c.forgotten(1);
        assert!(!c.opened(1, &snap(&["a"])));
    }
}
