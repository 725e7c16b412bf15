//! Symbolic links. A link is a small object named `<name>.rclonelink` whose content is the
//! target, the convention rclone's `--links` uses, so links made by either tool read as links
//! in the other, and every store (S3, GCS, a local folder, memory) can hold them. Listings
//! need no extra request to tell a link from a file.

use std::collections::HashMap;

use crate::inode::{ChildMeta, Kind};
use crate::names;
pub use crate::names::LINK_SUFFIX;

/// Longest target accepted (Linux's PATH_MAX less the terminating NUL).
pub const TARGET_MAX: usize = 4095;

/// The link name for a listed file name, if it names a link object.
pub fn link_name(file_name: &str) -> Option<&str> {
    file_name.strip_suffix(LINK_SUFFIX).filter(|n| names::valid_segment(n))
}

/// Whether `name` can be a link: its object's name (with the suffix) must fit NAME_MAX,
/// which stores such as MinIO enforce per key segment.
pub fn may_be_link(name: &str) -> bool {
    name.len() + LINK_SUFFIX.len() <= names::NAME_MAX
}

/// How a listed (non-directory) name shows: as a link (suffix removed) or a file.
pub fn classify(file_name: &str) -> (&str, Kind) {
    match link_name(file_name) {
        Some(n) => (n, Kind::Symlink),
        None => (file_name, Kind::File),
    }
}

/// Add a child to a listing being built. One name, several objects: a directory shadows a
/// file, and a file shadows a link (SEMANTICS.md).
pub fn merge_child(children: &mut HashMap<String, ChildMeta>, meta: ChildMeta) {
    let rank = |k: Kind| match k {
        Kind::Dir => 2,
        Kind::File => 1,
        Kind::Symlink => 0,
    };
    match children.get(&meta.name) {
        Some(c) if rank(c.kind) >= rank(meta.kind) => {}
        _ => {
            children.insert(meta.name.clone(), meta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn m(name: &str, kind: Kind) -> ChildMeta {
        ChildMeta {
            name: name.into(),
            kind,
            size: 0,
            mtime: SystemTime::UNIX_EPOCH,
            etag: None,
            attrs: None,
            size_unknown: false,
            asked: 0,
        }
    }

    #[test]
    fn link_objects_show_without_their_suffix() {
        assert_eq!(classify("a.rclonelink"), ("a", Kind::Symlink));
        assert_eq!(classify("a.txt"), ("a.txt", Kind::File));
        // Nothing left to name, or an invalid name: a plain file.
        assert_eq!(classify(".rclonelink"), (".rclonelink", Kind::File));
        assert_eq!(classify("...rclonelink"), ("...rclonelink", Kind::File));
    }

    #[test]
    fn directories_shadow_files_shadow_links() {
        let mut c = HashMap::new();
        merge_child(&mut c, m("x", Kind::Symlink));
        merge_child(&mut c, m("x", Kind::File));
        assert_eq!(c["x"].kind, Kind::File);
        merge_child(&mut c, m("x", Kind::Symlink));
        assert_eq!(c["x"].kind, Kind::File);
        merge_child(&mut c, m("x", Kind::Dir));
        merge_child(&mut c, m("x", Kind::File));
        assert_eq!(c["x"].kind, Kind::Dir);
    }
}
