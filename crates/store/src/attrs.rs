//! File attributes kept with an object as user metadata: `mode` (octal, file type bits
//! included, as rclone writes it), `uid`, `gid` (decimal) and `mtime` (seconds since the
//! epoch with a fraction, the form rclone's S3 backend writes and s3fs reads). Stores that
//! have no user metadata keep none ([`crate::Capabilities::keeps_attrs`] is false).
//! Beside them, `bucketfs-create`: the tag of a create-only upload ([`FileAttrs::created_by`]).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a filesystem wants to keep beside an object's bytes. `None`: not set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileAttrs {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
    /// A create-only upload's tag ([`new_create_tag`], hex), the same on every try of one
    /// `O_EXCL` file: an upload refused because the key holds an object tells by it whether
    /// that object is one of its own earlier tries, landed though its answer was lost, or
    /// another writer's (which no other client can give this tag).
    pub created_by: Option<u128>,
}

/// A fresh tag for a file's create-only uploads ([`FileAttrs::created_by`]): random, else
/// (no randomness from the OS) the time, the process and a counter.
pub fn new_create_tag() -> u128 {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_ok() {
        return u128::from_le_bytes(b);
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as u128;
    nanos ^ (u128::from(std::process::id()) << 64) ^ (n << 96)
}

impl FileAttrs {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The user-metadata map to send with an upload.
    pub fn to_metadata(&self) -> HashMap<String, String> {
        let mut m = HashMap::new();
        if let Some(mode) = self.mode {
            m.insert("mode".into(), format!("{mode:o}"));
        }
        if let Some(uid) = self.uid {
            m.insert("uid".into(), uid.to_string());
        }
        if let Some(gid) = self.gid {
            m.insert("gid".into(), gid.to_string());
        }
        if let Some(t) = self.mtime {
            // Seconds as a decimal number, negative before 1970 (`touch -d 1960-...`).
            let (sign, d) = match t.duration_since(UNIX_EPOCH) {
                Ok(d) => ("", d),
                Err(e) => ("-", e.duration()),
            };
            m.insert("mtime".into(), format!("{sign}{}.{:09}", d.as_secs(), d.subsec_nanos()));
        }
        if let Some(tag) = self.created_by {
            m.insert("bucketfs-create".into(), format!("{tag:032x}"));
        }
        m
    }

    /// Parse what an object carries; values that do not parse are ignored.
    pub fn from_metadata(m: &HashMap<String, String>) -> Self {
        let get = |k: &str| m.iter().find(|(key, _)| key.eq_ignore_ascii_case(k)).map(|(_, v)| v.trim());
        let mtime = get("mtime").and_then(|v| {
            let (before, v) = match v.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, v),
            };
            let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
            let secs: u64 = secs.parse().ok()?;
            let digits: String = frac.chars().take(9).collect();
            let nanos =
                if digits.is_empty() { 0 } else { digits.parse::<u32>().ok()? * 10u32.pow(9 - digits.len() as u32) };
            let d = Duration::new(secs, nanos);
            if before {
                UNIX_EPOCH.checked_sub(d)
            } else {
                UNIX_EPOCH.checked_add(d)
            }
        });
        Self {
            mode: get("mode").and_then(|v| u32::from_str_radix(v, 8).ok()).filter(|m| *m <= 0o177777),
            uid: get("uid").and_then(|v| v.parse().ok()),
            gid: get("gid").and_then(|v| v.parse().ok()),
            mtime,
            created_by: get("bucketfs-create").and_then(|v| u128::from_str_radix(v, 16).ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_round_trip_through_metadata() {
        let a = FileAttrs {
            mode: Some(0o100755),
            uid: Some(1000),
            gid: Some(0),
            mtime: Some(UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789)),
            created_by: Some(new_create_tag()),
        };
        let m = a.to_metadata();
        assert_eq!(m["mode"], "100755");
        assert_eq!(m["mtime"], "1700000000.123456789");
        assert_eq!(FileAttrs::from_metadata(&m), a);
        // Integer seconds (s3fs), short fractions, junk.
        let m = HashMap::from([("Mtime".to_string(), "1700000000.5".to_string()), ("mode".into(), "99".into())]);
        let b = FileAttrs::from_metadata(&m);
        assert_eq!(b.mtime, Some(UNIX_EPOCH + Duration::new(1_700_000_000, 500_000_000)));
        assert_eq!(b.mode, None);
        assert!(FileAttrs::from_metadata(&HashMap::new()).is_empty());
    }

    #[test]
    fn mtimes_before_1970_round_trip() {
        for d in [Duration::new(304_776_000, 0), Duration::new(0, 500_000_000), Duration::new(2_208_988_800, 1)] {
            let a = FileAttrs { mtime: Some(UNIX_EPOCH - d), ..Default::default() };
            let m = a.to_metadata();
            assert!(m["mtime"].starts_with('-'), "{m:?}");
            assert_eq!(FileAttrs::from_metadata(&m), a, "{m:?}");
        }
        let m = HashMap::from([("mtime".to_string(), "-304776000".to_string())]); // another tool's
        assert_eq!(FileAttrs::from_metadata(&m).mtime, Some(UNIX_EPOCH - Duration::new(304_776_000, 0)));
    }
}
