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

/// A link object whose content is no target Linux can hold (another client's link): its
/// readlink fails rather than serve a target cut short, which `cp -a`, `rsync -a` and `tar`
/// would copy without a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadTarget {
    /// Over `TARGET_MAX` bytes: ENAMETOOLONG.
    TooLong,
    /// EIO, as no link can have it.
    Empty,
    /// Holds a NUL byte, where the kernel would cut it: EIO.
    Nul,
}

impl std::fmt::Display for BadTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BadTarget::TooLong => "its target is longer than Linux's PATH_MAX",
            BadTarget::Empty => "its target is empty",
            BadTarget::Nul => "its target holds a NUL byte",
        })
    }
}

/// What is wrong with a link object of `size` bytes, if its size tells.
pub fn bad_target_size(size: u64) -> Option<BadTarget> {
    if size > TARGET_MAX as u64 {
        Some(BadTarget::TooLong)
    } else if size == 0 {
        Some(BadTarget::Empty)
    } else {
        None
    }
}

/// What is wrong with a link object's content `target` (read up to `TARGET_MAX + 1`
/// bytes), if anything.
pub fn bad_target(target: &[u8]) -> Option<BadTarget> {
    bad_target_size(target.len() as u64).or_else(|| target.contains(&0).then_some(BadTarget::Nul))
}

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
    fn link_targets_linux_cannot_hold_are_bad() {
        assert_eq!(bad_target(b"../t"), None);
        assert_eq!(bad_target(&[b'a'; TARGET_MAX]), None);
        assert_eq!(bad_target(&[b'a'; TARGET_MAX + 1]), Some(BadTarget::TooLong));
        assert_eq!(bad_target(b""), Some(BadTarget::Empty));
        assert_eq!(bad_target(b"safe\0/etc/passwd"), Some(BadTarget::Nul));
        assert_eq!(bad_target_size(5_000), Some(BadTarget::TooLong));
        assert_eq!(bad_target_size(0), Some(BadTarget::Empty));
        assert_eq!(bad_target_size(TARGET_MAX as u64), None);
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
