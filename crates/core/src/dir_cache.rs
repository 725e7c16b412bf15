//! The kernel's readdir cache: when the kernel may keep a directory's cached entries.
//!
//! Every opendir asks the kernel to cache the entries it reads (FOPEN_CACHE_DIR), so a
//! directory read again is answered without a readdir round trip. Whether the kernel may
//! keep what it cached at an earlier open (FOPEN_KEEP_CACHE) is decided here: only when the
//! snapshot this opendir took equals the one the cache was filled from. Otherwise the
//! kernel drops its cache and fills it again from this handle's readdirs.
//!
//! The kernel fills its cache from whichever handle reads first after the drop. When other
//! handles of the directory are open at that moment, that may be one of theirs, with an
//! older snapshot: the cache's content is then unknown and the next opendir drops it too.
//! The kernel itself drops the cache when the directory changes through it (its iversion)
//! or its mtime changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::fs::DirEntry;

#[derive(Default)]
struct DirState {
    /// The snapshot the kernel's cache holds (or is being filled from), if known.
    filled_from: Option<Arc<Vec<DirEntry>>>,
    /// Directory handles open now.
    open: usize,
}

#[derive(Default)]
pub(crate) struct DirCache {
    dirs: Mutex<HashMap<u64, DirState>>,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Kind;

    fn snap(names: &[&str]) -> Arc<Vec<DirEntry>> {
        Arc::new(names.iter().enumerate().map(|(i, n)| DirEntry { ino: i as u64 + 2, kind: Kind::File, name: n.to_string() }).collect())
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

    #[test]
    fn a_forgotten_directory_starts_over() {
        let c = DirCache::default();
        c.opened(1, &snap(&["a"]));
        c.released(1);
        c.forgotten(1);
        assert!(!c.opened(1, &snap(&["a"])));
    }
}
