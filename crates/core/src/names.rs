//! Object keys to file names.
//!
//! A key is split on `/`. A segment becomes a file name only if it is a valid POSIX name:
//! not empty (`a//b`), not `.` or `..`, no NUL byte, at most 255 bytes. A key with any
//! invalid segment is never exposed (it is skipped, and counted in the debug log), so no
//! path inside the mount can escape it or alias another key. See docs/SEMANTICS.md.

/// Longest file name Linux accepts (NAME_MAX).
pub const NAME_MAX: usize = 255;

/// MinIO stores a directory marker `x/` as `x__XLDIR__` and lists a key ending so as that
/// marker: a file named `x__XLDIR__` would become the empty directory `x` (and `rmdir x`
/// would delete its bytes). New names ending so are refused on object stores.
pub const MINIO_DIR_SUFFIX: &str = "__XLDIR__";

/// The key suffix that marks a symbolic link object (rclone's convention: [`crate::links`]).
pub const LINK_SUFFIX: &str = ".rclonelink";

/// Whether one key segment may be shown as a file name.
pub fn valid_segment(seg: &str) -> bool {
    !seg.is_empty() && seg != "." && seg != ".." && !seg.contains('\0') && seg.len() <= NAME_MAX
}

/// The child name for a listing entry `key` under directory prefix `prefix`, with whether it
/// is a directory (a common prefix ending in `/`). `None` when it must not be exposed.
pub fn child_name<'a>(prefix: &str, key: &'a str) -> Option<(&'a str, bool)> {
    let rest = key.strip_prefix(prefix)?;
    let (name, is_dir) = match rest.strip_suffix('/') {
        Some(n) => (n, true),
        None => (rest, false),
    };
    (valid_segment(name) && !name.contains('/')).then_some((name, is_dir))
}

/// Whether `key`, listed below directory prefix `prefix`, is shown by the mount: every
/// segment below the prefix is a valid file name (a marker's trailing `/` aside).
pub fn shown_below(prefix: &str, key: &str) -> bool {
    let Some(rest) = key.strip_prefix(prefix) else { return false };
    if rest.is_empty() {
        return true; // the directory's own marker
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    rest.split('/').all(valid_segment)
}

/// The keys of the directories above `key` (listed below directory key `prefix`) that a
/// listing can show: `prefix` and each leading segment up to the first that is not a valid
/// file name. One trailing `/` is a marker's; `d//` holds an empty segment.
pub fn ancestors(prefix: &str, key: &str) -> Vec<String> {
    let rest = key.strip_prefix(prefix).unwrap_or(key);
    let segments: Vec<&str> = rest.strip_suffix('/').unwrap_or(rest).split('/').collect();
    let valid = segments[..segments.len() - 1].iter().take_while(|s| valid_segment(s)).count();
    (0..=valid).map(|i| segments[..i].iter().fold(prefix.to_string(), |k, s| format!("{k}{s}/"))).collect()
}

/// The key of child `name` in the directory whose key is `parent_key` (`""` or ending in
/// `/`): the inverse of [`child_name`], so `child_name(p, &child_key(p, n, d)) == Some((n, d))`
/// for every valid `n` (checked by the `names` fuzz target).
pub fn child_key(parent_key: &str, name: &str, is_dir: bool) -> String {
    let mut k = String::with_capacity(parent_key.len() + name.len() + 1);
    k.push_str(parent_key);
    k.push_str(name);
    if is_dir {
        k.push('/');
    }
    k
}

/// Check a name the kernel asked about; errors match what a local filesystem would say.
pub fn check_lookup_name(name: &str) -> Result<(), crate::FsError> {
    if name.len() > NAME_MAX {
        return Err(crate::FsError::NameTooLong);
    }
    if !valid_segment(name) || name.contains('/') {
        return Err(crate::FsError::NotFound);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn invalid_segments_are_never_names() {
        for bad in ["", ".", "..", "a\0b", &"x".repeat(256)] {
            assert!(!valid_segment(bad), "{bad:?}");
        }
        assert!(valid_segment("..."));
        assert!(valid_segment(&"x".repeat(255)));
    }

    #[test]
    fn child_names_from_listing_keys() {
        assert_eq!(child_name("d/", "d/f.txt"), Some(("f.txt", false)));
        assert_eq!(child_name("d/", "d/sub/"), Some(("sub", true)));
        assert_eq!(child_name("d/", "d//"), None);
        assert_eq!(child_name("d/", "d/../"), None);
        assert_eq!(child_name("d/", "d/."), None);
        assert_eq!(child_name("d/", "e/x"), None);
        assert_eq!(child_name("", "top"), Some(("top", false)));
    }

    proptest! {
        /// Whatever the key, a name we expose is one path component that cannot climb out.
        #[test]
        fn exposed_names_never_escape(prefix in "([a-z]{1,3}/){0,2}", rest in "[a-z./\\x00]{0,12}") {
            let key = format!("{prefix}{rest}");
            if let Some((name, _)) = child_name(&prefix, &key) {
                prop_assert!(valid_segment(name));
                prop_assert!(!name.contains('/'));
                prop_assert!(name != "." && name != "..");
            }
        }
    }
}
