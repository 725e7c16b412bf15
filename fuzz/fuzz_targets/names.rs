//! The key-to-name mapping (crates/core/src/names.rs), on arbitrary keys and names.
//!
//! Properties: a name shown for a key is one valid POSIX path component (not empty, `.` or
//! `..`, no `/` or NUL, at most 255 bytes); the mapping is exactly invertible (the shown name
//! leads back to the same key, so no two keys alias); and every name the kernel may send
//! that passes `check_lookup_name` maps to a key that lists back as that same name.
#![no_main]

use bucketfs_core::names::{check_lookup_name, child_key, child_name, valid_segment, NAME_MAX};
use libfuzzer_sys::fuzz_target;

fn assert_valid_name(name: &str) {
    assert!(!name.is_empty(), "empty name");
    assert!(name != "." && name != "..", "dot name {name:?}");
    assert!(!name.contains('/') && !name.contains('\0'), "separator in {name:?}");
    assert!(name.len() <= NAME_MAX, "{} bytes", name.len());
}

fuzz_target!(|input: (String, String, bool)| {
    let (prefix, key, is_dir) = input;
    // Any prefix the core could list: "" or a directory key ending in '/'.
    let prefix = if prefix.is_empty() || prefix.ends_with('/') { prefix } else { format!("{prefix}/") };

    // key -> name: whatever is in the bucket.
    if let Some((name, dir)) = child_name(&prefix, &key) {
        assert_valid_name(name);
        assert!(valid_segment(name));
        assert_eq!(child_key(&prefix, name, dir), key, "name {name:?} does not lead back to its key");
    }

    // name -> key -> name: whatever the kernel asks for.
    let name = key;
    if check_lookup_name(&name).is_ok() {
        assert_valid_name(&name);
        let k = child_key(&prefix, &name, is_dir);
        assert_eq!(child_name(&prefix, &k), Some((name.as_str(), is_dir)), "key {k:?}");
    }
});
